"""Decode speed of firscope against HF transformers, a NumPy GPT-2 and llama.cpp.

    python benchmarks/decode.py [--quick] [--steps N] [--rounds R] [--threads T]
                                [--engines a,b,...] [--breakdown] [--llama-lib DIR]
                                [--firscope-threads adaptive|fixed] [--omp-wait auto|active|passive]
                                [--position N]

Makes (once) a randomly initialised GPT-2 with GPT-2 small's shapes with HF
transformers in ~/.cache/firscope-bench (outside the repo), copies the
sample's gpt2.fir beside it, and (when ``llama_cpp`` and ``gguf`` import)
writes it as GGUF quantized to Q4_0 / Q4_1 with an f32 head
(benchmarks/llama_peer.py). Then, for each of R rounds, it runs every engine
in its own fresh process (the order rotates from round to round), and each
process loads its model, warms up with one step, resets, and times N decode
steps one token at a time (positions 0..N-1, a KV cache, at most 2 threads
each by default; ``--position P``: positions P..P+N-1, every engine's K/V
cache first holding the same seeded random rows 0..P-1, a prefill in
milliseconds instead of P steps; llama.cpp, whose cache cannot be written from here, gets a
real prefill of P tokens instead: its steps do the same work, attention reading P rows
whatever they hold, but its logits come from another context and are not compared).
Engines that share a process slow each other down (OpenMP
and OpenBLAS threads spin after a call), hence one process per measurement.

firscope runs as a user gets it: its kernels use the cores other processes
leave free, chosen per step (model/threads.adapt), and OpenMP's wait policy
chosen at start from the load average and the tasks running then
(jitcache.choose_omp_wait); the table
says which thread counts and policy each measurement ran with.
``--firscope-threads fixed`` and ``--omp-wait active|passive`` pin them, to
measure each way. llama.cpp runs from ``llama_cpp`` when it imports; the
shared wheel was built for a CPU with AMX and dies with SIGILL on these
machines, so ``--llama-lib DIR`` points it at a libllama.so built here
(benchmarks/llama_peer.py says how).

Printed per engine: the median over rounds of each round's median ms/token
(and the range of the round medians), the load time and the resident memory
(VmRSS) after load and after decoding, and for every measurement the load
average and the CPU that *other* processes used meanwhile (from /proc/stat
minus the engine's own CPU): a figure taken while others ran is noisy and
says so. Ratios are against transformers, the NumPy GPT-2 and llama.cpp
(when it ran). The last step's logits of every engine are compared, so a
fast wrong engine shows. ``--breakdown`` adds firscope's time per node kind
(ext ops, each micro-kernel) measured with a node hook in a separate process.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
SEED_FIR = REPO / "sample_models" / "tiny-gpt2" / "gpt2.fir"
SMALL = dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
FIRSCOPE = {  # engine -> load options and the f32 product backend
    "firscope-q4": dict(fir_f32=False, q4_path="packed", f32_gemv="numba"),
    "firscope-q4-dequant": dict(fir_f32=False, q4_path="dequant", f32_gemv="numba"),
    "firscope-q4-blashead": dict(fir_f32=False, q4_path="packed", f32_gemv="blas"),
    "firscope-f32": dict(fir_f32=True, q4_path="packed", f32_gemv="numba"),
}
PEERS = ("transformers", "numpy")
LLAMA = ("llama-Q4_0", "llama-Q4_1")
DEFAULT_ENGINES = ("firscope-q4", "firscope-q4-dequant", "firscope-q4-blashead", "firscope-f32",
                   *PEERS, *LLAMA)


# --- the checkpoint ---------------------------------------------------------------------------
def make_checkpoint(folder: Path, shape: dict = SMALL) -> Path:
    """A random-weight HF GPT-2 checkpoint with ``shape`` and the seed's gpt2.fir beside it."""
    fir = folder / "gpt2.fir"
    if not (folder / "model.safetensors").exists():
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        folder.mkdir(parents=True, exist_ok=True)
        GPT2LMHeadModel(GPT2Config(**shape)).save_pretrained(folder, safe_serialization=True)
    shutil.copy(SEED_FIR, fir)
    return fir


# --- a plain NumPy GPT-2 with a KV cache (picoGPT-style) -----------------------------
def gelu_new(x):  # [n] -> [n]
    return 0.5 * x * (1 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715) * x ** 3)))


def layer_norm(x, g, b, eps=1e-5):  # [n] -> [n]
    mean = x.mean()
    var = ((x - mean) ** 2).mean()
    return (x - mean) / np.sqrt(var + np.float32(eps)) * g + b


