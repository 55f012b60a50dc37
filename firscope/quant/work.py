"""Chunks of a corpus run on model variants, in worker processes, the f32 side cached.

A :class:`Task` is one chunk and some variants of the model (each a choice of dtype per
q4-declared instance). Its worker runs the f32 base on the chunk (or reads the base's
logits from the cache, keyed by what the f32 model computes and the chunk's tokens),
then each variant, and returns per-token figures against the base (:mod:`.stats`), never
logits. Tasks are independent: :func:`run_tasks` spreads them over processes (spawned:
each loads the model once, with a share of the cores) and hands results back in task
order, so every figure is the same bit for bit whatever the number of workers.
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..jitcache import prune, save_atomic
from .stats import TokenStats, base_stats, token_stats

Choice = tuple[tuple[str, str], ...]  # sorted (instance, dtype) pairs
CACHE_LIMIT_BYTES = 2 << 30  # the f32 logits kept on disk; the oldest go first


@dataclass(frozen=True)
class Setup:
    """What every worker loads once."""

    model: str
    group: int
    engine: str
    threads: int = 0  # FIRSCOPE_THREADS for a worker process; 0: decide per token


@dataclass(frozen=True)
class Task:
    index: int  # order of results
    chunk: int
    tokens: np.ndarray
    first_scored: int
    variants: tuple[Choice, ...]
    cache: str | None  # the base's logits file (read if there, else written)
    importance: bool = False  # mean x^2 per input channel of each q4-declared linear
    # suffix replay (quant/replay.py): "record" runs the f32 base and the first variant
    # (all q4) in full, records their live-in sets into these files and verifies each
    # boundary; "replay" runs each variant from the first layer it changes, from the
    # record of the base it derives from (origins[i]: "f32", "q4" or "" for none)
    replay: str = ""  # "", "record" or "replay"
    snapshots: tuple[tuple[str, str], ...] = ()  # (origin, file)
    origins: tuple[str, ...] = ()
    verified: tuple[int, ...] = ()  # layers whose replay reproduced the base bit for bit


@dataclass
class Result:
    index: int
    chunk: int
    base_nll: np.ndarray
    stats: list[TokenStats]
    importance: dict[str, tuple[np.ndarray, int]] = field(default_factory=dict)
    seconds: float = 0.0
    steps: int = 0  # decode steps run (a replayed step counts as the share of nodes it ran)
    verified: tuple[int, ...] = ()


# -- one process's state -----------------------------------------------------------------
_STATE: dict = {}


def _bank(setup: Setup):
    got = _STATE.get(setup)
    if got is None:
        from ..runtime import load_model
        from .variants import Bank
        got = Bank(load_model(setup.model, group=setup.group))
        _STATE.clear()
        _STATE[setup] = got
    return got


def adopt(setup: Setup, bank) -> None:
    """Use ``bank`` (loaded by the command) for tasks of ``setup`` run in this process."""
    _STATE.clear()
    _STATE[setup] = bank


def _init_worker(setup: Setup) -> None:
    if setup.threads:
        os.environ["FIRSCOPE_THREADS"] = str(setup.threads)
        os.environ["NUMBA_NUM_THREADS"] = str(setup.threads)
    _bank(setup)


def chunk_logits(model, engine: str, tokens: np.ndarray, first_scored: int,
                 taps: dict | None = None, bank=None) -> np.ndarray:
    """Logits predicting tokens first_scored..ctx-1 of the chunk, [n, vocab] f32."""
    from ..runtime.machine import Hooks, Machine
    if bank is not None:
        m = bank.machine(model, engine)
        m.hooks = Hooks(at_node=taps or {})
    else:
        m = Machine(model, engine=engine, hooks=Hooks(at_node=taps or {}))
    rows = []
    for j in range(len(tokens) - 1):
        r = m.step(int(tokens[j]))
        if j + 1 >= first_scored:
            rows.append(r.logits)
    return np.stack(rows)


def _importance_taps(model, sums: dict) -> dict:
    """Taps that add x^2 of each q4-declared linear's input (read right before it runs)."""
    taps: dict[int, list] = {}
    for node in model.nodes:
        if node.target != "fir.linear" or node.index == 0:
            continue
        x, w = node.args
        if w.weight is None or w.region is not None:
            continue
        name, base, size = w.weight.name, x.region.base, x.region.size

        def tap(machine, _node, name=name, base=base, size=size):
            v = machine.arena[base: base + size].astype(np.float64)
            acc = sums.get(name)
            if acc is None:
                sums[name] = [v * v, 1]
            else:
                acc[0] += v * v
                acc[1] += 1
        taps.setdefault(node.index - 1, []).append(tap)
    return taps


