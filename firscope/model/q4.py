"""Grouped asymmetric int4, as the .fir format defines it.

For each row of a ``[out, in]`` matrix, each run of ``G`` consecutive input
elements is a group with ``scale = (max - min) / 15`` and
``q = clip(round((w - min) / scale), 0, 15)``; ``w' = q * scale + min``.
A group whose max equals its min gets scale 1 and q 0. Codes are packed two
per byte, low nibble first. Rounding is NumPy's round-half-to-even.

The matrix stays in this form in memory: :meth:`Q4Matrix.matvec` multiplies
by the packed codes directly (a numba kernel, parallel over output rows), and
equals "dequantize, then f32 matvec" bit for bit: the weight ``q * scale + min``
is an f32 product then an f32 sum, and the row's sum has the reference's order
(model/numerics, docs/reference-numerics.md). An f32 copy is made only when one
is asked for (:meth:`Q4Matrix.dequantize`, or :meth:`Q4Matrix.dense`, which
keeps it for a viewer that looks at the same weight again).

A group whose range ``max - min`` is beyond the f32 maximum (a group holding
+3e38 and -3e38) has no f32 scale: :func:`quantize` refuses it with
:class:`Q4RangeError` (the loader names the tensor) instead of storing NaN.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..defaults import DEFAULT_GROUP
from ..jitcache import entry_for
from .threads import matvec_threads

# The group the vectorized matvec is written for (16 bytes of codes per group,
# one scale broadcast per 16 bytes); any other group size takes the general kernel.
FAST_GROUP = 32
# Below this many weights a matvec runs on the calling thread: waking the other
# threads costs more than the work (the sample model's linears are 16k-64k weights).
PARALLEL_MIN_WEIGHTS = 1 << 18
MATVEC_CHUNK_ROWS = 64  # rows per parallel work item
# How the runtime multiplies by a q4 matrix: its packed codes, or an f32 copy made at load.
Q4_PATHS = ("packed", "dequant")


class Q4RangeError(ValueError):
    """A group's range does not fit in f32, so it has no int4 step (``max - min`` / 15)."""

    def __init__(self, row: int, group_index: int, first: int, last: int, lo: float,
                 hi: float):
        self.row, self.group_index, self.first, self.last = row, group_index, first, last
        self.lo, self.hi = lo, hi
        super().__init__(
            f"row {row} (an output), columns {first}..{last} (group {group_index}) span "
            f"{lo:.7g} to {hi:.7g}: the int4 step (max - min) / 15 and the largest code's "
            "value do not fit in f32, so this tensor cannot be quantized to q4")


