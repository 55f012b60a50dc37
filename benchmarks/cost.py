"""How long `firscope cost` takes on GPT-2 small shapes, against its goals and `run`.

    python benchmarks/cost.py [--at 31] [--rounds 3] [--threads 2] [--cache DIR]

Makes (once) a random-weight GPT-2 with GPT-2 small's shapes (benchmarks/scale.py's
checkpoint, vocab 50257, 1024 positions) and times, each in a fresh process, rounds
rotated: `firscope cost --at AT --json` (load, AT steps on the compiled engine, then
the recorded step) and `firscope run` of the same AT + 1 tokens (load and decode: the
peer). Prints the median wall time of each, the ratio cost / run, cost / each goal
(10 s when `cost` was built; 2 s since issue 45, the speed round), the analysis' own
time (from its JSON) and the load average before and after.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
GOALS_S = (10.0, 2.0)  # the first goal, then issue 45's


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return dt, p.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--at", type=int, default=31)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="h200")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "firscope-bench"))
    args = ap.parse_args()
    from scale import prepare
    folder = prepare("small", Path(args.cache))
    if isinstance(folder, str):
        print(folder)
        return 0
    fir = str(folder / "gpt2.fir")
    env = dict(os.environ, NUMBA_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    tokens = ",".join(str(i % 50257) for i in range(1, args.at + 2))
    py = [sys.executable, "-m", "firscope"]
    cost_cmd = py + ["cost", fir, "--tokens", tokens, "--at", str(args.at), "--device",
                     args.device, "--json"]
    run_cmd = py + ["run", fir, "--tokens", tokens, "-n", "1", "--ids"]
    timed(cost_cmd, env)  # compile and cache the kernels once, outside the figures
    load0 = os.getloadavg()[0]
    print(f"GPT-2 small shapes, step at position {args.at}, {args.threads} threads, "
          f"{os.cpu_count()} cpus, load average {load0:.2f}")
    cost_t, run_t, analysis = [], [], []
    for r in range(args.rounds):
        order = [("cost", cost_cmd), ("run", run_cmd)]
        for name, cmd in (order if r % 2 == 0 else order[::-1]):
            dt, out = timed(cmd, env)
            if name == "cost":
                cost_t.append(dt)
                report = json.loads(out)
                analysis.append(report["analysis_seconds"])
            else:
                run_t.append(dt)
    c, r_ = statistics.median(cost_t), statistics.median(run_t)
    print(f"firscope cost: {c:.2f} s median of {args.rounds} (analysis itself "
          f"{statistics.median(analysis):.2f} s, {report['recorded_nodes']} nodes recorded)")
    print(f"firscope run : {r_:.2f} s median (the same {args.at + 1} tokens)")
    goals = "; ".join(f"cost / goal ({g:.0f} s) {c / g:.2f}" for g in GOALS_S)
    print(f"ratio cost / run {c / r_:.2f}; {goals}")
    print(f"predicted on {report['device']['name']}: {report['predicted_us_per_token']:.1f} us "
          f"per token")
    print(f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
