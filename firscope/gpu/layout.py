"""Where the arena lives on the GPU: in pages no larger than one storage binding, with
tables too large for one binding split by rows.

WebGPU caps a storage binding (``maxStorageBufferBindingSize``: 128 MiB by default,
and lavapipe's own maximum) below what a real model's arena needs (GPT-2 small:
223 MiB, of which the token embedding alone is 147 MiB). So the host arena, a
flat array of regions, is laid out on the GPU as:

* **pages**: runs of consecutive regions, each run at most ``page_cap`` bytes, one
  GPU buffer each; a region never straddles two pages. A micro kernel binds each
  page its regions lie in as a window of its own (vm/wgsl's ``place``), so a node
  whose regions lie in two pages binds two buffers; every shader addresses a
  region by its page-local base.
* **tables**: a region larger than ``table_cap`` that only fir.embedding (its
  table) and fir.linear_t (its row-major weight) read, split into chunks of whole
  rows, one GPU buffer each; those ops run one dispatch per chunk.

Any other region over the cap (a micro kernel's buffer, fir.linear's ``[in, out]``
weight) cannot be split: :class:`ArenaLayout` refuses it in one line that says
how large it is, what uses it, and the adapter's limit.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..runtime import Model, NodeKind
from .device import GpuError

MIB = 1 << 20
# (op, argument index): the uses of a region that read it as whole rows of a table
_ROW_READS = {("fir.embedding", 1), ("fir.linear_t", 1)}


@dataclass(frozen=True)
class Page:
    lo: int  # host arena elements [lo, hi)
    hi: int


@dataclass(frozen=True)
class Chunk:
    row_lo: int  # the table's rows [row_lo, row_lo + rows)
    rows: int
    lo: int  # host arena elements [lo, hi)
    hi: int


@dataclass(frozen=True)
class Table:
    name: str
    cols: int
    chunks: tuple[Chunk, ...]


def region_uses(model: Model) -> dict[str, list[str]]:
    """Each arena region's uses, by name: ``op:argument`` for an ext op's argument, the
    kernel's name for a micro node, ``op:out`` for an ext op's output."""
    uses: dict[str, list[str]] = {}
    for node in model.nodes:
        if node.kind == NodeKind.MICRO:
            for _, region in node.program.operands:
                uses.setdefault(region.name, []).append(f"kernel {node.target}")
            continue
        for i, a in enumerate(node.args):
            if a.region is not None:
                uses.setdefault(a.region.name, []).append(f"{node.target}:{i}")
        for o in node.outs:
            if o.region is not None:
                uses.setdefault(o.region.name, []).append(f"{node.target}:out")
    return uses


def _row_read(use: str) -> bool:
    op, _, arg = use.partition(":")
    return arg.isdigit() and (op, int(arg)) in _ROW_READS


class ArenaLayout:
    """Pages and tables for one model under one adapter's caps (bytes)."""

    def __init__(self, model: Model, page_cap: int, table_cap: int | None = None,
                 adapter: str = "the adapter"):
        self.page_cap = max(page_cap // 4, 1)  # elements
        self.table_cap = max((table_cap or page_cap) // 4, 1)
        uses = region_uses(model)
        self.pages: list[Page] = []
        self.tables: dict[str, Table] = {}
        self._page_of: dict[str, int] = {}
        lo = hi = None
        for r in sorted(model.regions.values(), key=lambda r: r.base):
            mine = uses.get(r.name, [])
            if r.size > self.table_cap and mine and all(_row_read(u) for u in mine):
                self.tables[r.name] = self._table(model, r)
                continue
            if r.size > self.page_cap:
                raise GpuError(
                    f"the arena of {model.path.name}: {r.name} ({_size(r.size * 4)}) is over "
                    f"the adapter's limit of {_size(self.page_cap * 4)} per storage buffer "
                    f"({adapter}), and {_what_uses(mine)} reads it whole (only a table that "
                    "fir.embedding or fir.linear_t reads is split across buffers): use a GPU "
                    "with larger buffers, or a smaller model")
            if lo is None or r.base + r.size - lo > self.page_cap:
                if lo is not None:
                    self.pages.append(Page(lo, hi))
                lo = r.base
            hi = r.base + r.size
            self._page_of[r.name] = len(self.pages)
        if lo is not None:
            self.pages.append(Page(lo, hi))

    def _table(self, model: Model, region) -> Table:
        shapes = [a.weight.shape for n in model.nodes if n.kind != NodeKind.MICRO
                  for a in n.args if a.region is not None and a.region.name == region.name
                  and a.weight is not None]
        cols = int(shapes[0][-1]) if shapes else region.size
        per = max(self.table_cap // cols, 1)
        rows = region.size // cols
        chunks = tuple(Chunk(r0, min(per, rows - r0), region.base + r0 * cols,
                             region.base + min(r0 + per, rows) * cols)
                       for r0 in range(0, rows, per))
        return Table(region.name, cols, chunks)

    def place(self, region) -> tuple[int, int]:
        """(page index, page-local base) of a region kept whole."""
        if region.name in self.tables:
            raise KeyError(region.name)
        i = self._page_of[region.name]
        return i, region.base - self.pages[i].lo

    def is_table(self, region) -> bool:
        return region.name in self.tables

    def pieces(self, lo: int, hi: int):
        """The parts of host elements [lo, hi) on the GPU: (kind, index, host lo, host hi),
        kind "page" (index: the page) or "chunk" (index: (table name, chunk number))."""
        for i, p in enumerate(self.pages):
            a, b = max(lo, p.lo), min(hi, p.hi)
            if a < b:
                yield "page", i, a, b
        for name, t in self.tables.items():
            for k, c in enumerate(t.chunks):
                a, b = max(lo, c.lo), min(hi, c.hi)
                if a < b:
                    yield "chunk", (name, k), a, b

    def describe(self) -> str:
        out = [f"{len(self.pages)} page(s) of at most {_size(self.page_cap * 4)}"]
        out += [f"table {name}: {len(t.chunks)} chunks of at most {t.chunks[0].rows} rows"
                for name, t in self.tables.items()]
        return "; ".join(out)


def _size(nbytes: int) -> str:
    return f"{nbytes / MIB:.1f} MiB" if nbytes >= MIB else f"{nbytes / 1024:.1f} KiB"


def _what_uses(uses: list[str]) -> str:
    kinds = sorted(set(uses))
    return ", ".join(kinds[:3]) + (" ..." if len(kinds) > 3 else "") if kinds else "nothing"
