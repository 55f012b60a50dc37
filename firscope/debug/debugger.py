"""The typed debugger API: what every front end calls (the bdb under firscope's pdb).

A :class:`Debugger` wraps a :class:`~firscope.debug.session.Session` with what
belongs to the person looking rather than to the engine: the focused lane,
the register shown across lanes, the ``display`` list, checkpoints and the
last frozen :class:`~firscope.debug.snapshot.Snapshot`. Its methods take and
return Python values:

* movements (:meth:`step`, :meth:`next`, :meth:`finish`, :meth:`cont`,
  :meth:`until`, :meth:`next_token`, :meth:`goto`, :meth:`reverse_step`,
  :meth:`reverse_next`, :meth:`reverse_continue`, :meth:`restart`) return the
  new :class:`Snapshot` (``snapshot.description`` is what batch mode prints);
* breakpoints (:meth:`break_at`, :meth:`watch`, :meth:`dprintf`,
  :meth:`toggle_break`, :meth:`delete`, :meth:`enable`, :meth:`disable`,
  :meth:`condition`, :meth:`ignore`) return the breakpoint objects;
* :meth:`set` returns the :class:`~firscope.debug.patches.Patch`,
  :meth:`evaluate` the value (a float, an int or a NumPy array).

The text commands (:class:`~firscope.debug.commands.CommandInterpreter`, a
subclass, as pdb's ``Pdb`` is of ``bdb.Bdb``) parse a line into one of these
calls and format its answer; the UI's keys, DAP's requests and the Python API
(:meth:`firscope.Model.debug`) call them directly. A bad argument raises
:class:`~firscope.errors.FirError` with a message; nothing has changed then.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..compare.sources import instance_hint
from ..errors import FirError
from ..model.tokens import ByteTokenizer, Tokenizer
from . import diverge, info, kernel_edits
from .breakpoints import Breakpoint, parse_watch
from .checkpoints import Checkpoint, Checkpoints, restore
from .element_history import Write, element_history
from .expr import DebugExpr
from .lens import LensRow, lens
from .patches import Patch
from .session import Session
from .snapshot import DisplayValue, Location, Snapshot, Stop, StopReason, capture

__all__ = ["Debugger", "ElementHistory"]


@dataclass(frozen=True)
class ElementHistory:
    """Every recorded write to one arena element (:meth:`Debugger.history`)."""

    element: str  # as it was named: x[5], key_cache@1[3]
    writes: tuple[Write, ...]  # oldest first
    truncated: bool  # older history was dropped to stay within the memory budget


class Debugger:
    """A debugging session driven by typed calls. Open one with
    :func:`firscope.debug.opening.open_session` or :meth:`firscope.Model.debug`."""

    def __init__(self, session: Session, tokenizer: Tokenizer | None = None):
        self.session = session
        self.tok = tokenizer or ByteTokenizer()
        self.lane = 0  # the focused lane: registers, conditions and prints look at it
        self.register = ("R", 0)  # the register shown across lanes
        self._before_last: Snapshot | None = None
        self.displays: dict[int, DebugExpr] = {}
        self._display_text: dict[int, str] = {}
        self._next_display = 1
        self.checkpoints = Checkpoints()
        self.last: Snapshot = capture(session, session.here(), self.where_line())

    # The session under the debugger: modules of debug/ read it as ``ci.s``.
    @property
    def s(self) -> Session:
        return self.session

    @property
    def model(self):
        return self.session.model

    @property
    def previous(self) -> Snapshot | None:
        """The stop before the last one: what changed marks compare with (views of lanes
        other than the focused one use it)."""
        return self._before_last

    @property
    def breakpoints(self) -> list[Breakpoint]:
        return list(self.session.breakpoints)

    @property
    def patches(self) -> list[Patch]:
        return list(self.session.patches)

    @property
    def finished(self) -> bool:
        return self.session.finished

    def location(self) -> Location:
        return self.session.location()

    def interrupt(self) -> None:
        """Ask a running movement to stop (from any thread): it ends as INTERRUPTED."""
        self.session.cancel.set()

    def clear_interrupt(self) -> None:
        """Forget an interruption meant for a movement that has ended."""
        self.session.cancel.clear()

    # ------------------------------------------------------------------ movements
    def step(self, count: int | None = None) -> Snapshot:
        """Execute ``count`` instructions in lockstep (an ext node counts as one). Without a
        count, at a ``break diverge`` stop: into the diverging node, on the lane that wrote
        the element."""
        if count is None:
            into = diverge.step_into(self)
            if into is not None:
                return self._moved(into)
        return self._moved(self.session.stepi(_positive(count, 1), lane=self.lane))

    def next(self, count: int = 1) -> Snapshot:
        """Finish the node and stop before the next one, ``count`` times."""
        return self._moved(self.session.next(_positive(count, 1), lane=self.lane))

    def finish(self) -> Snapshot:
        """Run the current kernel to its end (between nodes: the token)."""
        return self._moved(self.session.finish(lane=self.lane))

    def cont(self) -> Snapshot:
        """Run to the next breakpoint or the end (gdb's continue)."""
        return self._moved(self.session.cont(lane=self.lane))

    def until(self, location: str) -> Snapshot:
        """Run to a node (``attention@1``), a kernel line (``g2.attn_decode:156``) or
        ``token N``: a one-off breakpoint."""
        if not location or not location.strip():
            raise FirError("until needs a location: a node, KERNEL:LINE or 'token N'")
        return self._moved(self.session.until(location.strip(), lane=self.lane))

    def next_token(self) -> Snapshot:
        """Run to the start of the next token."""
        return self._moved(self.session.next_token(lane=self.lane))

    def goto(self, node: str, token: int | None = None) -> Snapshot:
        """Go forward or back to the start of ``node`` (``attention@1``) at ``token``
        (default: the current one)."""
        try:
            idx = self.model.node_index(node)
        except KeyError:
            raise FirError(f"no node '{node}'{instance_hint(self.model, node)}") from None
        step = self.session.step if token is None else _index(token, "token")
        return self._moved(self.session.goto((step, idx), lane=self.lane))

    def reverse_step(self, count: int = 1) -> Snapshot:
        """Undo ``count`` instructions."""
        return self._moved(self.session.reverse_stepi(_positive(count, 1), lane=self.lane))

    def reverse_next(self, count: int = 1) -> Snapshot:
        """Undo ``count`` nodes (inside a kernel, the first goes back to its start)."""
        return self._moved(self.session.reverse_next(_positive(count, 1), lane=self.lane))

    def reverse_continue(self) -> Snapshot:
        """Back to the previous node or token breakpoint, or the start of the history."""
        return self._moved(self.session.reverse_continue(lane=self.lane))

    def checkpoint(self) -> tuple[Checkpoint, list[Checkpoint]]:
        """Save the whole state; returns it and the older checkpoints dropped to make room."""
        return self.checkpoints.save(self.session)

    def restart(self, number: int) -> Snapshot:
        """Return to checkpoint ``number``."""
        ck = self.checkpoints.get(_index(number, "checkpoint number"))
        restore(self.session, ck)
        self.checkpoints.rebudget(self.session)  # the restored log gets the share left to it
        return self._moved(self.session.here(StopReason.STEP, f"restarted at checkpoint "
                                                              f"{ck.number}: {ck.made_at}"))

    def delete_checkpoints(self, numbers: list[int] | None = None) -> list[int]:
        """Free checkpoints (all without ``numbers``); returns the numbers freed."""
        nums = [c.number for c in self.checkpoints] if numbers is None else \
            list(dict.fromkeys(numbers))
        for n in nums:
            self.checkpoints.get(n)  # all checked before any is deleted
        for n in nums:
            self.checkpoints.delete(n, self.session)
        return nums

    # ---------------------------------------------------------------- breakpoints
    def break_at(self, location: str, *, condition: str | None = None,
                 temporary: bool = False) -> Breakpoint:
        """A breakpoint at a node, kernel line, ``token N``, ``nan``, ``race``, ``uninit`` or
        ``diverge ...``; ``condition`` is an expression evaluated where it is hit."""
        return self.session.add_breakpoint(_with_condition(location, condition),
                                           temporary=temporary)

    def dprintf(self, location: str, message: str, *, condition: str | None = None,
                temporary: bool = False) -> Breakpoint:
        """A log point: where it would stop, print ``message`` with each ``{EXPR}``."""
        return self.session.add_breakpoint(_with_condition(location, condition),
                                           temporary=temporary, log=message)

    def watch(self, target: str, *, condition: str | None = None,
              temporary: bool = False) -> Breakpoint:
        """Stop when ``BUFFER[a:b]`` or a register (``R3``, ``lane 2 U4``) changes."""
        bp = self.session.add_watch(_with_condition(target, condition))
        if temporary:
            self.session.breakpoints.update(bp.number, temporary=True)
            bp = self.session.breakpoints.get(bp.number)
        return bp

    def toggle_break(self, location: str) -> tuple[Breakpoint | None, list[int]]:
        """F9: delete every breakpoint at ``location``, or add one if there is none.
        Returns (the breakpoint added or None, the numbers deleted)."""
        from .breakpoints import parse_location
        spec = parse_location(self.model, location).spec
        same = [bp.number for bp in self.session.breakpoints if bp.spec == spec]
        if same:
            self.session.delete_breakpoints(same)
            return None, same
        return self.break_at(location), []

    def delete(self, numbers: list[int] | None = None) -> None:
        """Delete breakpoints (all without ``numbers``)."""
        self.session.delete_breakpoints(None if numbers is None else list(numbers))

    def enable(self, numbers: list[int]) -> None:
        self.session.set_enabled(list(numbers), True)

    def disable(self, numbers: list[int]) -> None:
        self.session.set_enabled(list(numbers), False)

    def condition(self, number: int, condition: str | None) -> None:
        """Set (or, with None, clear) a breakpoint's condition."""
        self.session.set_condition(number, condition)

    def ignore(self, number: int, count: int) -> None:
        """Ignore the next ``count`` hits of a breakpoint."""
        self.session.set_ignore(number, count)

    # ---------------------------------------------------------------- looking, changing
    def set_lane(self, lane: int) -> Snapshot:
        """Focus lane ``lane`` (registers, conditions and prints look at it)."""
        self.session.check_lane(lane)
        self.lane = lane
        return self.refocus()

    def set_register(self, file: str, reg: int) -> Snapshot:
        """Show register ``file``/``reg`` (``"R", 3``) across the lanes."""
        self.register = (file, reg)
        return self.refocus()

    def evaluate(self, expr: str, *, lane: int | None = None):
        """The value of a debugger expression (``R3``, ``x[0:8]``, ``max(abs(x))``,
        ``scores@2[0:16]``) here, on the focused lane or ``lane``."""
        return self.session.evaluate(expr, lane=self.lane if lane is None else lane)

    def set(self, target: str, value, *, lane: int | None = None, weight: bool = False
            ) -> Patch:
        """Change a register or buffer here, replayably: ``set("x[0:4]", 0)``,
        ``set("R3", "R3 * 2", lane=1)``; ``weight=True`` for a weight element. ``value`` is
        a number or an expression."""
        text = f"{'--weight ' if weight else ''}{target} = {_expression(value)}"
        patch = self.session.set(text, lane=self.lane if lane is None else lane)
        self.refocus()
        return patch

    def unset(self, number: int) -> Patch:
        """Forget patch ``number`` for later replays (the values it set stay)."""
        return self.session.patches.delete(number)

    def display(self, expr: str) -> DisplayValue:
        """Show ``expr`` after every stop; returns its value here."""
        parsed = DebugExpr(expr)
        self.session.resolver.check(parsed)
        n = self._next_display
        self._next_display += 1
        self.displays[n] = parsed
        value = next(v for v in self._evaluate_displays() if v.number == n)
        self.refocus()
        return value

    def undisplay(self, numbers: list[int] | None = None) -> None:
        """Stop showing displays (all without ``numbers``)."""
        nums = list(self.displays) if numbers is None else list(numbers)
        for n in nums:
            if n not in self.displays:
                raise FirError(f"no display number {n}")
        for n in nums:
            self.displays.pop(n)
            self._display_text.pop(n, None)
        self.refocus()

    def history(self, element: str) -> ElementHistory:
        """Every recorded write to one element (``x[5]``, ``key_cache@1[3]``), oldest
        first: token, node, line, lane, old -> new."""
        w = parse_watch(self.model, element)
        if w.stop - w.start != 1:
            raise FirError(f"history follows one element: give an index, e.g. {w.region}[0]")
        writes, truncated = element_history(self.session, w.start)
        return ElementHistory(f"{w.region}[{w.offset}]", tuple(writes), truncated)

    def lens(self, k: int = 5, *, every_layer: bool = False) -> list[LensRow]:
        """The logit lens: the top-``k`` next tokens from the residual now (or after each
        layer of this token)."""
        return lens(self.session, k=_positive(k, 5), every_layer=every_layer)

    # -- kernels edited where the session stands (debug/kernel_edits) -------------------
    def kernel_edit(self, name: str, path: str | os.PathLike) -> str:
        """Replace kernel ``name`` with the block of that name in ``path``, from now on."""
        return kernel_edits.edit(self.s, name, str(path))

    def kernel_replay(self, node: str | None = None, *, every: bool = False) -> str:
        """The edit judged on the current node's inputs (``every``: all its nodes so far)."""
        return kernel_edits.replay_here(self.s, node, every)

    def kernel_revert(self, name: str | None = None) -> str:
        return kernel_edits.revert(self.s, name)

    def kernel_write(self) -> str:
        return kernel_edits.write(self.s)

    def kernel_toggle(self, name: str | None = None) -> str:
        """A/B: run the model's own code for a kept edit, or the edit again."""
        return kernel_edits.toggle(self.s, name)

    def kernel_history(self) -> str:
        """Which version of each edited kernel ran its nodes, token by token."""
        return kernel_edits.history(self.s)

    def save_breakpoints(self, path: str | os.PathLike) -> str:
        """Write breakpoints and displays as commands ``source FILE`` reads back; returns
        what was saved, as one line per note."""
        from .persist import save_breakpoints
        return save_breakpoints(self, Path(path))

    # ---------------------------------------------------------------- stops
    def _moved(self, stop: Stop) -> Snapshot:
        """Every movement ends here: focus, freeze a snapshot, describe the stop."""
        if stop.lane is not None:
            self.lane = stop.lane
        lanes = self.session.lanes()
        if lanes is not None and not 0 <= self.lane < max(lanes, 1):
            self.lane = 0
        text = self.describe_stop(stop)
        s = self.session
        if s.log_lines:  # log points hit on the way, printed before the stop
            text = "\n".join(s.log_lines + [text])
            s.log_lines.clear()
        displays = self._evaluate_displays()
        if displays:
            text += "\n" + "\n".join(f"{v.number}: {v.expr} = {v.text}" for v in displays)
        self._before_last = self.last
        self.last = capture(s, stop, text, lane=self.lane, register=self.register,
                            previous=self._before_last, displays=displays)
        return self.last

    def refocus(self) -> Snapshot:
        """The same stop seen with another lane or register (marks compare with the stop
        before it, as they did)."""
        self.last = capture(self.session, self.last.stop, self.last.description,
                            lane=self.lane, register=self.register, previous=self._before_last,
                            displays=self._evaluate_displays(mark=False))
        return self.last

    def display_values(self) -> tuple[DisplayValue, ...]:
        """Every display's value here (not marked as seen: the next stop still says what
        changed)."""
        return self._evaluate_displays(mark=False)

    def _evaluate_displays(self, mark: bool = True) -> tuple[DisplayValue, ...]:
        out = []
        for n, expr in self.displays.items():
            try:
                text, error = info.fmt_value(self.evaluate(expr)), False
            except FirError as e:
                text, error = f"<error: {e.message}>", True
            changed = n in self._display_text and self._display_text[n] != text
            if mark:
                self._display_text[n] = text
            out.append(DisplayValue(n, expr.text, text, changed, error))
        return tuple(out)

    def describe_stop(self, stop: Stop) -> str:
        lines = []
        r = stop.reason
        if r in (StopReason.FINISHED, StopReason.HISTORY, StopReason.INTERRUPTED):
            lines.append(stop.message)
            if r is not StopReason.FINISHED:
                lines.append(self.where_line())
            return "\n".join(lines)
        head = self.stop_head(stop)
        if head:
            lines.append(head)
        if stop.old is not None and stop.new is not None:
            lines.append(f"Old value = {info.fmt_array(stop.old)}")
            lines.append(f"New value = {info.fmt_array(stop.new)}")
        lines.append(self.where_line())
        edits = getattr(self.session, "kernel_edits", None)
        note = edits.ran_note(self.session) if edits is not None else None
        if note:
            lines.append(note)
        return "\n".join(lines)

    @staticmethod
    def stop_head(stop: Stop) -> str:
        """The stop's first words, as batch mode prints them (and the UI header, for a
        catchpoint)."""
        r = stop.reason
        if r is StopReason.FAULT:
            return "Program received a fault:\n" + stop.message
        if r is StopReason.BUDGET:
            return "Stopped: instruction budget exhausted:\n" + stop.message
        if r is StopReason.NAN:
            return "Catchpoint (nan): " + stop.message
        return stop.message

    def status_line(self, snap: Snapshot | None = None) -> str:
        """One line for a status bar or header, the same whoever moved (a key, the console,
        the palette): ``stopped: breakpoint 1 at attention@1``, ``fault at embeddings, line
        65``, ``stopped: watchpoint 2 at mlp@1, line 62``."""
        stop = (snap or self.last).stop
        loc = stop.location
        where = loc.node or "end"
        if loc.in_kernel and loc.line is not None:
            where += f", line {loc.line}"
        head = self.stop_head(stop).splitlines()
        if head and head[0].startswith("Catchpoint"):
            # a catchpoint's stop says what it caught (divergence, race, uninit, NaN), in the
            # words batch mode prints
            return head[0] + (f" (stopped at {where})" if loc.node and loc.node not in head[0]
                              else "")
        label = stop.reason.label
        if stop.breakpoint is not None and stop.reason in (StopReason.BREAKPOINT,
                                                           StopReason.WATCHPOINT):
            label += f" {stop.breakpoint}"
        return f"{label} at {where}"

    def token_text(self, token: int | None) -> str:
        if token is None:
            return "-"
        return f"{token} {self.tok.piece(token)!r}"

    def where_line(self) -> str:
        s = self.session
        loc = s.location()
        if s.finished:
            return f"[finished: {s.step} steps]"
        tok = f"token {loc.step} {self.token_text(loc.token)} pos {loc.position}"
        node = s.node
        d = s.dispatch
        if d is not None and not d.done:
            op = d.ops[d.pc]
            return (f"{loc.node} ({loc.kernel}) pc {loc.pc} at "
                    f"{kernel_edits.source_name(s, loc.kernel)}:{loc.line}"
                    f"  [{tok}]\n{loc.line}\t{op.text}")
        return f"before {loc.node} ({node.kind} {node.target})  [{tok}]"


def _positive(count, default: int) -> int:
    if count is None:
        return default
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
        raise FirError(f"expected a count, found {count!r}")
    if count < 1:
        raise FirError("count must be at least 1")
    return int(count)


def _index(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise FirError(f"expected a {what} (an integer >= 0), found {value!r}")
    return int(value)


def _with_condition(location: str, condition: str | None) -> str:
    if not isinstance(location, str) or not location.strip():
        raise FirError("give a location")
    if condition is None or not str(condition).strip():
        return location.strip()
    if " if " in f" {location} ":
        raise FirError("give the condition once: in condition= or after 'if', not both")
    return f"{location.strip()} if {condition}"


def _expression(value) -> str:
    """A value for ``set``: an expression as given, a number written so that it reads back
    as the same f32."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        raise FirError(f"set takes a number or an expression, not {value!r}")
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(np.float32(value)))
    raise FirError(f"set takes a number or an expression, not {type(value).__name__}")

