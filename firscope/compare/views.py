"""What the UI shows of a diff, as pure functions of results and arrays (no Textual here).

* :func:`node_errors`: one :class:`NodeError` per graph node for one step, with a
  :class:`Severity` the graph pane colours by and a short label.
* :func:`buffer_view`: reference, other and difference side by side for one
  output, a window of rows around the element a result points at, that
  element marked.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .lockstep import OutputResult
from .metrics import OutputDiff, ulp_distance


class Severity(enum.IntEnum):
    """Ordered: a node takes the worst of its outputs."""

    NOT_COMPARED = 0  # the other side has no value for it
    EXACT = 1  # bit for bit (or values that mean the same: +0/-0, NaN/NaN)
    WITHIN = 2  # differs, within the tolerance (reordering noise)
    NEAR = 3  # within the tolerance, but past a tenth of it: worth a look
    DIVERGED = 4
    NONFINITE = 5  # NaN/Inf on one side only

    @property
    def label(self) -> str:
        return _SEVERITY_LABELS[self]


_SEVERITY_LABELS = {Severity.NOT_COMPARED: "not compared", Severity.EXACT: "exact",
                    Severity.WITHIN: "within tolerance", Severity.NEAR: "near the tolerance",
                    Severity.DIVERGED: "diverged", Severity.NONFINITE: "NaN/Inf mismatch"}
NEAR_FRACTION = 0.1  # of rtol: a relative L2 error past this is NEAR


def severity(diff: OutputDiff | None, rtol: float | None = None) -> Severity:
    if diff is None:
        return Severity.NOT_COMPARED
    if diff.nonfinite:
        return Severity.NONFINITE
    if diff.diverged:
        return Severity.DIVERGED
    if diff.exact:
        return Severity.EXACT
    if rtol is not None and diff.rel_l2 > NEAR_FRACTION * rtol:
        return Severity.NEAR
    return Severity.WITHIN


@dataclass(frozen=True)
class NodeError:
    """One graph node at one step: its worst output."""

    node: int
    instance: str
    severity: Severity
    rel_l2: float | None  # worst over the compared outputs; None when none was compared
    max_abs: float | None
    worst: str | None  # the output that decided it ("attn")
    label: str  # short text for the pane: "1.2e-07", "DIVERGED 3.4e-03", ""


def node_errors(nodes: Sequence, results: Mapping[int, Sequence[OutputResult]],
                rtol: float | None = None) -> list[NodeError]:
    """``nodes`` in graph order (PlanNodes); ``results`` node index -> that step's results."""
    out = []
    for n in nodes:
        rows = results.get(n.index, ())
        if not rows:
            out.append(NodeError(n.index, n.full_name, Severity.NOT_COMPARED, None, None, None,
                                 ""))
            continue
        worst = max(rows, key=lambda r: (severity(r.diff, rtol), r.diff.rel_l2))
        sev = severity(worst.diff, rtol)
        rel = max(r.diff.rel_l2 for r in rows)
        out.append(NodeError(n.index, n.full_name, sev, rel, max(r.diff.max_abs for r in rows),
                             worst.buffer, _label(sev, rel)))
    return out


def _label(sev: Severity, rel: float) -> str:
    if sev is Severity.EXACT:
        return "="
    if sev is Severity.NONFINITE:
        return "NaN/Inf"
    text = "inf" if math.isinf(rel) else f"{rel:.1e}"
    return f"DIVERGED {text}" if sev is Severity.DIVERGED else text


@dataclass(frozen=True)
class BufferRow:
    index: int
    reference: float
    other: float
    difference: float  # other - reference (NaN when either is not finite)
    ulp: int | None  # None when either is not finite
    differs: bool
    marked: bool  # the element the result points at


@dataclass(frozen=True)
class BufferView:
    name: str  # "attention@3/attn"
    marked: int | None  # the first differing element (or the bad one when diverged)
    start: int  # first row's index
    rows: tuple[BufferRow, ...]
    summary: str


def buffer_rows(reference: np.ndarray, other: np.ndarray, start: int, count: int,
                marked: int | None = None) -> tuple[BufferRow, ...]:
    """Rows ``start .. start+count-1`` (clipped to the buffer)."""
    ref = np.asarray(reference, dtype=np.float32).reshape(-1)
    oth = np.asarray(other, dtype=np.float32).reshape(-1)
    stop = min(max(start, 0) + max(count, 0), ref.size)
    start = max(min(start, stop), 0)
    a, b = ref[start:stop], oth[start:stop]
    finite = np.isfinite(a) & np.isfinite(b)
    ulps = ulp_distance(np.where(finite, a, 0), np.where(finite, b, 0))
    rows = []
    for k in range(stop - start):
        i = start + k
        fa, fb = float(a[k]), float(b[k])
        same = a[k:k + 1].view(np.uint32)[0] == b[k:k + 1].view(np.uint32)[0] or fa == fb \
            or (math.isnan(fa) and math.isnan(fb))
        rows.append(BufferRow(i, fa, fb, fb - fa if finite[k] else math.nan,
                              int(ulps[k]) if finite[k] else None, not same, i == marked))
    return tuple(rows)


def buffer_view(result: OutputResult, reference: np.ndarray, other: np.ndarray,
                rows: int = 16) -> BufferView:
    """A window of ``rows`` elements with the result's element about a quarter of the way down
    (the rows before it give context, the ones after show whether the error runs on)."""
    d = result.diff
    marked = d.index
    n = int(np.asarray(reference).size)
    start = 0 if marked is None else max(0, min(marked - rows // 4, n - rows))
    if d.exact:
        summary = f"{result.name}: identical ({d.elements} elements)"
    else:
        summary = (f"{result.name}: {d.differing} of {d.elements} elements differ, max abs "
                   f"{d.max_abs:.3g}, relative L2 {d.rel_l2:.3g}, max {d.max_ulp} ULP")
        if d.diverged:
            summary += f"; DIVERGED: {d.reason}"
    return BufferView(result.name, marked, start,
                      buffer_rows(reference, other, start, rows, marked), summary)
