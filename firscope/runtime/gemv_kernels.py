"""The f32 matrix-vector kernels of :mod:`firscope.runtime.gemv` (numba).

Imported on first use (it imports numba). Module-level functions: numba's
on-disk cache misses, in every new process, for a function that calls
another one through a closure (the parallel product recompiled at each
start, about 0.4 s).

Each row's sum is the reference's (model/numerics: 32 partial sums over the
row, element i into sum i mod 32 by a fused multiply-add, then a fixed tree), the same on every CPU:
rows whose columns are a multiple of 32 one at a time, the tree in registers
(numeric_kernels.dot_f32_row); other rows ROWS at a time in vectors
(numeric_kernels.lanes_f32_rows), the tail into their partial sums, and the
tree last. No fastmath.
"""
from __future__ import annotations

import numpy as np

from ..jitcache import prepare_numba
from ..model.numeric_kernels import (ROWS, dot_f32_row, fma32, fold_lanes, lanes_f32_row,
                                     lanes_f32_rows)
from ..model.numerics import LANES

prepare_numba()

from numba import njit, prange  # noqa: E402 - after prepare_numba, which sets the cache folder


# inlined: called (not inlined) it cost about 0.2 us a row once it held the fma intrinsic
@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def f32_tail(w, x, r, acc):  # pragma: no cover - compiled
    """Row r's columns past the last full block of 32 into its partial sums ``acc``."""
    n = w.shape[1]
    first = n // LANES * LANES
    for i in range(first, n):
        acc[i - first] = fma32(w[r, i], x[i], acc[i - first])


@njit(cache=True, nogil=True, error_model="numpy")
def f32_rows(w, x, y, r0, r1):  # pragma: no cover - compiled
    blocks = w.shape[1] // LANES
    r = r0
    if blocks * LANES == w.shape[1]:  # no tail: the tree in registers, straight into y
        # One row at a time: a decode's weights stream from memory, and one row's
        # sequential read ran at 0.84-0.93 of benchmarks/bandwidth.py's read (a read that
        # touched one line in two before 2026-12-05, so the fraction is overstated) where four
        # rows' interleaved reads ran at 0.70-0.86 (2-core AMD EPYC, AVX2; the f32 head,
        # 1 and 2 threads). Four rows are faster only on a matrix in cache.
        while r < r1:
            dot_f32_row(y, w, x, r, blocks)
            r += 1
        return
    acc = np.empty((ROWS, LANES), dtype=np.float32)
    while r + ROWS <= r1:
        lanes_f32_rows(acc, w, x, r, blocks)
        for k in range(ROWS):
            f32_tail(w, x, r + k, acc[k])
            y[r + k] = fold_lanes(acc[k])
        r += ROWS
    while r < r1:
        lanes_f32_row(acc, w, x, r, blocks)
        f32_tail(w, x, r, acc[0])
        y[r] = fold_lanes(acc[0])
        r += 1


@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def f32_par(w, x, y, chunk):  # pragma: no cover - compiled
    rows = w.shape[0]
    for c in prange((rows + chunk - 1) // chunk):
        f32_rows(w, x, y, c * chunk, min(rows, c * chunk + chunk))


KERNELS = {"rows": f32_rows, "par": f32_par}
