"""The reference's numerics in numba: the definitions of :mod:`.numerics`, compiled.

Imported on first use (it imports numba). Nothing here is compiled with
``fastmath``: LLVM may then neither reassociate a sum nor fuse a multiply and
an add on its own, so the code means the same on every target; the dot
products' fused multiply-adds are written as such (one rounding: ``llvm.fma``,
the FMA instruction, or on a target without one the same value from f64
arithmetic, _fma_emulated). What makes the dot products fast anyway is that the 32
partial sums are written as one LLVM vector ``<32 x float>``
(``lanes_f32_rows``, ``lanes_q4_rows``): element-wise vector arithmetic has
one meaning whatever width the machine splits it into (two AVX-512
registers, four AVX2, eight SSE or NEON ones), so the vectorizing is done
here and not left to a loop vectorizer that would need ``reassoc``. The
``dot_*`` variants (rows whose columns are a multiple of 32) add the fixed
tree in registers and store the row's result. ROWS rows can go through the
loop together: one row's sums are a chain of dependent additions (one per
32 columns), and independent rows' chains overlap (the f32 kernels do; the
q4 ones, whose weights stream from memory in a decode, run one row at a
time, which streams better: see q4_kernels.q4_rows32).
"""
from __future__ import annotations

import numpy as np

from ..jitcache import prepare_numba
from .numerics import EXP_COEFFS, EXP_MAX, EXP_MIN, INV_LN2, LANES, LN2_HI, LN2_LO

prepare_numba()

from llvmlite import ir  # noqa: E402 - after prepare_numba, which sets the cache folder
from numba import njit  # noqa: E402
from numba.core import cgutils, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

_OPTS = dict(cache=True, nogil=True, error_model="numpy")
# The scalar functions the generated kernels call once per lane: inlined into the caller
# (a call per lane cost more than the function), which also keeps the caller's cache
# entry holding their code.
_INLINE = dict(_OPTS, inline="always")
_F32 = ir.FloatType()
_I64 = ir.IntType(64)
C0, C1, C2, C3, C4, C5, C6 = EXP_COEFFS[:7]
C7, C8, C9, C10, C11, C12, C13 = EXP_COEFFS[7:]
F32_INF = np.float32(np.inf)
F32_ZERO = np.float32(0.0)
F32_ONE = np.float32(1.0)


ROWS = 4  # rows one call of the vector kernels works on together


def _target_assembly(llvm_ir: str) -> str | None:
    """The assembly LLVM makes of ``llvm_ir`` for the CPU numba compiles for (its name and
    features, as numba's codegen chooses them: NUMBA_CPU_NAME, NUMBA_CPU_FEATURES, else
    the host's); None where LLVM cannot make it for that CPU."""
    import llvmlite.binding as ll
    from numba.core import config
    from numba.core.codegen import initialize_llvm
    try:
        initialize_llvm()
        name = config.CPU_NAME or ll.get_host_cpu_name()
        feats = (config.CPU_FEATURES if config.CPU_FEATURES is not None
                 else ll.get_host_cpu_features().flatten())
        machine = ll.Target.from_default_triple().create_target_machine(
            cpu=name, features=feats, opt=2)
        return machine.emit_assembly(ll.parse_assembly(llvm_ir))
    except Exception:  # noqa: BLE001 - LLVM could not: the caller takes the general way
        return None


_FMA_PROBE = """
declare float @llvm.fma.f32(float, float, float)
define float @probe(float %a, float %b, float %c) {
  %r = call float @llvm.fma.f32(float %a, float %b, float %c)
  ret float %r
}
"""
_ZMM_PROBE = """
define void @probe(<16 x float>* %p) {
  %v = load <16 x float>, <16 x float>* %p
  %r = fadd <16 x float> %v, %v
  store <16 x float> %r, <16 x float>* %p
  ret void
}
"""


