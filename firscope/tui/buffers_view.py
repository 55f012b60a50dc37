"""Buffers: the next node's inputs by default, or any buffer or weight by name: values
with paging and an element cursor, shape, statistics, a histogram and a sparkline; a
q4 weight also shows codes, scale and min per group and its dequantization error
against the checkpoint's f32 values (all computed in the worker: :mod:`.stats`).

The text is built by pure functions from the frozen :class:`BufferPeek` of a
:class:`StopView`. On an element, ``=`` edits it (``set``) and ``h`` lists every
write to it (``history``); the app runs both through the command interpreter.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import var
from textual.widgets import Input, Static

from ..debug.info import fmt_scalar
from .messages import ElementMessage
from .state import BufferPeek, StopView
from .stats import Q4Error
from .paint import update

PAGE = 64  # values per page (8 rows of 8)


def per_row_for(width: int) -> int:
    return max(1, min(8, (width - 10) // 11)) if width > 0 else 8


def values_text(arr: np.ndarray, cursor: int, per_row: int) -> Text:
    """One page of values around ``cursor`` (the element under it reversed)."""
    flat = arr.reshape(-1)
    n = flat.size
    offset = cursor - cursor % PAGE
    page = flat[offset: offset + PAGE]
    v = Text(no_wrap=True)
    for row in range(0, page.size, per_row):
        v.append(f"[{offset + row:>7}] ", style="dim")
        for k, x in enumerate(page[row: row + per_row]):
            style = "bold red" if not np.isfinite(x) else ""
            if offset + row + k == cursor:
                style += " reverse"
            v.append(f"{float(x):>11.5g}", style=style.strip())
        v.append("\n")
    v.append(f"{offset}..{min(offset + PAGE, n) - 1} of {n} · cursor [{cursor}] "
             "· = set · h history", style="dim")
    return v


def inputs_text(peek: BufferPeek) -> Text:
    """The next node's inputs, one line each (the first one's values are below), with the
    summaries the worker computed (:func:`~.stats.with_stats`)."""
    t = Text()
    t.append(peek.title, style="bold")
    t.append("  (type a name above to look at another buffer or weight)\n", style="dim")
    sums = peek.summaries or (None,) * len(peek.names)
    for name, arr, sm in zip(peek.names, peek.arrays, sums):
        t.append(f"{name:<16}", style="bold cyan")
        t.append(f" {str(list(arr.shape)):<12}")
        if sm is not None:
            lo, hi, mean, bad = sm
            t.append(f" min {lo:<10.4g} max {hi:<10.4g} mean {mean:<10.4g}")
            if bad:
                t.append(f" {bad} NaN/Inf", style="bold red")
        t.append("\n")
    t.rstrip()
    return t


def q4_text(w, row: int, col0: int, error: Q4Error | None) -> Text:
    q = w.q4
    g0 = col0 // q.group
    t = Text()
    t.append(f"q4 {w.name}: [{q.rows} out, {q.cols} in], group {q.group}\n", style="bold")
    t.append(f"row {row}, groups {g0}..{min(g0 + 3, q.ngroups - 1)}\n")
    codes = q.codes()[row]
    for g in range(g0, min(g0 + 4, q.ngroups)):
        t.append(f"g{g:<4} scale {float(q.scale[row, g]):.4g} min "
                 f"{float(q.minimum[row, g]):.4g}\n", style="cyan")
        c = codes[g * q.group:(g + 1) * q.group]
        t.append("  " + "".join(f"{int(x):x}" for x in c) + "\n", style="dim")
    if error is not None:
        t.append(f"\nerror vs f32: rmse {error.rmse:.3g}  max {error.max_abs:.3g}\n"
                 f"p95 {error.p95:.3g}  median {error.median:.3g}\n")
        t.append(f"|err|/scale max {error.rel_max:.3f} (≤ 0.5 + rounding)\n", style="dim")
    t.append(f"scales {q.scale.min():.3g}..{q.scale.max():.3g}  mins {q.minimum.min():.3g}.."
             f"{q.minimum.max():.3g}", style="dim")
    return t


class ValuesView(Static, can_focus=True):
    BINDINGS = [Binding("pagedown", "move(64)", "next page", show=False),
                Binding("pageup", "move(-64)", "prev page", show=False),
                Binding("left", "move(-1)", show=False), Binding("right", "move(1)", show=False),
                Binding("up", "move_row(-1)", show=False),
                Binding("down", "move_row(1)", show=False),
                Binding("home", "move(-1000000000000)", show=False),
                Binding("end", "move(1000000000000)", show=False),
                Binding("equals_sign", "edit", "set", show=False),
                Binding("h", "history", "history", show=False)]

    def _owner(self) -> "BuffersView":
        return next(a for a in self.ancestors if isinstance(a, BuffersView))

    def on_resize(self) -> None:
        self._owner().render_values()

    def action_move(self, delta: int) -> None:
        self._owner().move(delta)

    def action_move_row(self, rows: int) -> None:
        self._owner().move(rows * per_row_for(self.size.width))

    def action_edit(self) -> None:
        self._owner().request(BuffersView.Edit)

    def action_history(self) -> None:
        self._owner().request(BuffersView.History)


class BuffersView(Vertical):
    DEFAULT_CSS = """
    BuffersView #buf-bar { height: 3; }
    /* the whole placeholder (46 characters) + the padding (4), border (2) and cursor (1) */
    BuffersView #buf-name { width: 53; }
    BuffersView #buf-hint { width: 1fr; padding: 1 1 0 1; color: $text-muted; }
    BuffersView #buf-stats { height: auto; max-height: 8; padding: 0 1; }
    BuffersView #buf-body { height: 1fr; }
    BuffersView ValuesView { width: 1fr; padding: 0 1; }
    BuffersView #buf-q4 { width: 48; padding: 0 1; border-left: solid $primary-darken-2;
                          display: none; }
    BuffersView.-q4 #buf-q4 { display: block; }
    """

    @dataclass
    class NameChanged(Message):
        name: str

    class Edit(ElementMessage):
        """``=`` on an element: set it."""

    class History(ElementMessage):
        """``h`` on an element: every write to it."""

    # bound to the screen's (data_bind): the model and the frozen stop
    model = var(None, always_update=True)
    view: var[StopView | None] = var(None, always_update=True, init=False)
    # the element under the cursor, within the array shown (validate_cursor)
    cursor = var(0, init=False)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.peek: BufferPeek | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="buf-bar"):
            yield Input(value="", placeholder="the next node's inputs · or a name: x, qkvw@0",
                        id="buf-name")
            yield Static("Enter shows it · arrows/PgUp/PgDn move · = set · h history",
                         id="buf-hint")
        yield Static(id="buf-stats")
        with Horizontal(id="buf-body"):
            yield ValuesView(id="buf-values")
            yield Static(id="buf-q4")

    def watch_view(self, view: StopView | None) -> None:
        if view is not None:
            self.show(view)

    def validate_cursor(self, cursor: int) -> int:
        peek = self.peek
        n = peek.arrays[0].size if peek is not None and peek.arrays else 0
        return min(max(cursor, 0), max(n - 1, 0))

    def watch_cursor(self) -> None:
        self.render_values()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "buf-name":
            event.stop()
            self.set_reactive(BuffersView.cursor, 0)  # drawn with the values asked for
            self.post_message(self.NameChanged(event.value.strip()))
            self.query_one(ValuesView).focus()

    def show_name(self, name: str) -> None:
        """Type ``name`` into the name field (the app then asks for its values)."""
        self.query_one("#buf-name", Input).value = name
        self.set_reactive(BuffersView.cursor, 0)
        self.post_message(self.NameChanged(name))

    def show(self, view: StopView) -> None:
        old, self.peek = self.peek, view.buffer
        if old is None or self.peek is None or old.names[:1] != self.peek.names[:1]:
            self.set_reactive(BuffersView.cursor, 0)  # another buffer: its first element
        self._render_all()

    def _render_all(self) -> None:
        peek = self.peek
        stats = self.query_one("#buf-stats", Static)
        values = self.query_one(ValuesView)
        if peek is None:
            return
        if peek.error is not None or not peek.arrays:
            update(stats, Text(peek.error or f"{peek.title}: no buffer inputs", style="red"
                               if peek.error else "dim"))
            update(values, "")
            self.remove_class("-q4")
            return
        if len(peek.names) > 1 or peek.title.startswith("inputs of"):
            update(stats, inputs_text(peek))
        else:  # computed in the worker; a weight's once per load (38M values for wte)
            update(stats, peek.stats if peek.stats is not None else "")
        self.render_values()

    def render_values(self) -> None:
        peek = self.peek
        if peek is None or not peek.arrays:
            return
        arr = peek.arrays[0]
        self.set_reactive(BuffersView.cursor, self.validate_cursor(self.cursor))  # this array
        values = self.query_one(ValuesView)
        update(values, values_text(arr, self.cursor, per_row_for(values.size.width)))
        self._render_q4(peek.names[0], arr)

    def _render_q4(self, label: str, arr: np.ndarray) -> None:
        w = self.model.weights.get(label) if self.model is not None else None
        if w is None or w.q4 is None:
            self.remove_class("-q4")
            return
        self.add_class("-q4")
        q = w.q4
        update(self.query_one("#buf-q4", Static),
               q4_text(w, self.cursor // q.cols, self.cursor % q.cols, self.peek.q4_error))

    def move(self, delta: int) -> None:
        self.cursor += delta  # drawn by watch_cursor

    def request(self, kind) -> None:
        peek = self.peek
        if peek is None or not peek.arrays:
            return
        value = fmt_scalar(float(peek.arrays[0].reshape(-1)[self.cursor]))
        self.post_message(kind(f"{peek.names[0]}[{self.cursor}]", value))
