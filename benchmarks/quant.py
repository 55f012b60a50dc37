"""The quantization workbench's cost: ``firscope eval`` and ``quant sensitivity`` against
the same number of decode steps of ``firscope run``, on GPT-2 small shapes.

    python benchmarks/quant.py [--quick] [--ctx N] [--chunks K] [--rounds R] [--sensitivity]

Issue 42's goals: eval at most 1.2x the time of the same number of decode steps of
``firscope run`` (both precisions counted: 2 x chunks x (ctx-1) steps), using every core;
sensitivity for N weights must cost less than 2N evals.

Engines, each in its own fresh process, the order rotating from round to round:

* ``run``: what ``firscope run`` does per step (benchmarks/api.py's ``decode_cli``): the q4
  model and then the f32 model (``--fir-f32``), each fed ctx-1 tokens per chunk from position
  0, timed after loading;
* ``eval``: ``firscope eval`` on the same chunks (a .npy corpus of the same random ids), an
  empty f32 cache (so both sides run), timed from after the command loaded the model and
  its kernels, as run's steps are: making the f32 forms of the q4 weights, the statistics,
  and worker processes' start and loads (when it starts any) count against it;
* ``eval-cached``: the same with the f32 side in the cache (what a second plan's eval runs);
* ``sensitivity`` (``--sensitivity``): ``quant sensitivity`` on one chunk, reported as a
  multiple of one eval of that chunk.

Each engine's whole process (start, loads, steps) is timed too and printed beside it.

The checkpoint is benchmarks/decode.py's random-weight GPT-2 small in ~/.cache/firscope-bench;
``--quick`` uses the bundled sample.
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
    fir, corpus = Path(args.fir), Path(args.corpus)
    ids = np.load(corpus)
    chunks = [ids[i * args.ctx:(i + 1) * args.ctx] for i in range(args.chunks)]
    if args.child == "run":
        from firscope.runtime import Machine
        from firscope.runtime.interrupt import stop_between_nodes
        from firscope.runtime.opening import RunInput
        total = 0.0
        for f32 in (False, True):
            opened = RunInput(model=str(fir), fir_f32=f32, tokens=(0,)).open()
            machine = Machine(opened.model, engine="compiled")
            machine.kernel_runner.warmup()
            stop_between_nodes(machine)
            for c in chunks:
                machine.reset()
                t = time.perf_counter()
                machine.generate([int(x) for x in c[:-1]], 0)
                total += time.perf_counter() - t
        out = {"seconds": total}
    else:
        from firscope.quant.commands import EvalOptions, evaluate, open_bank, open_corpus
        opts = EvalOptions(model=str(fir), corpus=str(corpus), group=32, ctx=args.ctx,
                           chunks=args.chunks, as_json=True)
        bank, path = open_bank(opts)
        corp = open_corpus(bank, opts)
        if args.child == "eval-cached":
            evaluate(bank, path, corp, opts, {}, quiet=True)  # fills the cache
        else:  # both sides run: no f32 logits of these chunks from an earlier round
            from firscope.jitcache import cache_dir
            for f in cache_dir("eval").glob("*.npy"):
                f.unlink()
        t = time.perf_counter()
        if args.child == "sensitivity":
            from firscope.quant.planning import sensitivity
            sensitivity(bank, path, corp, opts, quiet=True)
        else:
            evaluate(bank, path, corp, opts, {}, quiet=True)
        out = {"seconds": time.perf_counter() - t}
    out.update(engine=args.child, load=os.getloadavg()[0])
    print(json.dumps(out))
    return 0


def run_child(engine: str, fir: Path, corpus: Path, ctx: int, chunks: int) -> dict:
    env = dict(os.environ)
    cmd = [sys.executable, __file__, "--child", engine, "--fir", str(fir), "--corpus",
           str(corpus), "--ctx", str(ctx), "--chunks", str(chunks)]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or [""])[-1][:300]
        return {"engine": engine, "error": f"exit {p.returncode}: {tail}"}
    return {**json.loads(p.stdout.strip().splitlines()[-1]), "wall": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the bundled sample")
    ap.add_argument("--ctx", type=int, default=None, help="tokens per chunk (default 128; "
                                                           "quick: 256)")
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sensitivity", action="store_true",
                    help="also time quant sensitivity on one chunk")
    for internal in ("--child", "--fir", "--corpus"):
        ap.add_argument(internal, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.quick:
        fir, vocab = REPO / "sample_models" / "tiny-gpt2" / "gpt2.fir", 256
        args.ctx = args.ctx or 256
    else:
        from decode import make_checkpoint
        fir = make_checkpoint(Path.home() / ".cache" / "firscope-bench" / "gpt2-small")
        vocab = 50257
        args.ctx = args.ctx or 128
    engines = ["run", "eval", "eval-cached"]
    results: dict[str, list[dict]] = {e: [] for e in engines}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.npy"
        np.save(corpus, np.random.default_rng(0).integers(0, vocab, args.ctx * args.chunks))
        for r in range(args.rounds):
            order = engines[r % len(engines):] + engines[: r % len(engines)]
            for e in order:
                res = run_child(e, fir, corpus, args.ctx, args.chunks)
                results[e].append(res)
                loads.append(os.getloadavg()[0])
                print(f"round {r + 1} {e:<12} " + (res["error"] if "error" in res else
                                                   f"{res['seconds']:.2f} s"), flush=True)
        sens = None
        if args.sensitivity:
            one = run_child("eval", fir, corpus, args.ctx, 1)
            s = run_child("sensitivity", fir, corpus, args.ctx, 1)
            sens = (one, s)
    steps = 2 * args.chunks * (args.ctx - 1)
    print(f"\n{fir.parent.name}: {args.chunks} chunk(s) of {args.ctx} tokens = {steps} decode "
          f"steps for both precisions; {args.rounds} rounds, {os.cpu_count()} cores; load "
          f"average {min(loads):.2f}..{max(loads):.2f}")
    med, walls = {}, {}
    for e, rs in results.items():
        ok = [x["seconds"] for x in rs if "error" not in x]
        if not ok:
            print(f"  {e:<12} failed: {rs[0].get('error')}")
            continue
        med[e] = statistics.median(ok)
        walls[e] = statistics.median(x["wall"] for x in rs if "error" not in x)
        print(f"  {e:<12} {med[e]:8.2f} s  ({med[e] / steps * 1e3:.2f} ms per step; rounds "
              f"{min(ok):.2f}..{max(ok):.2f}); whole process {walls[e]:.2f} s")
    for a in ("eval", "eval-cached"):
        if a in med and "run" in med:
            print(f"  {a} / run: {med[a] / med['run']:.3f}x the decode steps (goal for eval: "
                  f"<= 1.2x); whole processes (loading both models for run, the model and "
                  f"the f32 forms for eval): {walls[a] / walls['run']:.3f}x")
    if sens:
        one, s = sens
        if "error" in one or "error" in s:
            print(f"  sensitivity failed: {one.get('error') or s.get('error')}")
        else:
            from firscope.runtime import load_model
            n = sum(1 for w in load_model(fir).weights.values() if w.region is None)
            print(f"  sensitivity over 1 chunk, {n} weights: {s['seconds']:.1f} s = "
                  f"{s['seconds'] / one['seconds']:.1f} evals of that chunk (2N = {2 * n})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