def target_has_avx512() -> bool:
    """Whether numba compiles for a CPU with AVX-512F, asked of LLVM: whether a 16-lane
    f32 add is one instruction on a 512-bit register. (Not by compiling the permute
    itself: for a CPU without it LLVM stops the process instead of failing.)"""
    import platform
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    asm = _target_assembly(_ZMM_PROBE)
    return asm is not None and "zmm" in asm


def target_has_fma() -> bool:
    """Whether ``llvm.fma`` is an instruction on the CPU numba compiles for, asked of LLVM:
    where it becomes a call of libm's ``fmaf``, there is none (x86 before FMA3: numba's
    ``generic``, Sandy Bridge, Atom up to Goldmont Plus)."""
    asm = _target_assembly(_FMA_PROBE)
    return asm is not None and "fmaf" not in asm


# Without an FMA instruction every fma is computed from f64 arithmetic (_fma_emulated):
# the same value, the instruction's or libm's.
FMA_EMULATED = not target_has_fma()

# How the q4 dot products dequantize a group's codes. Both give the same bits (the
# table holds fma(k, scale, min) for k = 0..15, the value each weight's own fma gives);
# they differ in speed only. ``table``: one 16-lane fma per group, then a lookup per
# weight, which LLVM lowers to one permute instruction (vpermd) per 16 weights where
# AVX-512 has a 16-entry one; measured on AMD EPYC (Zen 4), 1 thread, fc-shaped matrix
# streamed from memory: 11.6 -> 12.8 GB/s on one core. Without AVX-512 the lookup
# is scalar (12x slower), so there each weight is converted and fused as it comes.
Q4_DEQUANT = "table" if target_has_avx512() else "convert"
# Bytes ahead of the codes being read that the q4 kernels ask the cache for (about five
# 768-column rows): on Zen 4, from memory, one core 12.8 GB/s without, 13.5 at 512 bytes
# ahead, 14.0 at 2048 (two cores 24.1 -> 26.3; no better further ahead, and prefetching
# the scales and mins too made it slower); nothing changes for a matrix already in cache.
Q4_PREFETCH = 2048


def _vector_at(builder, data, offset, vec):
    """The ``vec``-typed value stored at element ``offset`` of the array data ``data``."""
    ptr = builder.bitcast(builder.gep(data, [offset]), vec.as_pointer())
    return builder.load(ptr, align=1)


def _row_data(context, builder, ary_type, ary, row):
    """Pointer to element [row, 0] of a C-contiguous 2-D array."""
    a = context.make_array(ary_type)(context, builder, ary)
    cols = cgutils.unpack_tuple(builder, a.shape)[1]
    return builder.gep(a.data, [builder.mul(row, cols)])


def _splat(builder, value, n):
    vec = ir.VectorType(value.type, n)
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(_I64, 0))
    return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), n), [0] * n))


def _fma(builder, a, b, c, emulate: bool | None = None):
    """fma(a, b, c) of three values of one f32 or f32-vector type: LLVM's ``llvm.fma``
    where the target has an FMA instruction, else :func:`_fma_emulated` (FMA_EMULATED;
    ``emulate`` overrides it, for the tests)."""
    if FMA_EMULATED if emulate is None else emulate:
        return _fma_emulated(builder, a, b, c)
    ty = a.type
    suffix = f"v{ty.count}f32" if isinstance(ty, ir.VectorType) else "f32"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3),
                                        f"llvm.fma.{suffix}")
    return builder.call(fn, [a, b, c])


def _like(ty, elem, value):
    """A constant ``value`` of element type ``elem``, splat where ``ty`` is a vector type."""
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ir.VectorType(elem, ty.count), [value] * ty.count)
    return ir.Constant(elem, value)


