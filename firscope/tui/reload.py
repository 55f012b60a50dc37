"""F2: what a reload carries over, by name, and how it is re-resolved in the new model.

Breakpoints, watchpoints and displays are kept as the commands that made them
(``break attention@1 if ...``, ``watch x[0:4]``, ``display max(abs(x))``); a
kernel-line breakpoint is kept as its kernel and instruction text, so an edit
that moves lines still finds it. The position is a token and a node name. In
the reloaded session each is made again through the typed debugger API (a
breakpoint by its own saved command, as ``source`` reads it); what
no longer resolves is listed, never silently dropped. Patches (``set``) and
checkpoints are states of the old run's memory, made at places in its history:
they are not re-applied, and each is listed as not carried, with its text. Kernels edited
in place (key E, ``kernel edit``) are applied again first, so the way back to the position
runs the code the session ran.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..debug.breakpoints import CarriedBreak
from ..errors import FirError


@dataclass(frozen=True)
class Carried:
    breaks: tuple[CarriedBreak, ...]
    displays: tuple[str, ...]
    position: tuple[int, str] | None  # (step, node full name); None at the start
    lane: int
    finished: bool
    dropped: tuple[str, ...] = ()  # patches and checkpoints, described for the notes
    edits: tuple[tuple[str, str], ...] = ()  # kernels edited in place (E): (name, file)
    edits_off: tuple[str, ...] = ()  # of those, the ones toggled off (A/B)


def carry(session, ci) -> Carried:
    """What to keep from ``session`` (read while no worker runs)."""
    breaks = tuple(c for c in (bp.carried(session.model) for bp in session.breakpoints)
                   if c is not None)
    displays = tuple(expr.text for expr in ci.displays.values())
    position = None
    if not session.finished and session.cursor != (0, 0):
        position = (session.step, session.node.full_name)
    dropped = tuple(f"not carried: patch {p.number} `set {p.text}` (made at {p.made_at}); "
                    "set it again where it applies" for p in session.patches)
    dropped += tuple(f"not carried: checkpoint {c.number} ({c.made_at}), a state of the "
                     "old model" for c in ci.checkpoints)
    edits = getattr(session, "kernel_edits", None)
    applied = tuple((name, str(path)) for name, path in edits.files.items()) if edits else ()
    off = tuple(sorted(edits.off)) if edits else ()
    return Carried(breaks, displays, position, ci.lane, session.finished, dropped, applied,
                   off)


def restore(ci, carried: Carried) -> list[str]:
    """Re-make everything ``carried`` holds in the new session (``ci``: its debugger);
    returns one line per thing and its fate."""
    from ..debug.commands import display_text
    notes = []

    def attempt(what: str, call):
        try:
            return call()
        except FirError as e:
            notes.append(f"not restored: {what} — {e.message}")
            return None

    for name, path in carried.edits:  # first: the way back to the position runs them
        if attempt(f"kernel edit {name} (from {path})",
                   lambda: ci.kernel_edit(name, path)) is not None:
            notes.append(f"restored: the edit of kernel {name} (not in the file: ctrl+o in "
                         "the editor, or kernel write, puts it there)")
            if name in carried.edits_off and attempt(f"kernel toggle {name}",
                                                     lambda: ci.kernel_toggle(name)):
                notes.append(f"restored: {name}'s edit toggled off (A: the model's own code "
                             "runs)")
    model = ci.model
    if carried.position is not None:
        step, node = carried.position
        if attempt(f"position token {step} {node}", lambda: ci.goto(node, step)) is not None:
            notes.append(f"position restored: token {step}, {node}")
    elif carried.finished:
        notes.append("not restored: position (the session had finished; back at the start)")
    for c in carried.breaks:
        try:
            line = c.command_in(model)
        except FirError as e:
            notes.append(f"not restored: {c.command} — {e.message}")
            continue
        # the breakpoint's own command, as `save breakpoints` writes it and `source` reads it
        if attempt(c.command, lambda: ci.run(line)) is None:
            continue
        number = max(bp.number for bp in ci.breakpoints)
        if not c.enabled:
            attempt(f"disable {number}", lambda: ci.disable([number]))
        if c.ignore:
            attempt(f"ignore {number} {c.ignore}", lambda: ci.ignore(number, c.ignore))
        notes.append(f"restored: {line}")
    for expr in carried.displays:
        shown = attempt(f"display {expr}", lambda: ci.display(expr))
        if shown is not None:  # "1: max(abs(x)) = 3.25": its value here, as gdb shows it
            notes.append(f"restored: display {display_text(shown)}")
    if carried.lane:
        try:
            ci.set_lane(carried.lane)
        except FirError:
            pass  # the kernel here has fewer lanes now: lane 0 it is
    notes.extend(carried.dropped)
    return notes
