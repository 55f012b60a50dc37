"""What the kernel sanitizer costs on the sample model: 8 decode steps, sanitized vs plain.

    python benchmarks/sanitize.py [--rounds R] [--reps K] [--tokens 1,2,3 -n 6]

Every measurement runs in its own fresh process (the order rotates from round to
round) and prints the load average and the CPU other processes used meanwhile:

* command: the wall time of a whole command, ``firscope run`` (the plain run, the
  default compiled engine) against ``firscope sanitize`` (all three tools) on the
  same tokens: start-up, loading, compiling from the cache and the run. This is
  the figure the issue's bound is about (at most 20x a plain run).
* decode: inside one process, after a warm-up, the median of K repetitions of the
  8 steps alone: plain compiled, plain interpreter, and sanitized. The sanitizer
  sees every access through the step interpreter, so against the compiled
  engine's few milliseconds this ratio is large; it is printed so that nobody
  has to guess.

Medians over rounds of each process's figure; the ratios use those medians.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
from decode import cpu_snapshot  # noqa: E402

BOUND = 20.0  # the bound: sanitizing costs at most this many plain runs


def child_decode(kind: str, tokens: list[int], n: int, reps: int) -> dict:
    """In this process: load the sample, build one machine, warm up, then time ``reps`` runs
    of the steps (each from a reset machine; the sanitizer attached afresh each time)."""
    from firscope.runtime import Machine, load_model
    from firscope.samples import default_model
    from firscope.sanitize import Sanitizer
    model = load_model(default_model())
    machine = Machine(model, engine="interp" if kind == "interp" else "compiled")

    def once():
        machine.reset()
        sanitizer = Sanitizer(model).attach(machine) if kind == "sanitize" else None
        machine.generate(tokens, n)
        if sanitizer is not None:
            sanitizer.detach()
            report = sanitizer.report()
            assert report.errors == 0, report.text()
    once()  # compile / load kernels, first-dispatch setup
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        once()
        times.append(time.perf_counter() - t)
    return {"seconds": statistics.median(times)}


def measure(argv: list[str]) -> dict:
    """Run ``argv`` in a fresh process; its wall time, the load and others' CPU (the
    machine's busy CPU minus the child's own)."""
    load = os.getloadavg()[0]
    a, ca = cpu_snapshot(), _children_cpu()
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t
    b, cb = cpu_snapshot(), _children_cpu()
    own = (b[2] - a[2]) + (cb - ca)
    others = max(0.0, ((b[1] - a[1]) - own) / wall) if wall > 0 else 0.0
    return {"wall": wall, "rc": r.returncode, "load": load, "others": others,
            "stdout": r.stdout, "stderr": r.stderr}


def _children_cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=5, help="decode repetitions per process")
    p.add_argument("--tokens", default="1,2,3")
    p.add_argument("-n", type=int, default=6)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    if args.child:
        print(json.dumps(child_decode(args.child, tokens, args.n, args.reps)))
        return 0
    steps = len(tokens) + max(args.n - 1, 0)
    py = sys.executable
    common = ["--tokens", args.tokens, "-n", str(args.n)]
    commands = {
        "run (command)": [py, "-m", "firscope", "run", *common],
        "sanitize (command)": [py, "-m", "firscope", "sanitize", *common],
    }
    decodes = {f"{k} (decode)": [py, __file__, "--child", k, "--reps", str(args.reps), *common]
               for k in ("compiled", "interp", "sanitize")}
    jobs = {**commands, **decodes}
    results: dict[str, list[dict]] = {k: [] for k in jobs}
    names = list(jobs)
    print(f"sample model, {steps} decode steps, {args.rounds} rounds, each measurement in its "
          f"own process; load average now {os.getloadavg()[0]:.2f}")
    for rnd in range(args.rounds):
        order = names[rnd % len(names):] + names[: rnd % len(names)]
        for name in order:
            m = measure(jobs[name])
            if name.endswith("(decode)"):
                if m["rc"] != 0:
                    print(f"{name} failed:\n{m['stderr']}")
                    return 1
                m["value"] = json.loads(m["stdout"].strip().splitlines()[-1])["seconds"]
            else:
                if m["rc"] != 0:  # the sample must come out clean: 0, not 1
                    print(f"{name} exited {m['rc']}:\n{m['stdout'][-2000:]}{m['stderr']}")
                    return 1
                m["value"] = m["wall"]
            results[name].append(m)
            print(f"  round {rnd + 1} {name:<22} {m['value'] * 1e3:9.1f} ms   load "
                  f"{m['load']:.2f}, others' CPU {m['others']:.2f} cores")
    med = {k: statistics.median(m["value"] for m in v) for k, v in results.items()}
    print("\nmedians:")
    for k, v in med.items():
        lo = min(m["value"] for m in results[k])
        hi = max(m["value"] for m in results[k])
        print(f"  {k:<22} {v * 1e3:9.1f} ms  (rounds {lo * 1e3:.1f}..{hi * 1e3:.1f})")
    cmd = med["sanitize (command)"] / med["run (command)"]
    print(f"\nsanitize / run, whole commands:         {cmd:6.2f}x  (bound {BOUND:.0f}x: "
          f"{'met' if cmd <= BOUND else 'NOT met'})")
    print(f"sanitize / compiled, decode steps only: "
          f"{med['sanitize (decode)'] / med['compiled (decode)']:6.1f}x")
    print(f"sanitize / interp, decode steps only:   "
          f"{med['sanitize (decode)'] / med['interp (decode)']:6.2f}x")
    loads = [m["load"] for v in results.values() for m in v]
    print(f"load average during the measurements: {min(loads):.2f}..{max(loads):.2f} "
          f"(2 cores; a figure taken while others ran is noisy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
