"""What a stop reports: its reason, the true location, and a frozen picture of the state.

The engine (:class:`~firscope.debug.session.Session`) returns a :class:`Stop`
from every movement. A front end (batch mode, the UI, the DAP server) turns
it into a :class:`Snapshot` with :func:`capture`: a frozen copy of everything
a view shows at that stop (the focused lane's registers and what changed
since the previous stop, one register across lanes, the mask, loop/if
frames, node times, line counts). Views render a Snapshot and never read the
live session, so a run in a worker thread cannot change what is on screen.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import numpy as np

from ..vm.isa import NREGS


class StopReason(enum.StrEnum):
    """Why a movement ended; the same words in batch output, the UI and DAP."""

    ENTRY = "entry"  # the session's first stop, before anything ran
    STEP = "step"  # the movement did what it was asked
    BREAKPOINT = "breakpoint"
    WATCHPOINT = "watchpoint"
    NAN = "nan"  # break nan: a NaN or Inf was written
    FAULT = "fault"  # a kernel faulted (out of bounds, bad rtou, bad loop count)
    BUDGET = "budget"  # a kernel ran past its instruction budget
    FINISHED = "finished"  # generation is over
    INTERRUPTED = "interrupted"  # escape / ctrl+c / a DAP pause
    HISTORY = "history"  # reverse execution reached the start of the recorded history

    @property
    def is_error(self) -> bool:
        return self in (StopReason.FAULT, StopReason.BUDGET)

    @property
    def wants_attention(self) -> bool:
        """Something to look at: a UI drops the keys typed ahead of it."""
        return self not in (StopReason.STEP, StopReason.ENTRY)

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    StopReason.ENTRY: "stopped", StopReason.STEP: "stopped",
    StopReason.BREAKPOINT: "stopped: breakpoint", StopReason.WATCHPOINT: "stopped: watchpoint",
    StopReason.NAN: "stopped: NaN/Inf written", StopReason.FAULT: "fault",
    StopReason.BUDGET: "budget exhausted", StopReason.FINISHED: "finished",
    StopReason.INTERRUPTED: "interrupted", StopReason.HISTORY: "no more history",
}


@dataclass(frozen=True)
class Location:
    """Where the session is: between nodes (``in_kernel`` False) or inside a dispatch."""

    step: int  # decode step = index into the token sequence
    token: int | None  # token fed at this step
    position: int
    node_index: int | None  # the node about to run (or running); None at the end
    node: str | None  # its full name
    kernel: str | None
    pc: int | None  # inside a kernel: next instruction
    line: int | None  # its .fir line
    in_kernel: bool

    def short(self) -> str:
        """``attention@1, line 156`` / ``before attention@1`` / ``end``."""
        if self.node is None:
            return "end"
        if self.in_kernel and self.line is not None:
            return f"{self.node}, line {self.line}"
        return f"before {self.node}"


@dataclass(frozen=True)
class Stop:
    """What a movement returns."""

    reason: StopReason
    message: str
    location: Location
    breakpoint: int | None = None
    old: np.ndarray | None = None  # a watchpoint's range before and after the write
    new: np.ndarray | None = None
    lane: int | None = None  # the lane to focus, when the stop names one (a fault's lane)


@dataclass(frozen=True)
class FrameView:
    kind: str  # "for" or "if"
    pc: int
    line: int
    trips: int  # iterations started (loops)
    remaining: int | None  # the focused lane's iterations left, counting the current one


@dataclass(frozen=True)
class LaneRegisters:
    """One lane's register files at a stop, and which registers changed since the last."""

    lane: int
    lanes: int
    active: bool
    R: np.ndarray  # f32 [32]
    U: np.ndarray  # uint32 [32]
    changed: frozenset  # {("R", 3), ("U", 4)}


@dataclass(frozen=True)
class AcrossLanes:
    """One register over every lane of the dispatch, with the mask."""

    file: str  # "R" or "U"
    reg: int
    values: np.ndarray
    changed: np.ndarray  # bool per lane
    mask: np.ndarray


@dataclass(frozen=True)
class DisplayValue:
    """One ``display`` expression's value at a stop, and whether it changed since the last."""

    number: int
    expr: str
    text: str  # the value as shown, or the error
    changed: bool
    error: bool = False


