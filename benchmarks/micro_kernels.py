"""Time of the compiled micro-kernels per decoded token: this tree against a git revision.

    python benchmarks/micro_kernels.py --against 1f1778e [--rounds 5] [--steps 48]

What a change to the code generator or the compiled runner costs on the normal
path (e.g. the store journal that makes a dispatch all or nothing). Writes a
random GPT-2 with GPT-2 small's widths (n_embd 768, 12 heads, 1024 positions)
but 2 layers and a small vocabulary with NumPy into a temporary folder, then
runs rounds: each round starts one fresh process per tree, in rotated order,
which loads the model, compiles its kernels (not timed) and decodes
``--steps`` tokens, timing every micro node with a node hook. Per process the
figure is the median over tokens of the micro nodes' summed time (and of the
whole step, for scale); the result is the median over rounds, with the ratio this tree / revision and the load
average before and after (the machine is shared: compare ratios, not
milliseconds).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SHAPE = dict(n_layer=2, n_embd=768, n_head=12, n_positions=1024, vocab=2048)

CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from firscope.runtime import load_model
from firscope.runtime import Machine
model = load_model(sys.argv[2])
machine = Machine(model, engine="compiled")
machine.kernel_runner.warmup()
per_token, whole, acc = [], [], [0.0]
def hook(m, node, dt):
    if node.kind == "micro":
        acc[0] += dt
machine.hooks.after_node.append(hook)
steps = int(sys.argv[3])
for t in range(steps):
    acc[0] = 0.0
    t0 = time.perf_counter()
    machine.step((t * 7919) % model.vocab)
    whole.append(time.perf_counter() - t0)
    per_token.append(acc[0])
print(json.dumps({"median_ms": statistics.median(per_token) * 1e3,
                  "step_ms": statistics.median(whole) * 1e3,
                  "fallbacks": len(machine.kernel_runner.fallbacks)}))
"""


def write_model(folder: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import write_random_gpt2
    return write_random_gpt2(folder, **SHAPE)


def tree_of(revision: str, work: Path) -> Path:
    """The package at ``revision``, extracted (not checked out: the worktree stays as is)."""
    dest = work / f"rev-{revision}"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "firscope"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def run_child(tree: Path, fir: Path, steps: int, cache: Path) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), NUMBA_CACHE_DIR=str(cache / "numba"),
               PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(fir), str(steps)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, help="git revision to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=48, help="tokens decoded per process")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="firscope-kernels-") as tmp:
        work = Path(tmp)
        fir = write_model(work / "model")
        trees = {"this tree": REPO, f"revision {args.against}": tree_of(args.against, work)}
        caches = {name: work / f"cache{i}" for i, name in enumerate(trees)}
        names = list(trees)
        print(f"GPT-2 small widths, {SHAPE['n_layer']} layers, {args.steps} tokens per process, "
              f"{args.rounds} rounds; load average before {os.getloadavg()}")
        results: dict[str, list[float]] = {n: [] for n in names}
        steps: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                res = run_child(trees[name], fir, args.steps, caches[name])
                results[name].append(res["median_ms"])
                steps[name].append(res["step_ms"])
                print(f"  round {r}: {name}: {res['median_ms']:.3f} ms/token "
                      f"(whole step {res['step_ms']:.2f} ms) "
                      f"({res['fallbacks']} nodes interpreted)", flush=True)
        med = {n: statistics.median(v) for n, v in results.items()}
        print(f"load average after {os.getloadavg()}")
        for n in names:
            print(f"{n:<24} micro-kernels {med[n]:.3f} ms/token of a "
                  f"{statistics.median(steps[n]):.2f} ms step (medians of round medians; "
                  f"rounds {', '.join(f'{v:.3f}' for v in results[n])})")
        ratio = med[names[0]] / med[names[1]]
        print(f"ratio this tree / {names[1]}: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
