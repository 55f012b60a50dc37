"""The debugger engine: a session over a loaded model (the bdb of firscope).

Where the session is, is a cursor: decode step (token), the next node to
run, and, when stopped inside a micro node, the live :class:`Dispatch` (pc,
per-lane registers, active mask, loop/if frames). The engine never prints
and never calls a UI: every movement returns a :class:`Stop`.

One stop rule. Every forward movement is a :class:`Goal` handed to one loop
(:meth:`Session._resume`): ``stepi`` stops after N units (an instruction, or
an ext node), ``next``/``finish``/``token``/``goto`` stop when the cursor
reaches a node boundary that satisfies the goal, ``until`` adds a one-off
location, ``continue`` has no goal of its own. Breakpoints (node, line,
token), watchpoints, NaN catchpoints, faults, the instruction budget and the
cancel flag are stop predicates every movement honours. Every backward
movement is a goal for the mirror loop (:meth:`Session._rewind`).

Speed: nodes run whole through the runtime (the compiled engine where there
is one) unless instruction granularity is needed: a line breakpoint in that
kernel, ``break nan``, ``stepi``, or locating the exact instruction behind a
watchpoint or a NaN, which re-runs that one node in the interpreter from
its start.

Reverse: the undo log (:mod:`.history`) keeps what each node changed; the
tape (:mod:`.tape`) keeps what each instruction of the live dispatch stored,
with register marks, so ``reverse-stepi`` costs about what ``stepi`` does.

size: the forward loop, the backward loop and the cursor bookkeeping they share
(token boundaries, entering and completing a dispatch) stay in this one class,
as bdb keeps its stepping core in one; breakpoints, the undo log, name lookup,
the tape and the stop predicates each live in their own module.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ..errors import BudgetExceeded, FirError, FirFault, Interrupted
from ..runtime import Model, PlanNode
from ..runtime.machine import DEFAULT_BUDGET, Machine
from ..vm.interp import Dispatch, Ended, compose
from .breakpoints import (Breakpoint, BreakpointTable, Hit, LineBreakpoint, NodeBreakpoint,
                          RegisterWatch, parse_register_watch,
                          TokenBreakpoint, Watchpoint, parse_location, parse_watch,
                          split_condition)
from .expr import DebugExpr
from .info import fmt_value
from .logpoints import check_format, interpolate
from .history import (DEFAULT_HISTORY_BUDGET, History, Record, RecordKind, changes_since,
                      copy_regions, restore_regions)
from .patches import Patch, PatchTable, apply_patch, parse_set
from .resolver import Resolver
from .snapshot import Location, Stop, StopReason
from .predicates import DriveObserver, Replay, nan_written, watch_message
from .state import SessionState
from .tape import Tape
from ..runtime import NodeKind

__all__ = ["Goal", "Session", "DEFAULT_HISTORY_BUDGET"]

Cursor = tuple[int, int]  # (step, node index) between nodes


@dataclass(frozen=True)
class Goal:
    """When a movement stops, besides the stop predicates every movement honours: plain
    data, as bdb's ``_set_stopinfo`` sets stopframe/returnframe/stoplineno, read by the one
    loop of each direction (:meth:`Session._resume`, :meth:`Session._rewind`).

    A goal with ``at`` or ``nodes`` stops between nodes, and going back to it passes
    breakpoints by (reverse-continue, which has neither, stops at them)."""

    units: int | None = None  # stepi: instructions (an ext node counts as one)
    at: Cursor | None = None  # stop between nodes on reaching (step, node): forward at it,
    #                           backward at it or before it
    nodes: int | None = None  # backward: stop after undoing this many nodes
    extra: Breakpoint | None = None  # until / advance: a one-off location
    lane: int = 0  # the lane register conditions look at

    @property
    def between_nodes(self) -> bool:
        return self.at is not None or self.nodes is not None


class Session:
    def __init__(self, model: Model, prompt: list[int], n_generate: int, *,
                 engine: str = "compiled", history_budget: int = DEFAULT_HISTORY_BUDGET,
                 budget: int | None = DEFAULT_BUDGET, machine: Machine | None = None):
        if not prompt:
            raise FirError("the prompt is empty: give at least one token")
        self.model = model
        self.nodes = model.nodes
        self.machine = machine or Machine(model, engine=engine, budget=budget)
        self.arena = self.machine.arena
        for t in prompt:
            self.machine.check_token(int(t))
        self.prompt = [int(t) for t in prompt]
        self.n_generate = max(int(n_generate), 0)
        self.total_steps = len(self.prompt) + max(self.n_generate - 1, 0)
        self.machine.reset()
        self.machine.check_room(self.total_steps)
        # where the session is and what its run produced: one object (checkpoints copy it)
        self.state = SessionState(sequence=list(self.prompt))
        self.history = History(history_budget)
        self.breakpoints = BreakpointTable()
        self.patches = PatchTable()
        self.resolver = Resolver(self)
        self.cancel = self.machine.stop_flag  # set it (from any thread) to interrupt a run
        self._write_cache: dict[int, list[tuple[int, int]]] = {}
        self._shared_names: dict[int, str] | None = None
        # the first node of a layer: those before it (the embeddings) are recorded too
        self._first_layer = next((n.index for n in self.nodes if n.layer is not None),
                                 len(self.nodes))
        # Called as f(session, node) after every node completes, however it ran
        # (observe_nodes).
        self._node_observers: list[Callable] = []
        # Log points (dprintf): f(breakpoint, text) as each is hit, or, without a sink, the
        # lines wait here for the command interpreter to print before the stop.
        self.log_sink: Callable | None = None
        self.log_lines: list[str] = []
        # A dump every node is compared with (attach_reference), and the last
        # `break diverge` stop, which `s` steps back into.
        self.reference = None
        self.diverged_at = None
        self._begin_step()

    def use_model(self, model: Model) -> None:
        """Go on with ``model``: the same model with some kernels edited (debug/kernel_edits),
        on the same arena and plan, from where the session is: between two nodes (a live
        dispatch of the old kernel cannot go on in the new one)."""
        if self.dispatch is not None:
            raise FirError("inside a dispatch: finish it first (finish, or next), then edit")
        self.machine.use_model(model, reset=False)
        self.model = model
        self.nodes = model.nodes
        self._write_cache.clear()
        self._shared_names = None

    # ------------------------------------------------------------------ where
    # The state's fields, read-only here: the session moves them, a checkpoint replaces
    # them all (``session.state = saved.copy()``).
    step = property(lambda self: self.state.step)
    node_index = property(lambda self: self.state.node_index)
    finished = property(lambda self: self.state.finished)
    sequence = property(lambda self: self.state.sequence)
    logits = property(lambda self: self.state.logits)
    dispatch = property(lambda self: self.state.dispatch)
    tape = property(lambda self: self.state.tape)
    node_before = property(lambda self: self.state.node_before)
    layer_values = property(lambda self: self.state.layer_values)
    node_times = property(lambda self: self.state.node_times)
    line_counts = property(lambda self: self.state.line_counts)

    @property
    def node(self) -> PlanNode | None:
        return None if self.finished else self.nodes[self.node_index]

    @property
    def token(self) -> int | None:
        return self.sequence[self.step] if self.step < len(self.sequence) else None

    @property
    def layer(self) -> int | None:
        n = self.node
        return n.layer if n is not None else None

    @property
    def cursor(self) -> Cursor:
        return self.state.cursor

    def location(self) -> Location:
        if self.finished:
            return Location(self.step, None, self.step, None, None, None, None, None, False)
        n = self.node
        d = self.dispatch
        kernel = n.target if n.kind == NodeKind.MICRO else None
        pc = line = None
        if d is not None and not d.done:
            pc, line = d.pc, d.ops[d.pc].loc.line
        elif n.kind == NodeKind.MICRO:
            pc, line = 0, n.program.ops[0].loc.line if n.program.ops else None
        return Location(self.step, self.token, self.step, self.node_index, n.full_name, kernel,
                        pc, line, d is not None)

    def here(self, reason: StopReason = StopReason.ENTRY, message: str = "",
             bp: int | None = None, old=None, new=None, lane: int | None = None) -> Stop:
        """A stop record for where the session is now (the first stop, a re-display, and
        every stop the loops and the stop predicates return)."""
        return Stop(reason, message, self.location(), bp, old, new, lane)

    def breakpoint_stop(self, bp: Breakpoint, goal: Goal, text: str | None = None, *,
                        reason: StopReason = StopReason.BREAKPOINT, old=None, new=None,
                        lane: int | None = None) -> Stop | None:
        """``bp`` is reached here: its condition, ignore count and log point decide. The
        stop says ``text`` (by default "Breakpoint N, SPEC"), under the condition's error
        if evaluating it failed; None: go on."""
        hit = self._hit(bp, goal)
        return self._hit_stop(bp, hit, text, reason, old, new, lane) if hit.stop else None

    def watch_stop(self, bp: Watchpoint, goal: Goal, where: str) -> Stop | None:
        """The range ``bp`` watches changed (``where`` says how): a stop, or None to go on."""
        old = self.breakpoints.watch_values.get(bp.number)
        new = self.arena[bp.start: bp.stop].copy()
        self.breakpoints.watch_values[bp.number] = new
        hit = self._hit(bp, goal)
        if not hit.stop:
            return None
        return self._hit_stop(bp, hit, watch_message(bp, old, new, where),
                              StopReason.WATCHPOINT, old, new)

    def _hit_stop(self, bp: Breakpoint, hit: Hit, text: str | None,
                  reason: StopReason = StopReason.BREAKPOINT, old=None, new=None,
                  lane: int | None = None) -> Stop:
        if text is None:
            if bp.number == 0:
                return self.here(StopReason.STEP, f"reached {bp.spec}")
            label = "Temporary breakpoint" if bp.temporary else "Breakpoint"
            text = f"{label} {bp.number}, {bp.spec}"
        return self.here(reason, f"{hit.error}\n{text}" if hit.error else text, bp.number,
                         old, new, lane)

    def _interrupted(self, detail: str = "") -> Stop:
        return self.here(StopReason.INTERRUPTED, "interrupted by the user"
                         + (f" ({detail})" if detail else ""))

    def observe_nodes(self, fn: Callable) -> None:
        """Call ``fn(session, node)`` after every node completes, however it ran (a run, a
        step, a reverse replay), for the rest of the session: the UI records attention maps
        and node times this way, the sanitizer follows the session."""
        self._node_observers.append(fn)

    def attach_reference(self, reference) -> None:
        """Compare every node run from now on with ``reference`` (an
        :class:`~firscope.compare.attached.AttachedDump`; debug.diverge opens one)."""
        self.reference = reference

    def lanes(self) -> int | None:
        """Lanes of the live dispatch, or of the next node's kernel."""
        if self.dispatch is not None:
            return self.dispatch.lanes
        n = self.node
        if n is not None and n.kind == NodeKind.MICRO:
            return n.program.threads
        return None

    def check_lane(self, lane: int) -> None:
        lanes = self.lanes()
        if lanes is None:
            raise FirError("no kernel is running: step into a micro node first")
        if not 0 <= lane < lanes:
            raise FirError(f"lane {lane} does not exist (0..{lanes - 1})" if lanes
                           else "this dispatch has no lanes")

    # ------------------------------------------------------------- forward
    def stepi(self, count: int = 1, *, lane: int = 0) -> Stop:
        """Execute ``count`` instructions in lockstep (an ext node counts as one)."""
        return self._resume(Goal(units=max(count, 1), lane=lane))

    def next(self, count: int = 1, *, lane: int = 0) -> Stop:
        """Finish the current node and stop before the next one, ``count`` times."""
        return self._resume(Goal(at=self._boundaries_ahead(max(count, 1)), lane=lane))

    def finish(self, *, lane: int = 0) -> Stop:
        """Inside a kernel: run it to its end. Between nodes: run to the end of the token."""
        if self.dispatch is not None:
            return self.next(lane=lane)
        return self.next_token(lane=lane)

    def next_token(self, *, lane: int = 0) -> Stop:
        return self._resume(Goal(at=(self.step + 1, 0), lane=lane))

    def cont(self, *, lane: int = 0) -> Stop:
        return self._resume(Goal(lane=lane))

    def until(self, where: str, *, lane: int = 0) -> Stop:
        """Run to a node or kernel line (a one-off breakpoint, like gdb's until/advance)."""
        bp = parse_location(self.model, where)
        if not isinstance(bp, (NodeBreakpoint, LineBreakpoint, TokenBreakpoint)):
            raise FirError("until needs a node, a kernel line or 'token N'")
        return self._resume(Goal(extra=bp, lane=lane))

    def goto(self, target: Cursor, *, lane: int = 0) -> Stop:
        """Go to the start of node ``target[1]`` of step ``target[0]``: forward (breakpoints
        stop on the way) or back through the history."""
        step, idx = target
        if not (0 <= idx < len(self.nodes)) or not 0 <= step < self.total_steps:
            raise FirError(f"no node {idx} at step {step}")
        if target == self.cursor and self.dispatch is None:
            return self.here(StopReason.STEP, f"at {self.nodes[idx].full_name}")
        if target > self.cursor:
            return self._resume(Goal(at=target, lane=lane))
        return self._rewind(Goal(at=target, lane=lane))

    def goto_node(self, full_name: str, *, lane: int = 0) -> Stop:
        """Go to a node of the current token, by name."""
        try:
            idx = self.model.node_index(full_name)
        except KeyError:
            raise FirError(f"no node '{full_name}'") from None
        return self.goto((self.step, idx), lane=lane)

    # ------------------------------------------------------------- backward
    def reverse_stepi(self, count: int = 1, *, lane: int = 0) -> Stop:
        return self._rewind(Goal(units=max(count, 1), lane=lane))

    def reverse_next(self, count: int = 1, *, lane: int = 0) -> Stop:
        """Undo ``count`` nodes (inside a kernel, the first goes back to its start)."""
        return self._rewind(Goal(nodes=max(count, 1), lane=lane))

    def reverse_continue(self, *, lane: int = 0) -> Stop:
        """Back to the previous node or token breakpoint, or the start of the history."""
        return self._rewind(Goal(lane=lane))

    # ------------------------------------------------------------- breakpoints
    def add_breakpoint(self, text: str, *, temporary: bool = False,
                       log: str | None = None) -> Breakpoint:
        """``log``: a log point (dprintf) that prints this message where it would stop."""
        loc, cond = split_condition(text)
        if loc.split(None, 1)[:1] == ["diverge"]:
            from .diverge import parse_diverge
            bp = parse_diverge(self, loc)
        else:
            bp = parse_location(self.model, loc)
        if cond is not None:
            self.resolver.check(cond)
        if log is not None:
            check_format(log, self.resolver.check)
        return self.breakpoints.add(replace(bp, temporary=temporary, condition=cond, log=log))

    def add_watch(self, text: str) -> Watchpoint | RegisterWatch:
        """``BUFFER[a:b]`` (an arena range), or a register: ``R3``, ``lane 2 U4``."""
        loc, cond = split_condition(text)
        bp = parse_register_watch(loc) or parse_watch(self.model, loc)
        if cond is not None:
            self.resolver.check(cond)
        return self.breakpoints.add(replace(bp, condition=cond), self.arena)

    def toggle_breakpoint(self, text: str) -> tuple[str, Breakpoint]:
        loc, _ = split_condition(text)
        return self.breakpoints.toggle(parse_location(self.model, loc), self.arena)

    def set_condition(self, number: int, text: str | None) -> None:
        cond = DebugExpr(text) if text and text.strip() else None
        if cond is not None:
            self.resolver.check(cond)
        self.breakpoints.update(number, condition=cond)

    def set_ignore(self, number: int, count: int) -> None:
        if count < 0:
            raise FirError("ignore count must be >= 0")
        self.breakpoints.update(number, ignore_count=count)

    def set_enabled(self, numbers: list[int], enabled: bool) -> None:
        for n in numbers:
            self.breakpoints.get(n)
        for n in numbers:
            self.breakpoints.update(n, enabled=enabled)
        self.breakpoints.refresh_watches(self.arena)

    def delete_breakpoints(self, numbers: list[int] | None = None) -> None:
        self.breakpoints.delete(numbers)

    # ------------------------------------------------------------ patches
    def set(self, text: str, *, lane: int = 0) -> Patch:
        """``set [--weight] [lane N] TARGET = EXPR``: change state here, replayably."""
        patch = self.patches.add(parse_set(self, text, lane))
        apply_patch(self, patch)
        return patch

    def _arrive(self) -> None:
        """The forward loop reached a node boundary: patches made here apply again."""
        for patch in self.patches.at(self.step, self.node_index, None):
            apply_patch(self, patch)

    def patches_due(self, d: Dispatch) -> None:
        """Inside a dispatch: apply the patches made at this instruction count."""
        for patch in self.patches.at(self.step, self.node_index, d.steps):
            apply_patch(self, patch)

    # ------------------------------------------------------------ expressions
    def evaluate(self, text: str | DebugExpr, *, lane: int = 0):
        expr = text if isinstance(text, DebugExpr) else DebugExpr(text)
        return expr.evaluate(lambda name, layer: self.resolver.value(name, layer, lane))

    def buffer_value(self, name: str, layer: int | None = None) -> np.ndarray:
        return self.resolver.buffer_value(name, layer)

    # ===================================================== the forward loop
    def _resume(self, goal: Goal) -> Stop:
        """The one forward loop: run until the goal or a stop predicate says stop."""
        units = goal.units
        first = True
        # Resuming from a stop on an instruction (or stepping into a kernel) executes that
        # instruction even if a line breakpoint is on it, as gdb does.
        skip = self.dispatch is not None or units is not None
        while True:
            if self.finished:
                return self.here(StopReason.FINISHED, self._end_message())
            if self.cancel.is_set():
                return self._interrupted()
            if self.dispatch is None:
                node = self.nodes[self.node_index]
                if not first:
                    stop = self._boundary_breakpoints(node, goal)
                    if stop is not None:
                        return stop
                if node.kind == NodeKind.MICRO and (units is not None
                                             or self._needs_instructions(node, goal)):
                    self._enter_dispatch(node)
                else:
                    stop = self._run_whole(node, goal)
                    if stop is not None:
                        return stop
                    if units is not None:
                        units -= 1
                    if self._goal_reached(goal, units):
                        return self._at_goal(goal)
            if self.dispatch is not None:
                stop, executed = self._drive(goal, skip_first=first and skip, units=units)
                if units is not None:
                    units -= executed
                if stop is not None:
                    return stop
                if not self.dispatch.done:  # the units ran out inside the kernel
                    return self.here(StopReason.STEP, "")
                stop = self._complete_dispatch(goal)
                if stop is not None:
                    return stop
                if self._goal_reached(goal, units):
                    return self._at_goal(goal)
            first = False

    def _goal_reached(self, goal: Goal, units: int | None) -> bool:
        if self.finished:
            return False  # the loop reports the end
        if units is not None and units <= 0:
            return True
        return goal.at is not None and self.cursor >= goal.at

    def _at_goal(self, goal: Goal) -> Stop:
        """Reached the goal between nodes: a breakpoint there is still reported as one."""
        stop = self._boundary_breakpoints(self.nodes[self.node_index], goal)
        return stop if stop is not None else self.here(StopReason.STEP, "")

    def _boundaries_ahead(self, count: int) -> Cursor:
        step, idx = self.cursor
        for _ in range(count):
            idx += 1
            if idx >= len(self.nodes):
                step, idx = step + 1, 0
        return step, idx

    def _needs_instructions(self, node: PlanNode, goal: Goal) -> bool:
        """Whether this kernel must be interpreted instruction by instruction."""
        if self.breakpoints.lines(node.target) or self.breakpoints.nan \
                or self.breakpoints.register_watches():
            return True
        if self.breakpoints.instruction_checks(self, node):
            return True
        if self.patches.inside(self.step, node.index):
            return True
        extra = goal.extra
        return isinstance(extra, LineBreakpoint) and extra.kernel == node.target

    def _boundary_breakpoints(self, node: PlanNode, goal: Goal) -> Stop | None:
        """Node and token breakpoints (and a one-off location) before ``node``."""
        candidates: list[Breakpoint] = list(self.breakpoints.at_node(node))
        if self.node_index == 0:
            candidates += self.breakpoints.at_token(self.step)
        extra = goal.extra
        if isinstance(extra, NodeBreakpoint) and extra.matches(node):
            candidates.append(extra)
        if isinstance(extra, TokenBreakpoint) and self.node_index == 0 \
                and extra.token == self.step:
            candidates.append(extra)
        for bp in candidates:
            stop = self.breakpoint_stop(bp, goal)
            if stop is not None:
                return stop
        return None

    def _hit(self, bp: Breakpoint, goal: Goal) -> Hit:
        hit = self.breakpoints.hit(bp, lambda e: self.evaluate(e, lane=goal.lane))
        if hit.log is not None:
            self._log_point(bp, hit.log, goal.lane)
        return hit

    def _log_point(self, bp: Breakpoint, message: str, lane: int) -> None:
        """A log point was hit: its message, interpolated here, goes to ``log_sink`` (DAP
        sends it at once) or waits in ``log_lines`` for the command that ran."""
        text = interpolate(message, lambda e: fmt_value(self.evaluate(e, lane=lane)))
        if self.log_sink is not None:
            self.log_sink(bp, text)
        else:
            self.log_lines.append(text)

    # -- whole nodes ----------------------------------------------------------------------
    def _run_whole(self, node: PlanNode, goal: Goal) -> Stop | None:
        """Run one node through the runtime and move past it; check watches and NaN.

        If a watchpoint or NaN catchpoint fires in a kernel, or it faults, the
        node is restored and replayed in the interpreter to stop on the exact
        instruction.
        """
        saved = copy_regions(self.arena, self.write_regions(node))
        t = time.perf_counter()
        try:
            self.machine.run_node(node)
        except Interrupted as e:
            restore_regions(self.arena, saved)  # the node is undone: the cursor stays before it
            return self._interrupted(e.message)
        except (FirFault, BudgetExceeded) as e:
            restore_regions(self.arena, saved)
            if node.kind == NodeKind.MICRO and isinstance(e, FirFault):
                return self._replay_to_stop(node, goal, e)
            reason = StopReason.FAULT if isinstance(e, FirFault) else StopReason.BUDGET
            return self.here(reason, str(e), lane=getattr(e, "lane", None))
        self.node_times[node.index] = time.perf_counter() - t
        changes = changes_since(self.arena, saved)
        watches = self.breakpoints.changed_watches(self.arena)
        nan = nan_written(self.model, self.arena, changes, node) if self.breakpoints.nan else None
        if (watches or nan) and node.kind == NodeKind.MICRO:
            restore_regions(self.arena, saved)
            return self._replay_to_stop(node, goal, None)
        self.history.push(Record(RecordKind.NODE, self.step, node.index, changes))
        self._observe(node)
        self._advance_node()
        stop = self._after_node(node, goal)
        if stop is not None:
            return stop
        for bp in watches:
            stop = self.watch_stop(bp, goal, f"at {node.full_name}")
            if stop is not None:
                return stop
        if nan:
            return self.here(StopReason.NAN, nan)
        return None

    def _replay_to_stop(self, node: PlanNode, goal: Goal, fault: FirFault | None) -> Stop | None:
        """Interpret a node from its start to find the instruction behind a stop."""
        self._enter_dispatch(node)
        stop, _ = self._drive(goal, skip_first=False, units=None, locate=True)
        if stop is not None:
            return stop
        stop = self._complete_dispatch(goal)
        if stop is not None:
            return stop
        if fault is not None:  # the interpreter ran it without a fault: engines disagree
            return self.here(StopReason.FAULT, f"{fault} (the interpreter ran this node without "
                                               "a fault: please report)")
        return None

    # -- instruction by instruction ------------------------------------------------------
    def _drive(self, goal: Goal, *, skip_first: bool, units: int | None,
               locate: bool = False) -> tuple[Stop | None, int]:
        """Interpret the live dispatch until it ends, ``units`` ran, or a predicate stops it.

        Returns (stop or None, instructions executed)."""
        d = self.dispatch
        obs = DriveObserver(self, goal, skip_first)
        start = d.steps
        try:
            ended = d.run(self.machine.budget, self.cancel, observer=compose(self.tape, obs),
                          limit=units)
        except FirFault as f:
            return self.here(StopReason.FAULT, str(f), lane=f.lane), d.steps - start
        except BudgetExceeded as e:
            return self.here(StopReason.BUDGET, str(e)), d.steps - start
        except Interrupted:
            return self._interrupted(), d.steps - start
        executed = d.steps - start
        if not d.done:
            self.patches_due(d)  # stopped at a count where something was set: it holds here
        if ended is Ended.DONE and obs.stop is None and locate:
            return None, executed
        if obs.stop is not None and ended is Ended.AFTER and d.done:
            # the write was the kernel's last instruction: the true location is after the node
            stop = obs.stop
            self._complete_dispatch()
            return self.here(stop.reason, stop.message, stop.breakpoint, stop.old,
                             stop.new), executed
        return obs.stop, executed

    # -- cursor bookkeeping --------------------------------------------------------------------
    def write_regions(self, node: PlanNode) -> list[tuple[int, int]]:
        cached = self._write_cache.get(node.index)
        if cached is None:
            cached = self._write_cache[node.index] = node.written_spans()
        return cached

    def _enter_dispatch(self, node: PlanNode) -> None:
        st = self.state
        st.node_before = copy_regions(self.arena, self.write_regions(node))
        d = self.machine.dispatch(node)
        st.dispatch = d
        st.tape = Tape(d, max(self.history.budget // 8, 1 << 20))

    def _after_node(self, node: PlanNode, goal: Goal) -> Stop | None:
        """Kinds that decide after a node completes (break diverge)."""
        for bp in self.breakpoints.node_checks():
            message = bp.fired(self, node)
            if message:
                hit = self._hit(bp, goal)
                if hit.stop:
                    return self._hit_stop(bp, hit, f"{bp.what.capitalize()} {bp.number}, "
                                          f"{message}", lane=bp.focus_lane(self, node))
        return None

    def _complete_dispatch(self, goal: Goal | None = None) -> Stop | None:
        node = self.nodes[self.node_index]
        d = self.dispatch
        self.line_counts[node.target] = d.line_counts
        self.history.push(Record(RecordKind.NODE, self.step, self.node_index,
                                 changes_since(self.arena, self.node_before)))
        self._leave_dispatch()
        self._observe(node)
        self._advance_node()
        return self._after_node(node, goal) if goal is not None else None

    def _leave_dispatch(self) -> None:
        st = self.state
        st.dispatch = st.tape = st.node_before = None

    def _observe(self, node: PlanNode) -> None:
        # what each layer (and, under the key layer None, the embeddings before the first
        # layer) last wrote into the buffers all layers share: NAME@L and the logit lens
        if node.layer is not None or node.index < self._first_layer:
            names = self._region_names()
            for a, b in self.write_regions(node):
                name = names.get(a)
                if name is not None:
                    self.layer_values[(name, node.layer)] = (self.step, node.index,
                                                             self.arena[a:b].copy())
        ref = self.reference
        if ref is not None:
            token = self.sequence[self.step]
            ref.compare(self.step, node, token)
            if ref.isolate:  # break diverge --isolate: each node judged on its own too
                ref.judge(self.step, node, token, self.machine)
        for f in self._node_observers:
            f(self, node)

    def _region_names(self) -> dict[int, str]:
        """Arena base -> buffer name, for buffers shared by all layers."""
        if self._shared_names is None:
            m = self.model
            self._shared_names = {m.regions[n].base: n for n, d in m.buffers.items()
                                  if not d.per_layer}
        return self._shared_names

    def _begin_step(self) -> None:
        inputs = copy_regions(self.arena, [(r.base, r.base + r.size)
                                           for r in self.model.inputs.values()])
        self.machine.begin_token(self.sequence[self.step], position=self.step)
        self.history.push(Record(RecordKind.BEGIN, self.step, 0,
                                 changes_since(self.arena, inputs)))
        self.breakpoints.refresh_watches(self.arena)  # the token buffers changing is no stop

    def _end_step(self) -> None:
        res = self.machine.finish_token()
        self.history.push(Record(RecordKind.END, self.step, len(self.nodes),
                                 seq_len=len(self.sequence)))
        self.logits.append(res.logits)
        generated_so_far = len(self.sequence) - len(self.prompt)
        if self.step == len(self.sequence) - 1 and generated_so_far < self.n_generate:
            self.sequence.append(int(np.argmax(res.logits)))
        st = self.state
        st.step += 1
        st.node_index = 0
        if st.step >= self.total_steps:
            st.finished = True
        else:
            self._begin_step()

    def _advance_node(self) -> None:
        self.state.node_index += 1
        if self.node_index >= len(self.nodes):
            self._end_step()
        if not self.finished:
            self._arrive()

    def _end_message(self) -> str:
        return f"end of generation after {self.step} steps"

    # ===================================================== the backward loop
    def _rewind(self, goal: Goal) -> Stop:
        """The one backward loop: undo until the goal, a node/token breakpoint (when the goal
        has no boundary of its own), or the start of the recorded history."""
        units = goal.units
        nodes = goal.nodes  # reverse-next: node boundaries still to undo
        while True:
            if self.cancel.is_set():
                return self._interrupted()
            d = self.dispatch
            if d is not None and d.steps > 0 and units is not None:
                back = min(units, d.steps)
                stop = self._seek_instruction(d.steps - back)
                if stop is not None:
                    return stop
                units -= back
                if units <= 0:
                    return self.here(StopReason.STEP, "")
                continue  # at the kernel's start: on to the node before
            if d is not None:
                restore_regions(self.arena, self.node_before)
                self._leave_dispatch()
                moved = d.steps > 0
            else:
                moved = False
            if not moved:
                if not self._undo_node():
                    self.breakpoints.refresh_watches(self.arena)
                    return self.here(StopReason.HISTORY, self._no_history_message())
                if units is not None:
                    node = self.nodes[self.node_index]
                    if node.kind == NodeKind.MICRO and node.program.ops:
                        stop = self._enter_at_end(node)
                        if stop is not None:
                            return stop
                        continue  # step back from the kernel's end
                    units -= 1
                    if units <= 0:
                        self.breakpoints.refresh_watches(self.arena)
                        return self.here(StopReason.STEP, "")
                    continue
            self.breakpoints.refresh_watches(self.arena)
            if goal.between_nodes:
                if nodes is not None:
                    nodes -= 1
                if (nodes is not None and nodes <= 0) or (goal.at is not None
                                                          and self.cursor <= goal.at):
                    return self.here(StopReason.STEP, "")
                continue
            stop = self._boundary_breakpoints(self.nodes[self.node_index], goal)
            if stop is not None:
                return stop

    def _undo_node(self) -> bool:
        """Undo records up to and including the last node's; False if none is left."""
        if not self.history.has_node():
            return False
        while True:
            rec = self.history.pop()
            self.history.undo(rec, self.arena)
            if rec.kind is RecordKind.END:
                self.logits.pop()
                del self.sequence[rec.seq_len:]
                self.state.finished = False
                self.machine.rewind_token(self.sequence[rec.step])
                self.state.step, self.state.node_index = rec.step, len(self.nodes)
            elif rec.kind is RecordKind.BEGIN:
                self.machine.unbegin_token()
                self.state.step, self.state.node_index = rec.step - 1, len(self.nodes)
            elif rec.kind is RecordKind.PATCH:
                continue  # undone with the node boundary it was made at
            else:
                self.state.step, self.state.node_index = rec.step, rec.node
                return True

    def _no_history_message(self) -> str:
        return "no more reverse-execution history" + (
            " (older history was dropped to stay within the memory budget)"
            if self.history.truncated else "")

    def _enter_at_end(self, node: PlanNode) -> Stop | None:
        """Back into a kernel that ran whole: interpret it once (recording the tape), so
        that stepping back from its end is cheap."""
        self._enter_dispatch(node)
        try:
            self.dispatch.run(None, self.cancel, observer=compose(Replay(self), self.tape))
        except Interrupted:
            restore_regions(self.arena, self.node_before)
            self._leave_dispatch()
            return self._interrupted()
        return None

    def _seek_instruction(self, steps: int) -> Stop | None:
        """Put the live dispatch at instruction count ``steps`` (back from where it is)."""
        d, tape = self.dispatch, self.tape
        if tape is not None and tape.can_rewind():
            mark = tape.rewind(steps)
            todo = steps - mark.steps
        else:  # the journal was given up: from the node's start
            restore_regions(self.arena, self.node_before)
            node = self.nodes[self.node_index]
            d = self.machine.dispatch(node)
            self.state.dispatch = d
            self.state.tape = tape = Tape(d, 0)
            tape.complete = False
            todo = steps
        try:
            d.run(None, self.cancel, observer=compose(Replay(self), tape), limit=todo)
        except Interrupted:
            return self._interrupted()
        self.patches_due(d)  # the state at this count includes what was set here
        self.breakpoints.refresh_watches(self.arena)
        return None
