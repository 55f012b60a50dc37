"""The f32 matrix-vector kernels of :mod:`firscope.runtime.gemv` (numba).

Imported on first use (it imports numba). Module-level functions: numba's
on-disk cache misses, in every new process, for a function that calls
another one through a closure (the parallel product recompiled at each
start, about 0.4 s).
"""
from __future__ import annotations

import numpy as np

from ..jitcache import prepare_numba

prepare_numba()

from numba import njit, prange  # noqa: E402 - after prepare_numba, which sets the cache folder


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
def f32_rows(w, x, y, r0, r1):  # pragma: no cover - compiled
    n = w.shape[1]
    for r in range(r0, r1):
        acc = np.float32(0)
        for i in range(n):
            acc += w[r, i] * x[i]
        y[r] = acc


@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def f32_par(w, x, y, chunk):  # pragma: no cover - compiled
    rows = w.shape[0]
    for c in prange((rows + chunk - 1) // chunk):
        f32_rows(w, x, y, c * chunk, min(rows, c * chunk + chunk))


KERNELS = {"rows": f32_rows, "par": f32_par}