def token_of(step: int, total_steps: int) -> str:
    """The one numbering of decode steps, for every surface (header, ``where``, diff,
    ``info diff``, the Diff tab, ``goto NODE token N``, ``break token N``, DAP frames):
    0-based, ``token S`` feeds the token at position S, as the dump format numbers steps.
    ``token 2 of 0..11``: the step and the range a run covers."""
    return f"token {step} of {token_range(total_steps)}"


def token_range(total_steps: int) -> str:
    """The tokens a run covers, in :func:`token_of`'s numbering: ``0..11``."""
    return f"0..{max(total_steps - 1, 0)}"


@dataclass(frozen=True)
class Snapshot:
    stop: Stop
    description: str  # the stop description, as batch mode prints it
    step: int
    total_steps: int
    finished: bool
    sequence: tuple[int, ...]
    lane: LaneRegisters | None  # inside a dispatch
    across: AcrossLanes | None
    frames: tuple[FrameView, ...]
    node_lanes: int | None  # lanes of the current (or next) micro node
    line_counts: np.ndarray | None  # the current kernel's per-pc counts
    node_times: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}))
    dispatch_key: tuple[int, int] | None = None  # (step, node index) of the live dispatch
    all_R: np.ndarray | None = field(default=None, repr=False)  # every lane's registers
    all_U: np.ndarray | None = field(default=None, repr=False)
    displays: tuple[DisplayValue, ...] = ()

    @property
    def location(self) -> Location:
        return self.stop.location

    @property
    def reason(self) -> StopReason:
        return self.stop.reason


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


def capture(session, stop: Stop, description: str, *, lane: int = 0,
            register: tuple[str, int] = ("R", 0), previous: Snapshot | None = None,
            displays: tuple[DisplayValue, ...] = ()) -> Snapshot:
    """Freeze what the views show at this stop.

    Changed marks compare with ``previous`` when it was taken in the same
    dispatch, else with the dispatch's initial registers (R0 = lane id, all
    else 0), so the first stop inside a kernel marks what it already wrote.
    """
    d = session.dispatch
    lane_view = across = None
    frames: tuple[FrameView, ...] = ()
    key = None
    all_R = all_U = None
    if d is not None:
        key = (session.step, session.node_index)
        same = previous is not None and previous.dispatch_key == key and previous.all_R is not None
        if same:
            base_R, base_U = previous.all_R, previous.all_U
        else:  # the dispatch's initial registers: R0 = lane id, all else 0
            base_R = np.zeros((NREGS, d.lanes), dtype=np.float32)
            if d.lanes:
                base_R[0] = np.arange(d.lanes, dtype=np.float32)
            base_U = np.zeros((NREGS, d.lanes), dtype=np.uint32)
        all_R, all_U = _frozen(d.R), _frozen(d.U)
        if 0 <= lane < d.lanes:
            changed = {("R", int(i)) for i in np.flatnonzero(
                base_R[:, lane].view(np.uint32) != all_R[:, lane].view(np.uint32))}
            changed |= {("U", int(i)) for i in np.flatnonzero(base_U[:, lane] != all_U[:, lane])}
            lane_view = LaneRegisters(lane, d.lanes, bool(d.mask[lane]), all_R[:, lane],
                                      all_U[:, lane], frozenset(changed))
        file, reg = register
        cur, base = (all_R, base_R) if file == "R" else (all_U, base_U)
        lane_changed = base[reg].view(np.uint32) != cur[reg].view(np.uint32)
        across = AcrossLanes(file, reg, cur[reg], _frozen(lane_changed), _frozen(d.mask))
        frames = tuple(_frame_view(d, f, lane) for f in d.stack)
    counts = None
    node = session.node
    if d is not None:
        counts = d.line_counts
    elif node is not None and node.program is not None:
        counts = session.line_counts.get(node.target)
    return Snapshot(
        stop=stop, description=description, step=session.step,
        total_steps=session.total_steps, finished=session.finished,
        sequence=tuple(session.sequence), lane=lane_view, across=across, frames=frames,
        node_lanes=session.lanes(), line_counts=None if counts is None else _frozen(counts),
        node_times=MappingProxyType(dict(session.node_times)), dispatch_key=key,
        all_R=all_R, all_U=all_U, displays=displays)


def _frame_view(d, f, lane: int) -> FrameView:
    remaining = None
    rem = f.remaining
    if rem is not None and 0 <= lane < rem.size:
        remaining = int(rem[lane])
    return FrameView(str(f.kind), f.pc, d.ops[f.pc].loc.line, f.trips, remaining)
