"""A small chart writer for the report's figures: SVG text, built from numbers, no plotting
library.

The report's figures are bar charts, line charts, a timeline of rectangles and one heatmap
mosaic. Drawing them with matplotlib cost about 2.5 s per report (import, layout, text
rendering, PNG encoding); writing the same marks as SVG takes milliseconds, the browser
lays out the text, and the output is the same bytes for the same data.

A :class:`Figure` holds a grid of :class:`Axes`. An axes records its marks in data
coordinates; :meth:`Figure.svg` fixes every axes' limits from its data (or the limits it
was given), sizes its margins from its tick labels' estimated widths, and writes the marks.
Every text is escaped (names come from the model file). Elements carry a ``class`` naming
what they are (``xtick``, ``ytick``, ``legend``, ``note``, ``title``, ``mark``) so tests can
read a figure back.
"""
from __future__ import annotations

import base64
import html
import math
import struct
import zlib

import numpy as np

from ..text import printable

FONT = "DejaVu Sans,Verdana,Arial,Helvetica,sans-serif"
CHAR_W = 0.6  # estimated glyph width per pixel of font size (sans-serif, a little generous)
TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
         "#7f7f7f", "#bcbd22", "#17becf"]
TAB20 = ["#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728",
         "#ff9896", "#9467bd", "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2",
         "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d", "#17becf", "#9edae5"]
# viridis at 0, 0.1, ..., 1 (matplotlib's values); colours between are interpolated
VIRIDIS = ["#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c", "#22a884",
           "#44bf70", "#7ad151", "#bddf26", "#fde725"]
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def esc(text) -> str:
    return html.escape(printable(str(text)), quote=True)


def text_width(text: str, size: float) -> float:
    return len(str(text)) * size * CHAR_W


def fmt(v: float) -> str:
    """A coordinate: two decimals, no trailing zeros (the same number always reads the same)."""
    s = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if s == "-0" else s


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def viridis(values: np.ndarray) -> np.ndarray:
    """uint8 RGB for values in [0, 1] (NaN: white), piecewise linear through :data:`VIRIDIS`."""
    v = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(v)
    t = np.clip(np.where(bad, 0.0, v), 0.0, 1.0) * (len(VIRIDIS) - 1)
    lo = np.minimum(t.astype(np.int64), len(VIRIDIS) - 2)
    frac = (t - lo)[..., None]
    table = np.array([_rgb(c) for c in VIRIDIS], dtype=np.float64)
    rgb = table[lo] * (1 - frac) + table[lo + 1] * frac
    rgb[bad] = 255.0
    return np.rint(rgb).astype(np.uint8)


def png_rgb(pixels: np.ndarray) -> bytes:
    """A PNG of an (H, W, 3) uint8 array; zlib at a fixed level, no metadata: deterministic."""
    h, w, _ = pixels.shape
    raw = np.concatenate([np.zeros((h, 1), np.uint8), pixels.reshape(h, w * 3)], axis=1)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)) + chunk(b"IEND", b""))


def nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round-numbered ticks (1, 2, 2.5 or 5 x 10^k apart) within [lo, hi]."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9)
    ticks = [(first + i) * step for i in range(int((hi - lo) / step + 1e-9) + 2)]
    return [0.0 if abs(t) < step * 1e-9 else t for t in ticks if t <= hi + step * 1e-9]


def tick_label(v: float, log: bool) -> str:
    if log:
        k = round(math.log10(v))
        return "1" if k == 0 else "10" if k == 1 else f"10{str(k).translate(SUPERSCRIPT)}"
    return f"{v:.10g}"