@dataclass(frozen=True)
class Q4Matrix:
    rows: int
    cols: int
    group: int
    packed: np.ndarray  # uint8 [rows, ceil(ngroups*group/2)]
    scale: np.ndarray  # f32 [rows, ngroups]
    minimum: np.ndarray  # f32 [rows, ngroups]
    # The dequantized matrix, once someone asked to look at it (see dense()).
    _dense: list = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def ngroups(self) -> int:
        return self.scale.shape[1]

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scale.nbytes + self.minimum.nbytes

    def codes(self) -> np.ndarray:
        """uint8 codes 0..15 of shape [rows, cols]."""
        p = self.packed
        codes = np.empty((self.rows, p.shape[1] * 2), dtype=np.uint8)
        codes[:, 0::2] = p & 0x0F
        codes[:, 1::2] = p >> 4
        return codes[:, : self.cols]

    def dequantize(self, out: np.ndarray | None = None) -> np.ndarray:
        """f32 [rows, cols]: q * scale + min, computed in f32."""
        if out is None:
            out = np.empty((self.rows, self.cols), dtype=np.float32)
        if out.dtype == np.float32 and out.flags.c_contiguous and self.cols:
            _kernels("quant")["dequantize"](self.packed, self.scale, self.minimum, self.group, out)
            return out
        out[...] = self.dequantize_numpy()
        return out

    def dense(self) -> np.ndarray:
        """The dequantized f32 [rows, cols], made on first use and kept (read-only).

        For viewers (debugger expressions, the buffers view): the decode path
        never calls it, so a model nobody inspects holds no f32 copy.
        """
        if not self._dense:
            d = self.dequantize()
            d.flags.writeable = False
            self._dense.append(d)
        return self._dense[0]

    def drop_dense(self) -> None:
        """Forget the copy :meth:`dense` made."""
        self._dense.clear()

    def matvec(self, x: np.ndarray, out: np.ndarray | None = None, *,
               parallel: bool | None = None) -> np.ndarray:
        """``dequantize() @ x`` computed from the packed codes, in f32.

        ``x``: f32 [cols]; ``out``: f32 [rows] (may overlap ``x``: ``x`` is read
        in full before anything is written). ``parallel``: None chooses by size.
        """
        x = np.asarray(x)
        if x.shape != (self.cols,):
            raise ValueError(f"matvec: x has shape {x.shape}, the matrix has {self.cols} columns")
        if out is None:
            out = np.empty(self.rows, dtype=np.float32)
        elif out.shape != (self.rows,) or out.dtype != np.float32:
            raise ValueError(f"matvec: out must be f32 [{self.rows}], got {out.dtype} {out.shape}")
        if self.rows == 0:
            return out
        if self.cols == 0:
            out[...] = 0
            return out
        if parallel is None:
            parallel = self._parallel()
        if self.group == FAST_GROUP:  # the kernel splits x into even and odd columns
            if x.dtype != np.float32 or not x.flags.c_contiguous:
                x = np.ascontiguousarray(x, dtype=np.float32)
            fn, args = self._kernel(("q4_x32", "q4_par_x32"),
                                    (self.packed, self.scale, self.minimum, x, out), parallel)
        else:
            xc = np.array(x, dtype=np.float32)  # a copy: out may overlap x
            fn, args = self._kernel(("q4_rows_any", "q4_par_any"),
                                    (self.packed, self.scale, self.minimum, self.group, xc, out),
                                    parallel)
        fn(*args)
        return out

    def _parallel(self, threads: int | None = None) -> bool:
        """Whether a matvec on ``threads`` threads (None: numba's count now, asked only of
        a matrix large enough) spreads its rows over them."""
        if self.rows * self.cols < PARALLEL_MIN_WEIGHTS:
            return False
        return (matvec_threads() if threads is None else threads) > 1

    def _kernel(self, names: tuple[str, str], head: tuple,
                parallel: bool) -> tuple[Callable, tuple]:
        """The matvec kernel of ``names`` (serial, parallel) and its arguments: ``head``,
        then the row range (serial) or the rows per work item (parallel)."""
        fn = _kernels("matvec")[names[parallel]]
        return fn, head + ((MATVEC_CHUNK_ROWS,) if parallel else (0, self.rows))

    def matvec_call(self, x: np.ndarray, out: np.ndarray,
                    threads: int) -> tuple[Callable, tuple] | None:
        """(function, arguments) that compute ``out = dequantize() @ x`` each time they are
        called, with the values ``x`` holds then: the kernel and arguments :meth:`matvec`
        uses on ``threads`` threads (numba's count at the call), bound once, for a caller
        that multiplies the same ``x`` into the same ``out`` again and again (the runtime's
        plain loop: a matvec's checks and choices cost several microseconds a call). None
        where matvec does more than call one kernel (a group other than FAST_GROUP, an
        empty matrix, an ``x`` or ``out`` not f32 C-contiguous of the matrix's sizes)."""
        if (self.group != FAST_GROUP or not self.rows or not self.cols
                or x.shape != (self.cols,) or out.shape != (self.rows,)
                or any(a.dtype != np.float32 or not a.flags.c_contiguous for a in (x, out))):
            return None
        fn, args = self._kernel(("q4_x32", "q4_par_x32"),
                                (self.packed, self.scale, self.minimum, x, out),
                                self._parallel(threads))
        return entry_for(fn, args), args

    def dequantize_numpy(self) -> np.ndarray:
        """The reference formula in NumPy (what the compiled dequantize must equal)."""
        g = self.group
        ng = self.ngroups
        codes = self.codes()
        if ng * g != self.cols:
            codes = np.pad(codes, ((0, 0), (0, ng * g - self.cols)))
        q = codes.reshape(self.rows, ng, g).astype(np.float32)
        from .numerics import fma_f32_numpy
        deq = fma_f32_numpy(q, self.scale[:, :, None], self.minimum[:, :, None])
        return np.ascontiguousarray(deq.reshape(self.rows, ng * g)[:, : self.cols])


_KERNELS: dict[str, dict] = {}
_KERNELS_LOCK = threading.Lock()


