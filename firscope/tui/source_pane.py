"""Kernel source: lines with .fir line numbers, pc, breakpoint gutter, nesting, heat.

:func:`source_rows` and :func:`ext_text` are pure (static model + a
:class:`StopView` in, Rich text out). Rows fit the width they are given:
whole instructions first; the execution counts and then the nesting indent
give way before any instruction text is cut.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import var
from textual.widgets import Static
from textual.widgets.option_list import Option

from ..runtime import NodeKind
from ..text import printable
from .heat import ramp
from .state import FINDING_MARK, StopView
from .paint import RowList, set_border, show_options, update


@dataclass(frozen=True)
class SourceView:
    rows: tuple[tuple[int, Text], ...]  # (.fir line, text)
    title: str
    subtitle: str
    focus_line: int | None  # the pc's line (or the kernel's first, before it runs)
    first_line: int


def _per_line(prog, counts: np.ndarray | None) -> tuple[dict[int, int], dict[int, int]]:
    per_line: dict[int, int] = {}
    depth: dict[int, int] = {}
    for op in prog.ops:
        depth[op.loc.line] = op.depth
        if counts is not None and op.pc < len(counts):
            per_line[op.loc.line] = per_line.get(op.loc.line, 0) + int(counts[op.pc])
    return per_line, depth


def _count_cell(n: int | None, top: int) -> tuple[str, str]:
    if n is None:
        return " " * 7, ""
    return f"×{n:<6}", (f"bold {ramp(0.35 + 0.65 * n / top).name}" if n else "dim")


def _fit(body: str, indent: int, room: int) -> str:
    """The line's text in ``room`` cells: drop indent, then a trailing comment, then cut."""
    while indent and 2 * indent + len(body) > room:
        indent -= 1
    text = "  " * indent + body
    if len(text) > room and "#" in body[1:]:
        text = ("  " * indent + body[: body.index("#", 1)]).rstrip()
    if len(text) > room:
        text = text[: max(room - 1, 1)] + "…"
    return text


UNCOALESCED_MARK = "≠"  # GPU prediction: this line's loads/stores waste most of each sector
LOW_SIMD_MARK = "◌"  # GPU prediction: most SIMD lanes idle when this line issues
LOW = 0.5  # below this coalescing or SIMD efficiency a line is marked


def cost_marks(report) -> dict[str, dict[int, str]]:
    """kernel -> line -> gutter mark, from a firscope/cost report (uncoalesced wins)."""
    out: dict[str, dict[int, str]] = {}
    for name, k in report.by_kernel().items():
        marks = {}
        for ln in k["lines"]:
            if ln["coalescing_efficiency"] is not None and ln["coalescing_efficiency"] < LOW:
                marks[ln["line"]] = UNCOALESCED_MARK
            elif ln["simd_efficiency"] is not None and ln["simd_efficiency"] < LOW:
                marks[ln["line"]] = LOW_SIMD_MARK
        if marks:
            out[name] = marks
    return out


# a line's share of its kernel's predicted time, as one cell (key G / --device): none to most
HEAT_MARKS = " ▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class LineCost:
    """One source line's GPU-prediction counters (firscope cost's per-line figures)."""

    time_share: float  # of the kernel's predicted time
    active: float | None  # active-lane share
    sectors_per_request: float | None


def cost_lines(report) -> dict[str, dict[int, LineCost]]:
    """kernel -> line -> its counters, from a firscope/cost report."""
    return {name: {ln["line"]: LineCost(ln["time_share"], ln["active_lane_share"],
                                        ln["sectors_per_request"]) for ln in k["lines"]}
            for name, k in report.by_kernel().items() if k["lines"]}


def heat_mark(share: float, top: float) -> str:
    """The cell for a line's time share, scaled to the kernel's largest (top: █)."""
    if not share > 0 or not top > 0:
        return " "
    return HEAT_MARKS[max(1, min(8, round(8 * share / top)))]


