"""Which lane of a micro-kernel wrote an element: replay the dispatch and watch its stores.

A compiled dispatch leaves no trace of who stored what, so the node is run
again on the step interpreter, alone, on a small scratch arena holding every
region the kernel touches as it was when the node started (the caller
supplies those start values). A store hook notes, for each element asked
about, the lane and instruction of the last store to it: the one whose value
the node left there. An element no lane stored to was not written by this
dispatch (it keeps an earlier value).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping

import numpy as np

from ..errors import FirError
from ..model.layout import Region
from ..vm.assembler import Address, Program
from ..vm.interp import Dispatch, StoreObserver


@dataclass(frozen=True)
class Writer:
    """The last store to an element in one dispatch."""

    lane: int
    pc: int
    line: int  # the .fir line of the store instruction


def program_regions(program: Program) -> list[Region]:
    """Every arena region the kernel can read or write (its operands and ``@NAME``s)."""
    seen: dict[int, Region] = {}
    for _, r in program.operands:
        seen[r.base] = r
    for op in program.ops:
        for a in op.args:
            if isinstance(a, Address):
                seen[a.region.base] = a.region
    return list(seen.values())


def relocate(program: Program, layout: Mapping[int, int]) -> Program:
    """The same program on a scratch arena where region ``base`` starts at ``layout[base]``."""
    def move(a):
        if isinstance(a, Address):
            return replace(a, region=replace(a.region, base=layout[a.region.base]))
        return a
    ops = tuple(replace(op, args=tuple(move(a) for a in op.args)) for op in program.ops)
    operands = tuple((n, replace(r, base=layout[r.base])) for n, r in program.operands)
    return replace(program, ops=ops, operands=operands)


def scratch_arena(regions: list[Region], start: Mapping[int, np.ndarray]
                  ) -> tuple[dict[int, int], np.ndarray]:
    """The regions packed one after another into a small arena of their start values:
    (arena base -> scratch base, the scratch arena)."""
    layout, offset = {}, 0
    for r in regions:
        layout[r.base] = offset
        offset += r.size
    scratch = np.zeros(max(offset, 1), dtype=np.float32)
    for r in regions:
        scratch[layout[r.base]: layout[r.base] + r.size] = start[r.base]
    return layout, scratch


def start_values(program: Program, arena: np.ndarray) -> dict[int, np.ndarray]:
    """Copies of the kernel's regions as they are in ``arena`` now (call before the node)."""
    return {r.base: arena[r.base: r.stop].copy() for r in program_regions(program)}


def writers(program: Program, start: Mapping[int, np.ndarray], addresses: Iterable[int],
            budget: int | None = None) -> dict[int, Writer | None]:
    """For each arena address, the lane that stored the node's final value there, or None.

    ``start`` maps each region's arena base to its values when the node
    started (see :func:`start_values`). A fault or the budget in the replay
    ends it: what was found until then is returned.
    """
    regions = program_regions(program)
    layout, scratch = scratch_arena(regions, start)
    wanted: dict[int, int] = {}  # scratch address -> arena address
    for address in addresses:
        r = next((r for r in regions if r.base <= address < r.stop), None)
        if r is not None:
            wanted[layout[r.base] + address - r.base] = int(address)
    found: dict[int, Writer | None] = {int(a): None for a in addresses}
    if not wanted:
        return found
    targets = np.fromiter(wanted, dtype=np.int64)

    def store(d, where, values):
        where = np.asarray(where).reshape(-1)
        hit = np.flatnonzero(np.isin(where, targets))
        if hit.size:
            lanes = np.arange(d.lanes) if d.full else np.flatnonzero(d.mask)
            op = d.ops[d.pc]
            for k in hit:
                found[wanted[int(where[k])]] = Writer(int(lanes[k]), op.pc, op.loc.line)

    d = Dispatch(relocate(program, layout), scratch)
    try:
        d.run(budget, observer=StoreObserver(store))
    except FirError:  # the reference run did not fault here; a replay that does says little
        pass
    return found
