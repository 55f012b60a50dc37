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

Bit-identical outputs (a dump of the same engine) cost one equality pass;
otherwise :mod:`.scan` makes a few memory-speed passes and looks closely only
at the elements whose bits differ.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .scan import bits_equal, first_beyond, ordered_bits, scan

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


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(ordered_bits(a) - ordered_bits(b))


_EXACT_CACHE: dict[int, OutputDiff] = {}


def _exact(n: int) -> OutputDiff:
    d = _EXACT_CACHE.get(n)
    if d is None:
        d = OutputDiff(n, 0, 0.0, 0.0, 0, 0, None, None, None, None, False, "")
        _EXACT_CACHE[n] = d
    return d


def exact_diff(elements: int) -> OutputDiff:
    """The comparison of two equal vectors of ``elements`` (shared, frozen)."""
    return _exact(elements)


def compare_arrays(ref: np.ndarray, other: np.ndarray, tol: Tolerance, *,
                   scanner=scan) -> OutputDiff:
    """Compare two f32 vectors of equal size (the caller checked the sizes)."""
    ref = np.ascontiguousarray(ref, dtype=np.float32).reshape(-1)
    other = np.ascontiguousarray(other, dtype=np.float32).reshape(-1)
    n = ref.size
    if bits_equal(ref, other):
        return _exact(n)  # a same-engine dump: one pass at memory speed
    sc = scanner(ref, other)
    if sc.differing == 0:
        return _exact(n)
    norm_ref = math.sqrt(sc.sum_r2)
    norm_d = math.sqrt(sc.sum_d2)
    rel = norm_d / norm_ref if norm_ref > 0 else (math.inf if norm_d > 0 else 0.0)
    if tol.ulp is not None:
        beyond = -1 if sc.max_ulp <= tol.ulp else first_beyond(ref, other, None, tol.ulp)
        bound = f"{tol.ulp} ULP"
    else:
        floor = tol.atol * sc.max_ref
        beyond = -1 if sc.max_d <= floor else first_beyond(ref, other, floor, None)
        bound = f"the floor {floor:.3g} ({tol.atol:g} * max|reference|)"
    if sc.first_nonfinite >= 0 and (beyond < 0 or sc.first_nonfinite < beyond):
        k = sc.first_nonfinite
        reason = f"element {k} is {_show(other[k])} where the reference has {_show(ref[k])}"
    elif beyond >= 0:
        k = beyond
        err = abs(float(other[k]) - float(ref[k]))
        reason = (f"element {k} is off by {err:.3g} ({_show(other[k])} against "
                  f"{_show(ref[k])}), beyond {bound}")
    elif tol.ulp is None and rel > tol.rtol:
        k = sc.arg_d  # diverged by the L2 norm alone: show the worst element
        reason = f"relative L2 error {rel:.3g} > {tol.rtol:g}"
    else:
        k = sc.first
        reason = ""
    diverged = bool(reason)
    return OutputDiff(n, sc.differing, sc.max_d, rel, sc.max_ulp, sc.nonfinite, sc.first,
                      k if diverged else None, float(ref[k]), float(other[k]), diverged, reason)


def _show(v) -> str:
    v = float(v)
    return "NaN" if math.isnan(v) else ("Inf" if v == math.inf else
                                        "-Inf" if v == -math.inf else f"{v:.7g}")