def _kernel_costs(costs: dict | None, kernel: str) -> tuple[dict[int, LineCost], float]:
    """The kernel's line costs and the largest time share among them."""
    mine = (costs or {}).get(kernel, {})
    return mine, max((lc.time_share for lc in mine.values()), default=0.0)


def _share(costs: dict[int, LineCost], line: int) -> float:
    lc = costs.get(line)
    return lc.time_share if lc is not None else 0.0


def _cost_cell(lc: LineCost | None) -> str:
    """``42% 100% 1.0``: share of the kernel's time, active lanes, sectors per request."""
    if lc is None:
        return " " * COST_CELL
    spr = "   -" if lc.sectors_per_request is None else f"{lc.sectors_per_request:4.1f}"
    act = "   -" if lc.active is None else f"{lc.active:4.0%}"
    return f"{lc.time_share:4.0%} {act} {spr} "


COST_CELL = 15  # the width of _cost_cell


def _gutter(line: int, breakpoint: bool, flagged: bool, mark: str, cost: str = "") -> Text:
    """Breakpoint (or sanitizer finding, or GPU cost) mark, pc mark, line number."""
    t = Text(no_wrap=True, overflow="crop")
    if breakpoint:
        t.append("●", style="red bold")
    elif cost and not flagged:  # the GPU prediction's mark (key G / --device)
        t.append(cost, style="dark_orange bold")
    else:  # a line a sanitizer finding involves
        t.append(FINDING_MARK if flagged else " ", style="magenta bold")
    t.append(mark, style="yellow bold")
    t.append(f"{line:4d} ", style="magenta bold" if flagged else "dim")
    return t


def _cells(t: Text, line: int, costs: dict[int, LineCost], top_share: float,
           counts: dict[int, int] | None, top: int, show_costs: bool) -> None:
    """After the gutter: the heat cell (a kernel with costs), the execution count (when
    ``counts``) and the cost column (when ``show_costs``)."""
    if costs:
        t.append(heat_mark(_share(costs, line), top_share), style="dark_orange")
    if counts is not None:
        cell, style = _count_cell(counts.get(line), top)
        t.append(cell, style=style)
    if show_costs:
        t.append(_cost_cell(costs.get(line)), style="dark_orange")


def _columns(width: int, widest: int, counts: bool, costs: bool) -> tuple[bool, bool]:
    """Whether the execution counts and then the cost column fit beside whole lines (the
    heat cell of a kernel with costs always shows)."""
    gutter = 8 + costs
    show_counts = counts and gutter + 7 + widest <= width  # counts give way to whole lines
    return show_counts, costs and gutter + 7 * show_counts + COST_CELL + widest <= width


def source_rows(model, view: StopView, node_index: int, width: int,
                marks: dict[str, dict[int, str]] | None = None,
                costs: dict[str, dict[int, LineCost]] | None = None) -> SourceView:
    """The kernel of node ``node_index`` as the source pane shows it at this stop;
    ``marks``: the GPU prediction's gutter marks (:func:`cost_marks`); ``costs``: its
    per-line counters (:func:`cost_lines`): a heat cell of the line's share of the kernel's
    predicted time, and where the width allows, that share, active lanes and sectors per
    request as a column."""
    node = model.nodes[node_index]
    snap = view.snapshot
    loc = snap.location
    live = node_index == loc.node_index and not snap.finished
    prog = node.program
    k = prog.kernel.syntax
    pc_line = loc.line if live and loc.in_kernel else None
    next_line = prog.ops[0].loc.line if live and not loc.in_kernel and prog.ops else None
    counts = snap.line_counts if live and snap.line_counts is not None else \
        view.kernel_counts.get(node.target)
    per_line, depth = _per_line(prog, counts)
    top = max(per_line.values()) if per_line else 0
    bps = view.marks.lines.get(node.target, frozenset())
    from ..runtime.load import kernel_source
    # the user sees \x1b from a file escaped; the terminal never gets it (an edited kernel:
    # the edit's own lines)
    bodies = {ln: printable(text.strip()) for ln, text in kernel_source(model, k).items()}
    # instructions only: the kernel header and comments may be cut, an instruction never
    widest = max((len(b) + 2 * depth.get(ln, 0) for ln, b in bodies.items() if ln in depth),
                 default=0)
    line_costs, top_share = _kernel_costs(costs, node.target)
    show_counts, show_costs = _columns(width, widest, bool(top), bool(line_costs))
    rows = []
    mine = (marks or {}).get(node.target, {})
    for ln, body in bodies.items():
        t = _gutter(ln, ln in bps, view.findings.line_marked(node.target, ln),
                    "▶" if ln == pc_line else ("▷" if ln == next_line else " "), mine.get(ln, ""))
        _cells(t, ln, line_costs, top_share, per_line if show_counts else None, top,
               show_costs)
        here = ln in (pc_line, next_line)
        style = "bold yellow" if here else ("dim" if body.startswith("#") else "")
        t.append(_fit(body, depth.get(ln, 0), max(width - t.cell_len, 8)), style=style)
        rows.append((ln, t))
    title = f"{node.target} · {printable(model.path.name)}:{pc_line or k.loc.line}"
    subtitle = f"{node.full_name} · {prog.threads} lanes" + (
        f" · pc {loc.pc}" if pc_line is not None else "")
    return SourceView(tuple(rows), title, subtitle, pc_line or next_line, k.loc.line)