class Axes:
    """One plot area: marks in data coordinates, axis scales and labels, an optional legend."""

    def __init__(self):
        self.marks: list[tuple] = []
        self.scale = {"x": "linear", "y": "linear"}
        self.lim: dict[str, tuple | None] = {"x": None, "y": None}
        self.margin = {"x": 0.05, "y": 0.05}
        self.data: dict[str, list[float]] = {"x": [], "y": []}
        self.ticks: dict[str, tuple | None] = {"x": None, "y": None}
        self.tick_style = {"x": (10, 0), "y": (10, 0)}  # (font size, rotation)
        self.label = {"x": "", "y": "", "title": ""}
        self.title_size = 11
        self.inverted_y = False
        self.legend_items: list[tuple[str, str, str]] = []
        self.legend_opts: dict = {}
        self.show_ticks = {"x": True, "y": True}
        self.frame = True
        self.colorbar: tuple | None = None

    # -- data ---------------------------------------------------------------------------------
    def _see(self, axis: str, values) -> None:
        self.data[axis].extend(float(v) for v in values if v is not None and math.isfinite(v))

    def bar(self, xs, heights, colors, width: float = 0.8) -> None:
        """Vertical bars from 0 (NaN or, on a log axis, non-positive heights are left out)."""
        for x, h, c in zip(xs, heights, colors):
            self.marks.append(("rect", x - width / 2, x + width / 2, 0.0, h, c))
        self._see("x", [x - width / 2 for x in xs] + [x + width / 2 for x in xs])
        self._see("y", list(heights) + [0.0])

    def barh(self, values, colors, height: float = 0.8) -> None:
        """Horizontal bars, the first at y = 0 (the bottom), one per value."""
        for i, (v, c) in enumerate(zip(values, colors)):
            self.marks.append(("rect", 0.0, v, i - height / 2, i + height / 2, c))
        self._see("x", list(values) + [0.0])
        self._see("y", [-height / 2, len(values) - 1 + height / 2])

    def rects(self, rects, colors) -> None:
        """Many rectangles (x0, x1, y0, y1); one path per colour."""
        by_color: dict[str, list] = {}
        for r, c in zip(rects, colors):
            by_color.setdefault(c, []).append(r)
        for c, rs in by_color.items():
            self.marks.append(("rects", rs, c))
        self._see("x", [v for r in rects for v in r[:2]])
        self._see("y", [v for r in rects for v in r[2:]])

    def line(self, xs, ys, color: str, marker: float = 0, label: str | None = None,
             width: float = 1.5, step: bool = False) -> None:
        """A polyline (broken at NaN); ``marker``: dot radius; ``step``: ``xs`` are the
        len(ys) + 1 edges of a stairs plot."""
        self.marks.append(("line", list(xs), list(ys), color, marker, width, step))
        self._see("x", xs)
        self._see("y", ys)
        if label is not None:
            self.legend_items.append((label, color, "line"))

    def hline(self, y: float, color: str = "#000", width: float = 0.5) -> None:
        self.marks.append(("hline", y, color, width))

    def vline(self, x: float, color: str = "#ccc", width: float = 0.5) -> None:
        self.marks.append(("vline", x, color, width))

    def text(self, x, y, s: str, size: float = 8, anchor: str = "start", dx: float = 0,
             dy: float = 0, rotate: float = 0, cls: str = "note") -> None:
        """A label at a data point, offset by (dx, dy) pixels (dy up), rotated counter-clockwise."""
        self.marks.append(("text", x, y, s, size, anchor, dx, dy, rotate, cls))

    def image(self, png: bytes, shape: tuple[int, int]) -> None:
        """A raster covering data x in [-0.5, w - 0.5], y in [-0.5, h - 0.5] (row 0 on top)."""
        h, w = shape
        self.marks.append(("image", png, w, h))
        self._see("x", [-0.5, w - 0.5])
        self._see("y", [-0.5, h - 0.5])
        self.inverted_y = True
        self.margin = {"x": 0.0, "y": 0.0}

    # -- axes ---------------------------------------------------------------------------------
    def set(self, *, xscale=None, yscale=None, xlim=None, ylim=None, xlabel=None, ylabel=None,
            title=None, title_size=None) -> None:
        for key, val in (("x", xscale), ("y", yscale)):
            if val:
                self.scale[key] = val
        for key, val in (("x", xlim), ("y", ylim)):
            if val is not None:
                self.lim[key] = val
        for key, val in (("x", xlabel), ("y", ylabel), ("title", title)):
            if val is not None:
                self.label[key] = val
        if title_size:
            self.title_size = title_size

    def set_ticks(self, axis: str, positions, labels, size: float = 10, rotate: float = 0
                  ) -> None:
        self.ticks[axis] = (list(positions), [str(s) for s in labels])
        self.tick_style[axis] = (size, rotate)

    def legend(self, items, *, where: str = "upper right", size: float = 8, title: str = "",
               ncol: int = 1) -> None:
        """``items``: (label, colour, "patch" or "line"); ``where``: "upper right", "lower
        right" (inside) or "outside" (right of the axes)."""
        self.legend_items = list(items)
        self.legend_opts = {"where": where, "size": size, "title": title, "ncol": ncol}

    def add_colorbar(self, label: str) -> None:
        self.colorbar = (label,)

    # -- limits and mapping -------------------------------------------------------------------
    def limits(self, axis: str) -> tuple[float, float]:
        if self.lim[axis] is not None:
            return self.lim[axis]
        vals = self.data[axis]
        if self.scale[axis] == "log":
            pos = [v for v in vals if v > 0]
            if not pos:
                return 1.0, 10.0
            lo = 10.0 ** math.floor(math.log10(min(pos)) + 1e-9)
            hi = 10.0 ** math.ceil(math.log10(max(pos)) - 1e-9)
            return (lo, hi) if hi > lo else (lo / 10, hi * 10)
        if not vals:
            return 0.0, 1.0
        lo, hi = min(vals), max(vals)
        if hi == lo:
            return lo - 0.5, hi + 0.5
        pad = (hi - lo) * self.margin[axis]
        return (lo if lo == 0 else lo - pad), (hi if hi == 0 else hi + pad)

    def tick_list(self, axis: str) -> tuple[list[float], list[str]]:
        if self.ticks[axis] is not None:
            return self.ticks[axis]
        lo, hi = self.limits(axis)
        if self.scale[axis] == "log":
            ks = range(math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9) + 1)
            pos = [10.0 ** k for k in ks]
            return pos, [tick_label(p, True) for p in pos]
        pos = nice_ticks(lo, hi)
        return pos, [tick_label(p, False) for p in pos]


