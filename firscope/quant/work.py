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
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import FirError
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


@dataclass
class Result:
    index: int
    chunk: int
    base_nll: np.ndarray
    stats: list[TokenStats]
    importance: dict[str, tuple[np.ndarray, int]] = field(default_factory=dict)
    seconds: float = 0.0
    steps: int = 0


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


def _init_worker(setup: Setup) -> None:
    if setup.threads:
        os.environ["FIRSCOPE_THREADS"] = str(setup.threads)
        os.environ["NUMBA_NUM_THREADS"] = str(setup.threads)
    _bank(setup)


def chunk_logits(model, engine: str, tokens: np.ndarray, first_scored: int,
                 taps: dict | None = None) -> np.ndarray:
    """Logits predicting tokens first_scored..ctx-1 of the chunk, [n, vocab] f32."""
    from ..runtime.machine import Hooks, Machine
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
    steps = 0
    base = _read_cache(task.cache)
    sums: dict = {}
    if base is None or task.importance:
        taps = _importance_taps(bank.model, sums) if task.importance else None
        base = chunk_logits(bank.variant(bank.all_f32()), setup.engine, task.tokens,
                            task.first_scored, taps)
        steps += len(task.tokens) - 1
        _write_cache(task.cache, base)
    stats = []
    for choice in task.variants:
        q = chunk_logits(bank.variant(dict(choice)), setup.engine, task.tokens,
                         task.first_scored)
        steps += len(task.tokens) - 1
        stats.append(token_stats(q, base, targets))
    imp = {k: (v[0], v[1]) for k, v in sums.items()}
    return Result(task.index, task.chunk, base_stats(base, targets), stats, imp,
                  time.perf_counter() - t0, steps)


def _worker_task(setup: Setup, task: Task) -> Result:
    return run_task(setup, task)


def workers_for(tasks: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    return max(1, min(cores, tasks)), cores


START_SECONDS = 1.5  # a spawned worker's interpreter, NumPy and numba, before its model load


def run_tasks(setup: Setup, tasks: Sequence[Task], *, workers: int | None = None,
              load_seconds: float = 0.0) -> Iterator[Result]:
    """Results in task order. The first task runs in this process (its model is loaded);
    the rest go to worker processes only when that pays: when starting them (an interpreter
    and a model load each, ``load_seconds`` being this process's) costs less than a quarter
    of running the rest here. ``workers``: a fixed count (0 or 1: all in this process)."""
    n, cores = workers_for(len(tasks))
    if workers is not None:
        n = max(1, min(workers, len(tasks)))
    if not tasks:
        return
    first = run_task(setup, tasks[0])
    yield first
    rest = tasks[1:]
    if workers is None and n > 1:
        start = START_SECONDS + load_seconds
        if start > 0.25 * first.seconds * len(rest):
            n = 1
    n = min(n, len(rest))
    if n <= 1:
        for t in rest:
            yield run_task(setup, t)
        return
    import multiprocessing
    wsetup = Setup(setup.model, setup.group, setup.engine, threads=max(1, cores // n))
    pending: dict[int, Result] = {}
    want = rest[0].index
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker, initargs=(wsetup,)) as pool:
        futures = [pool.submit(_worker_task, wsetup, t) for t in rest]
        try:
            for f in futures:
                r = f.result()
                pending[r.index] = r
                while want in pending:
                    yield pending.pop(want)
                    want += 1
        except BaseException:
            for f in futures:
                f.cancel()
            raise


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
    if path is None:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            np.save(f, logits)
        os.replace(tmp, path)
        _prune(Path(path).parent)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _prune(folder: Path) -> None:
    files = sorted((p.stat().st_mtime, p.stat().st_size, p) for p in folder.glob("*.npy"))
    total = sum(s for _, s, _ in files)
    for _, size, p in files:
        if total <= CACHE_LIMIT_BYTES:
            break
        try:
            p.unlink()
            total -= size
        except OSError:
            pass