def ext_text(model, node, view: StopView) -> Text:
    """An ext node: the op, operands with shapes, q4 detail, what it computes, its time."""
    t = Text()
    t.append(f"{node.full_name}: ext {node.target}\n", style="bold")
    t.append(printable(model.fir.lines[node.loc.line - 1].strip()) + "\n\n", style="dim")
    for label, ops in (("in", node.args), ("out", node.outs)):
        for i, o in enumerate(ops):
            t.append(f"{label}{i} ", style="cyan")
            t.append(f"{o.display}", style="bold")
            t.append(f"  {o.kind}, {o.size:,} elements\n")
            w = o.weight
            if w is not None:
                t.append(f"     {w.dtype} declared {list(w.shape)}, {w.stored}\n")
                if w.q4 is not None:
                    t.append(f"     q4 group {w.q4.group}, {w.q4.ngroups} groups/row, "
                             f"{w.q4.nbytes:,} bytes\n")
    t.append("\n" + _EXT_FORMULA.get(node.target, "out = table[int(ids[0])]") + "\n", style="dim")
    last = view.snapshot.node_times.get(node.index)
    if last is not None:
        t.append(f"\nlast run: {last * 1e3:.3f} ms\n")
    return t


_EXT_FORMULA = {"fir.linear": "y = x · W  (W declared [in, out])",
                "fir.linear_t": "y = W · x  (W declared [out, in])"}


class SourceLines(RowList):
    """One option per source line of the kernel (id = line number)."""

    def cursor_line(self) -> int | None:
        opt = self.highlighted_option
        if opt is None or opt.id is None:
            return None
        return int(opt.id)

    def on_resize(self) -> None:
        pane = self.parent
        if not isinstance(pane, SourcePane) or pane.view is None:
            return
        if self.scrollable_content_region.width != pane.rows_width:
            pane.redraw(keep=True)  # rows fit the width the list has now
        else:  # the same rows; a list of another height keeps its cursor line in view
            self.scroll_to_highlight()


class ExtInfo(Static, can_focus=True):
    """What an ext node does (focusable, so the pane can be focused and maximized)."""


