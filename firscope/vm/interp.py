"""The SIMT step interpreter: the reference semantics of a dispatch.

Registers are arrays over lanes (``R[reg, lane]`` f32, ``U[reg, lane]``
uint32). All active lanes execute one instruction in lockstep; divergence
is an active mask plus a stack of frames: an ``ifbegin`` frame remembers
the mask to restore, a ``forbegin`` frame also holds each lane's remaining
iteration count (lanes may loop different numbers of times). One call to
:meth:`Dispatch.step` executes exactly one instruction.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import BudgetExceeded, FirFault
from .assembler import NREGS, Address, Op, Program


@dataclass
class Frame:
    kind: str  # "for" or "if"
    pc: int  # pc of the opener
    saved_mask: np.ndarray
    remaining: np.ndarray | None = None  # per-lane iterations left (for loops)
    trips: int = 0  # iterations started, for display


class Dispatch:
    """One execution of a program over ``threads`` lanes on a shared arena."""

    def __init__(self, program: Program, arena: np.ndarray, *, store_hook=None):
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
        self.stack: list[Frame] = []
        self.pc = 0
        self.steps = 0  # instructions executed
        self.lane_steps = 0  # sum of active lanes over executed instructions
        self.line_counts: np.ndarray | None = None  # per-pc counts when instrumented
        self.store_hook = store_hook  # called (addresses, old, new) before each store

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

    def active_lanes(self) -> np.ndarray:
        return np.flatnonzero(self.mask)

    # -- execution ----------------------------------------------------------
    def step(self) -> Op:
        """Execute exactly one instruction; return it."""
        op = self.ops[self.pc]
        if self.line_counts is not None:
            self.line_counts[self.pc] += 1
        self.lane_steps += int(self.mask.sum()) if not self.full else self.lanes
        self.steps += 1
        with np.errstate(all="ignore"):
            nxt = op.spec.interp(self, op)
        self.pc = self.pc + 1 if nxt is None else nxt
        return op

    def run(self, budget: int | None = None) -> None:
        """Run to the end (or until ``budget`` instructions have executed)."""
        ops = self.ops
        n = len(ops)
        limit = None if budget is None else self.steps + budget
        lanes = self.lanes
        counts = self.line_counts
        with np.errstate(all="ignore"):
            while self.pc < n:
                if limit is not None and self.steps >= limit:
                    self.over_budget(budget)
                op = ops[self.pc]
                if counts is not None:
                    counts[self.pc] += 1
                self.lane_steps += lanes if self.full else int(self.mask.sum())
                self.steps += 1
                nxt = op.spec.interp(self, op)
                self.pc = self.pc + 1 if nxt is None else nxt

    def over_budget(self, budget):
        op = self.ops[min(self.pc, len(self.ops) - 1)]
        raise BudgetExceeded(
            f"kernel '{self.program.name}' at node {self.program.node} executed more than "
            f"{budget} instructions; stopped at pc {self.pc} (line {op.loc.line}: {op.text})",
            op.loc)

    # -- helpers used by handlers --------------------------------------------
    def set_mask(self, mask: np.ndarray) -> None:
        self.mask = mask
        self.full = bool(mask.all())

    def enter_loop(self, op: Op):
        count_reg = op.args[0]
        values = self.R[count_reg]
        active = self.mask
        bad = active & ~np.isfinite(values)
        if bad.any():
            lane = int(np.flatnonzero(bad)[0])
            self.fault(op, lane, f"loop count R{count_reg} = {float(values[lane])!r} "
                                 f"in lane {lane} is not finite")
        counts = np.where(active, np.floor(values), 0)
        counts = np.maximum(counts, 0).astype(np.int64)
        frame = Frame("for", op.pc, self.mask.copy(), counts)
        now = active & (counts > 0)
        if not now.any():
            return op.match + 1  # no lane enters: skip the body, nothing pushed
        frame.trips = 1
        self.stack.append(frame)
        self.set_mask(now)
        return None

    def loop_back(self, op: Op):
        frame = self.stack[-1]
        frame.remaining[self.mask] -= 1
        still = self.mask & (frame.remaining > 0)
        if still.any():
            frame.trips += 1
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
        self.stack.append(Frame("if", op.pc, self.mask.copy()))
        self.set_mask(now)
        return None

    def leave_if(self, op: Op):
        frame = self.stack.pop()
        self.set_mask(frame.saved_mask)
        return None

    def check_bounds(self, op: Op, addr: Address, idx: np.ndarray, lanes) -> None:
        if idx.size == 0:
            return
        lo, hi = idx.min(), idx.max()
        if lo >= 0 and hi < addr.extent:
            return
        bad = np.flatnonzero((idx < 0) | (idx >= addr.extent))[0]
        lane = int(bad if lanes is None else lanes[bad])
        index = int(idx[bad])
        kind = "store to" if op.spec.mnemonic == "ustoref32" else "load from"
        self.fault(op, lane,
                   f"{kind} {addr} index {index} is outside {addr.region.name}[0:{addr.extent}] "
                   f"(arena address {addr.base + index})", address=addr.base + index)

    def store(self, where: np.ndarray, values: np.ndarray) -> None:
        if self.store_hook is not None:
            self.store_hook(self, where, values)
        self.arena[where] = values

    def fault(self, op: Op, lane: int, message: str, address: int | None = None):
        p = self.program
        layer = f", layer {p.layer}" if p.layer is not None else ""
        raise FirFault(
            f"fault in kernel '{p.name}' at node {p.node}{layer}, lane {lane}, pc {op.pc} "
            f"(line {op.loc.line}: {op.text}): {message}", op.loc,
            kernel=p.name, node=p.node, layer=p.layer, lane=lane, pc=op.pc, address=address)

    # -- state for debuggers ---------------------------------------------------
    def snapshot(self) -> "DispatchState":
        return DispatchState(self.pc, self.R.copy(), self.U.copy(), self.mask.copy(),
                             tuple(Frame(f.kind, f.pc, f.saved_mask.copy(),
                                         None if f.remaining is None else f.remaining.copy(),
                                         f.trips) for f in self.stack),
                             self.steps, self.lane_steps)

    def restore(self, s: "DispatchState") -> None:
        self.pc = s.pc
        self.R[...] = s.R
        self.U[...] = s.U
        self.set_mask(s.mask.copy())
        self.stack = [Frame(f.kind, f.pc, f.saved_mask.copy(),
                            None if f.remaining is None else f.remaining.copy(), f.trips)
                      for f in s.stack]
        self.steps = s.steps
        self.lane_steps = s.lane_steps


@dataclass(frozen=True)
class DispatchState:
    pc: int
    R: np.ndarray
    U: np.ndarray
    mask: np.ndarray
    stack: tuple
    steps: int
    lane_steps: int
