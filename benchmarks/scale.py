"""firscope on GPT-2 medium, large and XL shapes (random weights): load, decode, debug.

    python benchmarks/scale.py [--models medium,large,xl] [--steps N] [--keep]

Writes (once) a random-weight checkpoint of each shape in HF's safetensors
layout under ~/.cache/firscope-bench/gpt2-NAME-random (outside the repo;
medium 1.4 GB, large 3.1 GB, XL 6.2 GB of f32; the script checks the free
disk first and says what it skipped), with the sample's gpt2.fir beside it.
Each model then runs in a fresh process that prints:

* load time (parse, read + quantize, plan) and resident memory after load
  (VmRSS, and the peak so far),
* ms/token: median of N compiled decode steps after one warm-up step,
* the debugger: a ``Session`` stepping one whole token (``next_token``) with
  an unbounded history, its time and the undo log it kept (``Session.history.nbytes``,
  what reverse stepping over that token costs in memory),

and the load average and other processes' CPU while it ran (the machine may
be shared: then the figures are noisy, and the table says so).
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
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from decode import (SEED_FIR, cpu_snapshot, load_firscope, others_cpu, rss_bytes,  # noqa: E402
                    token_reads)

SHAPES = {  # GPT-2's published shapes; vocab 50257, 1024 positions
    "small": dict(n_layer=12, n_embd=768, n_head=12),
    "medium": dict(n_layer=24, n_embd=1024, n_head=16),
    "large": dict(n_layer=36, n_embd=1280, n_head=20),
    "xl": dict(n_layer=48, n_embd=1600, n_head=25),
}
VOCAB, POSITIONS = 50257, 1024


def tensor_shapes(n_layer: int, n_embd: int) -> list[tuple[str, tuple[int, ...]]]:
    E = n_embd
    out = [("wte.weight", (VOCAB, E)), ("wpe.weight", (POSITIONS, E))]
    for i in range(n_layer):
        p = f"h.{i}."
        out += [(p + "ln_1.weight", (E,)), (p + "ln_1.bias", (E,)),
                (p + "attn.c_attn.weight", (E, 3 * E)), (p + "attn.c_attn.bias", (3 * E,)),
                (p + "attn.c_proj.weight", (E, E)), (p + "attn.c_proj.bias", (E,)),
                (p + "ln_2.weight", (E,)), (p + "ln_2.bias", (E,)),
                (p + "mlp.c_fc.weight", (E, 4 * E)), (p + "mlp.c_fc.bias", (4 * E,)),
                (p + "mlp.c_proj.weight", (4 * E, E)), (p + "mlp.c_proj.bias", (E,))]
    return out + [("ln_f.weight", (E,)), ("ln_f.bias", (E,))]


def checkpoint_bytes(shape: dict) -> int:
    return sum(4 * int(np.prod(s)) for _, s in tensor_shapes(shape["n_layer"], shape["n_embd"]))


def write_checkpoint(folder: Path, shape: dict, seed: int = 0) -> None:
    """Stream a random GPT-2 to model.safetensors one tensor at a time (no full copy in memory)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = tensor_shapes(shape["n_layer"], shape["n_embd"])
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, s in names:
        n = 4 * int(np.prod(s))
        header["transformer." + name] = {"dtype": "F32", "shape": list(s),
                                         "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = folder / "model.safetensors.part"
    with open(tmp, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for name, s in names:
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                t = np.ones(s, dtype=np.float32)
            elif name.endswith("bias"):
                t = np.zeros(s, dtype=np.float32)
            else:  # HF's GPT-2 init: N(0, 0.02)
                t = rng.standard_normal(s, dtype=np.float32) * np.float32(0.02)
            f.write(t.tobytes())
    tmp.rename(folder / "model.safetensors")
    config = dict(model_type="gpt2", n_layer=shape["n_layer"], n_embd=shape["n_embd"],
                  n_head=shape["n_head"], n_positions=POSITIONS, n_ctx=POSITIONS,
                  vocab_size=VOCAB, layer_norm_epsilon=1e-5, activation_function="gelu_new",
                  scale_attn_weights=True, tie_word_embeddings=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


class RssSampler:
    """Peak anonymous and file-backed resident memory, sampled every 20 ms in a thread:
    the peak of a load is either copies (anon) or checkpoint pages still mapped (file)."""

    def __init__(self):
        import threading
        self.peak = {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(0.02):
            with open("/proc/self/status") as f:
                for line in f:
                    key = line.split(":")[0]
                    if key in self.peak:
                        self.peak[key] = max(self.peak[key], int(line.split()[1]) * 1024)

    def stop(self) -> dict:
        self._stop.set()
        self._t.join()
        return dict(self.peak)


def child(folder: Path, steps: int) -> dict:
    """Load, decode and step one token in the debugger; everything in this process."""
    from firscope.debug.session import Session
    from firscope.runtime import Machine
    load1 = os.getloadavg()[0]
    a = cpu_snapshot()
    sampler = RssSampler()
    t = time.perf_counter()
    model = load_firscope(folder / "gpt2.fir", dict(fir_f32=False, q4_path="packed"))
    load_s = time.perf_counter() - t
    rss_load, peak_load = rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak_split = sampler.stop()
    machine = Machine(model, engine="compiled")
    machine.kernel_runner.warmup()
    rng = np.random.default_rng(0)
    tokens = [int(x) for x in rng.integers(0, VOCAB, steps + 1)]
    machine.step(tokens[0])
    machine.reset()
    times = []
    for tok in tokens[1:]:
        t = time.perf_counter()
        machine.step(tok)
        times.append(time.perf_counter() - t)
    machine.reset()
    session = Session(model, tokens[:2], 1, engine="compiled", history_budget=1 << 50,
                      machine=machine)
    t = time.perf_counter()
    session.next_token()
    debug_s = time.perf_counter() - t
    b = cpu_snapshot()
    return {"load_s": load_s, "timings": model.timings, "rss_load": rss_load,
            "peak_load": peak_load, "peak_anon": peak_split["RssAnon"],
            "peak_file": peak_split["RssFile"], "ms": statistics.median(times) * 1e3,
            "ms_range": [min(times) * 1e3, max(times) * 1e3], "debug_token_s": debug_s,
            "history_bytes": session.history.nbytes,
            "history_records": len(session.history.records),
            "peak_end": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "loadavg": [load1, os.getloadavg()[0]], "others_cpu": others_cpu(a, b),
            "q4_bytes": sum(w.nbytes for w in model.weights.values() if w.q4 is not None)}


def prepare(name: str, cache: Path) -> Path | str:
    """The model's folder, or why it was skipped."""
    shape = dict(SHAPES[name])
    folder = cache / f"gpt2-{name}-random"
    if not (folder / "model.safetensors").exists():
        need = checkpoint_bytes(shape)
        cache.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(cache).free
        if free < need + (8 << 30):  # leave 8 GiB for everyone else
            return f"skipped: needs {need / 2**30:.1f} GiB of disk, {free / 2**30:.1f} GiB free"
        t = time.perf_counter()
        write_checkpoint(folder, shape)
        print(f"wrote {folder} ({need / 2**30:.2f} GiB) in {time.perf_counter() - t:.0f} s",
              flush=True)
    shutil.copy(SEED_FIR, folder / "gpt2.fir")
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="small,medium,large,xl")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "firscope-bench"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child), args.steps)))
        return 0
    unknown = [m for m in args.models.split(",") if m not in SHAPES]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)} (known: {', '.join(SHAPES)})")
    cache = Path(args.cache)
    print(f"{args.steps} compiled decode steps per model, {args.threads} threads, "
          f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f}")
    rows = {}
    for name in args.models.split(","):
        where = prepare(name, cache)
        if isinstance(where, str):
            rows[name] = {"error": where}
            continue
        env = dict(os.environ, NUMBA_NUM_THREADS=str(args.threads),
                   OPENBLAS_NUM_THREADS=str(args.threads))
        p = subprocess.run([sys.executable, __file__, "--child", str(where), "--steps",
                            str(args.steps)], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            rows[name] = {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
        else:
            rows[name] = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"{name} done, load average {os.getloadavg()[0]:.2f}", flush=True)
    print(f"\n{'model':<7} {'load s':>7} {'(read+q4)':>9} {'RSS load':>9} {'peak load':>9} "
          f"{'peak':>7} "
          f"{'q4 MiB':>7} {'ms/token':>9} {'debug token s':>13} {'undo log/token':>14} "
          f"{'load avg':>9} {'others CPU':>10}")
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:<7} {r['error']}")
            continue
        print(f"{name:<7} {r['load_s']:>7.2f} {r['timings'].get('weights', 0):>9.2f} "
              f"{r['rss_load'] / 2**20:>8.0f}M {r['peak_load'] / 2**20:>8.0f}M "
              f"{r['peak_end'] / 2**20:>6.0f}M "
              f"{r['q4_bytes'] / 2**20:>7.0f} {r['ms']:>9.1f} {r['debug_token_s']:>13.2f} "
              f"{r['history_bytes'] / 2**20:>12.1f}Mi {max(r['loadavg']):>9.2f} "
              f"{r['others_cpu']:>10.2f}")
    for name, r in rows.items():
        if "error" not in r:
            print(f"{name}: during load, peak anonymous RSS {r['peak_anon'] / 2**20:.0f} MiB, "
                  f"peak file-backed RSS (checkpoint pages mapped) {r['peak_file'] / 2**20:.0f} MiB")
    print("(RSS load: VmRSS right after load; peak load: peak RSS during load; peak: over the "
          "whole run (decode and the debugger's token included); "
          "undo log/token: Session.history.nbytes after next_token with an unbounded history)")
    print_scaling(rows)
    return 0


def token_bytes(name: str) -> int:
    """Bytes of weights one decode step of the seed's layout reads (q4 linears + f32 head)."""
    cfg = dict(SHAPES[name], vocab_size=VOCAB)
    return sum(b for _, b in token_reads(cfg))


def print_scaling(rows: dict) -> None:
    """Each model's time per token against small's, over its bytes per token against
    small's (issue 27's goal for XL: at most 1.1): decode should grow with what it reads."""
    small = rows.get("small")
    if not small or "error" in small:
        print("(no scaling ratios: small was not measured in this run; add it to --models)")
        return
    print("\nscaling against small, measured in this run (time ratio / bytes ratio; 1.0: "
          "time grows exactly with the bytes read per token):")
    b0 = token_bytes("small")
    for name, r in rows.items():
        if name == "small" or "error" in r:
            continue
        nbytes = token_bytes(name)
        br = nbytes / b0
        tr = r["ms"] / small["ms"]
        print(f"  {name:<7} {nbytes / 1e6:7.1f} MB/token = {br:5.2f}x small's; "
              f"{r['ms']:6.1f} ms/token = {tr:5.2f}x small's; ratio {tr / br:4.2f}")


if __name__ == "__main__":
    sys.exit(main())