class NumpyGPT2:
    def __init__(self, path: Path, cfg: dict):
        from safetensors.numpy import load_file
        t = load_file(str(path))
        g = lambda n: t.get(n, t.get("transformer." + n))  # noqa: E731
        self.wte, self.wpe = g("wte.weight"), g("wpe.weight")  # [vocab, E], [P, E]
        self.h = [{k: g(f"h.{i}.{k}") for k in (
            "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
            "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
            "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")}
            for i in range(cfg["n_layer"])]
        self.lnf = g("ln_f.weight"), g("ln_f.bias")
        self.H, self.E, self.P = cfg["n_head"], cfg["n_embd"], cfg["n_positions"]
        self.k = np.zeros((len(self.h), self.P, self.E), np.float32)  # [L, P, E]
        self.v = np.zeros_like(self.k)
        self.pos = 0

    def step(self, token: int) -> np.ndarray:  # token -> logits [vocab]
        p, H, E = self.pos, self.H, self.E
        hd = E // H
        x = self.wte[token] + self.wpe[p]  # [E]
        for i, w in enumerate(self.h):
            a = layer_norm(x, w["ln_1.weight"], w["ln_1.bias"])
            q, k, v = np.split(a @ w["attn.c_attn.weight"] + w["attn.c_attn.bias"], 3)  # 3x [E]
            self.k[i, p], self.v[i, p] = k, v
            K = self.k[i, :p + 1].reshape(p + 1, H, hd)  # [T, H, hd]
            V = self.v[i, :p + 1].reshape(p + 1, H, hd)
            s = np.einsum("hd,thd->ht", q.reshape(H, hd), K) / np.float32(np.sqrt(hd))  # [H, T]
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("ht,thd->hd", s, V).reshape(E)  # [E]
            x = x + o @ w["attn.c_proj.weight"] + w["attn.c_proj.bias"]
            a = layer_norm(x, w["ln_2.weight"], w["ln_2.bias"])
            f = gelu_new(a @ w["mlp.c_fc.weight"] + w["mlp.c_fc.bias"])  # [4E]
            x = x + f @ w["mlp.c_proj.weight"] + w["mlp.c_proj.bias"]
        self.pos += 1
        return self.wte @ layer_norm(x, *self.lnf)  # [vocab]


# --- the bandwidth floor -------------------------------------------------------------------
LINEARS = ("qkv_linear", "attention_linear", "fc_linear", "proj_linear")  # the seed's, per layer
STREAM = "stream"  # the pseudo-engine that measures the machine's streaming bandwidth


def linear_shapes(cfg: dict) -> list[tuple[str, int, int]]:
    """(node, rows, cols) of every matrix a decode step of the seed's gpt2.fir reads, in
    order: per layer qkv [3E, E], attention out [E, E], fc [4E, E], proj [E, 4E]; then
    the head (the tied wte [vocab, E])."""
    e = cfg["n_embd"]
    m = cfg.get("n_inner") or 4 * e
    per = [("qkv_linear", 3 * e, e), ("attention_linear", e, e), ("fc_linear", m, e),
           ("proj_linear", e, m)]
    return per * cfg["n_layer"] + [("head", cfg["vocab_size"], e)]