def run_task(setup: Setup, task: Task) -> Result:
    bank = _bank(setup)
    t0 = time.perf_counter()
    targets = task.tokens[task.first_scored:]
    steps = 0.0
    full_steps = len(task.tokens) - 1
    base = None if task.replay == "record" else _read_cache(task.cache)
    sums: dict = {}
    verified: tuple[int, ...] = task.verified
    records: dict[str, dict] = {}
    bounds = {}
    if task.replay:
        from .replay import Recorder, boundaries, first_changed_layer, replay_logits
        bounds = boundaries(bank.model, full_steps)
    if task.replay == "replay":
        records = {origin: _read_records(path) for origin, path in task.snapshots}
    # the run each kind of variant derives from: all f32 ("alone") or all q4 ("recovered")
    origins = {o: bank.variant(_origin_choice(bank, o)) for o in records}
    if base is None or task.importance:
        taps = _importance_taps(bank.model, sums) if task.importance else {}
        f32 = bank.variant(bank.all_f32())
        rec = None
        if task.replay == "record":
            rec = Recorder(bank.model, bounds, full_steps)
            for k, v in rec.taps().items():
                taps.setdefault(k, []).extend(v)
        base = chunk_logits(f32, setup.engine, task.tokens, task.first_scored, taps, bank)
        steps += full_steps
        _write_cache(task.cache, base)
        if rec is not None:
            verified, cost = _verify(bank, f32, setup.engine, task, rec, base)
            steps += cost
            _write_records(dict(task.snapshots).get("f32"), rec)
            records["f32"] = rec.data
    stats = []
    for i, choice in enumerate(task.variants):
        variant = bank.variant(dict(choice))
        origin = task.origins[i] if i < len(task.origins) else ""
        q, cost = None, full_steps
        if task.replay == "replay" and origin in records:
            layer = first_changed_layer(origins[origin], variant)
            if (layer in verified and layer in bounds and bounds[layer].start > 0
                    and bounds[layer].layer in records[origin]):
                b = bounds[layer]
                q = replay_logits(variant, setup.engine, task.tokens, task.first_scored, b,
                                  records[origin][b.layer], bank)
                cost = full_steps * (len(bank.model.nodes) - b.start) / len(bank.model.nodes)
        if q is None:
            rec = None
            taps = {}
            if task.replay == "record" and i == 0:  # all q4: its records for "recovered"
                rec = Recorder(bank.model, bounds, full_steps)
                taps = rec.taps()
            q = chunk_logits(variant, setup.engine, task.tokens, task.first_scored, taps, bank)
            if rec is not None:
                _write_records(dict(task.snapshots).get("q4"), rec)
        steps += cost
        stats.append(token_stats(q, base, targets))
    imp = {k: (v[0], v[1]) for k, v in sums.items()}
    return Result(task.index, task.chunk, base_stats(base, targets), stats, imp,
                  time.perf_counter() - t0, steps, verified)


def _origin_choice(bank, origin: str) -> dict:
    return bank.all_f32() if origin == "f32" else bank.all_q4()


def _verify(bank, model, engine: str, task: Task, rec,
            base: np.ndarray) -> tuple[tuple[int, ...], float]:
    """The layers whose replay of ``model`` from its own records gives ``base`` bit for bit,
    and the decode steps that cost (as shares of a full step)."""
    from .replay import replay_logits
    ok, cost = [], 0.0
    n = len(model.nodes)
    for layer, b in rec.bounds.items():
        if b.start == 0:
            continue
        again = replay_logits(model, engine, task.tokens, task.first_scored, b,
                              rec.data[layer], bank)
        cost += (len(task.tokens) - 1) * (n - b.start) / n
        if np.array_equal(again.view(np.uint32), base.view(np.uint32)):
            ok.append(layer)
    return tuple(ok), cost


def _write_records(path: str | None, rec) -> None:
    save_atomic(path, lambda f: np.savez(f, **{f"l{k}": v for k, v in rec.data.items()}))


