"""Several dispatches of one kernel recorded as one: attention in every layer of a step.

A step's attention nodes run the same program on other buffers (each layer's K/V cache,
the shared qkv and scores as they were when that node ran) and branch on their data (the
running maximum of the scores), so their traces differ and each must be recorded
(:func:`.record.data_independent` says why a trace cannot be reused). Recorded one after
the other, each costs a pass of the step interpreter over ~30K instructions at position
31 of GPT-2 small, and the interpreter's time is per instruction, not per lane. Here the
copies run side by side in one wide dispatch: lane ``k * threads + j`` is lane ``j`` of
copy ``k`` (its lane id is ``j``) and its loads and stores go to copy ``k``'s own regions,
on a scratch arena holding each copy's regions as they were when its node ran.

Lanes run in lockstep, with per-lane masks, so copy ``k``'s lanes execute the instructions
of its own dispatch in the same order, under the same masks restricted to its lanes; the
wide dispatch also executes instructions where none of copy ``k``'s lanes is active (a
branch or trip only another copy takes), which its own dispatch would skip.
:func:`split` therefore keeps, of the wide trace, the stretches and memory executions in
which one of copy ``k``'s lanes is active, with its lanes' columns: copy ``k``'s own trace.
Tests compare every count with a recording of each node on its own.

Anything the wide dispatch cannot do as each dispatch would (an access outside its region,
which faults, the budget) raises :class:`Unbatched`; the caller records those nodes one by
one, which reports the fault as a single recording would.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..compare.lanes import program_regions
from ..errors import BudgetExceeded, FirFault
from ..vm.interp import Dispatch
from ..vm.liveness import liveness
from .record import Trace, TraceArrays, _accesses


class Unbatched(Exception):
    """The copies cannot run as one dispatch: record them one by one."""


class _Wide(Dispatch):
    """``copies`` dispatches of ``program`` side by side (see the module docstring):
    ``shifts`` maps each region's base (in ``program``) to the offset, per lane, of the
    copy's own region from it. Every instruction but loads and stores is the step
    interpreter's own handler; those two add the lane's shift to the address."""

    def __init__(self, program, arena: np.ndarray, shifts: dict[int, np.ndarray],
                 copies: int):
        self.shifts = shifts
        super().__init__(replace(program, threads=program.threads * copies), arena)
        self.R[0] = np.tile(np.arange(program.threads, dtype=np.float32), copies)
        for op in self.ops:
            if op.spec.mem is not None:
                self._fns[op.pc] = self._access(op)

    def _access(self, op):
        mem = op.spec.mem
        addr = op.args[mem.address]
        reg, u = self.Rr[op.args[mem.value]], self.Ur[op.args[mem.index]]
        base = addr.base + addr.offset + self.shifts[addr.base]  # per lane
        low, high = -addr.offset, addr.extent - addr.offset  # U's valid range (U >= 0)
        arena, stores = self.arena, op.spec.stores

        def run():
            full = self.full
            lanes = None if full else np.flatnonzero(self.mask)
            idx = u if full else u[lanes]
            if idx.size and ((low > 0 and idx.min() < low) or idx.max() >= high):
                raise Unbatched(f"an access outside {addr.region.name}")
            where = (base if full else base[lanes]) + idx
            if stores:
                arena[where] = reg if full else reg[lanes]
            elif full:
                arena.take(where, out=reg)
            else:
                reg[lanes] = arena[where]
        return run


class Copies:
    """The regions of up to ``n`` nodes running one program, each as it was when its node
    ran, side by side on a scratch arena of at most ``limit`` bytes where more than one
    fits (:meth:`keep` at each node until :attr:`full`, then :meth:`record`)."""

    def __init__(self, program, n: int, limit: int | None = None):
        self.program = program
        self.regions = program_regions(program)
        self.stride = sum(r.size for r in self.regions)
        if limit is not None:
            n = min(n, max(1, limit // max(self.stride * 4, 1)))
        self.capacity = n
        self.scratch = np.zeros(max(self.stride * n, 1), dtype=np.float32)
        self.nodes: list = []

    @property
    def n(self) -> int:
        return len(self.nodes)

    @property
    def full(self) -> bool:
        return len(self.nodes) >= self.capacity

    def keep(self, node, arena: np.ndarray) -> None:
        """Copy ``node``'s regions into the next slot, as they are now: compare/lanes.
        program_regions's order, which the program's own follow too (the caller keeps
        together only nodes whose identity keys and regions' sizes are the same)."""
        at = len(self.nodes) * self.stride
        for r in program_regions(node.program):
            self.scratch[at: at + r.size] = arena[r.base: r.stop]
            at += r.size
        self.nodes.append(node)

    def arena_of(self, k: int, like: np.ndarray) -> np.ndarray:
        """An arena like ``like`` (zeros, given by the system page by page as written) with
        the ``k``th node's regions at their own addresses: for recording it alone."""
        work = np.zeros_like(like)
        at = k * self.stride
        for r in program_regions(self.nodes[k].program):
            work[r.base: r.stop] = self.scratch[at: at + r.size]
            at += r.size
        return work

    def record(self, budget: int | None, stop=None) -> list["SplitTrace"]:
        """Record the program once over every slot's regions and return each node's own
        trace. Raises :class:`Unbatched` where the nodes cannot run as one."""
        threads, shifts, at = self.program.threads, {}, 0
        for r in self.regions:
            per_node = np.arange(self.n, dtype=np.int64) * self.stride + at - r.base
            shifts[r.base] = np.repeat(per_node, threads)
            at += r.size
        d = _Wide(self.program, self.scratch, shifts, self.n)
        trace = Trace(d)
        try:
            d.run(budget, stop, observer=trace)
        except (BudgetExceeded, FirFault) as e:  # named in its lanes' terms by a single run
            raise Unbatched(str(e)) from None
        arrays = trace.arrays()
        traces = [SplitTrace(split(arrays, threads, k)) for k in range(self.n)]
        _share_accesses(self.program, traces)
        lv = trace.liveness(self.program.ops)  # the program's: the same for every node
        for t in traces:
            t._liveness = lv
        return traces


def _share_accesses(program, traces: list["SplitTrace"]) -> None:
    """Give every trace whose memory executions are the first's (the same pcs, active lanes
    and index registers: attention, whose branch on its scores holds no load or store) the
    first's accesses (record._accesses: sectors, first touches, distinct elements), made
    once: the largest part of counting a trace at later positions."""
    first = traces[0].arrays()
    acc = _accesses(program, traces[0], first)
    mem_masks = first.masks[first.mem_key]
    for t in traces[1:]:
        a = t.arrays()
        if (np.array_equal(a.mem_pc, first.mem_pc) and np.array_equal(a.index, first.index)
                and np.array_equal(a.masks[a.mem_key], mem_masks)):
            t.accesses = (a, acc)


def split(arrays: TraceArrays, threads: int, k: int) -> TraceArrays:
    """Copy ``k``'s own trace from the wide one: its lanes' columns of the masks and index
    registers, and the stretches and memory executions in which one of its lanes is
    active."""
    cols = slice(k * threads, (k + 1) * threads)
    masks = arrays.masks[:, cols]
    live = masks.any(axis=1)
    seg = live[arrays.seg_keys]
    mem = live[arrays.mem_key]
    return TraceArrays(arrays.seg_counts[seg], arrays.seg_keys[seg], masks,
                       arrays.mem_pc[mem], arrays.mem_key[mem],
                       np.ascontiguousarray(arrays.index[mem][:, cols]), int(seg.sum()))


class SplitTrace:
    """What :func:`.record.count` reads of a :class:`.record.Trace`, for one copy's part
    of a wide recording."""

    def __init__(self, arrays: TraceArrays):
        self._arrays = arrays
        self.mem_pc = arrays.mem_pc.tolist()
        self.accesses = None  # record._accesses's cache, as on a Trace
        self._liveness = None

    def arrays(self) -> TraceArrays:
        return self._arrays

    def liveness(self, ops):
        if self._liveness is None:
            self._liveness = liveness(ops)
        return self._liveness
