"""The GPU engine on whatever adapter wgpu finds: time per token, per-kernel GPU time.

    python benchmarks/gpu.py [--models sample,gpt2] [--steps N] [--rounds R] [--fir-f32]
                             [--device NAME] [--at POSITION]

For each model (the bundled sample; GPT-2 small shapes with random weights, written once
under ~/.cache/firscope-bench/gpt2-small-random by benchmarks/decode.py's helper), each
engine runs in its own fresh process, rounds rotated:

* ``gpu``: decode steps with ``--engine gpu`` (one submission per token, logits read
  back); then, fed up to position ``--at`` (default 7, or the last step), that step run
  5 more times with every dispatch timed (timestamp queries when the adapter offers
  them, else queue completion per dispatch: the output says which), each dispatch's
  median kept (firscope/gpu/sol.py, as ``profile --engine gpu`` does);
* ``compiled``: the CPU reference's compiled engine, the peer the ratio is taken against.

The first GPU round also predicts that same step with firscope/cost's speed-of-light
model, for ``--device NAME`` (default: the adapter's own profile when devices.toml has
one by its name, as on an H200; else the devices.toml default, else h200).

It prints the adapter (name, backend, driver), ms/token of both engines (median of round
medians) and their ratio, and per kernel the GPU time (median over rounds), the predicted
time, the bound and measured/predicted, with the load average of each measurement.
Nothing here assumes an adapter: the caveats printed come from what the adapter says it
is (a software one, lavapipe or llvmpipe or SwiftShader or WARP: its figures mean
little; a different chip from the one predicted: the ratio compares two chips); a model
whose buffers exceed the adapter's limits is skipped with the engine's own message.
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
AT = 7  # the position whose step is timed per dispatch and predicted


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
        out.update(per_dispatch(model, machine, feed[: min(args.at, steps - 1) + 1], args))
    out["load"] = os.getloadavg()[0]
    out["checksum"] = float(np.abs(machine.model.view(model.outputs["logits"])).sum())
    print(json.dumps(out))
    return 0


def per_dispatch(model, machine, fed: list[int], args) -> dict:
    """The step at the last position of ``fed`` timed per dispatch (median of re-runs);
    with ``--predict``, beside firscope/cost's prediction of the same step."""
    from firscope.gpu.sol import beside, choose_device, predict_step, retime_last_step
    machine.reset()
    for t in fed:
        machine.step(t)
    seconds = retime_last_step(machine)
    kernel_us: dict = {}
    for node, s in zip(model.nodes, seconds):
        kernel_us[node.target] = kernel_us.get(node.target, 0.0) + 1e6 * s
    out = {"kernel_us": kernel_us, "gpu_ms_per_token": 1e-3 * sum(kernel_us.values()),
           "position": len(fed) - 1}
    if args.predict:
        g = machine.runner.gpu
        device, chosen_by = choose_device(args.device, g.name)
        t0 = time.perf_counter()
        report = predict_step(model, device, fed)
        out["speed_of_light"] = beside(seconds, report, g, device, chosen_by)
        out["analysis_s"] = time.perf_counter() - t0
    return out


def run_child(engine: str, model: Path, args, *, predict: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", engine, "--model", str(model),
           "--steps", str(args.steps), "--at", str(args.at)] + \
        (["--fir-f32"] if args.fir_f32 else []) + \
        (["--predict"] + (["--device", args.device] if args.device else []) if predict else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        return {"engine": engine, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


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
        kernels(gpu)


def kernels(gpu: list[dict]) -> None:
    """Per kernel: GPU time (median over rounds) beside the first round's prediction."""
    from firscope.cost.render import text_table
    from firscope.gpu.sol import caveats
    names = {k for r in gpu for k in r["kernel_us"]}
    measured = {k: statistics.median(r["kernel_us"].get(k, 0.0) for r in gpu) for k in names}
    sol = next((r["speed_of_light"] for r in gpu if "speed_of_light" in r), None)
    total = statistics.median(r["gpu_ms_per_token"] for r in gpu)
    print(f"  GPU time of the step at position {gpu[0]['position']}: {total:.3f} ms (sum of "
          f"its dispatches, each the median of re-runs; median over {len(gpu)} rounds)")
    predicted = {k["kernel"]: k for k in sol["kernels"]} if sol else {}
    if sol:
        print("\n".join(caveats(sol)))
        ratio = 1e3 * total / sol["predicted_us_per_token"]
        print(f"  predicted {sol['predicted_us_per_token']:.1f} us for that step, measured/"
              f"predicted {ratio:.2f} (analysis {gpu[0].get('analysis_s', 0):.1f} s on the CPU)")
        if sol.get("within_2x_share") is not None:
            print(f"  the prediction is within 2x for {sol['within_2x_share']:.0%} of the "
                  f"step's measured time (first round; {sol['within_2x_nodes']} of "
                  f"{len(sol['nodes'])} node instances)")
    rows = []
    for k, us in sorted(measured.items(), key=lambda kv: -kv[1]):
        p = predicted.get(k)
        rows.append([k, f"{us:.2f}", f"{p['predicted_us']:.2f}" if p else "-",
                     p["bound"] if p else "-",
                     f"{us / p['predicted_us']:.2f}" if p and p["predicted_us"] else "-"])
    print("\n".join("    " + line for line in text_table(
        ["kernel / op", "GPU us", "predicted us", "bound", "measured/predicted"], rows)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="sample,gpt2")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fir-f32", action="store_true")
    ap.add_argument("--device", metavar="NAME",
                    help="device profile to predict for (firscope cost --device list); "
                         "default: the adapter's own profile by name, else the devices.toml "
                         "default, else h200")
    ap.add_argument("--at", type=int, default=AT, metavar="POSITION",
                    help=f"the position whose step is timed per dispatch and predicted "
                         f"(default {AT}, or the last step)")
    ap.add_argument("--child", choices=("gpu", "compiled"))
    ap.add_argument("--predict", action="store_true")
    ap.add_argument("--model")
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.steps < 2 or args.at < 0:
        ap.error("--steps must be at least 2 and --at 0 or more")
    if args.device:  # a typo fails now, not after the runs
        from firscope.cost import find_device
        from firscope.errors import FirError
        try:
            find_device(args.device)
        except FirError as e:
            ap.error(str(e))
    print(f"load average at start: {os.getloadavg()}")
    for name in args.models.split(","):
        try:
            path = model_path(name)
        except ImportError as e:
            print(f"\n== {name}\n  skipped: writing its random checkpoint needs {e.name} "
                  "(torch and transformers)")
            continue
        results: dict[str, list[dict]] = {"gpu": [], "compiled": []}
        for i in range(args.rounds):
            order = ("gpu", "compiled") if i % 2 == 0 else ("compiled", "gpu")
            for engine in order:
                results[engine].append(run_child(engine, path, args,
                                                 predict=engine == "gpu" and i == 0))
        report(name, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
