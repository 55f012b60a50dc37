"""Registers: the focused lane's R and U registers with changes marked, one register over
lanes, and the watch list of ``display`` expressions.

The renderers are pure functions of a :class:`StopView` and the static model.
The registers pane keeps a cursor on one register: Enter shows it across
lanes, ``=`` edits it (through ``set``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.table import Table
from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import var
from textual.widgets import Static

from ..debug.info import fmt_scalar
from .heat import normalise, ramp
from .messages import ElementMessage
from .state import StopView
from .paint import drawn, set_border, update, update_at_least

CHANGED = "bold black on yellow"


def used_registers(program) -> list[tuple[str, int]]:
    """Registers the kernel names, in file then number order (R0 always: the lane id)."""
    return sorted(program.registers() | {("R", 0)})


def shown_registers(model, view: StopView) -> list[tuple[str, int]]:
    regs = view.snapshot.lane
    idx = view.node_index
    if regs is None or idx is None or model.nodes[idx].program is None:
        return []
    used = set(used_registers(model.nodes[idx].program)) | set(regs.changed)
    return sorted(used, key=lambda r: (r[0], r[1]))


def register_table(model, view: StopView, cursor: tuple[str, int] | None) -> Table | Text:
    regs = view.snapshot.lane
    if regs is None:
        msg = Text("no kernel running\n", style="dim")
        idx, lanes = view.node_index, view.snapshot.node_lanes
        if idx is not None and lanes is not None:
            msg.append(f"next: {model.nodes[idx].full_name} dispatches {lanes} lanes\n"
                       "press s / F11 to step into it", style="dim")
        return msg
    shown = shown_registers(model, view)
    r_list = [i for f, i in shown if f == "R"]
    u_list = [i for f, i in shown if f == "U"]
    table = Table.grid(padding=(0, 1))
    for justify in ("left", "right", "left", "right"):
        table.add_column(justify=justify)
    for k in range(max(len(r_list), len(u_list))):
        cells = []
        for file, lst, values, colour in (("R", r_list, regs.R, "cyan"),
                                          ("U", u_list, regs.U, "magenta")):
            if k >= len(lst):
                cells += [Text(""), Text("")]
                continue
            i = lst[k]
            text = fmt_scalar(values[i], 6) if file == "R" else str(int(values[i]))
            style = CHANGED if (file, i) in regs.changed else ""
            name_style = colour + (" reverse" if cursor == (file, i) else "")
            cells += [Text(f"{file}{i}", style=name_style), Text(text, style=style)]
        table.add_row(*cells)
    return table


LANE_CELL = 18  # " 12 ■ -1.23457e+06◆◀" without the spaces around the value


def lanes_text(view: StopView, width: int) -> Text:
    """The chosen register over lanes: a bar per lane, then the values of the first 16
    lanes, in as many columns as the width holds (so a short pane shows every lane)."""
    snap = view.snapshot
    t = Text()
    across = snap.across
    if across is None or snap.lane is None:
        return t
    mask = across.mask
    lanes = mask.size
    t.append(f"{across.file}{across.reg} over lanes", style="bold")
    t.append(f" · mask {int(mask.sum())}/{lanes} active\n")
    bar = max(width - 2, 8)
    vals = across.values.astype(np.float64)[:bar]
    for lane, v in enumerate(normalise(vals)):  # █ active, ░ masked off
        colour = ramp(v).name if np.isfinite(v) else "magenta"
        t.append("█" if mask[lane] else "░", style=colour)
    t.append(("…" if lanes > bar else "") + "\n")
    per_row = max(1, min(4, width // LANE_CELL))
    listed = min(lanes, 16)
    for lane in range(listed):
        mark = "◆" if across.changed[lane] else " "
        focus = "◀" if lane == view.lane else " "
        v = across.values[lane]
        text = fmt_scalar(v, 6) if across.file == "R" else str(int(v))
        end = "\n" if lane % per_row == per_row - 1 or lane == listed - 1 else ""
        t.append(f"{lane:>3}{'■' if mask[lane] else '□'}{text:>12}{mark}{focus}{end}")
    if lanes > 16:
        t.append(f" … {lanes - 16} more lanes (info lanes {across.file}{across.reg})\n",
                 style="dim")
    t.append("◆ changed since last stop · Enter: this register over lanes · =: set it",
             style="dim")
    return t


def registers_title(view: StopView) -> str:
    regs = view.snapshot.lane
    if regs is None:
        return "Registers"
    return f"Registers · lane {regs.lane} of {regs.lanes}" + ("" if regs.active else
                                                              " (inactive)")


def watch_text(view: StopView) -> Text:
    """The pinned ``display`` list: changed values highlighted."""
    shown = view.snapshot.displays
    if not shown:
        return Text("no displays: d (or the console: display EXPR) adds one", style="dim")
    t = Text()
    for d in shown:
        t.append(f"{d.number}: ", style="dim")
        t.append(d.expr, style="bold")
        t.append(" = ")
        t.append(d.text, style="red" if d.error else (CHANGED if d.changed else ""))
        t.append("\n")
    t.rstrip()
    return t


class _ForItsWidth(Static):
    """A text of the registers pane made for the widget's width: made again (by the pane's
    method named ``remake``) when that changes."""

    remake = ""

    def on_resize(self, event) -> None:
        pane = self.parent
        if isinstance(pane, RegistersPane) and pane.view is not None:
            pane.call_after_refresh(getattr(pane, self.remake))


class LanesText(_ForItsWidth):
    """The register over lanes, laid out for its own width (beside the table, whose width
    follows its widest value, it changes without the pane changing size)."""

    remake = "_lanes"


class RegisterTable(_ForItsWidth):
    """The registers' table, drawn as text at its width (paint.drawn; a narrower pane
    shrinks its columns)."""

    remake = "_table"


class RegistersPane(VerticalScroll):
    ALLOW_MAXIMIZE = True
    BINDINGS = [Binding("up", "move(0, -1)", show=False), Binding("down", "move(0, 1)", show=False),
                Binding("left", "move(-1, 0)", show=False),
                Binding("right", "move(1, 0)", show=False),
                Binding("enter", "choose", "across lanes", show=False),
                Binding("equals_sign", "edit", "set", show=False)]
    DEFAULT_CSS = """
    RegistersPane { border: round $primary-darken-2; height: 1fr; scrollbar-gutter: stable; }
    RegistersPane:focus, RegistersPane:focus-within { border: round $accent; }
    RegistersPane > Static { width: 100%; }
    """
    can_focus = True

    @dataclass
    class Chosen(Message):
        """Show this register across lanes."""

        file: str
        reg: int

    class Edit(ElementMessage):
        """``=`` on a register: set it."""

    # bound to the right column's (data_bind): the model and the frozen stop
    model = var(None, always_update=True)
    view: var[StopView | None] = var(None, always_update=True, init=False)
    # the register under the cursor: one the kernel shows (validate_cursor), drawn reversed
    cursor: var[tuple[str, int] | None] = var(None, init=False)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        # the rows the table and the lanes have taken per kernel and width (see _fill)
        self._room: dict[tuple, int] = {}
        self._room_model = None

    def compose(self):
        yield RegisterTable(classes="regs")
        yield LanesText(classes="lanes")

    def on_mount(self) -> None:
        self.border_title = "Registers"

    def validate_cursor(self, cursor: tuple[str, int] | None) -> tuple[str, int] | None:
        if self.view is None or self.model is None:
            return cursor
        shown = shown_registers(self.model, self.view)
        if cursor not in shown:
            return shown[0] if shown else None
        return cursor

    def watch_cursor(self) -> None:
        if self.view is not None and self.model is not None:
            self._table()

    def watch_view(self, view: StopView | None) -> None:
        if view is not None and self.model is not None:
            self.show(self.model, view)

    def show(self, model, view: StopView) -> None:
        self.set_reactive(RegistersPane.model, model)
        self.set_reactive(RegistersPane.view, view)
        self.set_reactive(RegistersPane.cursor, self.validate_cursor(self.cursor))
        self._table()
        self._lanes()
        if view.snapshot.lane is None and self.scroll_y:
            # the room kept below "no kernel running" must not hide it (scrolled to the
            # lanes in the kernel before, the offset would stay where now nothing is)
            self.scroll_home(animate=False)
        set_border(self, registers_title(view))

    def _table(self) -> None:
        table = self.query_one(".regs", Static)
        width = table.content_size.width
        if table.styles.width is not None and table.styles.width.is_auto:  # beside the lanes
            # (the Registers tab): as wide as it needs, at most the pane's width
            width = self.scrollable_content_region.width - table.styles.gutter.width
        self._fill(table, drawn(table, register_table(self.model, self.view, self.cursor),
                                width))

    def _lanes(self) -> None:
        lanes = self.query_one(".lanes", Static)
        width = lanes.size.width or self.scrollable_content_region.width
        if width > 0:  # hidden (the tab, or the column when narrow): drawn on its resize
            self._fill(lanes, lanes_text(self.view, width))

    def _fill(self, widget: Static, content) -> None:
        """``content`` into the table or the lanes, as tall as the most they have shown for
        the kernel the stop is in or before (at this width; before a library node, the
        kernel after it): stepping into a kernel, in it and back out ("no kernel running",
        with the kernel's room kept below) changes no size, so those keys lay the screen
        out no more (two layouts each before). Only a step to another kernel's node changes
        the heights."""
        if self._room_model is not self.model:
            self._room, self._room_model = {}, self.model
        program = self._kernel_at(self.view.node_index)
        key = None if program is None else \
            (widget.has_class("regs"), program.name, program.threads, widget.content_size.width)
        need = update_at_least(widget, content, self._room.get(key, 0))
        if key is not None and need is not None:
            self._room[key] = max(self._room.get(key, 0), need)

    def _kernel_at(self, idx: int | None):
        """The kernel of node ``idx``, or where it has none (a library node: ``s`` steps
        over it into the next kernel), of the first node after it that has one."""
        nodes = self.model.nodes
        while idx is not None and idx < len(nodes):
            if nodes[idx].program is not None:
                return nodes[idx].program
            idx += 1
        return None

    def action_move(self, dx: int, dy: int) -> None:
        if self.view is None or self.cursor is None:
            return
        shown = shown_registers(self.model, self.view)
        file, reg = self.cursor
        if dx:
            file = "U" if file == "R" else "R"
            same = [r for r in shown if r[0] == file]
            if not same:
                return
            old_row = [r for r in shown if r[0] == self.cursor[0]].index(self.cursor)
            self.cursor = same[min(old_row, len(same) - 1)]
        else:
            same = [r for r in shown if r[0] == file]
            k = same.index(self.cursor) + dy
            if 0 <= k < len(same):
                self.cursor = same[k]

    def action_choose(self) -> None:
        if self.cursor is not None:
            self.post_message(self.Chosen(*self.cursor))

    def action_edit(self) -> None:
        regs = self.view.snapshot.lane if self.view is not None else None
        if self.cursor is None or regs is None:
            return
        file, i = self.cursor
        value = fmt_scalar(regs.R[i], 6) if file == "R" else str(int(regs.U[i]))
        self.post_message(self.Edit(f"{file}{i}", value))


class WatchPane(VerticalScroll):
    """The pinned watch list (display expressions), updated at every stop."""

    ALLOW_MAXIMIZE = True
    DEFAULT_CSS = """
    WatchPane { border: round $primary-darken-2; height: auto; max-height: 40%; min-height: 4; }
    WatchPane:focus, WatchPane:focus-within { border: round $accent; }
    """
    can_focus = True

    view: var[StopView | None] = var(None, always_update=True, init=False)  # bound: the stop

    def compose(self):
        yield Static(classes="watch")

    def watch_view(self, view: StopView | None) -> None:
        if view is not None:
            self.show(view)

    def on_mount(self) -> None:
        self.border_title = "Watch"

    def show(self, view: StopView) -> None:
        update(self.query_one(".watch", Static), watch_text(view))


class RightColumn(Vertical):
    """Registers above the watch list: beside the source when wide, a tab when narrow (there
    side by side, the lanes beside the registers: the tab is a few rows high)."""

    DEFAULT_CSS = """
    RightColumn { height: 1fr; }
    RightColumn.-row { layout: horizontal; }
    RightColumn.-row RegistersPane { width: 1fr; layout: horizontal; }
    RightColumn.-row RegistersPane > .regs { width: auto; min-width: 16; padding-right: 1; }
    RightColumn.-row RegistersPane > .lanes { width: 1fr; }
    RightColumn.-row WatchPane { width: 30%; height: 1fr; max-height: 100%; }
    """

    # bound to the screen's; the panes in the column are bound to these
    model = var(None, always_update=True)
    view: var[StopView | None] = var(None, always_update=True, init=False)

    def compose(self):
        yield RegistersPane(classes="registers").data_bind(RightColumn.model, RightColumn.view)
        yield WatchPane(classes="watchpane").data_bind(RightColumn.view)