def token_reads(cfg: dict, q4: bool = True, group: int = 32,
                position: int | None = None) -> list[tuple[str, int]]:
    """(node, bytes) of each linear's weights one token reads, for the seed's layout (q4
    group 32 codes + f32 scale and min per group, the head f32) or, with ``q4=False``,
    --fir-f32's (every matrix f32); with ``position``, also each layer's attention reading
    its K and V rows 0..position (f32), after the layer's qkv linear."""
    out = []
    e = cfg["n_embd"]
    for name, rows, cols in linear_shapes(cfg):
        if q4 and name != "head":
            ng = -(-cols // group)
            out.append((name, rows * ((ng * group + 1) // 2) + 8 * rows * ng))
        else:
            out.append((name, 4 * rows * cols))
        if position is not None and name == "qkv_linear":
            out.append(("attention", 2 * (position + 1) * e * 4))
    return out


def stream_child(args) -> int:
    """The machine's streaming bandwidth (benchmarks/bandwidth.py) over one token's reads
    of the seed's layout and of --fir-f32's, each linear's bytes read once in decode
    order, best of 7 passes per read: the bandwidth floor of a token."""
    from bandwidth import Streamer, last_level_cache
    cfg = json.loads((Path(args.folder) / "config.json").read_text())
    # --position: the K/V rows of the middle timed step too (each step reads one more row)
    pos = args.position + (len(args.tokens.split(",")) - 1) // 2 if args.position else None
    q4 = [n for _, n in token_reads(cfg, position=pos)]
    f32 = [n for _, n in token_reads(cfg, q4=False, position=pos)]
    s = Streamer(max(f32))
    load1 = os.getloadavg()[0]
    a = cpu_snapshot()
    floor_q4, floor_f32 = s.floor(q4), s.floor(f32, passes=3)
    b = cpu_snapshot()
    print(json.dumps({"engine": STREAM, "floor_s": floor_q4, "bytes": sum(q4), "kv_position": pos,
                      "floor_f32_s": floor_f32, "bytes_f32": sum(f32), "threads": s.threads,
                      "llc": last_level_cache(), "loadavg": [load1, os.getloadavg()[0]],
                      "others_cpu": others_cpu(a, b)}))
    return 0


# --- measuring inside a child process ------------------------------------------------------------
def rss_bytes() -> int:
    """Resident memory now (VmRSS), not the peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_snapshot() -> tuple[float, float, float]:
    """(wall, busy CPU seconds of the whole machine, CPU seconds of this process)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = (sum(fields[:8]) - idle) / hz  # user..steal
    return time.perf_counter(), busy, time.process_time()


def others_cpu(a, b) -> float:
    """Cores' worth of CPU other processes used between two snapshots."""
    wall = b[0] - a[0]
    return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / wall) if wall > 0 else 0.0


def load_firscope(fir: Path, opts: dict):
    from firscope.runtime import load_model
    kw = {"fir_f32": opts["fir_f32"]}
    if opts["q4_path"] != "packed":
        kw["q4_path"] = opts["q4_path"]
    return load_model(fir, **kw)


def firscope_engine(fir: Path, opts: dict):
    from firscope.runtime import Machine, gemv
    gemv.BACKEND["f32"] = opts["f32_gemv"]
    model = load_firscope(fir, opts)
    machine = Machine(model, engine="compiled")
    machine.kernel_runner.warmup()
    return (lambda tok: machine.step(tok).logits), machine


def transformers_engine(folder: Path, threads: int):
    import torch
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.set_num_threads(threads)
    model = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
    state = {"past": None}

    def step(tok):
        with torch.inference_mode():
            kw = {} if state.get("at") is None else {
                "position_ids": torch.tensor([[state["at"]]])}
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=state["past"],
                        use_cache=True, **kw)
        state["past"] = out.past_key_values
        if state.get("at") is not None:
            state["at"] += 1
        return out.logits[0, -1].numpy()

    def seek(p):
        from transformers import DynamicCache
        cfg = model.config
        hd = cfg.n_embd // cfg.n_head
        layers = []
        for layer in range(cfg.n_layer):
            k, v = (torch.from_numpy(r.reshape(p, cfg.n_head, hd).transpose(1, 0, 2).copy())[None]
                    for r in kv_rows(cfg.n_embd, p, layer))
            layers.append((k, v))
        state.update(past=DynamicCache(layers, config=cfg), at=p)

    return step, lambda: state.update(past=None, at=None), seek


# --- a cheap prefill (--position) ----------------------------------------------------------------
def kv_rows(n_embd: int, position: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """The K and V rows [position, n_embd] every engine's cache holds for ``layer`` after a
    ``--position`` prefill: seeded random values (the same in every engine and process),
    in place of ``position`` decode steps, which would take minutes."""
    rng = np.random.default_rng(1000 + layer)
    return (rng.standard_normal((position, n_embd), dtype=np.float32),
            rng.standard_normal((position, n_embd), dtype=np.float32))


def firscope_seek(machine, position: int) -> None:
    """Put a firscope Machine at ``position`` with kv_rows in every layer's caches."""
    model = machine.model
    machine.reset()
    attn = [n for n in model.nodes if n.kind == "micro" and n.target == "g2.attn_decode"]
    for layer, node in enumerate(attn):
        e = node.args[0].size // 3
        for cache, rows in zip((node.args[2], node.args[3]), kv_rows(e, position, layer)):
            model.view(cache.region)[: position * e] = rows.ravel()
    machine.history = [0] * position
    machine.position = position


def make_engine(name: str, folder: Path, threads: int, position: int = 0):
    """(step(token) -> logits, reset(), seek(position)) for engine ``name``, loaded in this
    process (``position``: where the timed steps will start); ``seek`` puts the engine at a
    position with kv_rows in its caches (llama.cpp: a real prefill, see the docstring)."""
    if name in FIRSCOPE:
        step, machine = firscope_engine(folder / "gpt2.fir", FIRSCOPE[name])
        return step, machine.reset, lambda p: firscope_seek(machine, p)
    if name == "transformers":
        return transformers_engine(folder, threads)
    if name == "numpy":
        cfg = json.loads((folder / "config.json").read_text())
        m = NumpyGPT2(folder / "model.safetensors", cfg)

        def reset():
            m.pos = 0

        def seek(p):
            for layer in range(len(m.h)):
                m.k[layer, :p], m.v[layer, :p] = kv_rows(m.E, p, layer)
            m.pos = p
        return m.step, reset, seek
    if name in LLAMA:
        import llama_peer
        kind = name.split("-", 1)[1]
        step, llm = llama_peer.engine(llama_peer.prepare(folder)[kind], threads, 1024,
                                      n_batch=256 if position else 1)

        def prefill(p):  # llama.cpp's own prefill of p tokens (batched, untimed)
            llm.eval([int(t) for t in np.random.default_rng(p).integers(0, llm.n_vocab(), p)])
        return step, llm.reset, prefill

    raise SystemExit(f"unknown engine {name}")


def child(args) -> int:
    """One engine, one process: load, warm up, time ``steps`` decode steps, print JSON."""
    folder = Path(args.folder)
    tokens = [int(t) for t in args.tokens.split(",")]
    rss0 = rss_bytes()
    t = time.perf_counter()
    step, reset, seek = make_engine(args.child, folder, args.threads, args.position)
    load_s = time.perf_counter() - t
    rss_load = rss_bytes()
    step(tokens[0])  # first call pays one-off costs (kernel loads, BLAS buffers, pages)
    reset()
    if args.position:
        seek(args.position)
    load1 = os.getloadavg()[0]
    a = cpu_snapshot()
    times, logits, used = [], None, []
    for tok in tokens:
        t = time.perf_counter()
        logits = step(tok)
        times.append(time.perf_counter() - t)
        used.append(threads_in_use(args.child))
    b = cpu_snapshot()
    np.save(args.logits, np.asarray(logits, dtype=np.float32))
    print(json.dumps({"engine": args.child, "times": times, "load_s": load_s,
                      "rss_start": rss0, "rss_load": rss_load, "rss_end": rss_bytes(),
                      "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "loadavg": [load1, os.getloadavg()[0]], "others_cpu": others_cpu(a, b),
                      "own_cpu": (b[2] - a[2]) / (b[0] - a[0]), "threads_used": used,
                      "omp_wait": os.environ.get("OMP_WAIT_POLICY", "default")}))
    return 0


def threads_in_use(engine: str) -> int | None:
    """The threads firscope's kernels ran the last step on (model/threads.adapt chooses)."""
    if engine not in FIRSCOPE:
        return None
    import numba
    return numba.get_num_threads()


# --- where firscope's time goes (a child of its own) -----------------------------------------
def linear_bytes(node) -> int | None:
    """Bytes of weights a linear node reads per call (q4 codes + scales + mins, or the f32
    matrix); None for any other node."""
    if node.kind != "ext" or node.target not in ("fir.linear", "fir.linear_t"):
        return None
    entry = node.args[1].weight
    if entry.q4 is not None and entry.matrix is None:
        return entry.q4.nbytes
    return 4 * int(np.prod(entry.shape))


def breakdown_child(args) -> int:
    """ms per token by node target on firscope q4 (node hook); per linear (the head and
    each q4 linear of the layers together) its bytes, ms and GB/s against a streaming read
    of the same bytes (benchmarks/bandwidth.py) done after each step, read for read."""
    from collections import defaultdict

    from bandwidth import Streamer
    folder = Path(args.folder)
    tokens = [int(t) for t in args.tokens.split(",")]
    step, machine = firscope_engine(folder / "gpt2.fir", FIRSCOPE["firscope-q4"])
    step(tokens[0])
    machine.reset()
    start = args.position or 0
    if start:  # the timed steps' positions, as the main table's (--position)
        firscope_seek(machine, start)
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(tokens))
    lin: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(tokens))
    reads: list[tuple[str, int]] = []
    current = [0]

    per_node: dict[str, list[float]] = defaultdict(list)  # micro target -> each dispatch's s

    def hook(m, node, dt):
        key = node.target if node.kind == "micro" else f"{node.target} ({node.args[1].name})"
        acc[key][current[0]] += dt
        if node.kind == "micro":
            per_node[node.target].append(dt)
        nb = linear_bytes(node)
        if nb is not None:
            lin[node.name][current[0]] += dt
            if current[0] == 0:
                reads.append((node.name, nb))
    machine.hooks.after_node.append(hook)
    streamer, streamed = None, defaultdict(lambda: [0.0] * len(tokens))
    for i, tok in enumerate(tokens):
        current[0] = i
        machine.step(tok)
        if streamer is None:
            streamer = Streamer(max(n for _, n in reads))
        for name, nb in reads:  # the same reads, in the same order, from memory
            streamed[name][i] += streamer.read(nb)
    machine.hooks.after_node.remove(hook)
    dispatch = dispatch_costs(machine, per_node, start)
    hot = hot_linears(machine)
    per = {k: statistics.median(v) * 1e3 for k, v in acc.items()}
    micro = sum(v for k, v in per.items() if not k.startswith("fir."))
    nbytes = defaultdict(int)
    for name, nb in reads:
        nbytes[name] += nb
    linears = {k: {"bytes": nbytes[k], "calls": sum(1 for n, _ in reads if n == k),
                   "ms": statistics.median(v) * 1e3, "best_ms": min(v) * 1e3,
                   "stream_ms": min(streamed[k]) * 1e3, "hot_ms": hot.get(k)}
               for k, v in lin.items()}
    stream_gbs = sum(nbytes.values()) / sum(min(v) for v in streamed.values()) / 1e9
    cfg = json.loads((folder / "config.json").read_text())
    e, n = cfg["n_embd"], len(tokens)
    # K and V rows one layer's attention reads, per step (positions start..start+n-1)
    kv_bytes = statistics.mean(2 * (start + p + 1) * e * 4 for p in range(n))
    step_ms = statistics.median(sum(col) for col in zip(*acc.values())) * 1e3
    print(json.dumps({"per_target_ms": per, "micro_ms": micro, "linears": linears,
                      "dispatch": dispatch, "stream_gbs": stream_gbs, "kv_bytes": kv_bytes,
                      "layers": cfg["n_layer"], "position": start, "step_ms": step_ms,
                      "threads": machine_threads(), "loadavg": os.getloadavg()[0]}))
    return 0


def hot_linears(machine) -> dict[str, float]:
    """Per linear that fits a quarter of the last-level cache: ms per token of its calls
    with its matrix in cache (its first layer's node run again and again, the best of 7
    loops, each call the plain loop's: Machine.bound_calls): the kernel's own speed, what it
    would take if memory cost nothing. A linear whose decode time is near this is bound by
    its instructions, not by memory."""
    from bandwidth import last_level_cache
    room = last_level_cache() // 4
    calls: dict[str, int] = {}
    first: dict[str, object] = {}
    for node in machine.model.nodes:
        nb = linear_bytes(node)
        if nb is None:
            continue
        calls[node.name] = calls.get(node.name, 0) + 1
        if nb <= room:
            first.setdefault(node.name, node)
    out = {}
    with np.errstate(all="ignore"):
        for name, node in first.items():
            call = machine.bound_call(node)
            fn, args = call.fn, call.args
            fn(*args)
            best = []
            for _ in range(7):
                t = time.perf_counter()
                for _ in range(20):
                    fn(*args)
                best.append((time.perf_counter() - t) / 20)
            out[name] = min(best) * calls[name] * 1e3
    return out


def dispatch_costs(machine, per_node: dict[str, list[float]], start: int = 0) -> dict[str, dict]:
    """Per micro-kernel: the median time of its dispatches in the decode (node hook around
    Machine._execute, the plain loop's calls), and, for kernels on the plain driver, the
    same call run hot in a loop with all its lanes and with none (an empty-work dispatch:
    what a dispatch costs beyond its lanes' work). A kernel proved per dispatch
    (attention: its position) has no such call: its first node is run hot through the
    runner instead, on a copy of the arena as the decode left it, at the decode's median
    position."""
    import time
    out = {}
    # the driver's own entries (attention's goes through the runner, proved per dispatch)
    calls = {c.node.target: c for c in machine.bound_calls() if c.plain and c.direct}
    for target, v in per_node.items():
        row = {"calls": len(v), "us": statistics.median(v) * 1e6}
        c = calls.get(target)
        if c is None and machine.kernel_runner is not None:
            nodes = [n for n in machine.model.nodes if n.target == target]
            node = nodes[0]
            arena = machine.arena.copy()
            # at the decode's median position (attention's work grows with it)
            steps = len(v) // len(nodes)
            arena[machine.model.inputs["position"].base] = start + steps // 2
            row["position"] = start + steps // 2
            best = []
            for _ in range(7):
                t = time.perf_counter()
                for _ in range(50):
                    machine.kernel_runner.run(node, arena, None)
                best.append((time.perf_counter() - t) / 50 * 1e6)
            row["alone_us"] = min(best)
        if c is not None:
            fn, args = c.fn, c.args
            row["lanes"] = args[5]
            for name, a in (("hot_us", args), ("empty_us", args[:4] + (0, 0) + args[6:])):
                best = []
                for _ in range(7):
                    t = time.perf_counter()
                    for _ in range(200):
                        fn(*a)
                    best.append((time.perf_counter() - t) / 200 * 1e6)
                row[name] = min(best)
        out[target] = row
    return out


def machine_threads() -> int:
    import numba
    return numba.get_num_threads()


def print_breakdown(b: dict) -> None:
    print(f"\nfirscope q4, median ms per token by node kind (load avg {b['loadavg']:.2f}); "
          f"micro-kernels together {b['micro_ms']:.2f} ms:")
    for k, v in sorted(b["per_target_ms"].items(), key=lambda kv: -kv[1]):
        print(f"  {k:<28} {v:7.3f}")
    print("\nper-dispatch cost of each micro-kernel (us): in decode = median of its dispatches "
          "in the steps above (node hook around Machine._execute); work = the same call run "
          "hot with all its lanes minus with none; empty = the call with no lanes (an "
          "empty-work dispatch); overhead = in decode - work (goal <= 3 us)")
    print(f"  {'kernel':<16} {'calls':>6} {'lanes':>6} {'in decode':>10} {'work':>7} "
          f"{'empty':>7} {'overhead':>9}")
    for k, v in sorted(b["dispatch"].items()):
        if "hot_us" in v:
            work = v["hot_us"] - v["empty_us"]
            print(f"  {k:<16} {v['calls']:>6} {v['lanes']:>6} {v['us']:>10.2f} {work:>7.2f} "
                  f"{v['empty_us']:>7.2f} {v['us'] - work:>9.2f}")
        elif "alone_us" in v:
            print(f"  {k:<16} {v['calls']:>6} {'':>6} {v['us']:>10.2f}   (proved per dispatch: "
                  f"hot alone through the runner at position {v['position']}: "
                  f"{v['alone_us']:.2f} us)")
    if "g2.attn_decode" in b["dispatch"]:
        floor = b["kv_bytes"] / (b["stream_gbs"] * 1e9) * 1e6
        us = b["dispatch"]["g2.attn_decode"]["us"]
        print(f"  attn_decode: {us:.1f} us per dispatch against its KV-cache-read floor "
              f"{floor:.2f} us (mean {b['kv_bytes'] / 1e3:.0f} kB of K and V rows per dispatch "
              f"over these positions at the linears' streamed {b['stream_gbs']:.1f} GB/s): "
              f"{us / floor:.0f}x")
        alone = b["dispatch"]["g2.attn_decode"].get("alone_us")
        if alone:
            print(f"  attn_decode hot alone (K and V in cache) at the median position: "
                  f"{alone:.1f} us, {alone / floor:.0f}x the floor: each lane (head) sums its "
                  "dot products one add after the other (the kernel's order), so a lane's "
                  "time is its chains' latency; the rest of a dispatch in the decode is "
                  "reading K and V back after the linears' streams")
    print(f"\nfirscope q4 linears against the machine's streaming bandwidth, {b['threads']} "
          "threads (each linear's weights read once per call, the same bytes streamed right "
          "after each step, read for read):")
    print(f"  {'linear':<18} {'calls':>5} {'MB/token':>9} {'ms/token':>9} {'GB/s':>7} "
          f"{'stream GB/s':>12} {'fraction':>9} {'(best step)':>12} {'in cache':>9} "
          f"{'ceiling':>8} {'goal':>6}")
    tot = {"bytes": 0, "ms": 0.0, "best_ms": 0.0, "stream_ms": 0.0}
    bound = []
    for k, v in sorted(b["linears"].items(), key=lambda kv: kv[0] != "head"):
        for f in tot:
            tot[f] += v[f]
        _breakdown_row(k, v["calls"], v)
        if v.get("hot_ms") and round(v["stream_ms"] / v["hot_ms"], 2) < 0.8:  # as printed
            bound.append(k)
    _breakdown_row("all linears", sum(v["calls"] for v in b["linears"].values()), tot)
    print("(GB/s: the linear's bytes / its median time per token; stream GB/s: the same "
          "reads streamed (benchmarks/bandwidth.py), best over the steps; fraction: "
          "GB/s / stream GB/s, the goal >= 0.80; best step: the same with the linear's "
          "fastest step; in cache: GB/s of the same calls with the matrix in cache (a "
          "layer's node run again and again; only a matrix within a quarter of the "
          "last-level cache), the kernel's own speed; ceiling: in cache / stream GB/s, "
          "the fraction the kernel could reach if reading memory cost nothing; goal: "
          "GB/s / min(stream GB/s, in cache), issue 45's restated q4 goal >= 0.80 (the "
          "stream alone where the matrix does not fit: the head))")
    if bound:
        print(f"  bound by their instructions on this CPU, not by memory (ceiling < 0.80): "
              f"{', '.join(bound)}: with its matrix in cache the kernel is already slower "
              "than the stream, so no memory layout or prefetch brings it to the goal")


def _breakdown_row(name: str, calls: int, v: dict) -> None:
    gbs = v["bytes"] / v["ms"] / 1e6
    sgbs = v["bytes"] / v["stream_ms"] / 1e6
    hot = v.get("hot_ms")
    tail = (f"{v['bytes'] / hot / 1e6:>9.2f} {v['stream_ms'] / hot:>8.2f}" if hot
            else f"{'-':>9} {'-':>8}")
    goal = f"{linear_bound_ms(v) / v['ms']:>6.2f}" if hot or name == "head" else f"{'-':>6}"
    print(f"  {name:<18} {calls:>5} {v['bytes'] / 1e6:>9.2f} {v['ms']:>9.3f} {gbs:>7.2f} "
          f"{sgbs:>12.2f} {v['stream_ms'] / v['ms']:>9.2f} {v['stream_ms'] / v['best_ms']:>12.2f} "
          f"{tail} {goal}")


def linear_bound_ms(v: dict) -> float:
    """The least time a linear's calls can take: its bytes streamed, or its arithmetic with
    the matrix in cache where that is slower (issue 45's restated q4 goal measures against
    this: GB/s over min(stream, in cache))."""
    return max(v["stream_ms"], v.get("hot_ms") or 0.0)


def print_decode_bound(b: dict, main_ms: float | None) -> None:
    """Issue 45's whole-decode goal, restated: a token's time against max(its bandwidth floor,
    the linears' in-cache time + the micro-kernels' floor), from this breakdown's figures
    (the same process, read for read)."""
    lin = b["linears"]
    kv_ms = b.get("layers", 0) * b["kv_bytes"] / (b["stream_gbs"] * 1e9) * 1e3
    floor = sum(v["stream_ms"] for v in lin.values()) + kv_ms
    # the linears' in-cache time (a matrix that does not fit the cache, the head: streamed)
    busy = sum(v.get("hot_ms") or v["stream_ms"] for v in lin.values()) + kv_ms
    bound = max(floor, busy)
    print(f"\nwhole decode at positions {b.get('position', 0)}.. against issue 45's restated "
          f"bound: max(bandwidth floor {floor:.2f} ms = the linears' bytes streamed + every "
          f"layer's K/V rows ({kv_ms:.2f} ms), the linears' own bound {busy:.2f} ms = their "
          f"time with the matrix in cache + the same K/V rows) = {bound:.2f} ms/token")
    line = f"  this breakdown's steps (node hooks on) {b['step_ms']:.2f} ms: {b['step_ms'] / bound:.2f}x"
    if main_ms:
        line += f"; the table's firscope-q4 {main_ms:.2f} ms: {main_ms / bound:.2f}x"
    print(line + " (goal <= 1.25x; the other micro-kernels' reads, activations of a few kB, "
          "are left out of the floor)")


# --- the parent: rounds of fresh processes ------------------------------------------------------
def child_env(engine: str, threads: int, opts) -> dict:
    """The environment of one engine's process: at most ``threads`` threads everywhere;
    for firscope, fixed threads (FIRSCOPE_THREADS) or its adaptive default, and OpenMP's
    wait policy when asked; for llama.cpp, the library to load (--llama-lib)."""
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads))
    env.pop("FIRSCOPE_THREADS", None)
    if engine in (*FIRSCOPE, STREAM) and opts.firscope_threads == "fixed":
        env["FIRSCOPE_THREADS"] = str(threads)
    if engine in (*FIRSCOPE, STREAM) and opts.omp_wait != "auto":
        env["OMP_WAIT_POLICY"] = opts.omp_wait.upper()
    if engine in LLAMA and opts.llama_lib:
        env["LLAMA_CPP_LIB_PATH"] = str(Path(opts.llama_lib).resolve())
    return env


