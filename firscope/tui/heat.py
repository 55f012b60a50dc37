"""Heatmaps in a terminal: a colour ramp and half-block cells (two rows per character).

Pure functions from arrays to Rich ``Text``; nothing here knows about widgets.
"""
from __future__ import annotations

import numpy as np
from rich.color import Color
from rich.style import Style
from rich.text import Text

# A viridis-like ramp (dark blue -> green -> yellow), sampled at 6 stops.
_STOPS = np.array([
    [68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [190, 223, 38], [253, 231, 37],
], dtype=np.float64)
EMPTY = Color.from_rgb(30, 30, 30)


def ramp(t: float) -> Color:
    """Colour for t in [0, 1]."""
    if not np.isfinite(t):
        return Color.from_rgb(255, 0, 255)  # NaN / Inf stand out
    t = min(max(float(t), 0.0), 1.0) * (len(_STOPS) - 1)
    i = min(int(t), len(_STOPS) - 2)
    f = t - i
    r, g, b = _STOPS[i] * (1 - f) + _STOPS[i + 1] * f
    return Color.from_rgb(int(r), int(g), int(b))


def normalise(a: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    finite = a[np.isfinite(a)]
    if lo is None:
        lo = float(finite.min()) if finite.size else 0.0
    if hi is None:
        hi = float(finite.max()) if finite.size else 1.0
    span = hi - lo if hi > lo else 1.0
    return (a - lo) / span


def half_block_rows(values: np.ndarray, lo: float | None = None,
                    hi: float | None = None) -> list[Text]:
    """A 2-D array as lines of '▀' cells: each character shows two rows.

    NaN cells are magenta; cells past the data (masked with np.nan in ``values``
    is not the same: use ``None`` rows) are drawn dark.
    """
    m = np.atleast_2d(np.asarray(values, dtype=np.float64))
    t = normalise(m, lo, hi)
    rows, cols = t.shape
    lines = []
    for r in range(0, rows, 2):
        line = Text()
        for c in range(cols):
            top = ramp(t[r, c])
            bottom = ramp(t[r + 1, c]) if r + 1 < rows else EMPTY
            line.append("▀", Style(color=top, bgcolor=bottom))
        lines.append(line)
    return lines


def legend(lo: float, hi: float, width: int = 12) -> Text:
    out = Text(f"{lo:.3g} ")
    for i in range(width):
        out.append("█", Style(color=ramp(i / max(width - 1, 1))))
    out.append(f" {hi:.3g}")
    return out


CHUNK = 1 << 20  # elements of a large all-finite array converted to f64 at a time


def sparkline(values: np.ndarray, width: int = 48, finite: bool = False) -> str:
    """Eight-level bars of ``values`` resampled to ``width`` columns (mean per bin).
    ``finite``: the caller knows every value is finite; each bin is then converted to
    f64 on its own (the same means, without an f64 copy of the whole array)."""
    bars = "▁▂▃▄▅▆▇█"
    if finite:
        flat = np.asarray(values).reshape(-1)
        if flat.size == 0:
            return ""
        k = min(width, flat.size)
        size, extra = divmod(flat.size, k)  # np.array_split's bins: the first ``extra`` +1
        stops = np.cumsum([size + (i < extra) for i in range(k)])
        means = np.array([flat[b - (size + (i < extra)): b].astype(np.float64).mean()
                          for i, b in enumerate(stops)])
        return "".join(bars[min(int(v * 8), 7)] for v in normalise(means))
    a = np.asarray(values, dtype=np.float64).reshape(-1)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return ""
    bins = np.array_split(a, min(width, a.size))
    means = np.array([b.mean() for b in bins])
    t = normalise(means)
    return "".join(bars[min(int(v * 8), 7)] for v in t)


def histogram(values: np.ndarray, bins: int = 24,
              finite: tuple[float, float] | None = None) -> tuple[str, float, float]:
    """Eight-level bars of the counts of ``values`` in ``bins`` equal bins, and the range.
    ``finite``: (min, max) of values the caller knows are all finite; they are then
    counted CHUNK at a time in f64 (the same counts, without an f64 copy of the whole)."""
    if finite is not None:
        flat = np.asarray(values).reshape(-1)
        counts = np.zeros(bins, dtype=np.int64)
        edges = np.histogram(np.zeros(0), bins=bins, range=finite)[1]
        for start in range(0, flat.size, CHUNK):
            counts += np.histogram(flat[start: start + CHUNK].astype(np.float64), bins=bins,
                                   range=finite)[0]
    else:
        a = np.asarray(values, dtype=np.float64).reshape(-1)
        a = a[np.isfinite(a)]
        if a.size == 0:
            return "", 0.0, 0.0
        counts, edges = np.histogram(a, bins=bins)
    bars = "▁▂▃▄▅▆▇█"
    top = counts.max() or 1
    return "".join(bars[min(int(c / top * 7.999), 7)] if c else " " for c in counts), \
        float(edges[0]), float(edges[-1])
