"""How far one node output is from the reference's, and whether that is a divergence.

The default tolerance (docs/dump-format.md says why): a node output diverges
when its relative L2 error ``||other - ref|| / ||ref||`` exceeds ``rtol``,
when one element's error exceeds the floor ``atol * max|ref|`` (an absolute
floor scaled to the buffer's magnitude), or when the two disagree about
NaN/Inf. Reordering noise (FMA, another reduction order) keeps relative L2
near 1e-7..1e-5 while a wrong index, mask or scale moves it by 1e-3 or far
more; the floor catches one wrong element in a large buffer, which barely
moves the L2 norm. A bound on ULPs alone cannot work: near-zero outputs of
a dot product are thousands of ULPs apart from reordering alone. ``--ulp N``
is still offered, as a strict mode for runs expected to be bit-near.

Work is proportional to the elements that differ: bit-identical outputs (a
dump of the same engine) cost one comparison pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-3
_STORAGE_UNIT = {"F16": 2.0 ** -11, "BF16": 2.0 ** -8}  # unit roundoff of narrow dump dtypes


@dataclass(frozen=True)
class Tolerance:
    """When a node output counts as diverged (see the module docstring)."""

    rtol: float = DEFAULT_RTOL  # bound on the relative L2 error of the whole output
    atol: float = DEFAULT_ATOL  # per-element floor, as a fraction of max|reference|
    ulp: int | None = None  # strict mode instead: any element more than this many ULPs

    def describe(self) -> str:
        if self.ulp is not None:
            return f"max {self.ulp} ULP per element"
        return f"relative L2 <= {self.rtol:g}, |error| <= {self.atol:g} * max|reference|"

    def for_dtype(self, dtype: str) -> "Tolerance":
        """Values stored as f16/bf16 carry their rounding (relative 2^-11 / 2^-8): the bounds
        widen to it, else storage alone would read as a divergence."""
        unit = _STORAGE_UNIT.get(dtype)
        if unit is None:
            return self
        if self.ulp is not None:
            return Tolerance(self.rtol, self.atol, max(self.ulp, int(unit * 2 ** 24)))
        return Tolerance(max(self.rtol, 4 * unit), max(self.atol, 2 * unit))

    def as_dict(self) -> dict:
        if self.ulp is not None:
            return {"ulp": self.ulp}
        return {"rtol": self.rtol, "atol": self.atol}


def make_tolerance(rtol: float | None = None, atol: float | None = None,
                   ulp: int | None = None) -> Tolerance:
    """A checked tolerance; ValueError names the bad value."""
    if ulp is not None:
        if rtol is not None or atol is not None:
            raise ValueError("give either --ulp or --rtol/--atol, not both")
        if isinstance(ulp, bool) or int(ulp) != ulp or ulp < 0:
            raise ValueError(f"--ulp {ulp}: must be a whole number >= 0")
        return Tolerance(ulp=int(ulp))
    rtol = DEFAULT_RTOL if rtol is None else float(rtol)
    atol = DEFAULT_ATOL if atol is None else float(atol)
    for name, v in (("rtol", rtol), ("atol", atol)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"--{name} {v:g}: must be a finite number >= 0")
    return Tolerance(rtol, atol)


@dataclass(frozen=True)
class OutputDiff:
    """One node output at one step, the other run against the reference."""

    elements: int
    differing: int  # elements whose values differ (bit patterns that mean the same are equal)
    max_abs: float  # over elements finite in both; 0.0 when none differ
    rel_l2: float  # ||other - ref|| / ||ref|| over elements finite in both
    max_ulp: int
    nonfinite: int  # elements where one side is NaN/Inf and the other is not the same
    first_index: int | None  # the first differing element
    bad_index: int | None  # the element to look at: first beyond tolerance, else the worst
    ref_value: float | None  # at bad_index (or first_index when within tolerance)
    other_value: float | None
    diverged: bool
    reason: str  # why it diverged, "" when it did not

    @property
    def exact(self) -> bool:
        return self.differing == 0 and self.nonfinite == 0

    @property
    def index(self) -> int | None:
        """The element a report shows: the bad one when diverged, else the first differing."""
        return self.bad_index if self.diverged else self.first_index


def ordered_bits(values: np.ndarray) -> np.ndarray:
    """f32 -> int64 that orders as the floats do, so that a difference counts ULPs."""
    i = np.asarray(values, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(ordered_bits(a) - ordered_bits(b))


_EXACT_CACHE: dict[int, OutputDiff] = {}


def _exact(n: int) -> OutputDiff:
    d = _EXACT_CACHE.get(n)
    if d is None:
        d = OutputDiff(n, 0, 0.0, 0.0, 0, 0, None, None, None, None, False, "")
        _EXACT_CACHE[n] = d
    return d


def compare_arrays(ref: np.ndarray, other: np.ndarray, tol: Tolerance) -> OutputDiff:
    """Compare two f32 vectors of equal size (the caller checked the sizes)."""
    ref = np.asarray(ref, dtype=np.float32).reshape(-1)
    other = np.asarray(other, dtype=np.float32).reshape(-1)
    n = ref.size
    idx = np.flatnonzero(ref.view(np.uint32) != other.view(np.uint32))
    if idx.size == 0:
        return _exact(n)
    a, b = ref[idx], other[idx]
    fa, fb = np.isfinite(a), np.isfinite(b)
    both = fa & fb
    # NaN against NaN (any payload) means the same thing; Inf differs from Inf only in sign
    same_nonfinite = ~fa & ~fb & ((np.isnan(a) & np.isnan(b)) | (a == b))
    mismatch = ~both & ~same_nonfinite
    d = b[both].astype(np.float64) - a[both].astype(np.float64)
    ad = np.abs(d)
    real = np.zeros(idx.size, dtype=bool)  # differs in value (not +0 against -0, not NaN~NaN)
    real[both] = ad > 0
    real |= mismatch
    if not real.any():
        return _exact(n)
    ulps = ulp_distance(a[both], b[both])
    norm_ref = _norm(ref)
    norm_d = float(np.sqrt(np.dot(d, d)))
    rel = norm_d / norm_ref if norm_ref > 0 else (math.inf if norm_d > 0 else 0.0)
    max_abs = float(ad.max()) if ad.size else 0.0
    max_ulp = int(ulps.max()) if ulps.size else 0
    first = int(idx[np.flatnonzero(real)[0]])
    out = np.zeros(idx.size, dtype=bool)  # beyond the per-element bound
    if tol.ulp is not None:
        out[both] = ulps > tol.ulp
        floor_text = f"{tol.ulp} ULP"
    else:
        floor = tol.atol * _max_abs(ref)
        out[both] = ad > floor
        floor_text = f"the floor {floor:.3g} ({tol.atol:g} * max|reference|)"
    out |= mismatch
    reason = ""
    if mismatch.any():
        k = int(np.flatnonzero(mismatch)[0])
        reason = (f"element {int(idx[k])} is {_show(b[k])} where the reference has "
                  f"{_show(a[k])}")
    elif out.any():
        k = int(np.flatnonzero(out)[0])
        err = abs(float(b[k]) - float(a[k]))
        reason = (f"element {int(idx[k])} is off by {err:.3g} ({_show(b[k])} against "
                  f"{_show(a[k])}), beyond {floor_text}")
    elif tol.ulp is None and rel > tol.rtol:
        reason = f"relative L2 error {rel:.3g} > {tol.rtol:g}"
    diverged = bool(reason)
    if out.any():
        k = int(np.flatnonzero(out)[0])
    elif diverged:  # by the L2 norm alone: show the worst element
        k = int(np.flatnonzero(both)[int(np.argmax(ad))])
    else:
        k = int(np.flatnonzero(real)[0])
    bad = int(idx[k])
    return OutputDiff(n, int(real.sum()), max_abs, rel, max_ulp, int(mismatch.sum()), first,
                      bad if diverged else None, float(a[k]), float(b[k]), diverged, reason)


def _show(v) -> str:
    v = float(v)
    return "NaN" if math.isnan(v) else ("Inf" if v == math.inf else
                                        "-Inf" if v == -math.inf else f"{v:.7g}")


def _norm(ref: np.ndarray) -> float:
    s = float(np.dot(ref, ref))  # BLAS, f32 accumulation: plenty for a norm
    if math.isfinite(s):
        return math.sqrt(s)
    finite = ref[np.isfinite(ref)].astype(np.float64)  # huge values or NaN in the reference
    return float(np.sqrt(np.dot(finite, finite)))


def _max_abs(ref: np.ndarray) -> float:
    hi, lo = float(ref.max()), float(ref.min())
    if math.isfinite(hi) and math.isfinite(lo):
        return max(hi, -lo)
    finite = ref[np.isfinite(ref)]
    return float(np.abs(finite).max()) if finite.size else 0.0