def run_child(engine: str, folder: Path, tokens: list[int], threads: int, out: Path,
              opts, breakdown: bool = False) -> dict:
    env = child_env(engine, threads, opts)
    cmd = [sys.executable, __file__, "--child", engine, "--folder", str(folder), "--tokens",
           ",".join(map(str, tokens)), "--threads", str(threads), "--logits", str(out),
           "--position", str(getattr(opts, "position", 0))]
    if breakdown:
        cmd.append("--breakdown-child")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        why = f"signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
        if p.returncode in (-4, 132):
            why += " (illegal instruction: the build uses an instruction this CPU lacks)"
        tail = (p.stderr.strip().splitlines() or [""])[-1][:200]
        return {"engine": engine, "error": f"{why} {tail}".strip()}
    return json.loads(p.stdout.strip().splitlines()[-1])


def summarize(results: dict[str, list[dict]]) -> dict[str, dict]:
    out = {}
    for name, runs in results.items():
        if name == STREAM:
            continue
        ok = [r for r in runs if "error" not in r]
        if not ok:
            out[name] = {"error": runs[0]["error"]}
            continue
        meds = [statistics.median(r["times"]) * 1e3 for r in ok]
        out[name] = {
            "ms": statistics.median(meds), "round_min": min(meds), "round_max": max(meds),
            "per_round": [None if "error" in r else statistics.median(r["times"]) * 1e3
                          for r in runs],
            "rounds": len(ok), "steps": len(ok[0]["times"]),
            "load_s": statistics.median(r["load_s"] for r in ok),
            "rss_load": statistics.median(r["rss_load"] for r in ok),
            "rss_end": statistics.median(r["rss_end"] for r in ok),
            "loadavg": max(max(r["loadavg"]) for r in ok),
            "others_cpu": statistics.median(r["others_cpu"] for r in ok),
            "others_cpu_max": max(r["others_cpu"] for r in ok),
            "threads": sorted({t for r in ok for t in r.get("threads_used", []) if t}),
            "omp_wait": sorted({r.get("omp_wait", "?") for r in ok}),
        }
    return out