def _kernels(kind: str) -> dict:
    """Compiled kernels by kind: "quant" (quantize/dequantize), "matvec" (packed GEMV),
    from :mod:`.q4_kernels` (imported on first use: it imports numba)."""
    got = _KERNELS.get(kind)
    if got is not None:
        return got
    with _KERNELS_LOCK:
        if kind not in _KERNELS:
            from . import q4_kernels as K  # imports numba
            _KERNELS.update(K.KERNELS)
    return _KERNELS[kind]


# The parallel matvecs' types: compile() loads them from numba's cache without running
# them, so the warm-up thread starts no OpenMP team of its own (a second team's threads
# compete with the decoding thread's on a small machine).
PARALLEL_SIGNATURES = {
    "q4_par_x32": "void(uint8[:, ::1], float32[:, ::1], float32[:, ::1], float32[::1], "
                  "float32[::1], int64)",
}


def warm_kernels(matvec: bool = True) -> threading.Thread:
    """Import numba and load (or compile) the kernels in the background, once per process.

    numba loads a kernel from its cache on the first call, so each serial one is
    called once on a tiny matrix of the types the loader and the runtime use; the
    parallel ones are only compiled (see PARALLEL_SIGNATURES).
    """
    def load():
        try:
            q = quantize(np.arange(64, dtype=np.float32).reshape(2, 32), DEFAULT_GROUP)
            quantize_conv1d(np.arange(64, dtype=np.float32).reshape(32, 2), DEFAULT_GROUP,
                            compiled=True)
            q.dequantize()
            if matvec:
                q.matvec(np.ones(32, dtype=np.float32), parallel=False)
                k = _kernels("matvec")
                for name, sig in PARALLEL_SIGNATURES.items():
                    k[name].compile(sig)
        except Exception:  # noqa: BLE001 - a failed warm-up shows again, clearly, on real use
            pass
    t = threading.Thread(target=load, name="firscope-q4-warmup", daemon=True)
    t.start()
    return t


def _matrix(w: np.ndarray, group: int, what: str) -> np.ndarray:
    """``w`` as a C-contiguous f32 matrix, after checking the arguments."""
    if w.ndim != 2:
        raise ValueError(f"{what} expects a 2-D matrix")
    if group < 1:
        raise ValueError("group must be positive")
    return np.ascontiguousarray(w, dtype=np.float32)


