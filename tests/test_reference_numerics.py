"""One reference on every machine: the reference's numbers do not depend on the host CPU.

The definitions (model/numerics, docs/reference-numerics.md) are checked
against their NumPy statement here, in process; then tests/numerics_probe.py
runs in fresh processes, each compiling for another numba target with its own
empty cache (generic x86-64 / aarch64 without vector extensions, Haswell's
AVX2 + FMA, Skylake's AVX-512; the host on the test run's cache) and one with
NumPy's SIMD dispatch switched off, and every one must print the same hashes:
logits and every node of a decode (compiled and interp, q4 and --fir-f32), the
quantized sample model, exp/sigmoid and matrix-vector products.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from firscope.model.numerics import (EXP_MAX, EXP_MIN, dot_f32_numpy, exp_f32_numpy,
                                     fma_f32_numpy, sigmoid_f32_numpy)
from firscope.model.q4 import quantize
from firscope.runtime.gemv import f32_matvec
from firscope.vm.opcodes import exp_f32, sigmoid_f32

PROBE = REPO / "tests" / "numerics_probe.py"
SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.0, -1.0,
                    EXP_MAX, np.nextafter(np.float32(EXP_MAX), np.float32(100)), EXP_MIN,
                    np.nextafter(np.float32(EXP_MIN), np.float32(-200)), 88.7228, 88.7229,
                    -87.3365, -103.279, -103.973, -103.972, 3e38, -3e38, 17.0, -17.0],
                   dtype=np.float32)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def spread(n=300_000, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.uniform(-110, 95, n), rng.standard_normal(n) * 5,
                           SPECIAL]).astype(np.float32)


# --- the definitions, in process ---------------------------------------------------------------
@pytest.mark.parametrize("name,numba_fn,numpy_fn", [("exp", exp_f32, exp_f32_numpy),
                                                      ("sigmoid", sigmoid_f32, sigmoid_f32_numpy)])
def test_numba_and_numpy_transcendentals_agree_bit_for_bit(name, numba_fn, numpy_fn):
    x = spread()
    with np.errstate(all="ignore"):
        assert np.array_equal(bits(numba_fn(x)), bits(numpy_fn(x))), name


def test_exp_and_sigmoid_are_correctly_rounded_but_for_rare_ties():
    """Against f64 (and where the machine has it, extended precision) rounded once to f32:
    the f64 polynomial is within ~2^-51, so at most one in a million inputs may differ,
    by one ulp."""
    x = spread(seed=1)
    wide = np.longdouble if np.finfo(np.longdouble).eps < np.finfo(np.float64).eps else np.float64
    with np.errstate(all="ignore"):
        t = x.astype(wide)
        want = {"exp": np.exp(t).astype(np.float32),
                "sigmoid": (1 / (1 + np.exp(-t))).astype(np.float32)}
        got = {"exp": exp_f32(x), "sigmoid": sigmoid_f32(x)}
    for name in want:
        nan = np.isnan(want[name])
        assert np.array_equal(np.isnan(got[name]), nan), name
        d = np.abs(bits(got[name])[~nan].astype(np.int64) - bits(want[name])[~nan].astype(np.int64))
        assert d.max() <= 1 and np.count_nonzero(d) <= x.size // 1_000_000, (name, d.max())
    assert exp_f32(np.array([EXP_MAX + 1], np.float32))[0] == np.inf
    assert exp_f32(np.array([-np.inf], np.float32))[0] == 0.0
    assert sigmoid_f32(np.array([-np.inf, np.inf], np.float32)).tolist() == [0.0, 1.0]


def test_fma_is_rounded_once_in_numpy_and_in_the_kernels():
    """fma_f32_numpy is IEEE fusedMultiplyAdd: where rounding a*b + c in f64 and then to f32
    rounds twice (an f64 sum landing on an f32 midpoint), it still gives the correctly
    rounded f32; and the kernels' fma (llvm.fma) gives the same bits on random, cancelling
    and special inputs."""
    from firscope.model.numeric_kernels import fma32
    from numba import njit

    @njit
    def fma_loop(a, b, c, out):
        for i in range(a.size):
            out[i] = fma32(a[i], b[i], c[i])

    # 1 + 2^-23 + (2^-24 - 2^-60): f64 rounds to the midpoint 1 + 2^-23 + 2^-24, ties to
    # even would then give 1 + 2^-22; the exact value is below the midpoint: 1 + 2^-23
    a = np.array([1 + 2**-18, -(1 + 2**-18)], np.float32)
    b = np.array([2**-24 * (1 - 2**-18)] * 2, np.float32)
    c = np.array([1 + 2**-23, -(1 + 2**-23)], np.float32)
    assert fma_f32_numpy(a, b, c).tolist() == [1 + 2**-23, -(1 + 2**-23)]
    assert (a.astype(np.float64) * b + c).astype(np.float32).tolist() != [1 + 2**-23, -(1 + 2**-23)]
    rng = np.random.default_rng(11)
    n = 200_000
    a = rng.standard_normal(n).astype(np.float32)
    b = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    c = (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(n) * 1e-7)).astype(np.float32)
    c[::3] = rng.standard_normal(c[::3].size).astype(np.float32)
    sp = np.array([0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1e-45, 1.0], np.float32)
    grid = [g.ravel() for g in np.meshgrid(sp, sp, sp)]
    a, b, c = (np.concatenate([v, g]) for v, g in zip((a, b, c), grid))
    got = np.empty(a.size, np.float32)
    fma_loop(a, b, c, got)
    want = fma_f32_numpy(a, b, c)
    same = (bits(got) == bits(want)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), (a[~same][:3], b[~same][:3], c[~same][:3])


def _fma_kernels(emulate: bool):
    """A scalar and a 16-lane loop of the kernels' fma, built one way (``emulate``: from
    f64 arithmetic, as on a CPU without FMA; else llvm.fma)."""
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from firscope.model.numeric_kernels import _fma, _vector_at

    @intrinsic
    def one(typingctx, a, b, c):
        def codegen(context, builder, signature, args):
            return _fma(builder, *args, emulate=emulate)
        return types.float32(types.float32, types.float32, types.float32), codegen

    @intrinsic
    def sixteen(typingctx, out, a, b, c, i):
        def codegen(context, builder, signature, args):
            vec = ir.VectorType(ir.FloatType(), 16)
            ptrs = [context.make_array(t)(context, builder, v).data
                    for t, v in zip(signature.args[:4], args[:4])]
            at = context.cast(builder, args[4], signature.args[4], types.int64)
            r = _fma(builder, *(_vector_at(builder, p, at, vec) for p in ptrs[1:]),
                     emulate=emulate)
            builder.store(r, builder.bitcast(builder.gep(ptrs[0], [at]), vec.as_pointer()),
                          align=1)
            return context.get_dummy_value()
        return types.void(out, a, b, c, i), codegen

    @njit
    def scalar(a, b, c, out):
        for i in range(a.size):
            out[i] = one(a[i], b[i], c[i])

    @njit
    def vector(a, b, c, out):
        for i in range(0, a.size - 15, 16):
            sixteen(out, a, b, c, i)
    del cgutils
    return scalar, vector


def test_the_fma_of_a_cpu_without_one_is_the_instructions_bit_for_bit():
    """Where the target has no FMA instruction (numba's generic, Sandy Bridge, Atom up to
    Goldmont) the kernels compute fma from f64 arithmetic instead of calling libm's
    fmaf (20x slower there): scalar and 16 lanes wide, the same bits as the definition
    (numerics.fma_f32_numpy) and as the instruction where this CPU has one, on random bit
    patterns (NaN, Inf, subnormals), cancelling sums, midpoints and results at the
    overflow and underflow edges."""
    from firscope.model.numeric_kernels import target_has_fma
    rng = np.random.default_rng(12)
    n = 1 << 18
    raw = [rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
           for _ in range(3)]
    a = rng.standard_normal(n).astype(np.float32)
    b = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 37, n)).astype(np.float32)
    c = (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(n) * 1e-7)).astype(np.float32)
    tiny = (rng.standard_normal(n) * 2.0 ** rng.integers(-149, -120, n)).astype(np.float32)
    big = (rng.standard_normal(n) * 2.0 ** rng.integers(60, 64, n)).astype(np.float32)
    edge = np.clip(-(big.astype(np.float64) * big[::-1]) / 2, -3.4e38, 3.4e38)

    def f32(*parts):  # raw bit patterns stay as they are (signalling NaNs among them)
        return np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])
    a = f32(raw[0], a, tiny, big, [1 + 2**-18, -(1 + 2**-18)])
    b = f32(raw[1], b, np.float32(0.5) + tiny, big, [2**-24 * (1 - 2**-18)] * 2)
    c = f32(raw[2], c, tiny, edge, [1 + 2**-23, -(1 + 2**-23)])
    a, b, c = (np.concatenate([v, np.zeros(-v.size % 16, np.float32)]) for v in (a, b, c))
    with np.errstate(over="ignore", invalid="ignore"):
        want = fma_f32_numpy(a, b, c)

    def same(got, ref):
        return (bits(got) == bits(ref)) | (np.isnan(got) & np.isnan(ref))
    kernels = {True: _fma_kernels(True)}
    if target_has_fma():
        kernels[False] = _fma_kernels(False)
    for emulate, (scalar, vector) in kernels.items():
        for fn in (scalar, vector):
            got = np.empty_like(a)
            fn(a, b, c, got)
            ok = same(got, want)
            assert ok.all(), (emulate, fn, a[~ok][:3], b[~ok][:3], c[~ok][:3])
    assert np.isnan(want).sum() > 1000 and (want == 0).sum() > 100  # the edges were reached
    assert ((np.abs(want) < 2**-126) & (want != 0)).sum() > 1000  # subnormal results
    assert np.isinf(want).sum() > 1000


SHAPES = [(1, 1), (5, 7), (3, 32), (4, 33), (37, 47), (9, 64), (300, 131), (700, 768),
          (2, 3072)]


@pytest.mark.parametrize("shape", SHAPES)
def test_f32_matvec_is_the_defined_sum(shape):
    rng = np.random.default_rng(shape[0] + shape[1])
    w = rng.standard_normal(shape).astype(np.float32)
    x = rng.standard_normal(shape[1]).astype(np.float32)
    y = np.empty(shape[0], dtype=np.float32)
    f32_matvec(w, x, y)
    assert np.array_equal(bits(y), bits(dot_f32_numpy(w, x)))
    # the definition is the written order, not just any order: sum i mod 32 by fused
    # multiply-adds, then the tree
    s = np.zeros((shape[0], 32), np.float32)
    for i in range(shape[1]):
        s[:, i % 32] = fma_f32_numpy(w[:, i], x[i], s[:, i % 32])
    for h in (16, 8, 4, 2, 1):
        s[:, :h] = s[:, :h] + s[:, h: 2 * h]
    assert np.array_equal(bits(y), bits(s[:, 0]))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("group", [32, 48, 7])
@pytest.mark.parametrize("parallel", [False, True])
def test_q4_matvec_is_the_f32_sum_of_the_dequantized_weights(shape, group, parallel):
    """Packed and dequantized paths are one computation: fma(q, scale, min), then the
    defined f32 sum."""
    rng = np.random.default_rng(shape[0] * 7 + shape[1] + group)
    q = quantize(rng.standard_normal(shape).astype(np.float32), group)
    x = rng.standard_normal(shape[1]).astype(np.float32)
    deq = q.dequantize_numpy()
    assert np.array_equal(bits(q.dequantize()), bits(deq))
    assert np.array_equal(bits(q.matvec(x, parallel=parallel)), bits(dot_f32_numpy(deq, x)))


def test_nan_and_inf_propagate_through_the_defined_sums():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((40, 70)).astype(np.float32)
    x = rng.standard_normal(70).astype(np.float32)
    x[3], x[50] = np.inf, np.nan
    y = np.empty(40, dtype=np.float32)
    f32_matvec(w, x, y)
    assert np.isnan(y).all()
    x[50] = 1
    f32_matvec(w, x, y)
    assert np.array_equal(bits(y), bits(dot_f32_numpy(w, x))) and np.isinf(y).all()


# --- every target, in fresh processes ----------------------------------------------------------
def host_features() -> set[str]:
    import llvmlite.binding as ll
    return {f[1:] for f in ll.get_host_cpu_features().flatten().split(",") if f.startswith("+")}


def targets() -> dict[str, dict[str, str]]:
    """numba targets this machine can run: name -> environment. A named CPU gets exactly its
    own features (NUMBA_CPU_FEATURES empty), not the host's."""
    out = {"host": {}, "generic": {"NUMBA_CPU_NAME": "generic", "NUMBA_CPU_FEATURES": ""}}
    if platform.machine().lower() in ("x86_64", "amd64"):
        have = host_features()
        if {"avx2", "fma"} <= have:
            out["haswell"] = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": ""}
        if {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"} <= have:
            out["skylake-avx512"] = {"NUMBA_CPU_NAME": "skylake-avx512",
                                     "NUMBA_CPU_FEATURES": ""}
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    found = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]
    if found:  # NumPy's baseline loops only, instead of its SIMD dispatch
        out["host+numpy-baseline"] = {"NPY_DISABLE_CPU_FEATURES": " ".join(found)}
    return out