def print_table(summary: dict[str, dict]) -> None:
    print(f"\n{'engine':<22} {'ms/token':>9} {'rounds range':>15} {'load s':>7} "
          f"{'RSS load':>9} {'RSS end':>8} {'load avg':>9} {'others CPU':>11}  threads")
    for name, s in summary.items():
        if "error" in s:
            print(f"{name:<22} failed: {s['error']}")
            continue
        print(f"{name:<22} {s['ms']:>9.2f} {s['round_min']:>7.2f}-{s['round_max']:<7.2f} "
              f"{s['load_s']:>7.2f} {s['rss_load'] / 2**20:>8.0f}M {s['rss_end'] / 2**20:>7.0f}M "
              f"{s['loadavg']:>9.2f} {s['others_cpu']:>5.2f}/{s['others_cpu_max']:<5.2f}"
              + (f"  {'/'.join(map(str, s['threads']))} (OpenMP wait "
                 f"{'/'.join(s['omp_wait'])})" if s["threads"] else ""))
    print("(ms/token: median over rounds of each round's median; RSS: VmRSS of the engine's "
          "process after load and after decoding; load avg: the highest 1-min load average seen; "
          "others CPU: cores used by other processes during the timed steps, median/max; "
          "threads: what firscope's kernels ran on, as model/threads.adapt chose per step)")