def _fma_emulated(builder, a, b, c):
    """fma(a, b, c) for f32 (or f32 vectors) without an FMA instruction, exactly as
    numerics.fma_f32_numpy states it: the f64 product (exact), the f64 sum made
    round-to-odd from its TwoSum error, rounded once to f32. Plain f64 vector arithmetic,
    which SSE2 has: libm's ``fmaf``, what ``llvm.fma`` becomes on such a target, is a
    call per element, and where the CPU has no FMA its software path is slow (glibc 2.36,
    numba's ``generic``: q4 matvec 0.009 GB/s on one core against 0.20 with this, a
    decode step 4.1 s against 0.20)."""
    ty = a.type
    f64 = ir.DoubleType()
    i64 = ir.IntType(64)
    wide = ir.VectorType(f64, ty.count) if isinstance(ty, ir.VectorType) else f64
    iwide = ir.VectorType(i64, ty.count) if isinstance(ty, ir.VectorType) else i64
    a64, b64, c64 = (builder.fpext(v, wide) for v in (a, b, c))
    p = builder.fmul(a64, b64)  # exact: 24 + 24 bits
    s = builder.fadd(p, c64)
    bp = builder.fsub(s, p)
    err = builder.fadd(builder.fsub(p, builder.fsub(s, bp)), builder.fsub(c64, bp))
    zero = _like(ty, f64, 0.0)
    bits = builder.bitcast(s, iwide)
    even = builder.icmp_unsigned("==", builder.and_(bits, _like(ty, i64, 1)), _like(ty, i64, 0))
    finite = builder.fcmp_ordered("==", builder.fsub(s, s), zero)  # false for Inf, NaN
    inexact = builder.fcmp_ordered("!=", err, zero)
    fix = builder.and_(builder.and_(even, finite), inexact)
    # one f64 ULP towards the exact value: the magnitude grows where err has s's sign
    same = builder.icmp_unsigned("==", builder.fcmp_ordered(">", err, zero),
                                 builder.fcmp_ordered(">", s, zero))
    step = builder.select(same, _like(ty, i64, 1), _like(ty, i64, -1))
    odd = builder.bitcast(builder.add(bits, step), wide)
    return builder.fptrunc(builder.select(fix, odd, s), ty)


def _fold_vector(builder, v):
    """The fixed tree of fold_lanes on a <32 x float> value: for h = 16, 8, 4, 2, 1 the
    first h lanes plus the next h (one vector add per level); returns lane 0."""
    n = LANES
    while n > 1:
        h = n // 2
        undef = ir.Constant(v.type, ir.Undefined)
        lo = builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(ir.IntType(32), h),
                                                          list(range(h))))
        hi = builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(ir.IntType(32), h),
                                                          list(range(h, 2 * h))))
        v, n = builder.fadd(lo, hi), h
    return builder.extract_element(v, ir.Constant(_I64, 0))


def _fold_even_odd(builder, e, o):
    """_fold_vector of the 32 sums s with s[2i] = e[i], s[2i + 1] = o[i] (two <16 x float>),
    without interleaving them: the tree's levels h = 16, 8, 4, 2 add s[j] and s[j + h],
    both even or both odd, so each is an add within e or within o (e[i] + e[i + h/2]);
    the last level (h = 1) adds s[0] = e[0] and s[1] = o[0]. The same additions of the
    same values, so the same bits."""
    n = LANES // 2
    while n > 1:
        h = n // 2
        undef = ir.Constant(e.type, ir.Undefined)
        lo = ir.Constant(ir.VectorType(ir.IntType(32), h), list(range(h)))
        hi = ir.Constant(ir.VectorType(ir.IntType(32), h), list(range(h, 2 * h)))
        e = builder.fadd(builder.shuffle_vector(e, undef, lo), builder.shuffle_vector(e, undef, hi))
        o = builder.fadd(builder.shuffle_vector(o, undef, lo), builder.shuffle_vector(o, undef, hi))
        n = h
    zero = ir.Constant(_I64, 0)
    return builder.fadd(builder.extract_element(e, zero), builder.extract_element(o, zero))


def _store_lanes(context, builder, t_out, out, r0v, k, value, fold):
    """Row k's 32 partial sums ``value``: into row k of ``out`` [>= rows, 32], or, with
    ``fold``, summed by the fixed tree into ``out[r0 + k]`` (``out`` 1-D: the result)."""
    if fold:
        data = context.make_array(t_out)(context, builder, out).data
        ptr = builder.gep(data, [builder.add(r0v, ir.Constant(_I64, k))])
        builder.store(_fold_vector(builder, value), ptr)
        return
    row = _row_data(context, builder, t_out, out, ir.Constant(_I64, k))
    builder.store(value, builder.bitcast(row, value.type.as_pointer()), align=1)


