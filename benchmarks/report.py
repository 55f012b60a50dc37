"""Time writing the profiling report (``write_report``: report.json, CSVs, trace.json,
logits.npz and report.html with its figures), against the goal of issue 27: <= 1 s.

    python benchmarks/report.py [--model PATH.fir] [--runs N] [-n STEPS]

Profiles the model once (the bundled sample by default: the model the README profiles),
pickles the ProfileData to a temporary folder, then runs N fresh processes that each load
it and time ``import firscope.profile.report`` + ``write_report`` (whatever the report
imports on first use is counted). Prints each run, the median and its ratio to the goal,
the CPU model and the load average (the machine may be shared: then the figures are noisy).
"""
from __future__ import annotations

import argparse
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

GOAL_S = 1.0
CHILD = """
import pickle, sys, time
data = pickle.load(open(sys.argv[1], "rb"))
t0 = time.perf_counter()
from firscope.profile.report import write_report
t1 = time.perf_counter()
write_report(data, sys.argv[2])
t2 = time.perf_counter()
print(f"{t2 - t0:.4f} {t1 - t0:.4f}")
"""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def profile_once(model: str | None, steps: int, path: Path) -> None:
    from firscope.profile.report import profile_model
    from firscope.runtime.opening import RunInput
    opened = RunInput(model=model, prompt="Hello world").open()
    data = profile_model(opened.model, list(opened.ids), steps, tokenizer=opened.tokenizer)
    path.write_bytes(pickle.dumps(data))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a .fir file (default: the bundled sample model)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("-n", type=int, default=16, help="tokens to generate in the profile")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pkl = Path(tmp) / "profile.pkl"
        try:
            profile_once(args.model, args.n, pkl)
        except Exception as e:  # noqa: BLE001 (a model that cannot be opened: say why)
            print(f"report.py: cannot profile {args.model or 'the sample'}: {e}", file=sys.stderr)
            return 2
        load0 = os.getloadavg()
        totals, imports = [], []
        for i in range(args.runs):
            out = Path(tmp) / f"report{i}"
            res = subprocess.run([sys.executable, "-c", CHILD, str(pkl), str(out)],
                                 capture_output=True, text=True, check=True)
            total, imp = map(float, res.stdout.split())
            totals.append(total)
            imports.append(imp)
            print(f"run {i}: write_report {total:.3f} s (of which importing the report "
                  f"module {imp:.3f} s)")
        load1 = os.getloadavg()
    med = statistics.median(totals)
    print(f"model: {args.model or 'bundled sample'}; CPU: {cpu_model()}, {os.cpu_count()} cores;"
          f" load average {load0[0]:.2f} before, {load1[0]:.2f} after")
    print(f"median of {args.runs}: {med:.3f} s = {med / GOAL_S:.2f}x the {GOAL_S:g} s goal "
          f"({'met' if med <= GOAL_S else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
