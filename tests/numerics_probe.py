"""Print, as JSON, a SHA-256 of everything the reference computes on the sample model.

Run by tests/test_reference_numerics.py once per numba target (NUMBA_CPU_NAME,
NUMBA_CPU_FEATURES), each in a fresh process with a fresh cache folder: the
logits and a dump of every node of a decode (compiled and interp engines, q4
and --fir-f32), attention at later positions than the decodes reach (compiled, its lanes
also split over two threads, and interp),
the sample model's q4 codes, scales and mins (both compiled
quantizers and the NumPy one), exp and sigmoid over a spread of f32 inputs, and
f32 / q4 matrix-vector products of shapes with tails (serial and parallel
kernels). The test asserts every target prints the same.

    python tests/numerics_probe.py OUT_FOLDER
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_models" / "tiny-gpt2"
sys.path.insert(0, str(REPO))

CONFIGS = {"compiled-q4": ["--engine", "compiled"],
           "interp-q4": ["--engine", "interp"],
           "compiled-f32": ["--engine", "compiled", "--fir-f32"],
           "interp-f32": ["--engine", "interp", "--fir-f32"]}


def sha(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:24]


def decodes(folder: Path) -> dict:
    from firscope.cli import main
    out = {}
    for name, opts in CONFIGS.items():
        dump, logits = folder / f"{name}.npz", folder / f"{name}.npy"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rc = main(["run", str(SAMPLE / "gpt2.fir"), "--prompt", "def ", "-n", "3",
                       "--dump", str(dump), "--logits-out", str(logits), *opts])
        if rc != 0:
            raise SystemExit(f"{name}: firscope run exited {rc}")
        nodes = np.load(dump)
        keys = sorted(k for k in nodes.files if k != "__metadata__")
        out[f"{name}/logits"] = sha(np.load(logits))
        out[f"{name}/dump"] = sha(*(nodes[k] for k in keys)) + f" ({len(keys)} arrays)"
    return out


def quantized() -> dict:
    from safetensors.numpy import load_file

    from firscope.model.q4 import quantize, quantize_conv1d, quantize_numpy
    tensors = load_file(SAMPLE / "model.safetensors")
    out = {}
    for name in sorted(tensors):
        w = tensors[name]
        if w.ndim != 2 or not name.startswith("transformer.h."):
            continue
        for how, q in (("conv1d", quantize_conv1d(w, compiled=True)), ("rows", quantize(w.T)),
                       ("numpy", quantize_numpy(w.T)), ("rows-g48", quantize(w.T, 48))):
            out[f"q4/{how}/{name}"] = sha(q.packed, q.scale, q.minimum)
    return out


def functions() -> dict:
    from firscope.model.numerics import exp_f32_numpy, sigmoid_f32_numpy
    from firscope.vm.opcodes import exp_f32, sigmoid_f32
    rng = np.random.default_rng(21)
    x = np.concatenate([rng.uniform(-110, 95, 200_000), rng.standard_normal(200_000) * 4,
                        [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72, -103.97]]).astype(np.float32)
    with np.errstate(all="ignore"):
        return {"exp/numba": sha(exp_f32(x)), "exp/numpy": sha(exp_f32_numpy(x)),
                "sigmoid/numba": sha(sigmoid_f32(x)), "sigmoid/numpy": sha(sigmoid_f32_numpy(x))}


def products() -> dict:
    from firscope.model.numerics import dot_f32_numpy
    from firscope.model.q4 import quantize
    from firscope.runtime.gemv import f32_matvec
    rng = np.random.default_rng(7)
    out = {}
    for rows, cols in ((3000, 131), (700, 768), (5, 7)):
        w = rng.standard_normal((rows, cols), dtype=np.float32)
        x = rng.standard_normal(cols, dtype=np.float32)
        y = np.empty(rows, dtype=np.float32)
        f32_matvec(w, x, y)  # parallel above PARALLEL_MIN_WEIGHTS
        out[f"f32/{rows}x{cols}"] = sha(y)
        out[f"numpy/{rows}x{cols}"] = sha(dot_f32_numpy(w, x))
        for group in (32, 48):
            q = quantize(w, group)
            out[f"q4-g{group}/{rows}x{cols}/serial"] = sha(q.matvec(x, parallel=False))
            out[f"q4-g{group}/{rows}x{cols}/parallel"] = sha(q.matvec(x, parallel=True))
    return out


def attention() -> dict:
    """Attention of the sample model at later positions than the decodes reach (its loops
    run longer there), on the compiled engine and on the interpreter: random K and V rows
    before the position, as earlier steps leave. The compiled engine also with its lanes
    split in two ranges on numba's threads (run_par: a tiny model's dispatches never split
    on their own, so without this the threaded driver would be compiled and never
    compared; ``parallel=2`` splits every dispatch, on any number of cores)."""
    from firscope.runtime import load_model
    from firscope.vm.compiled import CompiledRunner
    from firscope.vm.interp import Dispatch
    model = load_model(SAMPLE / "gpt2.fir")
    runner = CompiledRunner(model)
    split = CompiledRunner(model, parallel=2)
    out = {}
    for p in (17, 130, 255):
        rng = np.random.default_rng(p)
        for node in [n for n in model.nodes if n.target == "g2.attn_decode"][:2]:
            arena = model.arena.copy()
            qkv, _, kc, vc, _ = node.args
            hidden = qkv.size // 3
            arena[qkv.region.base: qkv.region.base + qkv.size] = rng.normal(0, 1, qkv.size)
            for c in (kc, vc):
                arena[c.region.base: c.region.base + p * hidden] = rng.normal(0, 1, p * hidden)
            arena[model.inputs["position"].base] = p
            interp, apart = arena.copy(), arena.copy()
            Dispatch(node.program, interp).run()
            runner.run(node, arena)
            before = split.split_dispatches
            split.run(node, apart)
            if split.split_dispatches != before + 1:
                raise SystemExit(f"{node.full_name} at {p}: the dispatch did not split")
            out[f"attention/{node.full_name}@{p}/compiled"] = sha(arena)
            out[f"attention/{node.full_name}@{p}/interp"] = sha(interp)
            out[f"attention/{node.full_name}@{p}/compiled-split"] = sha(apart)
    return out


def main() -> None:
    folder = Path(sys.argv[1])
    from firscope.model.numeric_kernels import FMA_EMULATED, Q4_DEQUANT
    report = {**decodes(folder), **quantized(), **functions(), **products(), **attention(),
              # how this target computed them (not a value: compared by no test of bits)
              "_target/fma": "emulated" if FMA_EMULATED else "instruction",
              "_target/q4-dequant": Q4_DEQUANT}
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