class SourcePane(Vertical):
    ALLOW_MAXIMIZE = True
    DEFAULT_CSS = """
    SourcePane { border: round $primary-darken-2; }
    SourcePane:focus-within { border: round $accent; }
    SourcePane SourceLines, SourcePane SourceLines:focus { height: 1fr; border: none; padding: 0;
                                                           scrollbar-size-vertical: 1;
                                                           scrollbar-gutter: stable; }
    SourcePane ExtInfo { height: 1fr; padding: 0 1; display: none; }
    """

    # bound to the screen's (data_bind): the model, whether to follow the stop, the stop
    model = var(None, always_update=True)
    follow = var(True)
    view: var[StopView | None] = var(None, always_update=True, init=False)
    # the GPU prediction's gutter marks (:func:`cost_marks`): new marks redraw at the pc
    cost_marks: var[dict[str, dict[int, str]]] = var(dict, always_update=True, init=False)
    # its per-line counters (:func:`cost_lines`), set before cost_marks (which redraws)
    cost_lines: var[dict[str, dict[int, LineCost]]] = var(dict, init=False)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.node_index: int | None = None  # the node shown (None: follow the stop)
        self.shown_node: int | None = None  # the node whose kernel is on screen
        self._shown: tuple | None = None
        # the list's width the rows were made for (a resize to another width remakes them;
        # shown again after an ext node, at the width it had, it needs nothing)
        self.rows_width: int | None = None

    def watch_view(self, view: StopView | None) -> None:
        if view is None or self.model is None:
            return
        if self.follow:
            self.show(self.model, view)
        else:  # nothing moved (F9 on a line, display, set): the source stays where it was
            self.show(self.model, view, self.node_index, keep=True)

    def watch_cost_marks(self) -> None:
        if self.view is not None and self.model is not None:
            self.redraw()

    def compose(self) -> ComposeResult:
        yield SourceLines(id="source-lines")
        yield ExtInfo(id="ext-info")

    def on_mount(self) -> None:
        self.border_title = "Kernel"

    def show(self, model, view: StopView, node_index: int | None = None,
             keep: bool = False) -> None:
        """Show the kernel of the stop's node (or of ``node_index``, e.g. the graph cursor).
        ``keep``: the cursor stays on its line when the same kernel is shown (a command that
        did not move, e.g. F9 on a line); else it goes to the pc."""
        self.set_reactive(SourcePane.model, model)
        self.set_reactive(SourcePane.view, view)
        self.node_index = node_index
        self.redraw(keep)

    def redraw(self, keep: bool = False) -> None:
        model, view = self.model, self.view
        idx = view.node_index if self.node_index is None else self.node_index
        if idx is None:
            self._show_text("end of generation", Text("generation is over", style="dim"))
            return
        node = model.nodes[idx]
        self.shown_node = idx
        if node.kind == NodeKind.EXT:
            self._show_text(f"{node.target} · {printable(model.path.name)}:{node.loc.line}",
                            ext_text(model, node, view), node.full_name)
            return
        self.show_ext(False)
        lines = self.query_one(SourceLines)
        width = lines.scrollable_content_region.width
        if width <= 0:  # hidden (after an ext node, loading, another pane maximized): the
            # width it will have, inside this pane's border less its scrollbar's gutter
            # (kept whether the bar shows or not: scrollbar-gutter stable)
            width = max(self.size.width - 1, 0) or 200
        self.rows_width = width
        sv = source_rows(model, view, idx, width - 1, self.cost_marks, self.cost_lines)
        old = lines.highlighted
        same = self._shown == (node.target,)
        show_options(lines, [Option(t, id=str(ln)) for ln, t in sv.rows])
        if keep and same and old is not None:
            lines.highlighted = min(old, len(sv.rows) - 1)
        elif sv.focus_line is not None:
            lines.highlighted = sv.focus_line - sv.first_line
        elif old is not None and same:
            lines.highlighted = min(old, len(sv.rows) - 1)
        self._shown = (node.target,)
        set_border(self, sv.title, sv.subtitle)

    def show_ext(self, ext: bool) -> None:
        """The ext node's text or the kernel's lines. Set on the two widgets: a class on the
        pane would restyle everything under it (its scrollbars too) at each switch, ~3 ms
        of a step key between a linear and a kernel."""
        self.query_one(ExtInfo).display = ext
        self.query_one(SourceLines).display = not ext

    @property
    def ext(self) -> bool:
        """The pane shows an ext node's text (not a kernel's lines)."""
        return bool(self.query_one(ExtInfo).display)

    def _show_text(self, title: str, body: Text, subtitle: str = "") -> None:
        self.show_ext(True)
        update(self.query_one(ExtInfo), body)
        set_border(self, title, subtitle)
