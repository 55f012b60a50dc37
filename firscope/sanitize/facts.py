"""What the lane analysis proves about a kernel before it runs, so the sanitizer can skip it.

For each bound program (one node's kernel), :func:`facts_of` runs the affine
lane analysis of vm/lanes once and keeps:

* per written region, whether lanes provably never share an element of it
  (:func:`~firscope.vm.lanes.disjoint_regions`; '' = proven, else why not).
  Only the unproven regions are tracked by racecheck at run time;
* whether every load and store it can reach is proven inside its region
  (then memcheck has nothing to look at);
* which regions its loads read and its stores write (initcheck needs a
  dispatch instrumented only while one of them is not yet fully written).

A kernel the analysis cannot walk (the compiled engine's size limits) gets
no proof: everything about it is checked at run time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from ..model import Region
from ..vm.compiled import MAX_COMPILED_NESTING, MAX_COMPILED_OPS
from ..vm.lanes import analyse, disjoint_regions


@dataclass(frozen=True)
class KernelFacts:
    races: Mapping[int, str]  # written region base -> '' (lanes provably disjoint) or why not
    memory_proven: bool  # every reachable access is inside its region in every lane
    loads: tuple[Region, ...]  # regions a load may read
    stores: tuple[Region, ...]  # regions a store may write
    names: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))
    not_analysed: str = ""  # why the analysis did not run ('' when it did)

    @property
    def race_free(self) -> bool:
        return not any(self.races.values())  # one lane (threads <= 1) never races

    @property
    def race_regions(self) -> frozenset[int]:
        """Bases of the written regions racecheck must track at run time."""
        return frozenset(b for b, why in self.races.items() if why)

    def race_reason(self) -> str:
        """Why the kernel is checked dynamically ('' when it is proven race-free)."""
        return "; ".join(dict.fromkeys(why for why in self.races.values() if why))


def _regions(program, stores: bool) -> tuple[Region, ...]:
    seen: dict[int, Region] = {}
    for op in program.ops:
        mem = op.spec.mem
        if mem is not None and mem.stores == stores:
            r = op.args[mem.address].region
            seen.setdefault(r.base, r)
    return tuple(seen.values())


def too_big(program) -> str:
    """Why the analysis would take too long on this kernel (a hostile file's), or ''."""
    if len(program.ops) > MAX_COMPILED_OPS:
        return f"not analysed: {len(program.ops)} instructions (more than {MAX_COMPILED_OPS})"
    depth = max((op.depth for op in program.ops), default=0)
    if depth > MAX_COMPILED_NESTING:
        return f"not analysed: blocks nested {depth} deep (more than {MAX_COMPILED_NESTING})"
    return ""


def facts_of(program) -> KernelFacts:
    loads, stores = _regions(program, False), _regions(program, True)
    names = MappingProxyType({r.base: r.name for r in loads + stores})
    why = too_big(program)
    if why:
        races = {r.base: why for r in stores} if program.threads > 1 else {}
        return KernelFacts(MappingProxyType(races), False, loads, stores, names, why)
    an = analyse(program)
    races = disjoint_regions(program, an)
    mem_pcs = [op.pc for op in program.ops if op.spec.mem is not None]
    memory = all(an.proved.get(pc, False) for pc in mem_pcs if pc in an.reached)
    return KernelFacts(MappingProxyType(races), memory, loads, stores, names)