def _read_records(path: str) -> dict[int, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {int(k[1:]): z[k] for k in z.files}
    except (OSError, ValueError):
        return {}


def _worker_task(setup: Setup, task: Task) -> Result:
    return run_task(setup, task)


_ONE_AT_A_TIME = threading.Lock()


def cluster_task(setup: Setup, task: Task) -> Result:
    """A task on a Dask worker, which may run several in threads of one process: one at a
    time here (a process holds one model and its machines, not made to be shared)."""
    with _ONE_AT_A_TIME:
        return run_task(setup, task)


def workers_for(tasks: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    return max(1, min(cores, tasks)), cores


START_SECONDS = 1.5  # a spawned worker's interpreter, NumPy and numba, before its model load


class Runner:
    """Runs lists of tasks, results in task order, over one set of worker processes kept
    for every list (a sensitivity sweep's two phases start them once). The first task runs
    in this process (its model is loaded); workers start only when that pays: when their
    start (an interpreter and a model load each, ``load_seconds`` being this process's)
    costs less than a quarter of running the rest here. ``workers``: a fixed count (0 or 1:
    everything in this process). ``cluster``: a Dask scheduler's address; every task then
    runs on its workers (quant/cluster.py), none here."""

    def __init__(self, setup: Setup, *, workers: int | None = None, load_seconds: float = 0.0,
                 cluster: str | None = None):
        self.setup, self.workers, self.load_seconds = setup, workers, load_seconds
        self.pool = None
        self.cluster = None
        self.decided = workers is not None and workers <= 1
        if cluster:
            from .cluster import connect
            self.cluster = connect(cluster, setup)
            self.decided = True

    @property
    def slots(self) -> int | None:
        """Tasks that run at once on the cluster (None: local)."""
        return self.cluster.slots if self.cluster is not None else None

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def run(self, tasks: Sequence[Task], remaining: int = 0) -> Iterator[Result]:
        """``remaining``: tasks of later lists, counted when deciding to start workers."""
        tasks = list(tasks)
        if not tasks:
            return
        if self.cluster is not None:
            yield from self.cluster.run(cluster_task, tasks)
            return
        if not self.decided:
            first = run_task(self.setup, tasks[0])
            yield first
            tasks = tasks[1:]
            self._decide(first.seconds, len(tasks) + remaining)
        if self.pool is None:
            for t in tasks:
                yield run_task(self.setup, t)
            return
        pending: dict[int, Result] = {}
        futures = [self.pool.submit(_worker_task, self.wsetup, t) for t in tasks]
        want = [t.index for t in tasks]
        k = 0
        try:
            for f in futures:
                r = f.result()
                pending[r.index] = r
                while k < len(want) and want[k] in pending:
                    yield pending.pop(want[k])
                    k += 1
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    def _decide(self, seconds: float, rest: int) -> None:
        self.decided = True
        n, cores = workers_for(rest)
        if self.workers is not None:
            n = max(1, min(self.workers, rest))
        elif START_SECONDS + self.load_seconds > 0.25 * seconds * rest:
            n = 1
        if n <= 1:
            return
        import multiprocessing
        self.wsetup = Setup(self.setup.model, self.setup.group, self.setup.engine,
                            threads=max(1, cores // n))
        self.pool = ProcessPoolExecutor(max_workers=n,
                                        mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_init_worker, initargs=(self.wsetup,))




def run_tasks(setup: Setup, tasks: Sequence[Task], *, workers: int | None = None,
              load_seconds: float = 0.0, cluster: str | None = None) -> Iterator[Result]:
    """:class:`Runner` for one list of tasks."""
    with Runner(setup, workers=workers, load_seconds=load_seconds, cluster=cluster) as runner:
        yield from runner.run(tasks)


# -- the f32 side's cache ----------------------------------------------------------------
_EXCEPT = re.compile(r"\s+except\s.*$")


def base_key(model, tokens: np.ndarray) -> str:
    """What the f32 model computes on ``tokens``: the model file with every q4 weight's dtype
    and ``except`` clause taken out (a plan of other precisions has the same f32 side), the
    config, the checkpoint's identity and the tokens."""
    h = hashlib.sha256()
    for line in model.path.read_text(encoding="utf-8").split("\n"):
        code = line.split("#", 1)[0].strip()
        if code.startswith("weight "):
            code = _EXCEPT.sub("", code)
            parts = code.split()
            if len(parts) > 2 and parts[2].startswith("q4"):
                parts[2] = "q4"
            code = " ".join(parts)
        if code:
            h.update(code.encode() + b"\n")
    h.update(model.config_path.read_bytes())
    ckpt = model.folder / "model.safetensors"
    st = ckpt.stat()
    h.update(f"{ckpt.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    h.update(np.ascontiguousarray(tokens, dtype=np.int64).tobytes())
    return h.hexdigest()[:32]


def cache_file(model, tokens: np.ndarray, first_scored: int) -> str | None:
    from ..jitcache import cache_dir
    try:
        folder = cache_dir("eval")
    except OSError:
        return None
    return str(folder / f"{base_key(model, tokens)}-{first_scored}.npy")


def _read_cache(path: str | None) -> np.ndarray | None:
    if path is None or not os.path.isfile(path):
        return None
    try:
        a = np.load(path, allow_pickle=False)
        os.utime(path)
        return a if a.dtype == np.float32 and a.ndim == 2 else None
    except (OSError, ValueError):
        return None


def _write_cache(path: str | None, logits: np.ndarray) -> None:
    if save_atomic(path, lambda f: np.save(f, logits)):
        prune(Path(path).parent, CACHE_LIMIT_BYTES, ("*.npy", "*.npz"))