class Figure:
    """A ``width`` x ``height`` pixel picture holding a grid of axes."""

    def __init__(self, width: float, height: float, title: str = ""):
        self.w, self.h = float(width), float(height)
        self.title = title
        self.grid: list[tuple[Axes, tuple[float, float, float, float]]] = []

    def subplots(self, rows: int = 1, cols: int = 1, height_ratios=None) -> list[Axes]:
        """Axes in a grid, filled row by row; each gets its cell and sizes its own margins."""
        top = 26.0 if self.title else 0.0
        ratios = list(height_ratios or [1] * rows)
        unit = (self.h - top) / sum(ratios)
        out, y = [], top
        for r in range(rows):
            for c in range(cols):
                ax = Axes()
                cw = self.w / cols
                self.grid.append((ax, (c * cw, y, cw, ratios[r] * unit)))
                out.append(ax)
            y += ratios[r] * unit
        return out

    def svg(self) -> bytes:
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{fmt(self.w)}" '
                 f'height="{fmt(self.h)}" viewBox="0 0 {fmt(self.w)} {fmt(self.h)}" '
                 f'font-family="{FONT}"><rect class="background" width="100%" height="100%" '
                 'fill="#fff"/>']
        if self.title:
            parts.append(_text(self.w / 2, 17, self.title, 12, "middle", cls="title"))
        for i, (ax, cell) in enumerate(self.grid):
            parts.append(_render(ax, cell, i))
        parts.append("</svg>")
        return "".join(parts).encode("utf-8")


# -- rendering --------------------------------------------------------------------------------
def _text(x, y, s, size, anchor="start", rotate: float = 0, cls: str = "",
          baseline: str = "") -> str:
    rot = f' transform="rotate({fmt(-rotate)} {fmt(x)} {fmt(y)})"' if rotate else ""
    base = f' dominant-baseline="{baseline}"' if baseline else ""
    klass = f' class="{cls}"' if cls else ""
    return (f'<text x="{fmt(x)}" y="{fmt(y)}" font-size="{fmt(size)}" text-anchor="{anchor}"'
            f'{base}{rot}{klass}>{esc(s)}</text>')


