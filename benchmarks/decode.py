"""Decode speed of firscope against HF transformers and a plain NumPy GPT-2.

    python benchmarks/decode.py [--quick] [--steps N]

Makes (once) a randomly initialised GPT-2 with GPT-2 small's shapes with HF
transformers in ~/.cache/firscope-bench (outside the repo), copies the
sample's gpt2.fir beside it, then in one run measures the time per decoded
token (median over the steps, one token per step with a KV cache, positions
0..N-1) of:

* firscope, compiled micro-kernels, Q4 linears (the default load)
* firscope, compiled micro-kernels, --fir-f32
* HF transformers GPT2LMHeadModel with its KV cache
* a plain NumPy GPT-2 with a KV cache (picoGPT-style, below)

and prints the ratios firscope / transformers and firscope / NumPy, the load
time (parse, weights + quantize, plan) and peak RSS of a firscope load
measured in a fresh subprocess (so the figure is firscope's own), and the step
interpreter's lane-instructions per second on g2.attn_decode at position 64.
Speed is a ratio against peers measured in the same run (DESIGN.md).
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SEED_FIR = REPO / "sample_models" / "tiny-gpt2" / "gpt2.fir"
SMALL = dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)


def numpy_blas_threads() -> int:
    """Threads numpy's OpenBLAS uses (what torch is matched to)."""
    import numpy
    libs = glob.glob(str(Path(numpy.__file__).parent.parent / "numpy.libs" / "*openblas*"))
    for lib in libs:
        try:
            h = ctypes.CDLL(lib)
        except OSError:
            continue
        for sym in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                    "openblas_get_num_threads"):
            fn = getattr(h, sym, None)
            if fn is not None:
                return int(fn())
    return os.cpu_count() or 1


def make_checkpoint(folder: Path) -> Path:
    fir = folder / "gpt2.fir"
    if not (folder / "model.safetensors").exists():
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        folder.mkdir(parents=True, exist_ok=True)
        cfg = GPT2Config(**SMALL)
        GPT2LMHeadModel(cfg).save_pretrained(folder, safe_serialization=True)
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


# --- the engines: each factory returns step(token) -> logits, warmed up, at position 0 ---
def firscope_engine(fir: Path, fir_f32: bool):
    from firscope.runtime import load_model
    from firscope.runtime import Machine
    model = load_model(fir, fir_f32=fir_f32)
    machine = Machine(model, engine="compiled")
    t = time.perf_counter()
    machine.kernel_runner.warmup()
    warm = time.perf_counter() - t
    machine.step(0)  # first call pays one-off costs (BLAS buffers)
    machine.reset()
    return (lambda tok: machine.step(tok).logits), machine, warm


def transformers_engine(folder: Path, threads: int):
    import torch
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.set_num_threads(threads)
    model = GPT2LMHeadModel.from_pretrained(folder, torch_dtype=torch.float32).eval()
    past = None

    def step(tok):
        nonlocal past
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        return out.logits[0, -1].numpy()

    step(0)
    past = None
    return step


def numpy_engine(folder: Path, cfg: dict):
    m = NumpyGPT2(folder / "model.safetensors", cfg)
    m.step(0)
    m.pos = 0
    return m.step


def load_in_subprocess(fir: Path, fir_f32: bool) -> dict:
    code = f"""
import json, resource, sys, time
sys.path.insert(0, {str(REPO)!r})
from firscope.runtime import load_model
t = time.perf_counter()
m = load_model({str(fir)!r}, fir_f32={fir_f32!r})
total = time.perf_counter() - t
load_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
from firscope.runtime import Machine
mach = Machine(m, engine="compiled")
mach.kernel_runner.warmup()
for tok in range(8):
    mach.step(tok)
print(json.dumps(dict(m.timings, wall=total, load_rss=load_rss,
      rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def node_breakdown(machine, tokens) -> dict[str, float]:
    """ms per token by node target (ext op or kernel), on the machine's next positions."""
    from collections import defaultdict
    acc: dict[str, float] = defaultdict(float)
    hook = lambda m, node, dt: acc.__setitem__(node.target, acc[node.target] + dt)  # noqa: E731
    machine.hooks.after_node.append(hook)
    for tok in tokens:
        machine.step(tok)
    machine.hooks.after_node.remove(hook)
    return {k: v / len(tokens) * 1e3 for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}


