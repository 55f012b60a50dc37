"""A compiled kernel's plan: what the runner (vm/compiled) decided for one node once, and
keeps between dispatches: its generated code and compiled drivers, the regions it may
write and how a dispatch is undone (a journal of stores, or a copy of the regions),
its proofs (vm/proofs), and the timings that decide whether its lanes spread over
threads."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .assembler import Program
from .codegen import Generated, bound_ops
from .kernel_cache import compiled_driver
from .proofs import PlainProofs

# A kernel's store journal starts with room for one store per store instruction and lane
# (at least JOURNAL_START entries) and grows by JOURNAL_GROWTH when a dispatch fills it;
# it never gets larger than the regions the kernel can write (a copy of those is then
# cheaper, and is what the runner takes instead, from the start for kernels that store
# into every element they can write).
JOURNAL_START = 4096
JOURNAL_GROWTH = 8
COPY_WRITTEN = -1  # KernelPlan.journal: copy the written regions instead of journaling

@dataclass
class KernelPlan:
    program: Program
    gen: Generated | None  # None: runs on the interpreter
    why: str = ""
    bases: np.ndarray | None = None
    slicing: dict = field(default_factory=dict)
    need: int = 0  # arena elements the kernel's regions span
    written: tuple[tuple[int, int], ...] = ()  # (start, stop) of every region it may store to
    journal: int = 0  # journal entries for one dispatch, or COPY_WRITTEN
    # Instructions a lane executes at most when no lane can fault (None: one may), so that
    # a dispatch under a budget of at least this many cannot stop early: nothing to undo.
    infallible: int | None = None
    # For a kernel whose proof depends on values it reads (see PlainProofs): the arena
    # addresses of those reads, and the proofs.
    reads: tuple[int, ...] = ()
    proofs: PlainProofs | None = None
    saved: np.ndarray | None = field(default=None, repr=False)  # the copy, in COPY_WRITTEN
    drivers: dict = field(default_factory=dict, repr=False)  # name -> compiled driver
    work: float = 0.0  # seconds the last dispatch's lanes took together (see _ranges)
    # One thread's work below which no split is tried again: twice the work of the last
    # split that did not pay for itself (see CompiledRunner.run).
    retry_split_at: float = 0.0
    alone: float = 0.0  # seconds the last dispatch on one thread took
    dispatched: bool = False  # whether the compiled code has run once (see run)
    one_range: list = field(default_factory=list, repr=False)  # [(0, threads)]
    sf: np.ndarray | None = field(default=None, repr=False)  # run_plain's scratch
    si: np.ndarray | None = field(default=None, repr=False)

    def scratch(self, parts: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """run_plain's scratch (sf, si) for ``parts`` ranges of lanes run at once, each range
        its own Generated.scratch elements and vm/sink's per lane of the kernel (at least
        one element each), made once and grown when more ranges run."""
        g, lanes = self.gen, self.program.threads
        nf = max(g.scratch + lanes * g.sink_r, 1) * parts
        ni = max(lanes * g.sink_i, 1) * parts
        if self.sf is None or self.sf.size < nf or self.si.size < ni:
            self.sf = np.zeros(nf, dtype=np.float32)
            self.si = np.zeros(ni, dtype=np.int64)
        return self.sf[:nf], self.si[:ni]

    def plain_args(self, arena: np.ndarray, lanes: int | None = None, parts: int = 0) -> tuple:
        """run_plain's arguments on ``arena`` for lanes 0..``lanes`` (None: all of the
        kernel's), with its scratch; with ``parts``, run_par's (that many ranges at once)."""
        g = self.gen
        n = self.program.threads if lanes is None else lanes
        args = (arena, self.bases, g.kf, g.ki, 0, n, *self.scratch(max(parts, 1)))
        return args + (parts,) if parts else args

    @property
    def written_size(self) -> int:
        return sum(b - a for a, b in self.written)

    def save_written(self, arena: np.ndarray) -> None:
        """Copy the regions a store can touch (COPY_WRITTEN plans), before the lanes run."""
        if self.saved is None:
            self.saved = np.empty(self.written_size, dtype=np.float32)
        k = 0
        for a, b in self.written:
            self.saved[k: k + b - a] = arena[a:b]
            k += b - a

    def driver(self, name: str) -> Callable:
        fn = self.drivers.get(name)
        if fn is None:
            fn = self.drivers[name] = compiled_driver(self.gen, name)
        return fn


def journal_plan(program: Program) -> tuple[tuple[tuple[int, int], ...], int]:
    """(the regions a store can touch, journal entries or COPY_WRITTEN). A kernel that
    stores at least once per element it can write (g2.add, gelu: one store per lane)
    copies the regions: a block copy costs less than journaling every store."""
    written = tuple((r.base, r.base + r.size) for r in program.written_regions())
    size = sum(b - a for a, b in written)
    stores = program.threads * sum(op.spec.stores for op in program.ops)
    if size <= stores:
        return written, COPY_WRITTEN
    return written, min(size, max(JOURNAL_START, stores))


def lane_key(program) -> tuple[tuple, tuple[int, ...]] | None:
    """(key, bases): two programs with equal keys get the same lane analysis but for region
    bases (GPT-2's layers: one kernel on each layer's buffers), so what
    :func:`.lanes.lane_partition`, :func:`.lanes.infallible_steps` and
    :func:`.lanes.uniform_reads` say of one holds for the other with each region's base
    replaced (``bases``: the base of each region in order of first use; the ops as
    codegen.bound_ops gives them, as generation_key does).

    The analysis reads bases only to key the slicing, to form a uniform read's address, and
    to see whether that address lies in a written region; with regions of the same sizes
    and pairwise disjoint, an in-bounds address (an address's extent is its region's size)
    lies in a written region exactly when its own is written, whatever the bases. None
    where regions overlap."""
    ops, _, regions = bound_ops(program)
    spans = sorted((r.base, r.base + r.size) for r in regions)
    if any(b[0] < a[1] for a, b in zip(spans, spans[1:])):
        return None
    key = (program.threads, ops, tuple(r.size for r in regions))
    return key, tuple(r.base for r in regions)