def probe(env: dict[str, str], folder: str, fresh: bool) -> dict:
    run_env = {**os.environ, **env}
    if fresh:
        run_env.update(XDG_CACHE_HOME=folder, NUMBA_CACHE_DIR=str(Path(folder) / "numba"))
    done = subprocess.run([sys.executable, str(PROBE), folder], capture_output=True,
                          text=True, timeout=900, cwd=REPO, env=run_env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_group(names_envs: list[tuple[str, dict]]) -> dict[str, dict]:
    """Probes in order, writing into one fresh folder. Another numba target compiles into an
    empty cache there; the host ones (the host, and the NumPy variant on the same numba
    target) use the test run's cache (tests/conftest: empty when the run starts), so the
    host's kernels are compiled once per run, by the probe or by whichever test needs
    them first, and these are the host bits every other test computes."""
    with tempfile.TemporaryDirectory(prefix="firscope-probe-") as folder:
        return {name: probe(env, folder, fresh=not name.startswith("host"))
                for name, env in names_envs}


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    runs = targets()
    groups = [[(name, env)] for name, env in runs.items() if not name.startswith("host")]
    groups.insert(0, [(name, env) for name, env in runs.items() if name.startswith("host")])
    out: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:  # CI has two cores
        for got in pool.map(probe_group, groups):
            out.update(got)
    return out


def test_every_target_computes_the_same_bits(reports):
    assert {"host", "generic"} <= set(reports)
    host = reports["host"]
    assert len(host) > 50
    for name, rep in reports.items():
        differ = sorted(k for k in host if rep.get(k) != host[k] and not k.startswith("_target/"))
        assert not differ, f"{name} differs from the host in {len(differ)}: {differ[:8]}"


def test_each_target_takes_the_ways_its_cpu_has(reports):
    """The same bits come from different code per target: an fma from f64 arithmetic
    where the CPU has no FMA instruction (generic), the q4 table lookup only with
    AVX-512 (a permute of 16 lanes): each target reached by the cross-target test
    above took the way its CPU has, as LLVM itself says for the target's name."""
    want = {"generic": ("emulated", "convert"), "haswell": ("instruction", "convert"),
            "skylake-avx512": ("instruction", "table")}
    for name, (fma, q4) in want.items():
        if name in reports:
            assert (reports[name]["_target/fma"], reports[name]["_target/q4-dequant"]) == (fma, q4)


def test_each_report_holds_its_own_equalities(reports):
    """Inside one run: compiled = interp, the NumPy definitions = the numba kernels, the
    three quantizers agree, and the f32 products = their NumPy statement."""
    rep = reports["host"]
    for what in ("q4/logits", "q4/dump", "f32/logits", "f32/dump"):
        kind, part = what.split("/")
        assert rep[f"compiled-{kind}/{part}"] == rep[f"interp-{kind}/{part}"], what
    assert rep["compiled-q4/logits"] != rep["compiled-f32/logits"]
    # attention past the decodes' positions
    attn = [k for k in rep if k.startswith("attention/") and k.endswith("/compiled")]
    assert len(attn) == 6
    for key in attn:
        assert rep[key] == rep[key.replace("/compiled", "/interp")], key
        assert rep[key + "-split"] == rep[key], key  # lanes on two threads: the same bits
    assert rep["exp/numba"] == rep["exp/numpy"] and rep["sigmoid/numba"] == rep["sigmoid/numpy"]
    for key in rep:
        if key.startswith("q4/conv1d/"):
            assert rep[key] == rep[key.replace("conv1d", "rows")] == rep[key.replace("conv1d", "numpy")]
        if key.startswith("numpy/"):
            assert rep[key] == rep[key.replace("numpy/", "f32/")]
