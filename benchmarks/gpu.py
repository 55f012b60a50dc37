"""The GPU engine on whatever adapter wgpu finds: time per token, per-kernel GPU time.

    python benchmarks/gpu.py [--models sample,gpt2] [--steps N] [--rounds R] [--fir-f32]

For each model (the bundled sample; GPT-2 small shapes with random weights, written once
under ~/.cache/firscope-bench/gpt2-small-random by benchmarks/decode.py's helper), each
engine runs in its own fresh process, rounds rotated:

* ``gpu``: decode steps with ``--engine gpu`` (one submission per token, logits read
  back), then the same steps with every dispatch timed (timestamp queries when the
  adapter offers them, else queue completion per dispatch: the table says which);
* ``compiled``: the CPU reference's compiled engine, the peer the ratio is taken against.

It prints the adapter (name, backend, driver), ms/token of both engines (median of round
medians) and their ratio, the GPU time per kernel, the speed-of-light prediction beside
it where firscope has one, and the load average of each measurement. Nothing here assumes
an adapter: on a software one (lavapipe, llvmpipe, SwiftShader, WARP) the script says that
its GPU figures mean little; a model whose buffers exceed the adapter's limits is skipped
with the engine's own message.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
SAMPLE = REPO / "sample_models" / "tiny-gpt2" / "gpt2.fir"
CACHE = Path.home() / ".cache" / "firscope-bench"
PROMPT = [464, 2068, 7586, 21831, 18045, 625, 262, 16931]


def model_path(name: str) -> Path:
    if name == "sample":
        return SAMPLE
    if name == "gpt2":
        from decode import make_checkpoint
        return make_checkpoint(CACHE / "gpt2-small-random")
    raise SystemExit(f"unknown model {name!r} (sample, gpt2)")


def child(args) -> int:
    """One engine on one model, in this fresh process: JSON on stdout."""
    import numpy as np

    from firscope.errors import FirError
    from firscope.runtime import Machine, load_model
    model = load_model(args.model, fir_f32=args.fir_f32)
    vocab = model.vocab
    tokens = [t % vocab for t in PROMPT]
    steps = min(args.steps, (model.n_positions or 1 << 30))
    feed = [tokens[i % len(tokens)] for i in range(steps)]
    out: dict = {"engine": args.child}
    try:
        if args.child == "gpu":
            from firscope.gpu import GpuMachine
            machine = GpuMachine(model)
            g = machine.runner.gpu
            out["adapter"] = {"name": g.name, "backend": g.backend, "software": g.is_software,
                              "driver": g.info.get("description", ""),
                              "timing": "timestamp queries" if g.timestamps
                              else "queue completion per dispatch"}
        else:
            machine = Machine(model, engine="compiled")
            machine.kernel_runner.warmup()
    except FirError as e:
        out["error"] = str(e)
        print(json.dumps(out))
        return 0
    machine.reset()
    machine.step(feed[0])  # warm-up: pipelines, caches
    times = []
    for t in feed[1:]:
        t0 = time.perf_counter()
        machine.step(t)
        times.append(time.perf_counter() - t0)
    out["ms_per_token"] = 1e3 * statistics.median(times)
    if args.child == "gpu":
        per_kernel: dict = {}
        machine.reset()
        for t in feed[: max(2, min(8, steps))]:
            machine.begin_token(t)
            for node, s in zip(model.nodes, machine.runner.timed(range(len(model.nodes)))):
                per_kernel[node.target] = per_kernel.get(node.target, 0.0) + s
            machine.finish_token()
        n = max(2, min(8, steps))
        out["kernel_ms_per_token"] = {k: 1e3 * v / n for k, v in per_kernel.items()}
        out["gpu_ms_per_token"] = sum(out["kernel_ms_per_token"].values())
    out["load"] = os.getloadavg()[0]
    out["checksum"] = float(np.abs(machine.model.view(model.outputs["logits"])).sum())
    print(json.dumps(out))
    return 0


def run_child(engine: str, model: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--child", engine, "--model", str(model),
           "--steps", str(args.steps)] + (["--fir-f32"] if args.fir_f32 else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        return {"engine": engine, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def speed_of_light(model_name: str) -> str:
    try:
        import firscope.cost  # noqa: F401 - a later firscope may have it
    except ImportError:
        return "none: this firscope has no device profiles (cost/) to predict from"
    return "see `firscope profile` (cost/ exists, this script does not read it yet)"


def report(name: str, results: dict[str, list[dict]]) -> None:
    gpu = [r for r in results["gpu"] if "error" not in r]
    cpu = [r for r in results["compiled"] if "error" not in r]
    print(f"\n== {name}")
    for r in results["gpu"][:1] + results["compiled"][:1]:
        if "error" in r:
            print(f"  {r['engine']}: skipped: {r['error']}")
    if gpu:
        a = gpu[0]["adapter"]
        print(f"  adapter: {a['name']} ({a['backend']}; {a['driver']}); timing: {a['timing']}")
        if a["software"]:
            print("  note: a software adapter (the CPU): its GPU figures mean little")
    med = {e: statistics.median(r["ms_per_token"] for r in rs) for e, rs in
           (("gpu", gpu), ("compiled", cpu)) if rs}
    loads = [round(r["load"], 2) for r in gpu + cpu]
    for e, v in med.items():
        print(f"  {e:9} {v:9.3f} ms/token (median of {len(results[e])} rounds)")
    if len(med) == 2:
        print(f"  gpu / compiled: {med['gpu'] / med['compiled']:.2f}x   load averages {loads}")
    if gpu:
        k = gpu[0]["kernel_ms_per_token"]
        print(f"  GPU time per token {gpu[0]['gpu_ms_per_token']:.3f} ms; speed of light: "
              f"{speed_of_light(name)}")
        for kernel, ms in sorted(k.items(), key=lambda kv: -kv[1]):
            print(f"    {kernel:24} {ms:9.4f} ms/token")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="sample,gpt2")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fir-f32", action="store_true")
    ap.add_argument("--child", choices=("gpu", "compiled"))
    ap.add_argument("--model")
    args = ap.parse_args()
    if args.child:
        return child(args)
    print(f"load average at start: {os.getloadavg()}")
    for name in args.models.split(","):
        path = model_path(name)
        results: dict[str, list[dict]] = {"gpu": [], "compiled": []}
        for i in range(args.rounds):
            order = ("gpu", "compiled") if i % 2 == 0 else ("compiled", "gpu")
            for engine in order:
                results[engine].append(run_child(engine, path, args))
        report(name, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
