"""f32 matrix-vector products for the ext ops, on numba's thread pool.

``fir.linear_t`` on the tied f32 head (GPT-2: 50257 x 768, 154 MB, the
largest read of a decode step) and ``fir.linear`` on an f32 ``[out, in]``
matrix (``--fir-f32``, or q4 on the dequant path) run here instead of in
OpenBLAS, so that one decode step uses one pool of threads: OpenBLAS's
threads spin for a while after each call, and on two cores they take the
core that numba's q4 kernels want next (benchmarks/decode.py measures both
ways with ``--f32-gemv blas``). Each row's sum has the reference's order
(model/numerics: the same on every CPU); BLAS's (``BACKEND["f32"] = "blas"``,
for measuring only) depends on the machine and is not the reference.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from ..jitcache import entry_for
from ..model.q4 import MATVEC_CHUNK_ROWS, PARALLEL_MIN_WEIGHTS
from ..model.threads import matvec_threads

# "numba" (default) or "blas": which implementation f32 products use. A switch
# for measuring, not a user option; change it only between decode steps.
BACKEND = {"f32": "numba"}

_KERNELS: dict = {}
_LOCK = threading.Lock()


def _kernels() -> dict:
    if not _KERNELS:
        with _LOCK:
            if not _KERNELS:
                from . import gemv_kernels  # imports numba
                _KERNELS.update(gemv_kernels.KERNELS)
    return _KERNELS


def warm() -> None:
    """Load (or compile) the kernels now rather than in the first decode step: numba
    loads a kernel from its cache at the first call, so the serial one is called on a
    tiny matrix and the parallel one compiled for its one signature."""
    k = _kernels()
    w = np.ones((2, 2), dtype=np.float32)
    x = np.ones(2, dtype=np.float32)
    y = np.empty(2, dtype=np.float32)
    k["rows"](w, x, y, 0, 2)
    # loaded, not run: running it here would start an OpenMP team in this thread too
    k["par"].compile("void(float32[:, ::1], float32[::1], float32[::1], int64)")


def f32_matvec(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = w @ x`` for f32 ``w`` [rows, cols]; ``out`` may overlap ``x``."""
    if BACKEND["f32"] != "numba" or w.ndim != 2 or w.shape[0] == 0 or w.shape[1] == 0:
        out[...] = w @ x
        return
    if w.dtype != np.float32 or not w.flags.c_contiguous:
        # a transposed view (a weight declared [in, out]): copied, so that its sums have
        # the reference's order too
        w = np.ascontiguousarray(w, dtype=np.float32)
    xc = np.array(x, dtype=np.float32)  # a copy: out may overlap x
    fn, args = _kernel(w, xc, out)
    fn(*args)


def _kernel(w: np.ndarray, x: np.ndarray, out: np.ndarray,
            threads: int | None = None) -> tuple[Callable, tuple]:
    """The kernel that computes ``out = w @ x`` on ``threads`` threads (None: numba's
    count now, asked only of a matrix large enough; its rows spread over them from
    PARALLEL_MIN_WEIGHTS on), and its arguments."""
    k = _kernels()
    if w.size >= PARALLEL_MIN_WEIGHTS and (matvec_threads() if threads is None
                                            else threads) > 1:
        return k["par"], (w, x, out, MATVEC_CHUNK_ROWS)
    return k["rows"], (w, x, out, 0, w.shape[0])


def f32_matvec_call(w: np.ndarray, x: np.ndarray, out: np.ndarray,
                    threads: int) -> tuple[Callable, tuple] | None:
    """(function, arguments) that do :func:`f32_matvec` (w, x, out) each time they are
    called, on ``threads`` threads (numba's count at the call), bound once: see
    Q4Matrix.matvec_call. None where f32_matvec does more than call one kernel (the BLAS
    backend, an empty or non-contiguous matrix, ``x`` or ``out`` not f32 C-contiguous of
    its sizes) or must copy ``x`` first (``out`` may overlap it)."""
    if (BACKEND["f32"] != "numba" or w.ndim != 2 or w.shape[0] == 0 or w.shape[1] == 0
            or any(a.dtype != np.float32 or not a.flags.c_contiguous for a in (w, x, out))
            or x.shape != (w.shape[1],) or out.shape != (w.shape[0],)
            or np.may_share_memory(x, out)):
        return None
    fn, args = _kernel(w, x, out, threads)
    return entry_for(fn, args), args
