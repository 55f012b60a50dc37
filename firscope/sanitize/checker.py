"""Checking one dispatch as the step interpreter runs it, and collecting what it finds.

:class:`DispatchChecker` is shown every memory instruction of a dispatch just
before it executes (an :class:`~firscope.vm.interp.Observer`'s ``before``),
with the arena addresses and lanes it is about to touch
(:func:`~firscope.vm.handlers.lane_addresses`). It records them in the race
shadow (only the regions the lane analysis could not prove disjoint) and the
init shadow, and returns what is wrong as :class:`Event` records; its
``memcheck`` method is the dispatch's recorder of out-of-bounds accesses,
which the interpreter then skips. The same checker serves ``firscope
sanitize`` and the debugger's ``break race`` / ``break uninit``.

:class:`Collector` deduplicates events into findings (by their key), counting
repeats, and builds the frozen :class:`~firscope.sanitize.findings.Finding`
list at the end.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..vm.handlers import lane_addresses
from .findings import Finding, Hazard, Site, Tool
from .shadow import InitShadow, RaceShadow


def site(program, pc: int, lane: int | None, access: str) -> Site:
    """Where instruction ``pc`` of ``program`` is, with the caret on its address operand."""
    op = program.ops[pc]
    col = op.loc.col
    mem = op.spec.mem
    static = program.kernel.ops[pc] if pc < len(program.kernel.ops) else None
    if mem is not None and static is not None:
        ref = static.operands[mem.address]
        if getattr(ref, "loc", None) is not None and ref.loc.line == op.loc.line:
            col = ref.loc.col
    return Site(op.loc.path, op.loc.line, col, op.loc.text or op.text, lane, access)


@dataclass(frozen=True)
class Event:
    """One problem at one instruction, before deduplication."""

    key: tuple
    count: int  # accesses it stands for
    lane: int  # the lane to look at (the second lane of a race)
    finding: Finding


_EARLIER = {Hazard.RAW: "write", Hazard.WAR: "read", Hazard.WAW: "write"}


class DispatchChecker:
    """Race and init checks for one dispatch of ``node`` at decode step ``step``."""

    def __init__(self, node, step: int, *, race: RaceShadow | None = None,
                 race_bases: frozenset[int] = frozenset(), init: InitShadow | None = None):
        self.node = node
        self.program = node.program
        self.step = step
        self.init = init
        self.race = race if race_bases else None
        if self.race is not None:
            regions = {}
            for op in self.program.ops:
                if op.spec.mem is not None:
                    r = op.args[op.spec.mem.address].region
                    if r.base in race_bases:
                        regions[r.base] = r
            self.race.begin(list(regions.values()))
        self.out_of_bounds: list[Event] = []
        # Per pc: whether check() has anything to do there. A load from a region already
        # fully written cannot read anything uninitialized (nothing unwrites), so only the
        # races can make it interesting.
        self.wanted = [self._wanted(op) for op in self.program.ops]

    def _wanted(self, op) -> bool:
        mem = op.spec.mem
        if mem is None:
            return False
        region = op.args[mem.address].region
        if self.race is not None and self.race.tracks(region):
            return True
        return self.init is not None and (mem.stores or not self.init.full(region))

    def check(self, d, op) -> list[Event]:
        """What the memory instruction ``op`` is about to do wrong (it has not run yet)."""
        if not self.wanted[op.pc]:
            return []
        mem = op.spec.mem
        region = op.args[mem.address].region
        race = self.race is not None and self.race.tracks(region)
        addresses, lanes = lane_addresses(d, op)
        events: list[Event] = []
        if race:
            for hazard in self.race.access(region, addresses, lanes, op.pc, mem.stores):
                events.append(self._race_event(op, region, *hazard))
        if self.init is not None:
            if mem.stores:
                self.init.mark(addresses)
            else:
                bad = self.init.unwritten(addresses)
                if bad.any():
                    i = int(np.flatnonzero(bad)[0])
                    events.append(self._event(Tool.INIT, "uninitialized read", op, region,
                                              int(addresses[i]), (site(self.program, op.pc,
                                              int(lanes[i]), "read"),), int(bad.sum())))
        return events

    def memcheck(self, d, op, addr, indices, lanes) -> None:
        """The dispatch's out-of-bounds recorder: the interpreter skips these accesses."""
        access = "write" if op.spec.stores else "read"
        kind = "out-of-bounds store" if op.spec.stores else "out-of-bounds load"
        self.out_of_bounds.append(self._event(
            Tool.MEM, kind, op, addr.region, addr.base + int(indices[0]),
            (site(self.program, op.pc, int(lanes[0]), access),), int(indices.size)))

    # -- building events ---------------------------------------------------------------
    def _race_event(self, op, region, kind: Hazard, other: int, other_pc: int, lane: int,
                    address: int, count: int) -> Event:
        first = site(self.program, other_pc, other, _EARLIER[kind])
        second = site(self.program, op.pc, lane, "write" if op.spec.stores else "read")
        return self._event(Tool.RACE, kind.value, op, region, address, (first, second), count)

    def _event(self, tool: Tool, kind: str, op, region, address: int, sites: tuple,
               count: int) -> Event:
        node = self.node
        f = Finding(tool, kind, self.program.name, node.full_name, node.index, self.step,
                    sites, region.name, address - region.base, region.size, count)
        return Event(f.key, count, sites[-1].lane, f)


class Collector:
    """Events of a whole run, one finding per key; repeats raise its counts."""

    def __init__(self):
        self._first: dict[tuple, Finding] = {}
        self._count: dict[tuple, int] = {}
        self._nodes: dict[tuple, set] = {}
        self._where: dict[tuple, set] = {}
        self._confirmed: dict[tuple, str] = {}

    def __len__(self) -> int:
        return len(self._first)

    def __contains__(self, key: tuple) -> bool:
        return key in self._first

    def add(self, event: Event, dispatch: int) -> bool:
        """Record ``event`` seen in dispatch number ``dispatch``; True if its key is new."""
        new = event.key not in self._first
        if new:
            self._first[event.key] = event.finding
            self._count[event.key] = 0
            self._nodes[event.key] = set()
            self._where[event.key] = set()
        self._count[event.key] += event.count
        self._nodes[event.key].add(dispatch)
        self._where[event.key].add(event.finding.node_index)
        return new

    def confirm(self, key: tuple, text: str) -> None:
        self._confirmed[key] = text

    def findings(self) -> list[Finding]:
        """Every finding, in the order the run met them."""
        return [replace(f, count=self._count[k], nodes=len(self._nodes[k]),
                        confirmed=self._confirmed.get(k, f.confirmed),
                        node_indices=tuple(sorted(self._where[k])))
                for k, f in self._first.items()]
