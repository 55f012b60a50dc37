"""The f32 matrix-vector kernels of :mod:`firscope.runtime.gemv` (numba).

Imported on first use (it imports numba). Module-level functions: numba's
on-disk cache misses, in every new process, for a function that calls
another one through a closure (the parallel product recompiled at each
start, about 0.4 s).

Each row's sum is the reference's (model/numerics: 16 partial sums over the
row, element i into sum i mod 16, then a fixed tree), the same on every CPU:
the full blocks of 16 run in one vector (numeric_kernels.lanes_f32), the tail
into its partial sums, and the tree last. No fastmath.
"""
from __future__ import annotations

import numpy as np

from ..jitcache import prepare_numba
from ..model.numeric_kernels import fold_lanes, lanes_f32
from ..model.numerics import LANES

prepare_numba()

from numba import njit, prange  # noqa: E402 - after prepare_numba, which sets the cache folder


@njit(cache=True, nogil=True, error_model="numpy")
def f32_rows(w, x, y, r0, r1):  # pragma: no cover - compiled
    n = w.shape[1]
    blocks = n // LANES
    acc = np.empty(LANES, dtype=np.float32)
    for r in range(r0, r1):
        row = w[r]
        lanes_f32(acc, row, x, blocks)
        for i in range(blocks * LANES, n):
            acc[i - blocks * LANES] += row[i] * x[i]
        y[r] = fold_lanes(acc)


@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def f32_par(w, x, y, chunk):  # pragma: no cover - compiled
    rows = w.shape[0]
    for c in prange((rows + chunk - 1) // chunk):
        f32_rows(w, x, y, c * chunk, min(rows, c * chunk + chunk))


KERNELS = {"rows": f32_rows, "par": f32_par}
