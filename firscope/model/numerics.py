"""What the reference computes, exactly: the one summation order and the transcendentals.

Every value firscope's reference (the step interpreter and the compiled
engine) computes is defined here to the last bit, so that it is the same on
every CPU whatever its vector width, FMA or libm (docs/reference-numerics.md
says it for a reader). This module is the NumPy statement of each definition;
:mod:`.numeric_kernels` is the numba one the kernels run, and the tests hold
the two equal bit for bit. Only IEEE-754 basic operations (+ - * /, sqrt,
conversions, fused multiply-add, all correctly rounded), ``rint`` and ``ldexp``
(both exact) are used: no libm transcendental, no reassociation.

Dot products (``fir.linear``, ``fir.linear_t``, on f32 and q4 weights):
``LANES`` = 32 partial sums; element ``i`` of a row is added, in increasing
``i``, to partial sum ``i mod 32`` by one fused multiply-add,
``s = fma(w[i], x[i], s)`` (the exact ``w[i] * x[i] + s`` rounded once to f32;
partial sums start at +0.0). Then a fixed tree: ``s[j] += s[j + h]`` for
h = 16, 8, 4, 2, 1 (j < h); the result is ``s[0]``. A q4 weight is first
dequantized to f32 as ``fma(q, scale, min)`` (rounded once), so the packed path
and the dequantized path are one computation. ``fma`` is IEEE-754's
fusedMultiplyAdd: one value on every machine (the kernels use the FMA
instruction, or where there is none the f64 arithmetic :func:`fma_f32_numpy`
states, which is its exact NumPy statement).

``exp(x)`` and ``sigmoid(x)`` are computed in float64 by the algorithm below
and rounded once to f32: the f64 value is within about 2^-51 of the true one,
so the f32 result is the correctly rounded one except for inputs within that
distance of a rounding boundary (about one in 10^8), and it is the same on
every machine in every case.
"""
from __future__ import annotations

import math

import numpy as np

LANES = 32  # partial sums of every dot product
LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # ln 2, its high 32 bits (n * LN2_HI is exact)
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")  # ln 2 - LN2_HI
INV_LN2 = float.fromhex("0x1.71547652b82fep+0")  # 1 / ln 2, rounded to f64
# Taylor coefficients 1/k! (k = 0..13) rounded to f64: on |r| <= ln2/2 the truncation
# error is below 2^-60 of the result.
EXP_COEFFS = tuple(1.0 / math.factorial(k) for k in range(14))
EXP_MAX = 89.0  # exp(x) > 4e38 above this: f32 +inf
EXP_MIN = -104.0  # exp(x) < 2^-150 below this: f32 0 (half the smallest subnormal)


def exp64_numpy(t: np.ndarray) -> np.ndarray:
    """exp of f64 ``t`` (the f32 functions clamp it to [EXP_MIN, EXP_MAX]; the sampler uses
    it on [-800, 0], where the result underflows to 0 as it should): t = n ln2 + r with
    n = rint(t / ln2) and r = (t - n LN2_HI) - n LN2_LO; exp(r) by the degree-13 Taylor
    polynomial evaluated in Estrin's scheme, exactly as written below (a short chain of
    dependent operations, unlike Horner's 13 steps); then times 2^(n>>1) and times
    2^(n - (n>>1)), powers of two that are normal f64 (the first product is exact, the
    second rounds once: this is ldexp(p, n))."""
    c = EXP_COEFFS
    n = np.rint(t * INV_LN2)
    r = (t - n * LN2_HI) - n * LN2_LO
    r2 = r * r
    r4 = r2 * r2
    r8 = r4 * r4
    s0 = (c[0] + c[1] * r) + (c[2] + c[3] * r) * r2
    s1 = (c[4] + c[5] * r) + (c[6] + c[7] * r) * r2
    s2 = (c[8] + c[9] * r) + (c[10] + c[11] * r) * r2
    s3 = c[12] + c[13] * r
    p = (s0 + s1 * r4) + (s2 + s3 * r4) * r8
    k = n.astype(np.int64)
    half = k >> 1
    return p * np.ldexp(1.0, half) * np.ldexp(1.0, k - half)