def _legend_size(ax: Axes) -> tuple[float, float]:
    if not ax.legend_items:
        return 0.0, 0.0
    size = ax.legend_opts.get("size", 8)
    ncol = ax.legend_opts.get("ncol", 1)
    per_col = math.ceil(len(ax.legend_items) / ncol)
    col_w = max(text_width(label, size) for label, _, _ in ax.legend_items) + size * 2.6
    title = ax.legend_opts.get("title", "")
    w = max(col_w * ncol, text_width(title, size) if title else 0) + 8
    h = per_col * size * 1.45 + (size * 1.6 if title else 0) + 6
    return w, h


def _margins(ax: Axes) -> dict[str, float]:
    """Room around the plot area for tick labels, axis labels, the title and an outside
    legend, from the labels' estimated widths."""
    m = {"left": 8.0, "right": 12.0, "top": 8.0, "bottom": 8.0}
    for axis, side in (("x", "bottom"), ("y", "left")):
        if not ax.show_ticks[axis]:
            continue
        size, rot = ax.tick_style[axis]
        labels = ax.tick_list(axis)[1]
        longest = max((text_width(s, size) for s in labels), default=0)
        across = size * 1.2
        if rot == 0:  # x labels stand one line high; y labels run their length leftwards
            m[side] += 6 + (across if axis == "x" else longest)
        else:  # rotated: a label's length runs across the axis
            m[side] += 6 + longest * abs(math.sin(math.radians(rot))) + across
    if ax.label["x"]:
        m["bottom"] += 16
    if ax.label["y"]:
        m["left"] += 16
    if ax.label["title"]:
        m["top"] += ax.title_size * 1.6
    if ax.legend_items and ax.legend_opts.get("where") == "outside":
        m["right"] += _legend_size(ax)[0] + 6
    if ax.colorbar:
        m["right"] += 70
    return m


class _Map:
    """Data -> pixel for one axes box."""

    def __init__(self, ax: Axes, box: tuple[float, float, float, float]):
        self.x0, self.y0, self.w, self.h = box
        self.ax = ax
        self.xl = self._t("x", ax.limits("x"))
        self.yl = self._t("y", ax.limits("y"))

    def _t(self, axis: str, vals):
        if self.ax.scale[axis] == "log":
            return tuple(math.log10(v) if v > 0 else -math.inf for v in vals)
        return tuple(vals)

    def px(self, x: float) -> float:
        t = self._t("x", (x,))[0]
        return self.x0 + (t - self.xl[0]) / ((self.xl[1] - self.xl[0]) or 1) * self.w

    def py(self, y: float) -> float:
        t = self._t("y", (y,))[0]
        f = (t - self.yl[0]) / ((self.yl[1] - self.yl[0]) or 1)
        return self.y0 + (f if self.ax.inverted_y else 1 - f) * self.h

    def ok(self, x: float, y: float) -> bool:
        return all(v is not None and math.isfinite(v) for v in (x, y)) and math.isfinite(
            self._t("x", (x,))[0]) and math.isfinite(self._t("y", (y,))[0])


def _render(ax: Axes, cell, index: int) -> str:
    m = _margins(ax)
    cx, cy, cw, ch = cell
    box = (cx + m["left"], cy + m["top"], max(cw - m["left"] - m["right"], 10),
           max(ch - m["top"] - m["bottom"], 10))
    mp = _Map(ax, box)
    x0, y0, w, h = box
    clip = f"c{index}"
    out = [f'<clipPath id="{clip}"><rect x="{fmt(x0)}" y="{fmt(y0)}" width="{fmt(w)}" '
           f'height="{fmt(h)}"/></clipPath><g clip-path="url(#{clip})">']
    out += [_mark(mp, mark) for mark in ax.marks if mark[0] != "text"]
    out.append("</g>")
    if ax.frame:
        out.append(f'<rect x="{fmt(x0)}" y="{fmt(y0)}" width="{fmt(w)}" height="{fmt(h)}" '
                   'fill="none" stroke="#000" stroke-width="0.8"/>')
    out.append(_ticks(ax, mp))
    out += [_mark(mp, mark) for mark in ax.marks if mark[0] == "text"]
    if ax.label["title"]:
        out.append(_text(x0 + w / 2, y0 - ax.title_size * 0.6, ax.label["title"],
                         ax.title_size, "middle", cls="title"))
    if ax.label["x"]:
        out.append(_text(x0 + w / 2, cy + ch - 6, ax.label["x"], 10, "middle", cls="xlabel"))
    if ax.label["y"]:
        out.append(_text(cx + 14, y0 + h / 2, ax.label["y"], 10, "middle", rotate=90,
                         cls="ylabel"))
    if ax.legend_items:
        out.append(_legend(ax, box))
    if ax.colorbar:
        out.append(_colorbar(ax, box))
    return "".join(out)