def interp_rate(machine, position: int) -> tuple[float, int]:
    """Lane-instructions per second of the step interpreter on attention at ``position``."""
    from firscope.vm.interp import Dispatch
    m = machine.model
    node = next(n for n in m.nodes if n.target == "g2.attn_decode")
    m.arena[m.inputs["position"].base] = position
    best = 0.0
    for _ in range(3):
        d = Dispatch(node.program, m.arena)
        t = time.perf_counter()
        d.run()
        best = max(best, d.lane_steps / (time.perf_counter() - t))
    return best, d.lane_steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 decode steps instead of 64")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "firscope-bench"))
    args = ap.parse_args()
    steps = args.steps or (16 if args.quick else 64)
    folder = Path(args.cache) / "gpt2-small-random"
    fir = make_checkpoint(folder)
    cfg = json.loads((folder / "config.json").read_text())
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(0, SMALL["vocab_size"], steps)]
    threads = numpy_blas_threads()
    print(f"GPT-2 small shapes (random weights), {steps} decode steps, positions 0..{steps - 1}; "
          f"numpy BLAS threads {threads}, torch.set_num_threads({threads}), "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}, "
          f"{os.cpu_count()} cpus")

    loads = {k: load_in_subprocess(fir, k == "f32") for k in ("q4", "f32")}
    import warnings
    warnings.filterwarnings("ignore")
    step_q4, machine, warm = firscope_engine(fir, fir_f32=False)
    step_f32, _, _ = firscope_engine(fir, fir_f32=True)
    engines = {"firscope compiled q4": step_q4, "firscope compiled f32": step_f32,
               "transformers": transformers_engine(folder, threads),
               "numpy gpt2": numpy_engine(folder, cfg)}
    # Round-robin, one token each per round, rotating who goes first: on a shared
    # machine the load changes by the second, and this way every engine sees it alike.
    res = {k: [] for k in engines}
    last = {}
    names = list(engines)
    for i, tok in enumerate(tokens):
        for k in names[i % len(names):] + names[:i % len(names)]:
            t = time.perf_counter()
            last[k] = np.asarray(engines[k](tok))
            res[k].append(time.perf_counter() - t)
    logits_q4, logits_f32 = last["firscope compiled q4"], last["firscope compiled f32"]
    logits_hf, logits_np = last["transformers"], last["numpy gpt2"]
    breakdown = node_breakdown(machine, tokens[:8])
    rate, lane_steps = interp_rate(machine, 64)

    med = {k: statistics.median(v) * 1e3 for k, v in res.items()}
    print(f"\n{'engine':<24} {'median ms/token':>16} {'min':>8} {'max':>8}")
    for k, v in res.items():
        print(f"{k:<24} {med[k]:>16.2f} {min(v) * 1e3:>8.2f} {max(v) * 1e3:>8.2f}")
    print("\nratios (median time per token, lower is faster for firscope):")
    for k in ("firscope compiled q4", "firscope compiled f32"):
        print(f"  {k} / transformers = {med[k] / med['transformers']:.2f}   "
              f"{k} / numpy gpt2 = {med[k] / med['numpy gpt2']:.2f}")
    print("\nagreement of the last step's logits (max abs difference):")
    print(f"  firscope f32 vs transformers {np.abs(logits_f32 - logits_hf).max():.2e}, "
          f"vs numpy {np.abs(logits_f32 - logits_np).max():.2e}; "
          f"firscope q4 vs f32 {np.abs(logits_q4 - logits_f32).max():.2e}")
    print(f"\nfirscope compiled q4, time per token by node kind (positions {len(tokens)}.."
          f"{len(tokens) + 7}, timed by a node hook):")
    print("  " + ", ".join(f"{k} {v:.2f} ms" for k, v in breakdown.items()))
    for k, t in loads.items():
        print(f"\nfirscope load ({k}, fresh process): parse {t['parse']:.2f} s, weights"
              f"{' + quantize' if k == 'q4' else ''} {t['weights']:.2f} s, plan {t['plan']:.2f} s, "
              f"total {t['wall']:.2f} s; peak RSS after load {t['load_rss'] / 2**20:.0f} MiB, "
              f"after 8 compiled decode steps {t['rss'] / 2**20:.0f} MiB")
    print(f"kernel warmup (compile or load from numba's cache): {warm:.2f} s")
    print(f"\nstep interpreter on g2.attn_decode at position 64: {rate / 1e6:.2f} M "
          f"lane-instructions/s ({lane_steps} lane-instructions per dispatch)")
    print(f"benchmark process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} "
          "MiB (all engines together)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
