"""The reference's numerics in numba: the definitions of :mod:`.numerics`, compiled.

Imported on first use (it imports numba). Nothing here is compiled with
``fastmath``: LLVM may then neither reassociate a sum nor fuse a multiply and
an add, so the code means the same on every target. What makes the dot
products fast anyway is that the 16 partial sums are written as one LLVM
vector ``<16 x float>`` (``lanes_f32``, ``lanes_q4``): element-wise vector
arithmetic has one meaning whatever width the machine splits it into (one
AVX-512 register, two AVX2, four SSE or NEON ones), so the vectorizing is
done here and not left to a loop vectorizer that would need ``reassoc``.
"""
from __future__ import annotations

import math

import numpy as np

from ..jitcache import prepare_numba
from .numerics import EXP_COEFFS, EXP_MAX, EXP_MIN, INV_LN2, LANES, LN2_HI, LN2_LO

prepare_numba()

from llvmlite import ir  # noqa: E402 - after prepare_numba, which sets the cache folder
from numba import njit  # noqa: E402
from numba.core import cgutils, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

_OPTS = dict(cache=True, nogil=True, error_model="numpy")
_F32 = ir.FloatType()
_I64 = ir.IntType(64)
C0, C1, C2, C3, C4, C5, C6 = EXP_COEFFS[:7]
C7, C8, C9, C10, C11, C12, C13 = EXP_COEFFS[7:]
F32_INF = np.float32(np.inf)
F32_ZERO = np.float32(0.0)
F32_ONE = np.float32(1.0)


def _vector_at(builder, data, offset, vec):
    """The ``vec``-typed value stored at element ``offset`` of the array data ``data``."""
    ptr = builder.bitcast(builder.gep(data, [offset]), vec.as_pointer())
    return builder.load(ptr, align=1)


def _store_lanes(builder, context, ary_type, ary, value, vec):
    data = context.make_array(ary_type)(context, builder, ary).data
    builder.store(value, builder.bitcast(data, vec.as_pointer()), align=1)


def _splat(builder, value, n):
    vec = ir.VectorType(value.type, n)
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(_I64, 0))
    return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), n), [0] * n))