def _mark(mp: _Map, mark: tuple) -> str:
    kind = mark[0]
    if kind == "rect":
        _, x0, x1, y0, y1, color = mark
        # a bar's base at 0 on a log axis starts at the axis' lower limit
        x0 = mp.ax.limits("x")[0] if x0 == 0 and mp.ax.scale["x"] == "log" else x0
        y0 = mp.ax.limits("y")[0] if y0 == 0 and mp.ax.scale["y"] == "log" else y0
        if not (mp.ok(x0, y0) and mp.ok(x1, y1)):
            return ""
        return _rect_path([(mp.px(x0), mp.px(x1), mp.py(y0), mp.py(y1))], color, "mark")
    if kind == "rects":
        _, rs, color = mark
        return _rect_path([(mp.px(a), mp.px(b), mp.py(c), mp.py(d)) for a, b, c, d in rs],
                          color, "mark")
    if kind == "line":
        return _line(mp, *mark[1:])
    if kind == "hline":
        _, y, color, width = mark
        return (f'<path d="M{fmt(mp.x0)} {fmt(mp.py(y))}h{fmt(mp.w)}" stroke="{color}" '
                f'stroke-width="{fmt(width)}"/>')
    if kind == "vline":
        _, x, color, width = mark
        return (f'<path d="M{fmt(mp.px(x))} {fmt(mp.y0)}v{fmt(mp.h)}" stroke="{color}" '
                f'stroke-width="{fmt(width)}"/>')
    if kind == "image":
        _, png, w, h = mark
        b64 = base64.b64encode(png).decode("ascii")
        x0, x1, y0, y1 = mp.px(-0.5), mp.px(w - 0.5), mp.py(-0.5), mp.py(h - 0.5)
        return (f'<image class="mark" x="{fmt(x0)}" y="{fmt(min(y0, y1))}" '
                f'width="{fmt(x1 - x0)}" height="{fmt(abs(y1 - y0))}" '
                'preserveAspectRatio="none" style="image-rendering:pixelated" '
                f'href="data:image/png;base64,{b64}"/>')
    _, x, y, s, size, anchor, dx, dy, rot, cls = mark
    if not mp.ok(x, y):
        return ""
    return _text(mp.px(x) + dx, mp.py(y) - dy, s, size, anchor, rot, cls, baseline="middle")


def _rect_path(rects, color: str, cls: str) -> str:
    d = "".join(f"M{fmt(min(a, b))} {fmt(min(c, e))}h{fmt(abs(b - a))}v{fmt(abs(e - c))}"
                f"h{fmt(-abs(b - a))}z" for a, b, c, e in rects)
    return f'<path class="{cls}" d="{d}" fill="{color}"/>' if d else ""


def _line(mp: _Map, xs, ys, color, marker, width, step) -> str:
    if step:  # stairs: xs are edges
        pts = []
        for i, y in enumerate(ys):
            pts += [(xs[i], y), (xs[i + 1], y)]
    else:
        pts = list(zip(xs, ys))
    d, pen = [], "M"
    for x, y in pts:
        if not mp.ok(x, y):
            pen = "M"
            continue
        d.append(f"{pen}{fmt(mp.px(x))} {fmt(mp.py(y))}")
        pen = "L"
    out = (f'<path class="mark" d="{"".join(d)}" fill="none" stroke="{color}" '
           f'stroke-width="{fmt(width)}" stroke-linejoin="round"/>' if d else "")
    if marker:
        dots = "".join(f'<circle cx="{fmt(mp.px(x))}" cy="{fmt(mp.py(y))}" r="{fmt(marker)}"/>'
                       for x, y in pts if mp.ok(x, y))
        out += f'<g class="mark" fill="{color}">{dots}</g>'
    return out