def exp_f32_numpy(x: np.ndarray) -> np.ndarray:
    """f32 exp(x): NaN stays NaN, x > EXP_MAX is +inf, x < EXP_MIN is +0, otherwise
    exp64 in f64 rounded once to f32."""
    x = np.asarray(x, dtype=np.float32)
    t = np.clip(x.astype(np.float64), EXP_MIN, EXP_MAX)
    with np.errstate(over="ignore", invalid="ignore"):
        out = exp64_numpy(np.nan_to_num(t)).astype(np.float32)
    out[x > EXP_MAX] = np.inf
    out[x < EXP_MIN] = 0.0
    nan = np.isnan(x)
    out[nan] = x[nan]
    return out


def sigmoid_f32_numpy(x: np.ndarray) -> np.ndarray:
    """f32 1 / (1 + exp(-x)): x < EXP_MIN is +0, x > -EXP_MIN is 1, otherwise
    1 / (1 + exp64(-x)) in f64 rounded once to f32; NaN stays NaN."""
    x = np.asarray(x, dtype=np.float32)
    t = np.clip(-x.astype(np.float64), EXP_MIN, -EXP_MIN)
    out = (1.0 / (1.0 + exp64_numpy(np.nan_to_num(t)))).astype(np.float32)
    out[x < EXP_MIN] = 0.0
    out[x > -EXP_MIN] = 1.0
    nan = np.isnan(x)
    out[nan] = x[nan]
    return out


def fma_f32_numpy(a, b, c) -> np.ndarray:
    """IEEE fusedMultiplyAdd of f32 arrays (broadcast): ``a * b + c`` rounded once to f32.

    In f64 the product of two f32 is exact (48 bits), but ``f32(f64(a b) + f64(c))``
    would round twice. So the f64 sum is made round-to-odd first: its exact error
    comes from Knuth's TwoSum, and where the sum is inexact and its last bit is even it
    moves one f64 ULP towards the exact value. An f64 (53 bits) rounded to odd then
    rounded to f32 (24 bits, >= 2 bits fewer) is the correctly rounded f32 of the exact
    value (Boldo and Melquiond), subnormal and overflowing results included."""
    a = np.asarray(a, dtype=np.float32).astype(np.float64)
    b = np.asarray(b, dtype=np.float32).astype(np.float64)
    c = np.asarray(c, dtype=np.float32).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        p = a * b  # exact
        s = p + c
        bp = s - p
        err = (p - (s - bp)) + (c - bp)  # s + err == p + c exactly (s finite)
        even = (s.view(np.int64) & 1) == 0
        fix = np.isfinite(s) & (err != 0) & even
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


def fold_lanes_numpy(s: np.ndarray) -> np.ndarray:
    """[..., 32] partial sums -> [...]: s[j] + s[j + h] for h = 16, 8, 4, 2, 1."""
    h = LANES
    while h > 1:
        h //= 2
        s = s[..., :h] + s[..., h: 2 * h]
    return s[..., 0]


def dot_f32_numpy(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``w @ x`` for f32 ``w`` [rows, n] and ``x`` [n] in the reference's order (the
    module docstring); what every matvec kernel must equal bit for bit."""
    w = np.asarray(w, dtype=np.float32)
    x = np.asarray(x, dtype=np.float32)
    rows, n = w.shape
    s = np.zeros((rows, LANES), dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for i0 in range(0, n, LANES):
            k = min(LANES, n - i0)
            s[:, :k] = fma_f32_numpy(w[:, i0: i0 + k], x[i0: i0 + k], s[:, :k])
        return fold_lanes_numpy(s)
