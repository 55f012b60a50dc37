"""The q4 kernels (numba): quantize, dequantize, and the packed-code matvec.

Imported on first use by :func:`firscope.model.q4._kernels` (importing this
module imports numba). Every kernel is a module-level function: numba's
on-disk cache misses, in every new process, for a function that calls
another one through a closure, which is how these were written before (the
parallel matvec and the quantizer recompiled at each start, 0.5-1 s each).

Quantizing: loops index slices from 0, because numba adds negative-index
wrap-around code to any index it cannot prove non-negative, and that kept the
loops from vectorizing (twice as slow).

The matvec, y = dequantize(W) @ x from the packed codes, serial (a row range)
or parallel: each weight is dequantized as ``fma(q, scale, min)`` (one fused
multiply-add, rounded once) and added times its x into its partial sum by
another one, and the row's sum is the reference's (model/numerics), so the
result is bit for bit the f32 kernel's on the dequantized matrix, on every CPU. Nothing is compiled with
fastmath; NaN and Inf propagate.
"""
from __future__ import annotations

import numpy as np

from ..jitcache import prepare_numba
from .numeric_kernels import (ROWS, dot_q4_row, fma32, fold_lanes, lanes_q4_row,
                              lanes_q4_rows)
from .numerics import LANES

prepare_numba()

from numba import njit, prange  # noqa: E402 - after prepare_numba, which sets the cache folder

f15 = np.float32(15)
one = np.float32(1)
fmax = np.float32(np.finfo(np.float32).max)
opts = dict(cache=True, nogil=True, error_model="numpy")
par = dict(cache=True, nogil=True, error_model="numpy", parallel=True)


@njit(**opts)
def quantize_row(v, group, codes, pk, scale, minimum):  # pragma: no cover - compiled
    """One row, ``v`` already padded to ngroups * group with its last element: scale
    and min per group, codes (uint8, one spare 0 at the end) and their packing."""
    for g in range(scale.shape[0]):
        seg = v[g * group: g * group + group]
        out = codes[g * group: g * group + group]
        lo = seg[0]
        hi = seg[0]
        for c in range(1, seg.shape[0]):
            x = seg[c]
            if x < lo:
                lo = x
            if x > hi:
                hi = x
        sc = (hi - lo) / f15
        if sc == 0:
            sc = one
        scale[g] = sc
        minimum[g] = lo
        inv = np.float64(sc)
        for c in range(seg.shape[0]):
            q = np.rint(np.float64(seg[c] - lo) / inv)  # f32 difference, f64 quotient
            out[c] = np.uint8(min(max(q, 0.0), 15.0))
    for i in range(pk.shape[0]):
        pk[i] = codes[2 * i] | (codes[2 * i + 1] << 4)


@njit(**opts)
def gather(src, out):  # pragma: no cover - compiled
    """out[:] = src[:] (1-D f32); returns how many are NaN or Inf."""
    bad = 0
    for c in range(src.shape[0]):
        x = src[c]
        out[c] = x
        if not abs(x) <= fmax:
            bad += 1
    return bad


@njit(**opts)
def quantize_rows(w, group, packed, scale, minimum):  # pragma: no cover - compiled
    """[out, in] matrix, row by row; returns the number of non-finite weights (then
    nothing is meaningful)."""
    cols = w.shape[1]
    padded = scale.shape[1] * group
    v = np.empty(padded, dtype=np.float32)
    codes = np.zeros(padded + 1, dtype=np.uint8)
    bad = 0
    for r in range(w.shape[0]):
        bad += gather(w[r], v[:cols])
        v[cols:] = w[r, cols - 1]  # the padding repeats the row's last element
        quantize_row(v, group, codes, packed[r], scale[r], minimum[r])
    return bad


@njit(**opts)
def quantize_conv1d(w, group, packed, scale, minimum, block):  # pragma: no cover
    """The same for the transpose of an HF Conv1D weight ``w`` [in, out], read as it
    lies in the checkpoint: ``block`` output rows at a time are gathered into a tile
    (one cache line of each input row serves them all), so no transposed copy of
    the matrix is ever made."""
    cols, rows = w.shape
    padded = scale.shape[1] * group
    # Rows one cache line longer than needed: rows of 2^k (or 3 * 2^k) bytes made the
    # gather's stores alias each other in the cache and cost twice the time.
    tile = np.empty((block, padded + 16), dtype=np.float32)
    codes = np.zeros(padded + 1, dtype=np.uint8)
    bad = 0
    for r0 in range(0, rows, block):
        nb = min(block, rows - r0)
        for c in range(cols):
            src = w[c, r0: r0 + nb]
            for k in range(src.shape[0]):
                x = src[k]
                tile[k, c] = x
                if not abs(x) <= fmax:
                    bad += 1
        for k in range(nb):
            row = tile[k, :padded]
            row[cols:] = row[cols - 1]
            quantize_row(row, group, codes, packed[r0 + k], scale[r0 + k],
                         minimum[r0 + k])
    return bad


@njit(**opts)
def dequantize(packed, scale, minimum, group, out):  # pragma: no cover - compiled
    rows, cols = out.shape
    for r in range(rows):
        for g in range(scale.shape[1]):
            sc = scale[r, g]
            mn = minimum[r, g]
            for c in range(g * group, min(g * group + group, cols)):
                k = (packed[r, c >> 1] >> ((c & 1) << 2)) & 15
                out[r, c] = fma32(np.float32(k), sc, mn)