def _c_layout(*arrays) -> bool:
    return all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)


def _lanes_f32(rows: int, fold: bool = False):
    @intrinsic
    def lanes(typingctx, acc, w, x, r0, blocks):
        """acc[k, j] = sum over b < blocks, in increasing b, of w[r0 + k, 32b + j] *
        x[32b + j] for k < rows (each step one fused multiply-add, from +0.0). C-contiguous
        arrays: acc [>= rows, 32], w [.., n], x [n]. With ``fold`` (rows of exactly
        ``blocks`` blocks), acc is y [..] and gets y[r0 + k] = the tree of those sums."""
        if not _c_layout(acc, w, x):
            return None
        sig = types.void(acc, w, x, r0, blocks)

        def codegen(context, builder, signature, args):
            vec = ir.VectorType(_F32, LANES)
            t_acc, t_w, t_x, t_r0, t_n = signature.args
            r0v = context.cast(builder, args[3], t_r0, types.int64)
            wrow = [_row_data(context, builder, t_w, args[1], builder.add(r0v, ir.Constant(_I64, k)))
                    for k in range(rows)]
            px = context.make_array(t_x)(context, builder, args[2]).data
            total = context.cast(builder, args[4], t_n, types.int64)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(vec, [0.0] * LANES))
                    for _ in range(rows)]
            with cgutils.for_range(builder, total) as loop:
                off = builder.mul(loop.index, ir.Constant(_I64, LANES))
                xv = _vector_at(builder, px, off, vec)
                for k in range(rows):  # independent sums: their latencies overlap
                    wv = _vector_at(builder, wrow[k], off, vec)
                    builder.store(_fma(builder, wv, xv, builder.load(accs[k])), accs[k])
            for k in range(rows):
                _store_lanes(context, builder, t_acc, args[0], r0v, k, builder.load(accs[k]),
                             fold)
            return context.get_dummy_value()
        return sig, codegen
    return lanes


def _prefetch(builder, data, offset):
    """Ask for the cache line holding element ``offset`` of ``data`` (a hint: no fault, no
    effect on any value; nothing on a target without prefetch instructions)."""
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8")
    ptr = builder.bitcast(builder.gep(data, [offset]), i8p)
    builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])


def _lookup(builder, table, index):
    """The vector of ``table[index[j] % 16]`` (``table`` 16 lanes, ``index`` i32 lanes: only
    their low 4 bits count). Where AVX-512 is the target, its 16-lane permute, which reads
    just those bits; elsewhere (only the tests use it there) masked, then lane by lane."""
    if Q4_DEQUANT == "table":
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(table.type, [table.type, index.type]),
            "llvm.x86.avx512.permvar.sf.512")
        return builder.call(fn, [table, index])
    index = builder.and_(index, ir.Constant(index.type, [15] * index.type.count))
    out = ir.Constant(table.type, ir.Undefined)
    for j in range(index.type.count):
        lane = ir.Constant(ir.IntType(32), j)
        out = builder.insert_element(
            out, builder.extract_element(table, builder.extract_element(index, lane)), lane)
    return out


