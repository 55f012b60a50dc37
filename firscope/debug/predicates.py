"""The stop predicates the session checks while a dispatch is interpreted.

Line breakpoints are checked before an instruction; NaN catchpoints and
watchpoints after it (on the registers it wrote and the stores it made), so
the stop's location is the instruction after the write. The session runs
them composed with the tape, which records the dispatch for stepping back,
and builds their stops (:meth:`~firscope.debug.session.Session.breakpoint_stop`).
"""
from __future__ import annotations

import numpy as np

from ..vm.interp import Observer
from .breakpoints import LineBreakpoint, Watchpoint
from .snapshot import Stop, StopReason


def name_address(model, addr: int) -> str:
    """``x[5]`` for an arena address (``arena[N]`` outside every region)."""
    for name, r in model.regions.items():
        if r.base <= addr < r.base + r.size:
            return f"{name}[{addr - r.base}]"
    return f"arena[{addr}]"


def watch_message(bp: Watchpoint, old, new, where: str) -> str:
    diff = np.flatnonzero(old.view(np.uint32) != new.view(np.uint32))
    i = int(diff[0]) if diff.size else 0
    return (f"Watchpoint {bp.number}: {bp.spec} changed {where} ({diff.size} element"
            f"{'s' if diff.size != 1 else ''}; first {bp.region}[{bp.offset + i}]: "
            f"{float(old[i])!r} -> {float(new[i])!r})")


def nan_written(model, arena, changes, node) -> str | None:
    """The first non-finite value a whole node wrote, as a catchpoint message."""
    for c in changes:
        vals = arena[c.base + c.index]
        bad = ~np.isfinite(vals)
        if bad.any():
            addr = int(c.base + c.index[np.flatnonzero(bad)[0]])
            return (f"node {node.full_name} wrote {float(arena[addr])!r} to "
                    f"{name_address(model, addr)}")
    return None