# inlined: called (not inlined) it cost about 0.2 us a row once it held the fma intrinsic
@njit(**opts, inline="always")
def q4_tail32(packed, scale, minimum, xe, xo, cols, r, acc):  # pragma: no cover - compiled
    """Row r's columns past the last full block of 32 into its partial sums ``acc``."""
    first = cols // LANES * LANES
    for c in range(first, cols):
        k = (packed[r, c >> 1] >> ((c & 1) << 2)) & 15
        xc = xe[c >> 1] if (c & 1) == 0 else xo[c >> 1]
        w = fma32(np.float32(k), scale[r, c >> 5], minimum[r, c >> 5])
        acc[c - first] = fma32(w, xc, acc[c - first])


@njit(**opts)
def q4_rows32(packed, scale, minimum, xe, xo, cols, y, r0, r1):  # pragma: no cover - compiled
    # Group 32: the full blocks of 32 columns (one group) of ROWS rows at a time run in vectors
    # (lanes_q4_rows, which deinterleaves nothing: even columns come from xe, odd ones
    # from xo), then each row's tail into its partial sums, then the fixed tree.
    blocks = cols // LANES
    r = r0
    if blocks * LANES == cols:  # no tail: the tree in registers, straight into y
        # One row at a time: the weights come from memory (a model's do not fit a cache)
        # and one row's sequential stream ran at the old fastmath kernel's speed, where
        # four rows' interleaved streams, faster on a matrix in cache, took 1.3-2x longer.
        while r < r1:
            dot_q4_row(y, packed, scale, minimum, xe, xo, r, blocks)
            r += 1
        return
    acc = np.empty((ROWS, LANES), dtype=np.float32)
    while r + ROWS <= r1:
        lanes_q4_rows(acc, packed, scale, minimum, xe, xo, r, blocks)
        for k in range(ROWS):
            q4_tail32(packed, scale, minimum, xe, xo, cols, r + k, acc[k])
            y[r + k] = fold_lanes(acc[k])
        r += ROWS
    while r < r1:
        lanes_q4_row(acc, packed, scale, minimum, xe, xo, r, blocks)
        q4_tail32(packed, scale, minimum, xe, xo, cols, r, acc[0])
        y[r] = fold_lanes(acc[0])
        r += 1


@njit(**opts, inline="always")
def split_x(x, half):  # pragma: no cover - compiled
    """x's even and odd columns (the layout of a row's bytes: low nibbles even, high
    nibbles odd), ``half`` long each, zero past the end (padding codes then add exactly
    0). Copies: the product's output may overlap x."""
    xe = np.zeros(half, dtype=np.float32)
    xo = np.zeros(half, dtype=np.float32)
    n = x.shape[0]
    for i in range(n // 2):
        xe[i] = x[2 * i]
        xo[i] = x[2 * i + 1]
    if n & 1:
        xe[n // 2] = x[n - 1]
    return xe, xo


@njit(**opts)
def q4_x32(packed, scale, minimum, x, y, r0, r1):  # pragma: no cover - compiled
    """Rows r0..r1 of y = W x for a group-32 matrix: x split here, not in Python (two
    allocations and two strided copies cost more than a small row range's product)."""
    xe, xo = split_x(x, packed.shape[1])
    q4_rows32(packed, scale, minimum, xe, xo, x.shape[0], y, r0, r1)


@njit(**opts)
def q4_rows_any(packed, scale, minimum, group, x, y, r0, r1):  # pragma: no cover
    cols = x.shape[0]
    acc = np.empty(LANES, dtype=np.float32)
    for r in range(r0, r1):
        acc[:] = 0
        for g in range(scale.shape[1]):
            s = scale[r, g]
            m = minimum[r, g]
            for c in range(g * group, min(g * group + group, cols)):
                k = (packed[r, c >> 1] >> ((c & 1) << 2)) & 15
                j = c & (LANES - 1)
                acc[j] = fma32(fma32(np.float32(k), s, m), x[c], acc[j])
        y[r] = fold_lanes(acc)


@njit(**par)
def q4_par_x32(packed, scale, minimum, x, y, chunk):  # pragma: no cover - compiled
    xe, xo = split_x(x, packed.shape[1])
    cols = x.shape[0]
    rows = packed.shape[0]
    for c in prange((rows + chunk - 1) // chunk):
        q4_rows32(packed, scale, minimum, xe, xo, cols, y, c * chunk,
                  min(rows, c * chunk + chunk))


@njit(**par)
def q4_par_any(packed, scale, minimum, group, x, y, chunk):  # pragma: no cover
    rows = packed.shape[0]
    for c in prange((rows + chunk - 1) // chunk):
        q4_rows_any(packed, scale, minimum, group, x, y, c * chunk,
                    min(rows, c * chunk + chunk))


KERNELS = {
    "quant": {"dequantize": dequantize, "quantize": quantize_rows,
              "quantize_conv1d": quantize_conv1d},
    "matvec": {"q4_rows32": q4_rows32, "q4_rows_any": q4_rows_any, "q4_par_any": q4_par_any,
               "q4_x32": q4_x32, "q4_par_x32": q4_par_x32},
}
