"""The Python API's cost: ``Model.run`` against what ``firscope run`` does, on GPT-2 small shapes.

    python benchmarks/api.py [--quick] [--tokens N] [--rounds R] [--reps K] [--threads T]

Issue 41's goal: ``Model.run`` of 64 tokens costs at most 1.1x ``firscope run`` of the same
tokens, and recording a handful of buffers costs what copying them costs, not a re-run.

Engines, each in its own fresh process (the order rotates from round to round):

* ``cli``: the decode of ``firscope run`` (profile/run.py's ``run_decode``): RunInput.open,
  a Machine, its kernels warmed up, ``stop_between_nodes``, then ``machine.generate``;
* ``api``: ``firscope.open`` and ``Model.warmup``, then ``Model.run(tokens=...)``;
* ``api-record``: the same with ``record="attention@*/attn"`` (one buffer per layer: 12 on
  GPT-2 small, 3 KB each per step); in the same process each recorded decode is followed by
  the same decode unrecorded (paired), and the values are copied once more alone, so the
  overhead can be held against what copying costs;
* ``api-patch``: the same with a patch on ``attention@0/attn`` that returns None (the cost
  of a Python call per step and the read-only copy it gets).

Every process loads the model (not timed), then times K decodes of N tokens (positions
0..N-1, a prompt fed one token per step, n=0), each from position 0; the process reports
the median ms/token of its K. Printed: per engine the median over rounds and its range,
the load average, and the ratios api/cli, api-record/api, api-patch/api. The logits of
the last decode of every engine are compared bit for bit.

The checkpoint is benchmarks/decode.py's: a random-weight HF GPT-2 with GPT-2 small's shapes
in ~/.cache/firscope-bench (made once, with torch and transformers); ``--quick`` uses the
bundled sample instead.
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
ENGINES = ("cli", "api", "api-record", "api-patch")
RECORD = "attention@*/attn"


def decode_cli(fir: Path, ids: list[int], reps: int) -> tuple[list[float], np.ndarray]:
    """What ``firscope run --tokens IDS -n 0`` runs, timed as it times itself."""
    from firscope.runtime import Machine
    from firscope.runtime.interrupt import stop_between_nodes
    from firscope.runtime.opening import RunInput
    opened = RunInput(model=str(fir), tokens=tuple(ids)).open()
    machine = Machine(opened.model, engine="compiled")
    machine.kernel_runner.warmup()
    stop_between_nodes(machine)
    times, logits = [], None
    for _ in range(reps):
        machine.reset()
        t = time.perf_counter()
        _, logits = machine.generate(list(opened.ids), 0)
        times.append(time.perf_counter() - t)
    return times, np.stack(logits)


def decode_api(fir: Path, ids: list[int], reps: int, engine: str):
    import firscope
    model = firscope.open(fir)
    model.warmup()
    kw = {}
    if engine == "api-record":
        kw["record"] = RECORD
    elif engine == "api-patch":
        kw["patch"] = {("attention@0", "attn"): lambda value, step: None}
    times, plain, run = [], [], None
    for _ in range(reps):
        t = time.perf_counter()
        run = model.run(tokens=ids, **kw)
        times.append(time.perf_counter() - t)
        if engine == "api-record":  # paired: the same decode unrecorded, right after
            t = time.perf_counter()
            model.run(tokens=ids)
            plain.append(time.perf_counter() - t)
    extra = {}
    if engine == "api-record":
        extra = copy_cost(run)
        extra["paired_overhead_ms"] = statistics.median(
            (a - b) * 1e3 for a, b in zip(times, plain))
    return times, run.logits, extra


def copy_cost(run) -> dict:
    """The recorded values' bytes, and the time to copy that many buffers of that size one
    at a time (what recording them must cost at least)."""
    values = list(run.values().values())
    sources = [np.array(v) for v in values]
    t = time.perf_counter()
    for src in sources:
        kept = src.copy()
        kept.setflags(write=False)
    copy_s = time.perf_counter() - t
    return {"recorded": len(values), "recorded_bytes": int(sum(v.nbytes for v in values)),
            "copy_ms": copy_s * 1e3}


def child(args) -> int:
    fir = Path(args.fir)
    ids = [int(t) for t in args.ids.split(",")]
    if args.child == "cli":
        times, logits = decode_cli(fir, ids, args.reps)
        extra = {}
    else:
        times, logits, extra = decode_api(fir, ids, args.reps, args.child)
    np.save(args.logits, logits)
    per_token = [t / len(ids) * 1e3 for t in times]
    print(json.dumps({"engine": args.child, "ms_per_token": statistics.median(per_token),
                      "reps": per_token, "load": os.getloadavg()[0], **extra}))
    return 0


def run_child(engine: str, fir: Path, ids: list[int], reps: int, threads: int,
              out: Path) -> dict:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads))
    cmd = [sys.executable, __file__, "--child", engine, "--fir", str(fir), "--ids",
           ",".join(map(str, ids)), "--reps", str(reps), "--logits", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or [""])[-1][:200]
        return {"engine": engine, "error": f"exit {p.returncode}: {tail}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the bundled sample, 2 rounds")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per decode (default 64)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="decodes per process (default 3)")
    ap.add_argument("--threads", type=int, default=2)
    for internal in ("--child", "--fir", "--ids", "--logits"):  # a measuring process's
        ap.add_argument(internal, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.quick:
        fir = REPO / "sample_models" / "tiny-gpt2" / "gpt2.fir"
        args.rounds = min(args.rounds, 2)
    else:
        from decode import make_checkpoint
        fir = make_checkpoint(Path.home() / ".cache" / "firscope-bench" / "gpt2-small")
    vocab = 256 if args.quick else 50257
    ids = [int(t) for t in np.random.default_rng(0).integers(0, vocab, args.tokens)]
    results: dict[str, list[dict]] = {e: [] for e in ENGINES}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        outs = {e: Path(tmp) / f"{e}.npy" for e in ENGINES}
        for r in range(args.rounds):
            order = ENGINES[r % len(ENGINES):] + ENGINES[: r % len(ENGINES)]
            for e in order:
                res = run_child(e, fir, ids, args.reps, args.threads, outs[e])
                results[e].append(res)
                loads.append(os.getloadavg()[0])
                print(f"round {r + 1} {e:<11} " + (res["error"] if "error" in res else
                      f"{res['ms_per_token']:.3f} ms/token (reps {', '.join(f'{x:.3f}' for x in res['reps'])})"),
                      flush=True)
        logits = {e: np.load(p) for e, p in outs.items() if p.exists()}
    print(f"\n{fir.parent.name}: {args.tokens} tokens per decode, {args.reps} decodes per "
          f"process, {args.rounds} rounds, {args.threads} threads; load average "
          f"{min(loads):.2f}..{max(loads):.2f}")
    med = {}
    for e, rs in results.items():
        ok = [x["ms_per_token"] for x in rs if "error" not in x]
        if not ok:
            print(f"  {e:<11} failed: {rs[0].get('error')}")
            continue
        med[e] = statistics.median(ok)
        print(f"  {e:<11} {med[e]:8.3f} ms/token  (round medians {min(ok):.3f}..{max(ok):.3f})")
    rec = [x for x in results["api-record"] if "error" not in x]
    if rec:
        x = rec[-1]
        print(f"  recorded {x['recorded']} values per run ({x['recorded_bytes'] / 1e3:.0f} KB); "
              f"copying them alone: {x['copy_ms']:.2f} ms per run")
    for a, b in (("api", "cli"), ("api-record", "api"), ("api-patch", "api")):
        if a in med and b in med:
            print(f"  {a} / {b}: {med[a] / med[b]:.3f}x")
    if rec:
        paired = statistics.median(x["paired_overhead_ms"] for x in rec)
        print(f"  recording overhead, paired in one process (recorded run minus the same run "
              f"unrecorded, median): {paired:.2f} ms per run against "
              f"{rec[-1]['copy_ms']:.2f} ms to copy the values alone")
    base = logits.get("cli")
    for e, v in logits.items():
        same = base is not None and v.shape == base.shape and np.array_equal(
            v.view(np.uint32), base.view(np.uint32))
        print(f"  logits {e:<11} {'bit-identical to cli' if same else 'DIFFER from cli'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