class DriveObserver(Observer):
    """The stop predicates a dispatch's instruction loop checks for the session."""

    def __init__(self, session, goal, skip_first: bool):
        self.s = session
        self.goal = goal
        d = session.dispatch
        node = session.nodes[session.node_index]
        self.node = node
        table = session.breakpoints
        lines = table.lines(node.target)
        edits = getattr(session, "kernel_edits", None)
        if edits is not None:  # original lines moved to the running edit's
            lines = edits.map_lines(node.target, lines)
        extra = goal.extra
        if isinstance(extra, LineBreakpoint) and extra.kernel == node.target:
            lines = dict(lines)
            lines[extra.line] = lines.get(extra.line, []) + [extra]
        self.lines = lines
        self.watches = table.watches()
        self.nan = table.nan
        self.patched = session.patches.inside(session.step, session.node_index)
        # kinds that watch every instruction (break race, ...), each with its observer
        self.checks = [(bp, bp.observer(session, node))
                       for bp in table.instruction_checks(session, node)]
        self.checks = [(bp, o) for bp, o in self.checks if o is not None]
        self.check_stores = [o for _, o in self.checks if o.wants_store]
        self.registers = table.register_watches()
        self.register_before: list = []  # (watch, the register's lanes before this op)
        self.wants_before = bool(lines) or self.patched or bool(self.registers) \
            or any(o.wants_before for _, o in self.checks)
        self.wants_after = True
        self.wants_store = bool(self.check_stores) or bool(self.watches) or self.nan
        self.skip_at = d.steps if skip_first else -1
        self.stored: list = []
        self.stop: Stop | None = None

    def store(self, d, where, values) -> None:
        for o in self.check_stores:
            o.store(d, where, values)
        if self.watches or self.nan:
            self.stored.append((np.array(where).reshape(-1), np.array(values).reshape(-1)))

    def before(self, d, op) -> bool:
        if self.patched:
            self.s.patches_due(d)
        if self.registers:
            self._registers_before(d, op)
        for bp, o in self.checks:
            if o.wants_before and o.before(d, op) and self._check_fired(bp, o):
                return True
        bps = self.lines.get(op.loc.line)
        if not bps or d.steps == self.skip_at:
            return False
        for bp in bps:
            self.stop = self.s.breakpoint_stop(bp, self.goal)
            if self.stop is not None:
                return True
        return False

    def after(self, d, op) -> bool:
        try:
            for bp, o in self.checks:
                if o.wants_after and o.after(d, op) and self._check_fired(bp, o):
                    return True
            if self.nan:
                msg = self._nan_after(d, op)
                if msg:
                    self.stop = self.s.here(StopReason.NAN, msg)
                    return True
            if self.register_before and self._registers_after(d, op):
                return True
            if self.watches and self.stored:
                return self._watch_after(op)
            return False
        finally:
            self.stored.clear()
            self.register_before.clear()

    def _registers_before(self, d, op) -> None:
        if op.spec.is_control:
            return
        written = {(file, op.args[idx]) for file, idx in op.spec.writes}
        for bp in self.registers:
            if (bp.file, bp.reg) in written and (bp.lane is None or bp.lane < d.lanes):
                rows = d.R if bp.file == "R" else d.U
                self.register_before.append((bp, rows[bp.reg].copy()))

    def _registers_after(self, d, op) -> bool:
        for bp, old in self.register_before:
            new = (d.R if bp.file == "R" else d.U)[bp.reg]
            changed = old.view(np.uint32) != new.view(np.uint32)
            if bp.lane is not None:
                lanes = [bp.lane] if changed[bp.lane] else []
            else:
                lanes = np.flatnonzero(changed & d.mask).tolist()
            if not lanes:
                continue
            lane = lanes[0]
            more = f" (and {len(lanes) - 1} more lanes)" if len(lanes) > 1 else ""
            text = (f"Watchpoint {bp.number}: {bp.file}{bp.reg} in lane {lane}{more}, in "
                    f"{self.node.full_name} by line {op.loc.line}: {op.text}")
            self.stop = self.s.breakpoint_stop(bp, self.goal, text,
                                               reason=StopReason.WATCHPOINT,
                                               old=old[lane].copy(), new=new[lane].copy(),
                                               lane=lane)
            if self.stop is not None:
                return True
        return False

    def _check_fired(self, bp, obs) -> bool:
        text = f"{bp.what.capitalize()} {bp.number}, {getattr(obs, 'message', bp.spec)}"
        self.stop = self.s.breakpoint_stop(bp, self.goal, text,
                                           lane=getattr(obs, "lane", None))
        return self.stop is not None

    def _watch_after(self, op) -> bool:
        arena = self.s.arena
        values = self.s.breakpoints.watch_values
        for bp in self.watches:
            old = values.get(bp.number)
            if old is not None and np.array_equal(old.view(np.uint32),
                                                  arena[bp.start: bp.stop].view(np.uint32)):
                continue
            stop = self.s.watch_stop(bp, self.goal, f"in {self.node.full_name} by line "
                                                    f"{op.loc.line}: {op.text}")
            if stop is not None:
                self.stop = stop
                return True
        return False

    def _nan_after(self, d, op) -> str | None:
        for where, values in self.stored:
            bad = ~np.isfinite(values)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                return (f"line {op.loc.line} ({op.text}) wrote {float(values[i])!r} "
                        f"to {name_address(self.s.model, int(where[i]))}")
        if op.spec.is_control:
            return None
        for file, idx in op.spec.writes:
            if file != "R":
                continue
            reg = op.args[idx]
            vals = d.R[reg]
            bad = ~np.isfinite(vals) & d.mask
            if bad.any():
                lane = int(np.flatnonzero(bad)[0])
                return (f"line {op.loc.line} ({op.text}) wrote {float(vals[lane])!r} to R{reg} "
                        f"in lane {lane}")
        return None


class Replay(Observer):
    """Re-running part of a dispatch to go back in it: the patches made inside it apply
    again (composed with the tape, which records the run)."""

    def __init__(self, session):
        self.s = session
        self.wants_before = session.patches.inside(session.step, session.node_index)

    def before(self, d, op) -> bool:
        self.s.patches_due(d)
        return False
