"""An edited kernel judged where the debugger stands: what the UI's ctrl+s costs on GPT-2
small (issue 43's goal: under 1 s at 120x36), against a plain step of that node.

    python benchmarks/replay.py [--quick] [--nodes ln1@5,attention@11] [--position 63]
                                [--rounds 3] [--reps 3]

Each round, in a fresh process per node (rounds rotate the order): load the model, a
debugging session stopped before NODE at POSITION (a random prompt), the node's kernel
text as the editor shows it; then REPS times ``kernel_edits.preview`` (assemble the draft,
replay it and the code running now on the node's inputs, the sanitizer's checks, the cost
before and after), and REPS times a plain step of that node (``next``, from a checkpoint).
The first preview of a process (module imports, first use of the interpreter's handlers)
is reported apart. Printed: per node the median preview, the median plain step, their
ratio and the load average.

The checkpoint is benchmarks/decode.py's random-weight GPT-2 small in
~/.cache/firscope-bench; ``--quick`` uses the bundled sample (nodes ln1@1, attention@3).
"""
from __future__ import annotations

import argparse
import json
import os
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


def child(args) -> int:
    from firscope.debug import kernel_edits
    from firscope.debug.commands import CommandInterpreter
    from firscope.debug.session import Session
    from firscope.runtime import load_model
    from firscope.tui.kernel_editor import kernel_block
    model = load_model(args.fir)
    ids = [int(t) for t in np.random.default_rng(0).integers(0, model.vocab, args.position + 1)]
    s = Session(model, ids, 0, engine="compiled")
    ci = CommandInterpreter(s)
    ci.goto(args.node, args.position)
    name = s.node.target
    first, text = kernel_block(s, name)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "draft.fir"
        path.write_text("\n" * (first - 1) + text + "\n")
        t = time.perf_counter()
        out = kernel_edits.preview(s, name, str(path))
        cold = time.perf_counter() - t
        assert "identical" in out, out
        warm = []
        for _ in range(args.reps):
            t = time.perf_counter()
            kernel_edits.preview(s, name, str(path))
            warm.append(time.perf_counter() - t)
    ck, _ = ci.checkpoint()
    steps = []
    for _ in range(args.reps):
        t = time.perf_counter()
        ci.next()
        steps.append(time.perf_counter() - t)
        ci.restart(ck.number)
    print(json.dumps({"node": args.node, "cold": cold, "preview": statistics.median(warm),
                      "step": statistics.median(steps), "load": os.getloadavg()[0]}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--nodes", default=None)
    ap.add_argument("--position", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    for internal in ("--child", "--fir", "--node"):
        ap.add_argument(internal, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.quick:
        fir = REPO / "sample_models" / "tiny-gpt2" / "gpt2.fir"
        nodes = (args.nodes or "ln1@1,attention@3").split(",")
        position = args.position if args.position is not None else 63
    else:
        from decode import make_checkpoint
        fir = make_checkpoint(Path.home() / ".cache" / "firscope-bench" / "gpt2-small")
        nodes = (args.nodes or "ln1@5,attention@11").split(",")
        position = args.position if args.position is not None else 63
    results: dict[str, list[dict]] = {n: [] for n in nodes}
    loads = []
    for r in range(args.rounds):
        order = nodes[r % len(nodes):] + nodes[: r % len(nodes)]
        for n in order:
            cmd = [sys.executable, __file__, "--child", "1", "--fir", str(fir), "--node", n,
                   "--position", str(position), "--reps", str(args.reps)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"round {r + 1} {n}: failed: {p.stderr.strip().splitlines()[-1:]}")
                continue
            res = json.loads(p.stdout.strip().splitlines()[-1])
            results[n].append(res)
            loads.append(res["load"])
            print(f"round {r + 1} {n:<14} preview {res['preview']:.3f} s (first "
                  f"{res['cold']:.2f} s), plain step {res['step'] * 1e3:.2f} ms", flush=True)
    print(f"\n{fir.parent.name}, position {position}: {args.rounds} rounds, {args.reps} reps; "
          f"load average {min(loads, default=0):.2f}..{max(loads, default=0):.2f}")
    for n, rs in results.items():
        if not rs:
            continue
        pv = statistics.median(x["preview"] for x in rs)
        st = statistics.median(x["step"] for x in rs)
        cold = statistics.median(x["cold"] for x in rs)
        print(f"  {n:<14} preview {pv:.3f} s (goal < 1 s; first of a process {cold:.2f} s), "
              f"plain step {st * 1e3:.2f} ms: {pv / st:.0f}x a plain step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