@intrinsic
def lanes_f32(typingctx, acc, a, b, blocks):
    """acc[j] = sum over k < blocks, in increasing k, of a[16k + j] * b[16k + j] (f32
    products and sums, from +0.0). acc, a, b: contiguous 1-D f32 arrays."""
    sig = types.void(acc, a, b, blocks)

    def codegen(context, builder, signature, args):
        vec = ir.VectorType(_F32, LANES)
        pa = context.make_array(signature.args[1])(context, builder, args[1]).data
        pb = context.make_array(signature.args[2])(context, builder, args[2]).data
        total = context.cast(builder, args[3], signature.args[3], types.int64)
        accp = cgutils.alloca_once_value(builder, ir.Constant(vec, [0.0] * LANES))
        with cgutils.for_range(builder, total) as loop:
            off = builder.mul(loop.index, ir.Constant(_I64, LANES))
            prod = builder.fmul(_vector_at(builder, pa, off, vec), _vector_at(builder, pb, off, vec))
            builder.store(builder.fadd(builder.load(accp), prod), accp)
        _store_lanes(builder, context, signature.args[0], args[0], builder.load(accp), vec)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def lanes_q4(typingctx, acc, packed, scale, minimum, xe, xo, blocks):
    """The same for a q4 row of group 32 from its packed codes: block k is bytes
    8k..8k+7 (columns 16k..16k+15, group k >> 1); byte 8k+b holds column 16k+2b (low
    nibble, x in xe[8k+b]) and 16k+2b+1 (high nibble, xo[8k+b]). Each weight is
    dequantized as q * scale + min (f32 product, then f32 sum) before its product."""
    sig = types.void(acc, packed, scale, minimum, xe, xo, blocks)

    def codegen(context, builder, signature, args):
        half = LANES // 2
        vec, vec8 = ir.VectorType(_F32, half), ir.VectorType(ir.IntType(8), half)
        data = [context.make_array(t)(context, builder, v).data
                for t, v in zip(signature.args[1:6], args[1:6])]
        pk, psc, pmn, pxe, pxo = data
        total = context.cast(builder, args[6], signature.args[6], types.int64)
        zero = ir.Constant(vec, [0.0] * half)
        acce = cgutils.alloca_once_value(builder, zero)
        acco = cgutils.alloca_once_value(builder, zero)
        with cgutils.for_range(builder, total) as loop:
            k = loop.index
            off = builder.mul(k, ir.Constant(_I64, half))
            codes = _vector_at(builder, pk, off, vec8)
            lo = builder.uitofp(builder.and_(codes, ir.Constant(vec8, [15] * half)), vec)
            hi = builder.uitofp(builder.lshr(codes, ir.Constant(vec8, [4] * half)), vec)
            g = builder.lshr(k, ir.Constant(_I64, 1))
            s = _splat(builder, builder.load(builder.gep(psc, [g])), half)
            m = _splat(builder, builder.load(builder.gep(pmn, [g])), half)
            we = builder.fadd(builder.fmul(lo, s), m)
            wo = builder.fadd(builder.fmul(hi, s), m)
            pe = builder.fmul(we, _vector_at(builder, pxe, off, vec))
            po = builder.fmul(wo, _vector_at(builder, pxo, off, vec))
            builder.store(builder.fadd(builder.load(acce), pe), acce)
            builder.store(builder.fadd(builder.load(acco), po), acco)
        order = [j // 2 + (j % 2) * half for j in range(LANES)]  # e0 o0 e1 o1 ...
        lanes = builder.shuffle_vector(builder.load(acce), builder.load(acco),
                                       ir.Constant(ir.VectorType(ir.IntType(32), LANES), order))
        _store_lanes(builder, context, signature.args[0], args[0], lanes,
                     ir.VectorType(_F32, LANES))
        return context.get_dummy_value()
    return sig, codegen


@njit(**_OPTS)
def fold_lanes(s):  # pragma: no cover - compiled
    """s[j] += s[j + h] for h = 8, 4, 2, 1 (j < h); returns s[0]."""
    h = LANES
    while h > 1:
        h //= 2
        for j in range(h):
            s[j] = s[j] + s[j + h]
    return s[0]


@njit(**_OPTS)
def exp64(t):  # pragma: no cover - compiled
    """exp of f64 t in [EXP_MIN, EXP_MAX]: numerics.exp64_numpy, operation for operation."""
    n = np.rint(t * INV_LN2)
    r = (t - n * LN2_HI) - n * LN2_LO
    p = C13
    p = p * r + C12
    p = p * r + C11
    p = p * r + C10
    p = p * r + C9
    p = p * r + C8
    p = p * r + C7
    p = p * r + C6
    p = p * r + C5
    p = p * r + C4
    p = p * r + C3
    p = p * r + C2
    p = p * r + C1
    p = p * r + C0
    return math.ldexp(p, int(n))


@njit(**_OPTS)
def exp_f32(x):  # pragma: no cover - compiled
    """f32 exp, as numerics.exp_f32_numpy defines it."""
    if x != x:
        return x
    if x > EXP_MAX:
        return F32_INF
    if x < EXP_MIN:
        return F32_ZERO
    return np.float32(exp64(np.float64(x)))


@njit(**_OPTS)
def sigmoid_f32(x):  # pragma: no cover - compiled
    """f32 1 / (1 + exp(-x)), as numerics.sigmoid_f32_numpy defines it."""
    if x != x:
        return x
    if x < EXP_MIN:
        return F32_ZERO
    if x > -EXP_MIN:
        return F32_ONE
    return np.float32(1.0 / (1.0 + exp64(-np.float64(x))))


@njit(**_OPTS)
def exp_array(x, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = exp_f32(x[i])


@njit(**_OPTS)
def sigmoid_array(x, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = sigmoid_f32(x[i])
