"""The graph pane: the unrolled node list grouped by layer, and the token strip.

:func:`node_rows` and :func:`token_strip` are pure: a :class:`StopView`, the
static model and a width in, Rich text out. A node's time sits right-aligned
on its own line at every width: the name is truncated, never the time.
"""
from __future__ import annotations

from typing import Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import var
from textual.widgets import Static
from textual.widgets.option_list import Option

from .diff_view import SEVERITY_STYLE
from .state import FINDING_MARK, StopView
from ..runtime import NodeKind
from .paint import RowList, set_border, show_options, update

TIME_WIDTH = 7  # "999.9ms" / " 187µs"


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds:.2f}s"


def token_strip(view: StopView) -> Text:
    snap = view.snapshot
    t = Text()
    for i, piece in enumerate(view.pieces):
        style = "bold reverse" if i == snap.step and not snap.finished else (
            "cyan" if i < view.n_prompt else "green")
        t.append(piece, style=style)
        t.append(" " if len(piece) > 1 else "")
    remaining = snap.total_steps + 1 - len(view.pieces)
    if remaining > 0:
        t.append(f" +{remaining}", style="dim")
    return t


def node_rows(model, view: StopView, width: int,
              times: Mapping[int, float] | None = None,
              made: dict | None = None) -> list[tuple[str, Text, bool]]:
    """(option id, text, disabled) per row: layer headers, then one row per node.
    ``made``: rows made before for this model, by what they show (the graph pane's: a step
    changes two rows of GPT-2 small's ~200, the rest are the same Text objects again)."""
    current = view.node_index if not view.snapshot.finished else None
    if times is None:
        times = view.snapshot.node_times
    if made is None:
        made = {}
    rows = []
    last_layer: object = "none"
    width = max(width, 12)
    for node in model.nodes:
        if node.layer != last_layer and node.layer is not None:
            key = ("layer", node.layer)
            head = made.get(key)
            if head is None:
                head = made[key] = Text(f"▾ layer {node.layer}", style="bold")
            rows.append((f"layer{node.layer}", head, True))
        last_layer = node.layer
        time = fmt_time(times.get(node.index))
        flagged = view.findings.node_marked(node)  # the sanitizer found something here
        mark = view.marks.node_marked(node)
        sev = view.diff.severity.get(node.index) if view.diff is not None else None
        key = (node.index, width, time, flagged, mark, sev, node.index == current)
        t = made.get(key)
        if t is None:
            t = made[key] = _node_row(node, width, time, flagged, mark, sev,
                                      node.index == current)
        rows.append((str(node.index), t, False))
    return rows


def _node_row(node, width: int, time: str, flagged: bool, mark: str, sev, current: bool) -> Text:
    indent = "  " if node.layer is not None else ""
    room = width - 2 - len(indent) - (len(time) + 1 if time else 0) - (2 if flagged else 0)
    name = node.name if len(node.name) <= room else node.name[: max(room - 1, 1)] + "…"
    t = Text(no_wrap=True, overflow="crop")
    t.append(mark, style="red bold")
    t.append("▶" if current else " ", style="yellow bold")
    style = "bold yellow" if current else ("" if node.kind == NodeKind.MICRO else "italic")
    if sev is not None and not current:  # against a dump: coloured by severity
        style = f"{style} {SEVERITY_STYLE[sev]}".strip()
    t.append(indent + name, style=style)
    if flagged:
        t.append(" " + FINDING_MARK, style="bold magenta")
    if time:
        t.append(" " * max(width - t.cell_len - len(time), 1) + time, style="dim")
    return t


class NodeList(RowList):
    """One option per node (id = node index); layer headers are disabled options."""

    def show_rows(self, rows: list[tuple[str, Text, bool]], follow: int | None) -> None:
        old = self.highlighted
        # the same rows (nodes and layer headers): only those whose text changed are
        # replaced; a rebuild of every option cost each step key several ms
        show_options(self, [Option(t, id=i, disabled=d) for i, t, d in rows])
        if follow is not None:
            self.highlighted = self.index_of_node(follow)
        elif old is not None and old < self.option_count:
            self.highlighted = old

    def index_of_node(self, node_index: int) -> int:
        for i in range(self.option_count):
            if self.get_option_at_index(i).id == str(node_index):
                return i
        return 0

    def cursor_node(self) -> int | None:
        opt = self.highlighted_option
        if opt is None or opt.id is None or not opt.id.isdigit():
            return None
        return int(opt.id)

    def on_resize(self) -> None:
        pane = self.parent
        if isinstance(pane, GraphPane) and pane.view is not None:
            pane.render_rows(None)  # rows fit the width the list has now


class GraphPane(Vertical):
    ALLOW_MAXIMIZE = True
    DEFAULT_CSS = """
    GraphPane { border: round $primary-darken-2; }
    GraphPane:focus-within { border: round $accent; }
    GraphPane NodeList, GraphPane NodeList:focus { height: 1fr; border: none; padding: 0;
                                                   scrollbar-size-vertical: 1; }
    GraphPane #tokens { height: auto; max-height: 3; padding: 0 1; }
    """

    # bound to the screen's (data_bind): the model, whether to follow the stop, node times as
    # shown (tests: deterministic times), the frozen stop; a new view is drawn
    model = var(None, always_update=True)
    follow = var(True)
    time_of = var(None)
    view: var[StopView | None] = var(None, always_update=True, init=False)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._made: dict = {}  # node_rows' rows made for _made_for (the model)
        self._made_for = None

    def compose(self) -> ComposeResult:
        yield Static(id="tokens")
        yield NodeList(id="nodes")

    def on_mount(self) -> None:
        self.border_title = "Graph"

    def watch_view(self, view: StopView | None) -> None:
        if view is not None and self.model is not None:
            self.show(self.model, view, follow=self.follow)

    def show(self, model, view: StopView, follow: bool = True) -> None:
        self.set_reactive(GraphPane.model, model)
        self.set_reactive(GraphPane.view, view)
        update(self.query_one("#tokens", Static), token_strip(view))
        self.render_rows(view.node_index if follow and not view.snapshot.finished else None)
        set_border(self, subtitle=f"{len(model.nodes)} nodes")

    def render_rows(self, follow: int | None) -> None:
        nodes = self.query_one(NodeList)
        width = nodes.scrollable_content_region.width
        if width <= 0:  # hidden (loading, another pane maximized): drawn again once shown
            width = max(self.size.width - 3, 0) or 200
        times = self.time_of(self.view.snapshot.node_times) if self.time_of else None
        if self._made_for is not self.model or len(self._made) > 8 * len(self.model.nodes):
            self._made, self._made_for = {}, self.model  # another model, or many widths
        nodes.show_rows(node_rows(self.model, self.view, width - 1, times, self._made),
                        follow)