def summarize_floor(runs: list[dict]) -> dict | None:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return None
    floors = [r["floor_s"] * 1e3 for r in ok]
    return {"ms": statistics.median(floors), "min": min(floors), "max": max(floors),
            "per_round": [None if "error" in r else r["floor_s"] * 1e3 for r in runs],
            "bytes": ok[0]["bytes"], "ms_f32": statistics.median(r["floor_f32_s"] * 1e3 for r in ok),
            "bytes_f32": ok[0]["bytes_f32"], "threads": ok[0]["threads"], "rounds": len(ok),
            "llc": ok[0]["llc"], "loadavg": max(max(r["loadavg"]) for r in ok),
            "others_cpu": statistics.median(r["others_cpu"] for r in ok),
            "kv_position": ok[0].get("kv_position")}


def print_floor(floor: dict | None, cfg: dict) -> None:
    if floor is None:
        print("\nbandwidth floor: not measured (the stream process failed)")
        return
    pos = floor.get("kv_position")
    reads = token_reads(cfg, position=pos)
    head = sum(n for k, n in reads if k == "head")
    kv = sum(n for k, n in reads if k == "attention")
    gbs = floor["bytes"] / floor["ms"] / 1e6
    kv_text = f" + K/V rows at position {pos} {kv / 1e6:.1f} MB" if pos is not None else ""
    print(f"\nbandwidth floor of a token, the seed's layout: {floor['bytes'] / 1e6:.1f} MB "
          f"(q4 linears {(floor['bytes'] - head - kv) / 1e6:.1f} MB + f32 head "
          f"{head / 1e6:.1f} MB{kv_text}) "
          f"streamed at {gbs:.2f} GB/s = {floor['ms']:.2f} ms/token (rounds "
          f"{floor['min']:.2f}-{floor['max']:.2f}); --fir-f32's layout "
          f"{floor['bytes_f32'] / 1e6:.1f} MB = {floor['ms_f32']:.2f} ms/token")
    print(f"(a streaming read on {floor['threads']} threads of a buffer larger than the "
          f"{floor['llc'] >> 20} MB last-level cache, each linear's bytes read once in decode "
          f"order, the best of 7 passes per read, in a process of its own in every round; load "
          f"avg up to {floor['loadavg']:.2f}, others CPU {floor['others_cpu']:.2f})")


