"""F2: what a reload carries over, by name, and how it is re-resolved in the new model.

Breakpoints, watchpoints and displays are kept as the commands that made them
(``break attention@1 if ...``, ``watch x[0:4]``, ``display max(abs(x))``); a
kernel-line breakpoint is kept as its kernel and instruction text, so an edit
that moves lines still finds it. The position is a token and a node name. In
the reloaded session each is re-issued through the command interpreter; what
no longer resolves is listed, never silently dropped. Patches (``set``) and
checkpoints are states of the old run's memory, made at places in its history:
they are not re-applied, and each is listed as not carried, with its text.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..debug.breakpoints import LineBreakpoint
from ..debug.persist import breakpoint_command
from ..errors import FirError


@dataclass(frozen=True)
class CarriedBreak:
    command: str  # "break attention@1 if R3 > 0" (for a line breakpoint: re-resolved first)
    enabled: bool
    ignore: int
    kernel: str | None = None  # a line breakpoint: its kernel, offset and instruction text
    offset: int = 0
    text: str = ""


@dataclass(frozen=True)
class Carried:
    breaks: tuple[CarriedBreak, ...]
    displays: tuple[str, ...]
    position: tuple[int, str] | None  # (step, node full name); None at the start
    lane: int
    finished: bool
    dropped: tuple[str, ...] = ()  # patches and checkpoints, described for the notes


def kernel_span(model, kernel: str) -> tuple[int, int] | None:
    """The .fir lines of ``kernel``'s body, from any node that dispatches it."""
    for node in model.nodes:
        if node.kind == "micro" and node.target == kernel:
            syn = node.program.kernel.syntax
            return syn.loc.line, syn.end.line
    return None


def _carry_break(model, bp) -> CarriedBreak | None:
    command = breakpoint_command(bp)  # the same text `save breakpoints` writes
    if command is None:
        return None
    if isinstance(bp, LineBreakpoint):
        span = kernel_span(model, bp.kernel)
        start = span[0] if span else bp.line
        return CarriedBreak(command, bp.enabled, bp.ignore_count, bp.kernel,
                            bp.line - start, model.fir.lines[bp.line - 1].strip())
    return CarriedBreak(command, bp.enabled, bp.ignore_count)


def carry(session, ci) -> Carried:
    """What to keep from ``session`` (read while no worker runs)."""
    breaks = tuple(c for c in (_carry_break(session.model, bp) for bp in session.breakpoints)
                   if c is not None)
    displays = tuple(expr.text for expr in ci.displays.values())
    position = None
    if not session.finished and session.cursor != (0, 0):
        position = (session.step, session.node.full_name)
    dropped = tuple(f"not carried: patch {p.number} `set {p.text}` (made at {p.made_at}); "
                    "set it again where it applies" for p in session.patches)
    dropped += tuple(f"not carried: checkpoint {c.number} ({c.made_at}), a state of the "
                     "old model" for c in ci.checkpoints)
    return Carried(breaks, displays, position, ci.lane, session.finished, dropped)


def _resolve_line(model, c: CarriedBreak) -> str:
    """The command for a line breakpoint in the new model: the same instruction text in the
    same kernel, nearest the old offset (lines may have moved)."""
    span = kernel_span(model, c.kernel)
    if span is None:
        raise FirError(f"kernel {c.kernel} is no longer dispatched by any node")
    start, end = span
    lines = model.fir.lines
    same = [ln for ln in range(start, end + 1) if lines[ln - 1].strip() == c.text]
    if not same:
        raise FirError(f"{c.kernel} no longer has the instruction '{c.text}'")
    line = min(same, key=lambda ln: abs(ln - start - c.offset))
    verb, _, rest = c.command.partition(" ")
    tail = rest.partition(" ")[2]  # the condition, and a log point's message
    return f"{verb} {c.kernel}:{line}" + (f" {tail}" if tail else "")


def restore(ci, carried: Carried) -> list[str]:
    """Re-issue everything ``carried`` holds; returns one line per thing and its fate."""
    notes = []

    def issue(what: str, line: str) -> str | None:
        try:
            out = ci.run(line)
        except FirError as e:
            notes.append(f"not restored: {what} — {e.message}")
            return None
        return out.text

    model = ci.s.model
    if carried.position is not None:
        step, node = carried.position
        if issue(f"position token {step} {node}", f"goto {node} token {step}") is not None:
            notes.append(f"position restored: token {step}, {node}")
    elif carried.finished:
        notes.append("not restored: position (the session had finished; back at the start)")
    for c in carried.breaks:
        line = c.command
        if c.kernel is not None:
            try:
                line = _resolve_line(model, c)
            except FirError as e:
                notes.append(f"not restored: {c.command} — {e.message}")
                continue
        if issue(c.command, line) is None:
            continue
        number = max(bp.number for bp in ci.s.breakpoints)
        if not c.enabled:
            issue(f"disable {number}", f"disable {number}")
        if c.ignore:
            issue(f"ignore {number} {c.ignore}", f"ignore {number} {c.ignore}")
        notes.append(f"restored: {line}")
    for expr in carried.displays:
        if issue(f"display {expr}", f"display {expr}") is not None:
            notes.append(f"restored: display {expr}")
    if carried.lane:
        try:
            ci.set_lane(carried.lane)
        except FirError:
            pass  # the kernel here has fewer lanes now: lane 0 it is
    notes.extend(carried.dropped)
    return notes