def _ticks(ax: Axes, mp: _Map) -> str:
    out = []
    for axis in ("x", "y"):
        if not ax.show_ticks[axis]:
            continue
        size, rot = ax.tick_style[axis]
        pos, labels = ax.tick_list(axis)
        lo, hi = sorted(ax.limits(axis))
        for p, s in zip(pos, labels):
            if not lo - 1e-9 * (abs(lo) + abs(hi)) <= p <= hi + 1e-9 * (abs(lo) + abs(hi)):
                continue
            if axis == "x":
                x, y = mp.px(p), mp.y0 + mp.h
                out.append(f'<path d="M{fmt(x)} {fmt(y)}v4" stroke="#000" stroke-width="0.8"/>')
                if rot:
                    out.append(_text(x + size * 0.35, y + 7, s, size, "end", rot, "xtick"))
                else:
                    out.append(_text(x, y + 6 + size, s, size, "middle", cls="xtick"))
            else:
                x, y = mp.x0, mp.py(p)
                out.append(f'<path d="M{fmt(x)} {fmt(y)}h-4" stroke="#000" stroke-width="0.8"/>')
                out.append(_text(x - 6, y, s, size, "end", rot, "ytick", baseline="middle"))
    return "".join(out)


def _legend(ax: Axes, box) -> str:
    size = ax.legend_opts.get("size", 8)
    ncol = ax.legend_opts.get("ncol", 1)
    where = ax.legend_opts.get("where", "upper right")
    title = ax.legend_opts.get("title", "")
    lw, lh = _legend_size(ax)
    x0, y0, w, h = box
    lx = x0 + w + 6 if where == "outside" else x0 + w - lw - 4
    ly = y0 + h - lh - 4 if where == "lower right" else y0 + (0 if where == "outside" else 4)
    out = ['<g class="legend">']
    if where != "outside":
        out.append(f'<rect x="{fmt(lx)}" y="{fmt(ly)}" width="{fmt(lw)}" height="{fmt(lh)}" '
                   'fill="#fff" fill-opacity="0.8" stroke="#ccc"/>')
    y = ly + 4
    if title:
        out.append(_text(lx + 4, y + size * 0.8, title, size, cls="legend-title"))
        y += size * 1.6
    per_col = math.ceil(len(ax.legend_items) / ncol)
    col_w = (lw - 8) / ncol
    for i, (label, color, kind) in enumerate(ax.legend_items):
        cx = lx + 4 + (i // per_col) * col_w
        cy = y + (i % per_col) * size * 1.45
        if kind == "line":
            out.append(f'<path d="M{fmt(cx)} {fmt(cy + size * 0.55)}h{fmt(size * 1.8)}" '
                       f'stroke="{color}" stroke-width="1.5"/>')
        else:
            out.append(f'<rect x="{fmt(cx)}" y="{fmt(cy + size * 0.1)}" width="{fmt(size * 1.8)}"'
                       f' height="{fmt(size * 0.9)}" fill="{color}"/>')
        out.append(_text(cx + size * 2.3, cy + size * 0.9, label, size, cls="legend-label"))
    out.append("</g>")
    return "".join(out)


def _colorbar(ax: Axes, box) -> str:
    x0, y0, w, h = box
    bx, bh = x0 + w + 14, h * 0.8
    by = y0 + (h - bh) / 2
    stops = "".join(f'<stop offset="{fmt(i / (len(VIRIDIS) - 1))}" stop-color="{c}"/>'
                    for i, c in enumerate(VIRIDIS))
    out = [f'<linearGradient id="cbar" x1="0" y1="1" x2="0" y2="0">{stops}</linearGradient>',
           f'<rect class="colorbar" x="{fmt(bx)}" y="{fmt(by)}" width="12" height="{fmt(bh)}" '
           'fill="url(#cbar)" stroke="#000" stroke-width="0.5"/>']
    for v in nice_ticks(0.0, 1.0, 5):
        ty = by + bh * (1 - v)
        out.append(f'<path d="M{fmt(bx + 12)} {fmt(ty)}h3" stroke="#000" stroke-width="0.8"/>')
        out.append(_text(bx + 18, ty, tick_label(v, False), 8, baseline="middle", cls="ctick"))
    out.append(_text(bx + 48, by + bh / 2, ax.colorbar[0], 9, "middle", rotate=90,
                     cls="clabel"))
    return "".join(out)