def _paired(s: dict, floor: dict, name: str = "") -> str:
    """The engine's time over the floor (or a peer's time) measured in the same round (its
    processes ran minutes apart at most), as the median over rounds and their range: a
    machine whose bandwidth drifts moves both medians apart, not a round's pair."""
    if name == "firscope-f32" or "per_round" not in s or "per_round" not in floor:  # f32:
        # its own layout's floor, not measured round by round
        return ""
    rs = [a / b for a, b in zip(s["per_round"], floor["per_round"]) if a and b]
    if len(rs) < 2:
        return ""
    return (f" (paired by round: median {statistics.median(rs):.2f}, "
            f"rounds {min(rs):.2f}-{max(rs):.2f})")


def print_ratios(summary: dict[str, dict], floor: dict | None = None) -> None:
    peers = [p for p in ("transformers", "numpy", *LLAMA, "firscope-f32")
             if "ms" in summary.get(p, {})]
    print("\nratios of ms/token (lower is faster for the row):")
    for name, s in summary.items():
        if "ms" not in s or not name.startswith("firscope"):
            continue
        cells = [f"/ {p} {s['ms'] / summary[p]['ms']:.2f}{_paired(s, summary[p])}"
                 for p in peers if p != name]
        if floor is not None:
            ms = floor["ms_f32"] if name == "firscope-f32" else floor["ms"]
            cells.insert(0, f"/ floor {s['ms'] / ms:.2f}{_paired(s, floor, name)}")
        print(f"  {name:<22} " + "   ".join(cells))
    if floor is not None:
        for name, s in summary.items():
            if "ms" in s and not name.startswith("firscope"):
                print(f"  {name:<22} / floor {s['ms'] / floor['ms']:.2f} (the seed's layout's)")
        print("  (floor: the bandwidth floor above, of the seed's layout; firscope-f32's of "
              "--fir-f32's layout. The goal: firscope-q4 <= 1.25x its floor)")
    for p in LLAMA:
        if p in summary and "error" in summary[p]:
            print(f"  {p}: no ratio, the engine failed ({summary[p]['error'][:80]})")


