"""The Diff tab: this session against another runtime's dump (``firscope MODEL --against
DUMP``, issue 13).

It shows the first divergence so far, the compared node outputs of the current
token with their error, and reference / other / difference side by side for the
output that decided the last compared node, its first differing element marked.
Everything comes from the frozen :class:`DiffPeek` of a :class:`StopView`; the
rows are pure functions, tested without Pilot. The graph pane colours each node
by the same severity (:data:`SEVERITY_STYLE`).
"""
from __future__ import annotations

import math

from rich.text import Text
from textual.containers import VerticalScroll
from textual.reactive import var
from textual.widgets import Static

from ..compare.views import Severity
from .state import DiffPeek, StopView
from .paint import update

SEVERITY_STYLE = {Severity.NOT_COMPARED: "", Severity.EXACT: "green",
                  Severity.WITHIN: "green", Severity.NEAR: "yellow",
                  Severity.DIVERGED: "bold red", Severity.NONFINITE: "bold magenta"}


def diff_text(peek: DiffPeek | None, width: int = 100) -> Text:
    t = Text()
    if peek is None:
        t.append("no dump attached: start with firscope MODEL.fir --against DUMP", style="dim")
        return t
    t.append(peek.first or "no divergence so far", style="bold red" if peek.first else "green")
    t.append("\n")
    for note in peek.notes:
        t.append(note + "\n", style="dim")
    if peek.errors:
        t.append(f"\ntoken {peek.step}: compared outputs\n", style="bold")
        for e in peek.errors:
            t.append(f"  {e.instance:<24}", style=SEVERITY_STYLE[e.severity])
            rel = "" if e.rel_l2 is None else (
                "inf" if math.isinf(e.rel_l2) else f"{e.rel_l2:.2e}")
            t.append(f" {e.severity.label:<18} rel L2 {rel:<9} {e.worst or ''}\n",
                     style=SEVERITY_STYLE[e.severity])
    view = peek.buffer
    if view is not None:
        t.append(f"\n{view.summary}\n", style="bold")
        t.append(f"  {'index':>7} {'reference':>14} {'other':>14} {'difference':>12} {'ULP':>10}\n",
                 style="dim")
        for r in view.rows:
            ulp = "" if r.ulp is None else str(r.ulp)
            line = (f"{'▶' if r.marked else ' '} {r.index:>7} {r.reference:>14.7g} "
                    f"{r.other:>14.7g} {r.difference:>12.4g} {ulp:>10}")
            style = "bold black on yellow" if r.marked else ("red" if r.differs else "")
            t.append(line[:width] + "\n", style=style)
    return t


class DiffView(VerticalScroll, can_focus=True):
    """Scrolls: at 80x24 the element table is below the compared outputs."""

    DEFAULT_CSS = """
    DiffView > Static { width: 100%; }
    """
    view: var[StopView | None] = var(None, always_update=True, init=False)  # bound: the stop

    def compose(self):
        yield Static(id="diff-body")

    def watch_view(self) -> None:
        self._draw()

    def show(self, view: StopView) -> None:
        self.view = view  # drawn by watch_view

    def _draw(self) -> None:
        width = self.scrollable_content_region.width
        if self.view is not None and width > 0:  # hidden (another tab): drawn when shown
            update(self.query_one("#diff-body", Static), diff_text(self.view.diff, width))

    def on_resize(self) -> None:
        self._draw()
