"""One pass over two f32 vectors: everything :func:`~.metrics.compare_arrays` needs.

:func:`scan_numpy` is the reference (plain NumPy, several passes and
temporaries); :func:`scan` is the same as one numba loop when numba is
installed, the way the compiled engine is a faster path checked against the
step interpreter (tests/test_compare.py compares the two on random and
adversarial vectors). A KV cache is dumped whole at every step, so the diff
reads tens of MB per step; one pass instead of six is what keeps it close to
the cost of the run itself.

Elements count as equal when their bits are equal, or both are NaN (any
payload), or they are numerically equal (+0 and -0).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Scan:
    differing: int
    first: int  # first differing element, -1 if none
    nonfinite: int  # NaN/Inf on one side that the other does not match
    first_nonfinite: int  # -1 if none
    sum_d2: float  # sum of (other - ref)^2 over elements finite on both sides
    sum_r2: float  # sum of ref^2 over finite reference elements
    max_ref: float  # max |ref| over finite reference elements
    max_d: float  # max |other - ref| over elements finite on both sides
    arg_d: int  # where max_d is (first such), -1 if none differ
    max_ulp: int


def ordered_bits(values: np.ndarray) -> np.ndarray:
    """f32 -> int64 that orders as the floats do, so that a difference counts ULPs."""
    i = np.asarray(values, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def scan_numpy(ref: np.ndarray, other: np.ndarray) -> Scan:
    r64 = ref[np.isfinite(ref)].astype(np.float64)
    sum_r2 = float(np.dot(r64, r64))
    max_ref = float(np.abs(r64).max()) if r64.size else 0.0
    idx = np.flatnonzero(ref.view(np.uint32) != other.view(np.uint32))
    a, b = ref[idx], other[idx]
    fa, fb = np.isfinite(a), np.isfinite(b)
    both = fa & fb
    d = b[both].astype(np.float64) - a[both].astype(np.float64)
    ad = np.abs(d)
    same_nonfinite = ~fa & ~fb & ((np.isnan(a) & np.isnan(b)) | (a == b))
    mismatch = ~both & ~same_nonfinite
    real = np.zeros(idx.size, dtype=bool)
    real[both] = ad > 0
    real |= mismatch
    pos = idx[both]
    ulps = np.abs(ordered_bits(a[both]) - ordered_bits(b[both]))
    differs = np.flatnonzero(real)
    nf = np.flatnonzero(mismatch)
    arg = int(pos[int(np.argmax(ad))]) if ad.size and ad.max() > 0 else -1
    return Scan(int(differs.size), int(idx[differs[0]]) if differs.size else -1, int(nf.size),
                int(idx[nf[0]]) if nf.size else -1, float(np.dot(d, d)), sum_r2, max_ref,
                float(ad.max()) if ad.size else 0.0, arg, int(ulps.max()) if ulps.size else 0)


def first_beyond_numpy(ref: np.ndarray, other: np.ndarray, floor: float | None,
                       ulp: int | None) -> int:
    """The first element finite on both sides whose error exceeds ``floor`` (or ``ulp``
    ULPs); -1 if none."""
    both = np.isfinite(ref) & np.isfinite(other)
    if ulp is not None:
        over = both & (np.abs(ordered_bits(ref) - ordered_bits(other)) > ulp)
    else:
        with np.errstate(invalid="ignore"):  # Inf - Inf: those elements are not "both"
            diff = np.abs(other.astype(np.float64) - ref.astype(np.float64))
        over = both & (diff > floor)
    hits = np.flatnonzero(over)
    return int(hits[0]) if hits.size else -1


def _make_numba():
    """The loops, compiled by numba (its on-disk cache in firscope's folder); ImportError
    when numba is not installed."""
    from ..jitcache import prepare_numba
    prepare_numba()
    import math
    from numba import njit

    @njit(cache=True, nogil=True)
    def ordered(bits):  # int32 bit pattern -> ordered int64
        v = np.int64(bits)
        return -(v & 0x7FFFFFFF) if v < 0 else v

    norms, sum_squares_finite, count_differing = _whole_array_loops(njit, math)
    detail, beyond_loop = _element_loops(njit, math, ordered)
    return norms, sum_squares_finite, detail, beyond_loop, count_differing


def _whole_array_loops(njit, math):
    # Separate simple loops vectorize and run at memory speed; one loop doing everything
    # with branches does not (5x slower on a KV cache). Sums may be reordered (SIMD);
    # no flag assumes away NaN or Inf.
    @njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
    def norms(ref, rbits):
        """Sum of ref^2, and max |ref| as bits (|x| orders as its bits with the sign
        cleared; Inf/NaN skipped there; a sum that is not finite is redone below)."""
        s = 0.0
        m = 0
        for i in range(ref.size):
            a = np.float64(ref[i])
            s += a * a
            b = rbits[i] & 0x7FFFFFFF
            m = max(m, b if b < 0x7F800000 else 0)
        return s, m

    @njit(cache=True, nogil=True)
    def sum_squares_finite(ref):  # when the plain sum is not finite (Inf/NaN, or huge values)
        s = 0.0
        for i in range(ref.size):
            a = np.float64(ref[i])
            if math.isfinite(a):
                s += a * a
        return s

    @njit(cache=True, nogil=True)
    def count_differing(rbits, obits):  # a plain loop: vectorizes, no temporary array
        n = 0
        for i in range(rbits.size):
            n += rbits[i] != obits[i]
        return n

    return norms, sum_squares_finite, count_differing


def _element_loops(njit, math, ordered):
    @njit(cache=True, nogil=True)
    def detail(ref, other, rbits, obits, idx):
        """Over the elements whose bits differ: the counts, sums and maxima of a Scan."""
        differing = 0
        first = -1
        nonfinite = 0
        first_nf = -1
        sum_d2 = 0.0
        max_d = 0.0
        arg_d = -1
        max_ulp = 0
        for j in range(idx.size):
            i = idx[j]
            a = np.float64(ref[i])
            b = np.float64(other[i])
            fa = math.isfinite(a)
            fb = math.isfinite(b)
            if fa and fb:
                dd = b - a
                if dd == 0.0:
                    continue
                sum_d2 += dd * dd
                if abs(dd) > max_d:
                    max_d = abs(dd)
                    arg_d = i
                u = abs(ordered(rbits[i]) - ordered(obits[i]))
                if u > max_ulp:
                    max_ulp = u
            else:
                if (math.isnan(a) and math.isnan(b)) or (not fa and not fb and a == b):
                    continue
                nonfinite += 1
                if first_nf < 0:
                    first_nf = i
            differing += 1
            if first < 0:
                first = i
        return differing, first, nonfinite, first_nf, sum_d2, max_d, arg_d, max_ulp

    @njit(cache=True, nogil=True)
    def beyond_loop(ref, other, rbits, obits, floor, ulp):
        for i in range(ref.size):
            if rbits[i] == obits[i]:
                continue
            a = np.float64(ref[i])
            b = np.float64(other[i])
            if not (math.isfinite(a) and math.isfinite(b)):
                continue
            if ulp >= 0:
                if abs(ordered(rbits[i]) - ordered(obits[i])) > ulp:
                    return i
            elif abs(b - a) > floor:
                return i
        return -1

    return detail, beyond_loop


_LOOPS = None


def _loops():
    global _LOOPS
    if _LOOPS is None:
        try:
            _LOOPS = _make_numba()
        except ImportError:  # numba is not installed: the NumPy reference does the work
            _LOOPS = False
    return _LOOPS


def scan(ref: np.ndarray, other: np.ndarray) -> Scan:
    loops = _loops()
    if not loops:
        return scan_numpy(ref, other)
    norms, sum_squares_finite, detail = loops[:3]
    rbits, obits = ref.view(np.int32), other.view(np.int32)
    idx = np.flatnonzero(rbits != obits)
    d, first, nf, first_nf, sum_d2, max_d, arg_d, max_ulp = detail(ref, other, rbits, obits, idx)
    sum_r2, max_bits = norms(ref, rbits)
    if not np.isfinite(sum_r2):
        sum_r2 = sum_squares_finite(ref)
    max_ref = float(np.int32(max_bits).view(np.float32))
    return Scan(d, first, nf, first_nf, sum_d2, sum_r2, max_ref, max_d, arg_d, max_ulp)


def bits_equal(ref: np.ndarray, other: np.ndarray) -> bool:
    """Whether two f32 vectors are bit for bit the same, at memory speed. The first block is
    looked at alone, so that a difference near the start costs nothing more."""
    r, o = ref.view(np.int32), other.view(np.int32)
    if r.size > 4096 and not np.array_equal(r[:1024], o[:1024]):
        return False
    loops = _loops()
    if not loops:
        return bool(np.array_equal(r, o))
    return loops[4](r, o) == 0


def first_beyond(ref: np.ndarray, other: np.ndarray, floor: float | None,
                 ulp: int | None) -> int:
    loops = _loops()
    if not loops:
        return first_beyond_numpy(ref, other, floor, ulp)
    return int(loops[3](ref, other, ref.view(np.int32), other.view(np.int32),
                        0.0 if floor is None else float(floor), -1 if ulp is None else int(ulp)))