def _empty_q4(rows: int, cols: int, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ng = -(-cols // group)
    packed = np.empty((rows, (ng * group + 1) // 2), dtype=np.uint8)
    scale = np.empty((rows, ng), dtype=np.float32)
    minimum = np.empty((rows, ng), dtype=np.float32)
    return packed, scale, minimum


def quantize(w: np.ndarray, group: int = DEFAULT_GROUP) -> Q4Matrix:
    """Quantize an f32 ``[rows, cols]`` matrix group-wise along its columns.

    One compiled pass per row (about 20x faster than the NumPy formulation, which
    :func:`quantize_numpy` keeps as the reference it must equal bit for bit). A matrix
    holding NaN or Inf gets the NumPy formulation's result.
    """
    w = _matrix(w, group, "quantize")
    rows, cols = w.shape
    if cols == 0 or rows == 0:
        return quantize_numpy(w, group)
    packed, scale, minimum = _empty_q4(rows, cols, group)
    if _kernels("quant")["quantize"](w, group, packed, scale, minimum):
        return quantize_numpy(w, group)
    _check_range(w, group, scale, minimum)
    return Q4Matrix(rows, cols, group, packed, scale, minimum)


class Q4NonFiniteError(ValueError):
    """The matrix holds NaN or Inf: it has no int4 form."""


CONV1D_BLOCK = 32  # output rows gathered per tile: two 64-byte lines of each input row


# Below this many weights quantize_conv1d takes the NumPy formula (the same bits): 7 ms at
# this size against the compiled kernel's 1.2 ms, but no numba import and kernel load (0.3-
# 0.7 s of a small model's start: a debugger's first stop on it then waits for no numba).
NUMPY_BELOW = 1 << 18


def quantize_conv1d(w: np.ndarray, group: int = DEFAULT_GROUP, *,
                    compiled: bool | None = None) -> Q4Matrix:
    """``quantize(w.T)`` for an HF Conv1D weight ``w`` [in, out], without the transposed
    copy (the loader's path: the checkpoint's layout in, [out, in] codes out); equal to
    it bit for bit. Raises :class:`Q4NonFiniteError` for NaN or Inf, and
    :class:`Q4RangeError` like :func:`quantize`. ``compiled``: the compiled kernel (True)
    or the NumPy formula (False); None takes NumPy below :data:`NUMPY_BELOW` weights."""
    w = _matrix(w, group, "quantize_conv1d")
    cols, rows = w.shape
    if cols == 0 or rows == 0:
        return quantize(w.T, group)
    if not (compiled if compiled is not None else w.size >= NUMPY_BELOW):
        if count_nonfinite(w):
            raise Q4NonFiniteError("the matrix contains NaN or Inf")
        return quantize_numpy(np.ascontiguousarray(w.T), group)
    packed, scale, minimum = _empty_q4(rows, cols, group)
    if _kernels("quant")["quantize_conv1d"](w, group, packed, scale, minimum, CONV1D_BLOCK):
        raise Q4NonFiniteError("the matrix contains NaN or Inf")
    _check_range(w.T, group, scale, minimum)
    return Q4Matrix(rows, cols, group, packed, scale, minimum)


NONFINITE_CHUNK = 1 << 18


def count_nonfinite(a: np.ndarray) -> int:
    """NaN and Inf values in an array, counted in chunks (no temporary the array's size).
    NumPy, not a compiled loop: as fast (22 ms for GPT-2's 38M-weight embedding, the
    numba loop 21 ms), and a load whose q4 weights come from the cache (model/q4_cache)
    then reads its f32 weights without waiting for numba's import."""
    flat = a.reshape(-1)
    if flat.size <= NONFINITE_CHUNK:
        return int(flat.size - np.count_nonzero(np.isfinite(flat)))
    ok = np.empty(NONFINITE_CHUNK, dtype=bool)
    bad = 0
    for i in range(0, flat.size, NONFINITE_CHUNK):
        part = flat[i: i + NONFINITE_CHUNK]
        np.isfinite(part, out=ok[: part.size])
        bad += part.size - int(np.count_nonzero(ok[: part.size]))
    return bad


def _check_range(w: np.ndarray, group: int, scale: np.ndarray, minimum: np.ndarray) -> None:
    """Raise :class:`Q4RangeError` for the first group whose step or top code overflows f32.

    ``hi - lo`` overflows when a group holds +3e38 and -3e38; then the scale is
    inf and every dequantized weight NaN. Even when it fits, ``15 * scale + min``
    (the largest code's value) can round past the f32 maximum.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        top = np.float32(15) * scale + minimum
    bad = ~(np.isfinite(scale) & np.isfinite(top))
    if not bad.any():
        return
    row, g = (int(i) for i in np.argwhere(bad)[0])
    first, last = g * group, min(g * group + group, w.shape[1]) - 1
    seg = w[row, first: last + 1]
    raise Q4RangeError(row, g, first, last, float(seg.min()), float(seg.max()))


def quantize_numpy(w: np.ndarray, group: int = DEFAULT_GROUP) -> Q4Matrix:
    """The format's formula in NumPy: the reference for :func:`quantize`."""
    w = _matrix(w, group, "quantize")
    rows, cols = w.shape
    ng = -(-cols // group)
    padded = ng * group
    if padded != cols:
        # Pad with each row's last element: it never widens a group's range.
        w = np.concatenate([w, np.repeat(w[:, -1:], padded - cols, axis=1)], axis=1)
    grouped = w.reshape(rows, ng, group)
    lo = grouped.min(axis=2)
    zero = lo == 0
    if zero.any():  # of -0.0 and 0.0 the one that comes first, as the compiled loop keeps
        first = np.argmax(grouped == 0, axis=2)  # it (np.min may give either)
        lo = np.where(zero, np.take_along_axis(grouped, first[:, :, None], axis=2)[:, :, 0], lo)
    hi = grouped.max(axis=2)
    with np.errstate(over="ignore", invalid="ignore"):
        scale = ((hi - lo) / np.float32(15)).astype(np.float32)
    flat = scale == 0
    scale[flat] = 1.0
    # (w - min) / scale in f64: with f32 inputs this is exact enough that the
    # rounded code is the nearest one, so |w - w'| <= scale/2 up to f32 rounding.
    if np.isfinite(w).all():  # non-finite weights are the loader's error, not a range one
        _check_range(w[:, :cols], group, scale, lo)
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.rint((grouped - lo[:, :, None]).astype(np.float64) / scale[:, :, None])
    np.clip(q, 0, 15, out=q)
    q = q.astype(np.uint8).reshape(rows, padded)
    if padded % 2:
        q = np.pad(q, ((0, 0), (0, 1)))
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return Q4Matrix(rows, cols, group, np.ascontiguousarray(packed), scale, lo.astype(np.float32))