def compare_logits(files: dict[str, Path], position: int = 0) -> None:
    got = {k: np.load(p) for k, p in files.items() if p.exists()
           and not (position and k in LLAMA)}  # llama.cpp: another context (real prefill)
    if not got:
        return
    print("\nagreement of the last step's logits (max |difference|, logits up to "
          f"{max(np.abs(v).max() for v in got.values()):.2f}):")
    pairs = [("firscope-f32", "transformers"), ("firscope-f32", "numpy"),
             ("firscope-q4", "firscope-q4-dequant"), ("firscope-q4", "firscope-q4-blashead"),
             ("firscope-q4", "firscope-f32"), ("llama-Q4_1", "firscope-q4"),
             ("llama-Q4_0", "firscope-q4")]
    for a, b in pairs:
        if a in got and b in got:
            print(f"  {a} vs {b}: {np.abs(got[a] - got[b]).max():.2e} "
                  f"(same argmax: {int(got[a].argmax()) == int(got[b].argmax())})")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds of 16 steps")
    ap.add_argument("--steps", type=int, default=None, help="decode steps per process (32)")
    ap.add_argument("--rounds", type=int, default=None, help="fresh processes per engine (5)")
    ap.add_argument("--threads", type=int, default=2, help="threads per engine, at most")
    ap.add_argument("--firscope-threads", choices=("adaptive", "fixed"), default="adaptive",
                    help="firscope: its default (one thread while other processes keep the "
                         "machine busy) or always --threads (FIRSCOPE_THREADS)")
    ap.add_argument("--omp-wait", choices=("auto", "active", "passive"), default="auto",
                    help="firscope: OpenMP's wait policy (auto: firscope chooses by load)")
    ap.add_argument("--llama-lib", help="folder of a libllama.so built for this CPU "
                    "(LLAMA_CPP_LIB_PATH; the shared wheel's needs AMX)")
    ap.add_argument("--engines", default=",".join(DEFAULT_ENGINES))
    ap.add_argument("--breakdown", action="store_true", help="firscope time per node kind")
    ap.add_argument("--position", type=int, default=0,
                    help="decode from this position: every engine's K/V cache first holds "
                         "the same seeded random rows 0..N-1 (a cheap prefill; llama.cpp "
                         "gets a real prefill of N tokens, untimed)")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "firscope-bench"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--breakdown-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", help=argparse.SUPPRESS)
    ap.add_argument("--logits", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main() -> int:
    args = parse_args()
    if args.child == STREAM:
        return stream_child(args)
    if args.child:
        return breakdown_child(args) if args.breakdown_child else child(args)
    steps = args.steps or (16 if args.quick else 32)
    rounds = args.rounds or (3 if args.quick else 5)
    folder = Path(args.cache) / "gpt2-small-random"
    make_checkpoint(folder)
    engines = [e for e in args.engines.split(",") if e]
    if args.position:
        if args.position + steps > SMALL["n_positions"]:
            raise SystemExit(f"--position {args.position} and {steps} steps pass GPT-2's "
                             f"{SMALL['n_positions']} positions")
    if any(e in LLAMA for e in engines):
        import llama_peer
        why = llama_peer.available()
        if why:
            print(why)
            engines = [e for e in engines if e not in LLAMA]
        else:
            llama_peer.prepare(folder)
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, SMALL["vocab_size"], steps)]
    first = args.position
    print(f"GPT-2 small shapes (random weights), {steps} decode steps (positions {first}.."
          f"{first + steps - 1}{', K/V rows before them seeded random' if first else ''}) "
          f"per process, {rounds} rounds of fresh processes, at most {args.threads} threads per "
          f"engine (firscope: {args.firscope_threads}, OpenMP wait {args.omp_wait}), "
          f"{os.cpu_count()} cpus, OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; load average at start "
          f"{os.getloadavg()[0]:.2f}")
    tmp = Path(tempfile.mkdtemp(prefix="firscope-bench-"))
    results: dict[str, list[dict]] = {e: [] for e in engines}
    logits = {e: tmp / f"{e}.npy" for e in engines}
    results[STREAM] = []
    every = [*engines, STREAM]
    for r in range(rounds):
        order = every[r % len(every):] + every[:r % len(every)]
        for e in order:
            results[e].append(run_child(e, folder, tokens, args.threads,
                                        logits.get(e, tmp / "stream.npy"), args))
        print(f"round {r + 1}/{rounds} done, load average {os.getloadavg()[0]:.2f}", flush=True)
    summary = summarize(results)
    floor = summarize_floor(results[STREAM])
    print_table(summary)
    print_floor(floor, json.loads((folder / "config.json").read_text()))
    print_ratios(summary, floor)
    compare_logits(logits, args.position)
    if args.breakdown:
        b = run_child("firscope-q4", folder, tokens, args.threads, tmp / "b.npy", args,
                      breakdown=True)
        if "error" in b:
            print(f"\nbreakdown failed: {b['error']}")
        else:
            print_breakdown(b)
            print_decode_bound(b, summary.get("firscope-q4", {}).get("ms"))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
