"""``history BUF[i]``: every write to one element in the recorded history (RenderDoc's
pixel history), oldest first.

The undo log already holds, per node, the old value of every element that
changed; the new value of a write is the old value of the next one (or the
element's value now). For a micro node the writing instruction and lane are
found by replaying that node alone: the values of every region the kernel
touches are rebuilt as they were when it started (the arena now, with the
undo log's newer changes undone), copied into a small scratch arena, and the
kernel is re-run there on the interpreter with a store observer. Bounded by
the same memory budget as the undo log: when older records were dropped, the
answer says the history is truncated.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..compare.lanes import program_regions, relocate, scratch_arena
from ..vm.interp import Dispatch, StoreObserver
from .history import RecordKind
from .info import fmt_scalar
from ..runtime import NodeKind

MAX_WRITES_PER_NODE = 64  # writes listed from one dispatch (a reduction can write many times)


@dataclass(frozen=True)
class Write:
    step: int
    node_index: int
    node: str  # "attention@1", or "set" for a patch, "token" for the input buffers
    old: float
    new: float
    line: int | None = None  # the kernel line that stored (micro nodes)
    lane: int | None = None
    text: str = ""  # that instruction

    def describe(self) -> str:
        where = f"token {self.step}  {self.node}"
        if self.line is not None:
            where += f" (line {self.line}: {self.text}, lane {self.lane})"
        return f"{where}   {fmt_scalar(float(self.old))} -> {fmt_scalar(float(self.new))}"


def element_history(session, address: int) -> tuple[list[Write], bool]:
    """Writes to the arena element ``address``, oldest first, and whether older history
    was dropped."""
    records = list(session.history.records)
    hits = []  # (record index, old value)
    for i, rec in enumerate(records):
        for c in rec.changes:
            pos = np.flatnonzero(c.base + c.index == address)
            if pos.size:
                hits.append((i, float(c.old[pos[0]])))
                break
    out: list[Write] = []
    for h, (i, old) in enumerate(hits):
        new = hits[h + 1][1] if h + 1 < len(hits) else _value_after(session, records, i,
                                                                    address)
        rec = records[i]
        out.extend(_describe_record(session, records, i, rec, address, old, new))
    return out, session.history.truncated


def _value_after(session, records, i, address) -> float:
    """The element's value right after record i, when no later record changed it."""
    before = session.node_before or []
    for a, data in before:  # a live dispatch may have written it since: its start value
        if a <= address < a + data.size:
            return float(data[address - a])
    return float(session.arena[address])


def _describe_record(session, records, i, rec, address, old, new) -> list[Write]:
    if rec.kind is RecordKind.PATCH:
        return [Write(rec.step, rec.node, "set", old, new)]
    if rec.kind is not RecordKind.NODE:
        return [Write(rec.step, rec.node, "token", old, new)]
    node = session.nodes[rec.node]
    if node.kind != NodeKind.MICRO:
        return [Write(rec.step, rec.node, node.full_name, old, new)]
    found = _replay_writes(session, records, i, node, address)
    if not found:
        return [Write(rec.step, rec.node, node.full_name, old, new)]
    return [Write(rec.step, rec.node, node.full_name, o, n, op.loc.line, lane, op.text)
            for op, lane, o, n in found]


def _start_values(session, records, i, regions) -> dict[int, np.ndarray]:
    """Each region's values when record i's node started."""
    arena = session.arena
    vals = {r.base: arena[r.base: r.base + r.size].copy() for r in regions}

    def undo(base, index, old):
        addr = base + index
        for r in regions:
            inside = (addr >= r.base) & (addr < r.base + r.size)
            if inside.any():
                vals[r.base][addr[inside] - r.base] = old[inside]

    for a, data in (session.node_before or []):  # a live dispatch: back to its start
        undo(a, np.arange(data.size), data)
    for rec in reversed(records[i:]):
        for c in reversed(rec.changes):
            undo(c.base, c.index, c.old)
    return vals


def _replay_writes(session, records, i, node, address):
    program = node.program
    regions = program_regions(program)
    target_region = next((r for r in regions if r.base <= address < r.base + r.size), None)
    if target_region is None:
        return []
    layout, scratch = scratch_arena(regions, _start_values(session, records, i, regions))
    moved = relocate(program, layout)
    target = layout[target_region.base] + (address - target_region.base)
    found = []

    def store(d, where, values):
        where = np.asarray(where).reshape(-1)
        hit = np.flatnonzero(where == target)
        if hit.size and len(found) < MAX_WRITES_PER_NODE:
            lanes = np.arange(d.lanes) if d.full else np.flatnonzero(d.mask)
            k = int(hit[-1])
            op = d.ops[d.pc]
            new = float(np.asarray(values).reshape(-1)[k])
            found.append((op, int(lanes[k]), float(scratch[target]), new))

    d = Dispatch(moved, scratch)
    try:
        d.run(session.machine.budget, observer=StoreObserver(store))
    except Exception:  # a fault or budget in the replay: report what was found until then
        pass
    return [w for w in found if w[2] != w[3] or len(found) == 1]
