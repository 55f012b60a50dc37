"""Suffix replay: a variant that changes weights of layer L runs only the nodes from layer
L's first node on, the rest taken from a run that shares everything before it.

A variant of a base run (all f32, or all q4) that differs only in weights of layer L
computes, at every position, what the base computes before layer L's first node (index
``start``), provided the nodes before ``start`` never read what the nodes from ``start``
on write. What the later nodes need of the earlier ones is the **live-in** set at
``start``: the buffers that nodes before ``start`` write and that nodes from ``start`` on
read before writing them (declared operands; a buffer a node both reads and writes, as an
attention kernel's scores, counts as written there, and the input buffers are written by
every step itself). The base run records the live-in set at every boundary and position
(:class:`Recorder`); a replay writes it back before running the suffix
(:meth:`~firscope.runtime.machine.Machine.step_from`).

That analysis stands on declarations, so each boundary is **verified** on every chunk: the
base run replayed from its own records must give its logits bit for bit, or that
boundary's variants run in full (:func:`verify`). ``quant sensitivity --full`` runs every
variant in full; tests/test_quant.py checks both give the same figures bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..fir.syntax import NodeKind


@dataclass(frozen=True)
class Boundary:
    layer: int
    start: int  # index of the layer's first node
    regions: tuple  # the live-in buffer regions, in order
    size: int  # their elements together


def _buffers(ops) -> list:
    return [o.region for o in ops if o.region is not None and o.weight is None]


SNAPSHOT_BUDGET = 256 << 20  # bytes of live-in records per base run of one chunk


def boundaries(model, steps: int = 1) -> dict[int, Boundary]:
    """Per layer with a node: its first node and the live-in set there. A buffer that a
    node both reads and writes (``x = x + mix``; an attention kernel's scores) is live-in
    when it is read there first, unless recording every such buffer at every boundary for
    ``steps`` positions would take more than :data:`SNAPSHOT_BUDGET`: then it counts as
    written there (verification catches a kernel that really reads it first)."""
    full = _boundaries(model, read_write_reads=True)
    total = sum(b.size for b in full.values()) * 4 * steps
    return full if total <= SNAPSHOT_BUDGET else _boundaries(model, read_write_reads=False)


def _boundaries(model, read_write_reads: bool) -> dict[int, Boundary]:
    firsts: dict[int, int] = {}
    for n in model.nodes:
        if n.layer is not None and n.layer not in firsts:
            firsts[n.layer] = n.index
    inputs = {(r.base, r.size) for r in model.inputs.values()}
    out = {}
    for layer, start in firsts.items():
        written_before = {(r.base, r.size) for n in model.nodes[:start] for r in _buffers(n.outs)}
        live, written_after = {}, set()
        for n in model.nodes[start:]:
            outs = {(r.base, r.size) for r in _buffers(n.outs)}
            for r in _buffers(n.args):
                key = (r.base, r.size)
                if key in inputs or key in written_after or (key in outs
                                                              and not read_write_reads):
                    continue
                if key in written_before:
                    live.setdefault(key, r)
            written_after |= outs
        regions = tuple(live[k] for k in sorted(live))
        out[layer] = Boundary(layer, start, regions, sum(r.size for r in regions))
    return out


class Recorder:
    """Taps that copy the live-in set of each boundary before its first node, per position."""

    def __init__(self, model, bounds: dict[int, Boundary], steps: int):
        self.bounds = bounds
        self.data = {b.layer: np.empty((steps, b.size), np.float32) for b in bounds.values()}
        self._pos = {b.layer: 0 for b in bounds.values()}

    def taps(self) -> dict[int, list]:
        taps: dict[int, list] = {}
        for b in self.bounds.values():
            if b.start == 0:
                continue

            def tap(machine, _node, b=b):
                row = self.data[b.layer][self._pos[b.layer]]
                at = 0
                for r in b.regions:
                    row[at: at + r.size] = machine.arena[r.base: r.base + r.size]
                    at += r.size
                self._pos[b.layer] += 1
            taps.setdefault(b.start - 1, []).append(tap)
        return taps


def replay_logits(model, engine: str, tokens: np.ndarray, first_scored: int, b: Boundary,
                  rows: np.ndarray, bank=None) -> np.ndarray:
    """The logits of ``model`` on the chunk, nodes before ``b.start`` skipped: their live-in
    set written from ``rows`` (one per position) instead."""
    from ..runtime.machine import Hooks, Machine
    if bank is not None:
        m = bank.machine(model, engine)
        m.hooks = Hooks()
    else:
        m = Machine(model, engine=engine)
    out = []
    for j in range(len(tokens) - 1):
        row = rows[j]

        def prepare(machine, row=row):
            at = 0
            for r in b.regions:
                machine.arena[r.base: r.base + r.size] = row[at: at + r.size]
                at += r.size
        res = m.step_from(int(tokens[j]), b.start, prepare)
        if j + 1 >= first_scored:
            out.append(res.logits)
    return np.stack(out)


def first_changed_layer(model, variant) -> int | None:
    """The first layer whose nodes use a weight ``variant`` stores differently from
    ``model`` (None: a node outside the layers does, or none does)."""
    for n, v in zip(model.nodes, variant.nodes):
        if n is v or n.kind != NodeKind.EXT:
            continue
        if any(a.weight is not b.weight for a, b in zip(n.args, v.args)):
            return n.layer
    return None
