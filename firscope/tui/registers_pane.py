"""Registers: the focused lane's R0..R31 and U0..U31, changes marked; one register over lanes."""
from __future__ import annotations

import numpy as np
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..debug.session import Session
from .heat import ramp, normalise


class RegistersPane(VerticalScroll):
    DEFAULT_CSS = """
    RegistersPane { border: round $primary-darken-2; }
    RegistersPane:focus-within { border: round $accent; }
    RegistersPane > Static { width: 100%; }
    """
    can_focus = True

    def compose(self):
        yield Static(id="regs")
        yield Static(id="lanes")

    def on_mount(self) -> None:
        self.border_title = "Registers"
        self.lane_register: tuple[str, int] | None = None

    def show(self, session: Session, ci) -> None:
        regs = self.query_one("#regs", Static)
        lanes_view = self.query_one("#lanes", Static)
        d = session.dispatch
        if d is None:
            n = session.lanes()
            self.border_title = "Registers"
            msg = Text("no kernel running\n", style="dim")
            if n is not None:
                msg.append(f"next: {session.node.full_name} dispatches {n} lanes\n"
                           "press s / F11 to step into it", style="dim")
            regs.update(msg)
            lanes_view.update("")
            return
        lane = min(ci.lane, max(d.lanes - 1, 0))
        snap = ci.last
        changed = snap.lane.changed if snap.lane is not None and snap.lane.lane == lane \
            else frozenset()
        active = bool(d.mask[lane]) if d.lanes else False
        self.border_title = f"Registers · lane {lane} of {d.lanes}" + ("" if active else " (inactive)")
        table = Table.grid(padding=(0, 1))
        table.add_column(justify="left")
        table.add_column(justify="right", min_width=11)
        table.add_column(justify="left")
        table.add_column(justify="right", min_width=10)
        used = _used_registers(d)
        for i in range(32):
            if i not in used["R"] and i not in used["U"] and ("R", i) not in changed \
                    and ("U", i) not in changed:
                continue
            r_style = "bold black on yellow" if ("R", i) in changed else ""
            u_style = "bold black on yellow" if ("U", i) in changed else ""
            table.add_row(Text(f"R{i}", style="cyan"), Text(_f(d.R[i, lane]), style=r_style),
                          Text(f"U{i}", style="magenta"), Text(str(int(d.U[i, lane])), style=u_style))
        regs.update(table)
        lanes_view.update(self._lanes_text(ci, d))

    def _lanes_text(self, ci, d) -> Text:
        t = Text()
        reg = self.lane_register or _last_written(d)
        width = max(self.size.width - 14, 8)
        mask = "".join("■" if m else "□" for m in d.mask[:width])
        t.append(f"\nmask {int(d.mask.sum())}/{d.lanes} ", style="bold")
        t.append(mask + ("…" if d.lanes > width else "") + "\n")
        if reg is None:
            return t
        file, i = reg
        vals = (d.R[i] if file == "R" else d.U[i].astype(np.float64))[:width]
        norm = normalise(vals)
        t.append(f"{file}{i} over lanes\n", style="bold")
        for lane, v in enumerate(norm):
            t.append("█" if d.mask[lane] else "░", style=ramp(v).name if np.isfinite(v) else "magenta")
        t.append("\n")
        if ci.register != (file, i):
            ci.set_register(file, i)
        across = ci.last.across
        changed = across.changed if across is not None else np.zeros(0, dtype=bool)
        for lane in range(min(d.lanes, 16)):
            mark = "◆" if changed.size > lane and changed[lane] else " "
            focus = "◀" if lane == ci.lane else " "
            v = _f(d.R[i, lane]) if file == "R" else str(int(d.U[i, lane]))
            t.append(f" {lane:>3} {'■' if d.mask[lane] else '□'} {v:>12}{mark}{focus}\n")
        if d.lanes > 16:
            t.append(f" … {d.lanes - 16} more lanes (command: info lanes {file}{i})\n", style="dim")
        t.append("◆ changed since last stop", style="dim")
        return t


def _f(v) -> str:
    v = float(v)
    if v != v or v in (float("inf"), float("-inf")):
        return str(v)
    return f"{v:.6g}"


def _used_registers(d) -> dict[str, set[int]]:
    used = {"R": {0}, "U": set()}
    for op in d.ops:
        for kind, a in zip(op.spec.operands, op.args):
            if kind in ("Rd", "Rs"):
                used["R"].add(a)
            elif kind in ("Ud", "Us"):
                used["U"].add(a)
    return used


def _last_written(d):
    """The register the most recent writing instruction before the pc wrote."""
    for op in reversed(d.ops[: min(d.pc, len(d.ops))]):
        for kind, a in zip(op.spec.operands, op.args):
            if kind == "Rd":
                return ("R", a)
            if kind == "Ud":
                return ("U", a)
    return ("R", 0)
