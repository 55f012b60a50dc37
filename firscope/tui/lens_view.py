"""The Lens tab: the logit lens after every layer of the current token (layer x top-5),
updated at each stop; Enter (or a click) on a layer goes to the end of that layer.

The table comes from the frozen :class:`LensPeek` of a :class:`StopView`
(``lens --all`` computed where the session may be read).
"""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.message import Message
from textual.reactive import var
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from .paint import show_options
from .state import StopView


LABEL = 10  # the row's label column ("layer 11  ")
CELL = 14  # one candidate: " 'tok'  0.123 "


def candidates_for(width: int) -> int:
    """How many of the top-5 fit on one line of ``width`` cells (at least 1): every layer
    keeps one row, at 80 columns as at 200."""
    return max(1, min(5, (width - LABEL) // CELL))


def lens_rows(view: StopView, width: int = 200) -> list[tuple[str | None, Text]]:
    """(option id: the layer, text) per row, as many candidates as fit ``width``; a message
    row when there is nothing to show."""
    peek = view.lens
    if peek is None:
        return [(None, Text("the lens is computed while this tab is showing", style="dim"))]
    if peek.error is not None:
        return [(None, Text(peek.error, style="dim"))]
    rows = []
    for row in peek.rows:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(f"{row.label:<{LABEL}}", style="bold")
        for tok, p in row.top[: candidates_for(width)]:
            t.append(f" {peek.pieces.get(tok, str(tok))!r:>6}", style="cyan")
            t.append(f" {p:5.3f} ", style="bold" if p >= 0.5 else "")
        rows.append((None if row.layer is None else str(row.layer), t))
    return rows


def end_of_layer(model, layer: int) -> str | None:
    """The node right after ``layer``'s last node: where the lens reads that layer's output."""
    last = max((n.index for n in model.nodes if n.layer == layer), default=None)
    if last is None or last + 1 >= len(model.nodes):
        return None
    return model.nodes[last + 1].full_name


class LensView(OptionList):
    @dataclass
    class Jump(Message):
        layer: int

    view: var[StopView | None] = var(None, always_update=True, init=False)  # bound: the stop

    def watch_view(self, view: StopView | None) -> None:
        if view is not None:
            self.show(view)

    def _width(self) -> int:
        """The cells a row has: the list's own width (the app's, before the first layout),
        less the scrollbar."""
        return max((self.content_size.width or self.app.size.width - 6) - 2, 20)

    def on_resize(self, event) -> None:
        if self.view is not None:
            self.show(self.view)

    def show(self, view: StopView) -> None:
        old = self.highlighted
        width = self._width()
        k = candidates_for(width)
        wide = ("top-5 next tokens from the residual after each layer of this token "
                "(final norm + unembedding) · Enter: go to the end of that layer")
        narrow = f"top-{k} next tokens after each layer · Enter: go to its end"
        head = Text(wide if len(wide) <= width else narrow, style="dim", no_wrap=True,
                    overflow="ellipsis")
        show_options(self, [Option(head, disabled=True)] + [
            Option(t, id=i, disabled=i is None) for i, t in lens_rows(view, width)])
        if old is not None and old < self.option_count:
            self.highlighted = old

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.post_message(self.Jump(int(event.option.id)))
