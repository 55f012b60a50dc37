"""g2.attn_decode per dispatch against its KV-read floor, on GPT-2 small's shapes.

    python benchmarks/attention.py [--positions 256,512,1000] [--steps 4] [--rounds 3]
                                   [--base DIR] [--threads 2] [--engine compiled]

For each position P, in a fresh process per measurement: the compiled engine on the
GPT-2 small checkpoint with random weights (~/.cache/firscope-bench/gpt2-small-random,
made once by benchmarks/decode.py's helper, located as benchmarks/gpu.py does), its
key and value caches filled cheaply with seeded random rows 0..P-1 in every layer
instead of P decode steps, then ``--steps`` decode steps from position P with a node
hook timing every attention dispatch (the median over layers and steps is the figure:
each dispatch as a decode makes it, its K and V rows cold after the linears' weights).
Its floor is the bytes of K and V it reads at that position, 2 x (P + 1) x hidden x 4,
over the machine's streaming read bandwidth (benchmarks/bandwidth.py, the best of 7
reads of that many bytes, measured in the same process after the steps).

``--base DIR``: also time the code of another checkout (a ``git worktree add`` of the
commit to compare against): each round runs both, each in its own process, the order
rotating from round to round; the last logits of both must have the same bits (the
printed hash), or the comparison says so. Printed: per position and code, the median
over rounds of each round's median us/dispatch (and the range), the floor, the ratio
(and the best round's), the threads the machine ran with (``--threads``, fixed unless
``--adaptive``), and the load average of each measurement.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def child(args) -> int:
    """One code's timings in this fresh process: JSON on stdout."""
    sys.path.insert(0, str(Path(args.code).resolve()))
    sys.path.insert(1, str(HERE))
    import numpy as np

    from firscope.runtime import Machine, load_model  # before bandwidth, which puts REPO first
    from bandwidth import Streamer
    model = load_model(args.model)
    machine = Machine(model, engine=args.engine)
    machine.step(0)  # loads (or compiles) every kernel
    attn = [n for n in model.nodes if n.kind == "micro" and n.target == "g2.attn_decode"]
    hidden = attn[0].args[0].size // 3
    times: list[float] = []

    def hook(m, node, dt):
        if node.target == "g2.attn_decode":
            times.append(dt)

    out: dict = {"positions": {}, "code": args.code}
    streamer = None
    for p in args.positions:
        machine.reset()
        rng = np.random.default_rng(p)
        for node in attn:  # rows 0..p-1 as earlier steps would have left them
            for cache in (node.args[2], node.args[3]):
                model.view(cache.region)[: p * hidden] = rng.standard_normal(p * hidden,
                                                                     dtype=np.float32)
        machine.history = [0] * p
        machine.position = p
        times.clear()
        machine.hooks.after_node.append(hook)
        logits = None
        for s in range(args.steps):
            logits = machine.step(100 + s).logits
        machine.hooks.after_node.remove(hook)
        nbytes = 2 * (p + 1) * hidden * 4
        if streamer is None:
            streamer = Streamer(nbytes)
        floor = streamer.best(nbytes)
        out["positions"][str(p)] = {
            "us": statistics.median(times) * 1e6, "floor_us": floor * 1e6,
            "dispatches": len(times), "kv_bytes": nbytes,
            "hash": hashlib.sha256(logits.tobytes()).hexdigest()[:16]}
    import numba
    out["threads"] = numba.get_num_threads()
    out["load"] = os.getloadavg()[0]
    import firscope
    out["firscope"] = str(Path(firscope.__file__).parent)
    print(json.dumps(out))
    return 0


def run_child(code: Path, model: Path, args) -> dict:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(args.threads),
               OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    env.pop("FIRSCOPE_THREADS", None)
    if not args.adaptive:  # the same threads in every measurement, whatever the load
        env["FIRSCOPE_THREADS"] = str(args.threads)
    cmd = [sys.executable, __file__, "--child", "--code", str(code), "--model", str(model),
           "--positions", ",".join(map(str, args.positions)), "--steps", str(args.steps),
           "--engine", args.engine]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--positions", default="256,512,1000")
    ap.add_argument("--steps", type=int, default=4, help="timed decode steps per position")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine", default="compiled")
    ap.add_argument("--adaptive", action="store_true",
                    help="let firscope choose its threads per step from the load (default: "
                         "--threads, fixed, so that measurements compare)")
    ap.add_argument("--base", help="another checkout to time too (e.g. a worktree of main)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--code", default=str(REPO), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.positions = [int(v) for v in str(args.positions).split(",")]
    if args.child:
        return child(args)
    sys.path.insert(0, str(HERE))
    from gpu import model_path
    model = model_path("gpt2")
    codes = {"this": REPO}
    if args.base:
        codes["base"] = Path(args.base).resolve()
    results: dict[str, list[dict]] = {name: [] for name in codes}
    names = list(codes)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            res = run_child(codes[name], model, args)
            results[name].append(res)
            if "error" in res:
                print(f"round {r + 1} {name}: {res['error']}", flush=True)
                continue
            cells = "  ".join(f"@{p} {v['us']:7.0f} us" for p, v in res["positions"].items())
            print(f"round {r + 1} {name:5s} {cells}  load {res['load']:.2f}  "
                  f"threads {res['threads']}", flush=True)
    print()
    print(f"{'position':>8s} {'code':5s} {'us/dispatch':>12s} {'range':>15s} {'floor us':>9s} "
          f"{'ratio':>6s} {'best':>5s}  logits")
    for p in map(str, args.positions):
        hashes = set()
        for name in names:
            ok = [res for res in results[name] if "error" not in res]
            if not ok:
                continue
            us = [res["positions"][p]["us"] for res in ok]
            floor = statistics.median(res["positions"][p]["floor_us"] for res in ok)
            med = statistics.median(us)
            hs = {res["positions"][p]["hash"] for res in ok}
            hashes |= hs
            print(f"{p:>8s} {name:5s} {med:12.0f} {min(us):7.0f}..{max(us):<7.0f} "
                  f"{floor:9.0f} {med / floor:6.1f} {min(us) / floor:5.1f}  "
                  f"{','.join(sorted(hs))}")
        if len(hashes) > 1:
            print(f"{'':8s} the logits differ between runs or codes at position {p}")
    loads = [res["load"] for rs in results.values() for res in rs if "error" not in res]
    if loads:
        print(f"load average over the measurements: {min(loads):.2f}..{max(loads):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
