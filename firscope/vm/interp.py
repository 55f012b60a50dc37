"""The SIMT step interpreter: the reference semantics of a dispatch.

Registers are arrays over lanes (``R[reg, lane]`` f32, ``U[reg, lane]``
uint32). All active lanes execute one instruction in lockstep; divergence
is an active mask plus a stack of frames: an ``ifbegin`` frame remembers
the mask to restore, a ``forbegin`` frame also holds each lane's remaining
iteration count (lanes may loop different numbers of times). One call to
:meth:`Dispatch.step` executes exactly one instruction.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .assembler import Address, Op, Program
from .faults import (bounds_message, budget_error, fault_error, interrupted_error,
                     loop_count_message)
from .isa import MAX_TRIPS, NREGS, FrameKind
from .runaway import runaway_stop


@dataclass
class Frame:
    kind: FrameKind
    pc: int  # pc of the opener
    saved_mask: np.ndarray
    counts: np.ndarray | None = None  # per-lane trip counts read on entry (for loops)
    trips: int = 0  # iterations started, for display
    min_count: int = 0  # no lane leaves the loop before this many trips

    @property
    def remaining(self) -> np.ndarray | None:
        """Per-lane iterations left, counting the current one (0: lane has left)."""
        if self.counts is None:
            return None
        return np.maximum(self.counts - max(self.trips - 1, 0), 0)


STOP_POLL = 4096  # instructions between looks at a stop flag


class Ended(enum.Enum):
    """Why :meth:`Dispatch.run` returned."""

    DONE = "done"  # the dispatch finished
    LIMIT = "limit"  # the requested number of instructions executed
    BEFORE = "before"  # the observer stopped before an instruction (pc is on it)
    AFTER = "after"  # the observer stopped after an instruction (pc is the next one)


class Observer:
    """What a debugger, profiler or sanitizer sees of the instruction loop.

    Override what you need and set the matching ``wants_*`` flag, so the loop
    pays nothing for a hook nobody uses. ``before``/``after`` return True to
    stop the run there. ``store`` is called before a store lands (the arena
    still holds the old values) with the arena addresses and the values.
    ``memcheck`` receives the accesses outside their region (dispatch, op,
    address, indices, lanes), which are then skipped (a skipped load reads 0)
    instead of faulting. ``mask`` (``wants_mask``) is told when the active
    mask changes. ``before_only_at`` (a frozenset of pcs) limits ``before`` to
    those instructions, so the loop makes no call at the others (cost/record
    wants the memory instructions only). :meth:`Dispatch.run` installs an
    observer for that run only; :func:`compose` makes one observer of several.
    """

    wants_before = False
    wants_after = False
    wants_store = False
    wants_memcheck = False
    wants_mask = False
    # with wants_before: the pcs whose instructions ``before`` sees (None: every one), so
    # an observer of a few instructions costs the loop no call at the others
    before_only_at: frozenset[int] | None = None

    def before(self, d: "Dispatch", op: Op) -> bool:
        return False

    def after(self, d: "Dispatch", op: Op) -> bool:
        return False

    def store(self, d: "Dispatch", where: np.ndarray, values) -> None:
        return None

    def memcheck(self, d: "Dispatch", op: Op, addr: Address, indices, lanes) -> None:
        return None

    def mask(self, d: "Dispatch") -> None:
        """The active mask changed (``d.mask``), inside the instruction at ``d.pc``: that
        instruction ran under the mask before, the next one runs under this one."""
        return None


class StoreObserver(Observer):
    """An observer of stores only: ``fn(dispatch, addresses, values)`` before each lands."""

    wants_store = True

    def __init__(self, fn):
        self.fn = fn

    def store(self, d, where, values) -> None:
        self.fn(d, where, values)


class _Composite(Observer):
    """Several observers as one, called in the order given; ``before``/``after`` stop at
    the first that asks to stop (the later ones do not see that instruction)."""

    def __init__(self, parts: list[Observer]):
        self.parts = parts
        befores = [o for o in parts if o.wants_before]
        self._before = [(o.before, o.before_only_at) for o in befores]
        self._after = [o.after for o in parts if o.wants_after]
        self._store = [o.store for o in parts if o.wants_store]
        self._memcheck = [o.memcheck for o in parts if o.wants_memcheck]
        self._mask = [o.mask for o in parts if o.wants_mask]
        self.wants_before, self.wants_after = bool(self._before), bool(self._after)
        self.wants_store, self.wants_memcheck = bool(self._store), bool(self._memcheck)
        self.wants_mask = bool(self._mask)
        self.before_only_at = (None if any(o.before_only_at is None for o in befores)
                           else frozenset().union(*(o.before_only_at for o in befores)))

    def before(self, d, op) -> bool:
        for f, pcs in self._before:
            if (pcs is None or op.pc in pcs) and f(d, op):
                return True
        return False

    def after(self, d, op) -> bool:
        for f in self._after:
            if f(d, op):
                return True
        return False

    def store(self, d, where, values) -> None:
        for f in self._store:
            f(d, where, values)

    def memcheck(self, d, op, addr, indices, lanes) -> None:
        for f in self._memcheck:
            f(d, op, addr, indices, lanes)

    def mask(self, d) -> None:
        for f in self._mask:
            f(d)


def compose(*observers: "Observer | None") -> "Observer | None":
    """One observer that passes every hook to ``observers`` in order (None ones left out)."""
    parts = [o for o in observers if o is not None]
    if len(parts) <= 1:
        return parts[0] if parts else None
    return _Composite(parts)


def _next_check(steps: int, end_at: int, budget_at: int, stop) -> int:
    """When the instruction loop next looks at its limit, its budget and the stop flag."""
    return min(end_at, budget_at, steps + STOP_POLL if stop is not None else MAX_TRIPS)


class Dispatch:
    """One execution of a program over ``threads`` lanes on a shared arena."""

    def __init__(self, program: Program, arena: np.ndarray):
        self.program = program
        self.ops = program.ops
        self.arena = arena
        n = program.threads
        self.lanes = n
        self.R = np.zeros((NREGS, n), dtype=np.float32)
        self.U = np.zeros((NREGS, n), dtype=np.uint32)
        self.R[0] = np.arange(n, dtype=np.float32)
        self.mask = np.ones(n, dtype=bool)
        self.full = True
        self.active = n  # lanes set in mask
        self.stack: list[Frame] = []
        self.pc = 0
        self.steps = 0  # instructions executed
        self.lane_steps = 0  # sum of active lanes over executed instructions
        self._counts = [0] * len(self.ops)  # executions per pc (a list: cheap to bump)
        # The running observer's store and memcheck hooks (installed by run()). With
        # memcheck None, an access outside its region faults.
        self.store_hook = None
        self.memcheck = None
        self.mask_hook = None  # the running observer's mask hook (installed by run())
        # Per-op closures with their register rows looked up once. R and U are
        # only ever written in place (restore() too), so the row views stay valid.
        self.Rr = list(self.R)
        self.Ur = list(self.U)
        self.tmp_f32 = np.empty(n, dtype=np.float32)
        self.tmp_bool = np.empty(n, dtype=bool)
        self._fns = [op.spec.interp(self, op) for op in self.ops]

    # -- inspection ---------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.pc >= len(self.ops)

    @property
    def current(self) -> Op | None:
        return None if self.done else self.ops[self.pc]

    @property
    def line(self) -> int | None:
        op = self.current
        return op.loc.line if op else None

    # -- execution ----------------------------------------------------------
    def step(self) -> Op:
        """Execute exactly one instruction; return it."""
        op = self.ops[self.pc]
        self.run(limit=1)
        return op

    def run(self, budget: int | None = None, stop=None, *, observer: "Observer | None" = None,
            limit: int | None = None) -> "Ended":
        """The one instruction loop: every engine path that interprets goes through here.

        Runs until the dispatch is done, ``limit`` more instructions have
        executed, or the observer asks to stop (before or after an
        instruction); returns which. ``budget`` bounds the dispatch's total
        instructions (:class:`BudgetExceeded`, naming the pc it would run
        next). ``stop`` (a threading.Event) is looked at every STOP_POLL
        instructions and ends the run with :class:`Interrupted`; the dispatch
        stays resumable where it stopped. An instruction that faults leaves
        the dispatch exactly as before it (pc, steps, counts), so a debugger
        can stop on it and replay. The observer's store, memcheck and mask hooks are
        installed for this run only.
        """
        if budget is not None and observer is None and limit is None and self.steps == 0:
            self._certain_runaway(budget)
        installed = self._install(observer)
        fns, ops = self._fns, self.ops
        n = len(fns)
        counts = self._counts
        before, at = self._befores(observer)
        after = observer.after if observer is not None and observer.wants_after else None
        pc, steps, lane_steps = self.pc, self.steps, self.lane_steps
        # One threshold for every check that is not needed per instruction.
        end_at = MAX_TRIPS if limit is None else steps + max(limit, 0)
        budget_at = MAX_TRIPS if budget is None else max(budget, 0)
        check_at = _next_check(steps, end_at, budget_at, stop)
        try:
            with np.errstate(all="ignore"):
                while pc < n:
                    if steps >= check_at:
                        if steps >= end_at:
                            return Ended.LIMIT
                        if steps >= budget_at:
                            self.pc = pc
                            self.over_budget(budget)
                        if stop is not None and stop.is_set():
                            raise interrupted_error(self.program, ops[pc], steps=steps)
                        check_at = _next_check(steps, end_at, budget_at, stop)
                    if before is not None and at[pc] and before(self, ops[pc]):
                        return Ended.BEFORE
                    active = self.active
                    self.pc = pc  # handlers and store observers see the instruction's pc
                    nxt = fns[pc]()
                    counts[pc] += 1
                    lane_steps += active
                    steps += 1
                    op_pc = pc
                    pc = pc + 1 if nxt is None else nxt
                    if after is not None:
                        self.pc, self.steps, self.lane_steps = pc, steps, lane_steps
                        if after(self, ops[op_pc]):
                            return Ended.AFTER
        finally:
            self.pc, self.steps, self.lane_steps = pc, steps, lane_steps
            if installed is not None:
                self.store_hook, self.memcheck, self.mask_hook = installed
        return Ended.DONE

    def _befores(self, observer: "Observer | None") -> tuple[Callable | None, list[bool]]:
        """The observer's ``before`` (None: not wanted) and, per pc, whether it is called
        there (its ``before_only_at``; None: everywhere)."""
        if observer is None or not observer.wants_before:
            return None, []
        pcs = observer.before_only_at
        return observer.before, [pcs is None or pc in pcs for pc in range(len(self.ops))]

    def _certain_runaway(self, budget: int) -> None:
        """A whole dispatch that certainly runs out of ``budget`` (vm/runaway): raise what
        running it would raise, without running it."""
        runaway = runaway_stop(self.program, max(budget, 0))
        if runaway is not None:
            self.pc = runaway
            self.over_budget(budget)

    def _install(self, observer: "Observer | None"):
        """Set the observer's store/memcheck hooks; returns the ones to put back (None: no
        change)."""
        if observer is None or not (observer.wants_store or observer.wants_memcheck
                                    or observer.wants_mask):
            return None
        saved = self.store_hook, self.memcheck, self.mask_hook
        if observer.wants_store:
            self.store_hook = observer.store
        if observer.wants_memcheck:
            self.memcheck = observer.memcheck
        if observer.wants_mask:
            self.mask_hook = observer.mask
        return saved

    @property
    def line_counts(self) -> np.ndarray:
        """Executions per pc in this dispatch (int64 [n_ops])."""
        return np.asarray(self._counts, dtype=np.int64)

    @line_counts.setter
    def line_counts(self, value) -> None:
        self._counts = [int(v) for v in value] if value is not None else [0] * len(self.ops)

    def over_budget(self, budget):
        raise budget_error(self.program, self.pc, budget)

    # -- helpers used by handlers --------------------------------------------
    def set_mask(self, mask: np.ndarray) -> None:
        self.mask = mask
        self.active = int(np.count_nonzero(mask))
        self.full = self.active == self.lanes
        if self.mask_hook is not None:
            self.mask_hook(self)

    def enter_loop(self, op: Op):
        count_reg = op.args[0]
        values = self.R[count_reg]
        active = self.mask
        bad = active & ~np.isfinite(values)
        if bad.any():
            lane = int(np.flatnonzero(bad)[0])
            self.fault(op, lane, loop_count_message(count_reg, values[lane], lane))
        counts = np.floor(np.where(active, values, 0)).astype(np.float64)
        np.clip(counts, 0, MAX_TRIPS, out=counts)
        counts = counts.astype(np.int64)
        now = active & (counts > 0)
        if not now.any():
            return op.match + 1  # no lane enters: skip the body, nothing pushed
        frame = Frame(FrameKind.FOR, op.pc, self.mask.copy(), counts, 1, int(counts[now].min()))
        self.stack.append(frame)
        self.set_mask(now)
        return None

    def loop_back(self, op: Op):
        frame = self.stack[-1]
        done = frame.trips  # trips completed, this one included
        if done < frame.min_count:  # every lane that entered goes round again
            frame.trips = done + 1
            return op.match + 1
        still = frame.counts > done  # counts are 0 for lanes that never entered
        if still.any():
            frame.trips = done + 1
            self.set_mask(still)
            return op.match + 1
        self.stack.pop()
        self.set_mask(frame.saved_mask)
        return None

    def enter_if(self, op: Op):
        cond = self.R[op.args[0]] != 0
        now = self.mask & cond
        if not now.any():
            return op.match + 1  # no lane takes the branch: skip to after ifend
        self.stack.append(Frame(FrameKind.IF, op.pc, self.mask.copy()))
        self.set_mask(now)
        return None

    def leave_if(self, op: Op):
        frame = self.stack.pop()
        self.set_mask(frame.saved_mask)
        return None

    def check_bounds(self, op: Op, addr: Address, idx: np.ndarray, lanes):
        """(indices, lanes, skipped lanes) of an access whose region indices are ``idx``
        in ``lanes`` (None: every lane). An index outside the region is a fault; with a
        ``memcheck`` recorder set it is reported to it instead and that lane's access is
        skipped (then lanes is an array and skipped names the lanes left out)."""
        if idx.size == 0:
            return idx, lanes, None
        lo, hi = idx.min(), idx.max()
        if lo >= 0 and hi < addr.extent:
            return idx, lanes, None
        bad = (idx < 0) | (idx >= addr.extent)
        if self.memcheck is None:
            first = np.flatnonzero(bad)[0]
            lane = int(first if lanes is None else lanes[first])
            index = int(idx[first])
            self.fault(op, lane, bounds_message(op, addr, index), address=addr.base + index)
        every = np.arange(self.lanes) if lanes is None else lanes
        self.memcheck(self, op, addr, idx[bad], every[bad])
        return idx[~bad], every[~bad], every[bad]

    def store(self, where: np.ndarray, values: np.ndarray) -> None:
        if self.store_hook is not None:
            self.store_hook(self, where, values)
        self.arena[where] = values

    def fault(self, op: Op, lane: int, message: str, address: int | None = None):
        raise fault_error(self.program, op, lane, message, address)

    # -- state for debuggers ---------------------------------------------------
    def snapshot(self) -> "DispatchState":
        return DispatchState(self.pc, self.R.copy(), self.U.copy(), self.mask.copy(),
                             tuple(_copy_frame(f) for f in self.stack),
                             self.steps, self.lane_steps)

    def restore(self, s: "DispatchState") -> None:
        self.pc = s.pc
        self.R[...] = s.R
        self.U[...] = s.U
        self.set_mask(s.mask.copy())
        self.stack = [_copy_frame(f) for f in s.stack]
        self.steps = s.steps
        self.lane_steps = s.lane_steps


def _copy_frame(f: Frame) -> Frame:
    return Frame(f.kind, f.pc, f.saved_mask.copy(), None if f.counts is None else f.counts.copy(),
                 f.trips, f.min_count)


@dataclass(frozen=True)
class DispatchState:
    pc: int
    R: np.ndarray
    U: np.ndarray
    mask: np.ndarray
    stack: tuple
    steps: int
    lane_steps: int