def _lanes_q4(rows: int, fold: bool = False, dequant: str = "convert"):
    @intrinsic
    def lanes(typingctx, acc, packed, scale, minimum, xe, xo, r0, blocks):
        """The same for q4 rows of group 32 from their packed codes: block b is bytes
        16b..16b+15 of a row (columns 32b..32b+31, group b); byte 16b+i holds column
        32b+2i (low nibble, x in xe[16b+i]) and 32b+2i+1 (high nibble, xo[16b+i]). Each
        weight is dequantized as fma(q, scale, min) first, then fma(w, x, acc). ``fold``:
        as in _lanes_f32; ``dequant``: see Q4_DEQUANT."""
        if not _c_layout(acc, packed, scale, minimum, xe, xo):
            return None
        sig = types.void(acc, packed, scale, minimum, xe, xo, r0, blocks)

        def codegen(context, builder, signature, args):
            half = LANES // 2
            vec, vec8 = ir.VectorType(_F32, half), ir.VectorType(ir.IntType(8), half)
            vec32 = ir.VectorType(ir.IntType(32), half)
            t = signature.args
            r0v = context.cast(builder, args[6], t[6], types.int64)
            rws = [builder.add(r0v, ir.Constant(_I64, k)) for k in range(rows)]
            pk = [_row_data(context, builder, t[1], args[1], r) for r in rws]
            psc = [_row_data(context, builder, t[2], args[2], r) for r in rws]
            pmn = [_row_data(context, builder, t[3], args[3], r) for r in rws]
            pxe = context.make_array(t[4])(context, builder, args[4]).data
            pxo = context.make_array(t[5])(context, builder, args[5]).data
            total = context.cast(builder, args[7], t[7], types.int64)
            zero = ir.Constant(vec, [0.0] * half)
            acce = [cgutils.alloca_once_value(builder, zero) for _ in range(rows)]
            acco = [cgutils.alloca_once_value(builder, zero) for _ in range(rows)]
            iota = ir.Constant(vec, [float(k) for k in range(half)])
            with cgutils.for_range(builder, total) as loop:
                b = loop.index
                off = builder.mul(b, ir.Constant(_I64, half))
                g = b  # one group of 32 per block
                xev, xov = _vector_at(builder, pxe, off, vec), _vector_at(builder, pxo, off, vec)
                for k in range(rows):  # independent sums: their latencies overlap
                    _prefetch(builder, pk[k], builder.add(off, ir.Constant(_I64, Q4_PREFETCH)))
                    # the codes as 32-bit integers (0..255), their nibbles converted exactly
                    codes = builder.zext(_vector_at(builder, pk[k], off, vec8), vec32)
                    hi_i = builder.lshr(codes, ir.Constant(vec32, [4] * half))
                    s = _splat(builder, builder.load(builder.gep(psc[k], [g])), half)
                    m = _splat(builder, builder.load(builder.gep(pmn[k], [g])), half)
                    if dequant == "table":  # the lookup reads the low nibble of the codes
                        table = _fma(builder, iota, s, m)  # fma(k, scale, min), k = 0..15
                        we, wo = _lookup(builder, table, codes), _lookup(builder, table, hi_i)
                    else:
                        lo_i = builder.and_(codes, ir.Constant(vec32, [15] * half))
                        lo, hi = builder.sitofp(lo_i, vec), builder.sitofp(hi_i, vec)
                        we, wo = _fma(builder, lo, s, m), _fma(builder, hi, s, m)
                    builder.store(_fma(builder, we, xev, builder.load(acce[k])), acce[k])
                    builder.store(_fma(builder, wo, xov, builder.load(acco[k])), acco[k])
            order = [j // 2 + (j % 2) * half for j in range(LANES)]  # e0 o0 e1 o1 ...
            mask = ir.Constant(ir.VectorType(ir.IntType(32), LANES), order)
            for k in range(rows):
                e, o = builder.load(acce[k]), builder.load(acco[k])
                if fold:  # the tree straight from the even and odd sums: no interleave
                    y = context.make_array(t[0])(context, builder, args[0]).data
                    builder.store(_fold_even_odd(builder, e, o),
                                  builder.gep(y, [builder.add(r0v, ir.Constant(_I64, k))]))
                    continue
                lanes32 = builder.shuffle_vector(e, o, mask)
                _store_lanes(context, builder, t[0], args[0], r0v, k, lanes32, False)
            return context.get_dummy_value()
        return sig, codegen
    return lanes


lanes_f32_rows, lanes_f32_row = _lanes_f32(ROWS), _lanes_f32(1)
lanes_q4_rows = _lanes_q4(ROWS, dequant=Q4_DEQUANT)
lanes_q4_row = _lanes_q4(1, dequant=Q4_DEQUANT)
# Rows without a tail (columns a multiple of 32): the tree in vector registers, the
# result straight into y (no partial sums through memory, no call per row).
dot_f32_row = _lanes_f32(1, True)
dot_q4_row = _lanes_q4(1, True, Q4_DEQUANT)
# Both ways of dequantizing, whatever the target, for the tests that they agree bit for bit.
DOT_Q4_BY_DEQUANT = {d: _lanes_q4(1, True, d) for d in ("convert", "table")}


@intrinsic
def fma32(typingctx, a, b, c):
    """fma(a, b, c) of three f32: a * b + c rounded once (the machine's FMA instruction
    where it has one, _fma_emulated where it has none; never the two roundings of a
    multiply and an add)."""
    if not all(t == types.float32 for t in (a, b, c)):
        return None
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return _fma(builder, *args)
    return sig, codegen


@intrinsic
def pow2(typingctx, k):
    """2.0 ** k as an f64, for -1022 <= k <= 1023: the exponent bits, no call to ldexp."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        k64 = context.cast(builder, args[0], signature.args[0], types.int64)
        bits = builder.shl(builder.add(k64, ir.Constant(_I64, 1023)), ir.Constant(_I64, 52))
        return builder.bitcast(bits, ir.DoubleType())
    return sig, codegen


@njit(**_INLINE)  # once per row: a call cost as much as the fold
def fold_lanes(s):  # pragma: no cover - compiled
    """s[j] += s[j + h] for h = 8, 4, 2, 1 (j < h); returns s[0]."""
    h = LANES
    while h > 1:
        h //= 2
        for j in range(h):
            s[j] = s[j] + s[j + h]
    return s[0]


@njit(**_INLINE)
def exp64(t):  # pragma: no cover - compiled
    """exp of f64 t: numerics.exp64_numpy, operation for operation."""
    n = np.rint(t * INV_LN2)
    r = (t - n * LN2_HI) - n * LN2_LO
    r2 = r * r
    r4 = r2 * r2
    r8 = r4 * r4
    s0 = (C0 + C1 * r) + (C2 + C3 * r) * r2
    s1 = (C4 + C5 * r) + (C6 + C7 * r) * r2
    s2 = (C8 + C9 * r) + (C10 + C11 * r) * r2
    s3 = C12 + C13 * r
    p = (s0 + s1 * r4) + (s2 + s3 * r4) * r8
    k = int(n)
    half = k >> 1
    return p * pow2(half) * pow2(k - half)


@njit(**_INLINE)
def exp_f32(x):  # pragma: no cover - compiled
    """f32 exp, as numerics.exp_f32_numpy defines it. Selects, not branches: exp64 runs
    on the clamped argument (a NaN clamps to EXP_MIN) whatever x is, and the special
    cases replace its result, so that a loop over lanes that calls it vectorizes."""
    t = np.float64(x)
    t = t if t > EXP_MIN else EXP_MIN
    t = t if t < EXP_MAX else EXP_MAX
    v = np.float32(exp64(t))
    v = F32_INF if x > EXP_MAX else v
    v = F32_ZERO if x < EXP_MIN else v
    return x if x != x else v


@njit(**_INLINE)
def sigmoid_f32(x):  # pragma: no cover - compiled
    """f32 1 / (1 + exp(-x)), as numerics.sigmoid_f32_numpy defines it; selects, as
    exp_f32."""
    t = -np.float64(x)
    t = t if t > EXP_MIN else EXP_MIN
    t = t if t < -EXP_MIN else -EXP_MIN
    v = np.float32(1.0 / (1.0 + exp64(t)))
    v = F32_ZERO if x < EXP_MIN else v
    v = F32_ONE if x > -EXP_MIN else v
    return x if x != x else v


@njit(**_OPTS)
def exp_array(x, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = exp_f32(x[i])


@njit(**_OPTS)
def sigmoid_array(x, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = sigmoid_f32(x[i])
