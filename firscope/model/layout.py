"""The arena: sizing it against the memory available, and placing every instance in it.

All buffers and f32 weights live in one flat f32 arena; an address is an
element index into it. A :class:`Region` is one instance's extent there and
knows what it is an instance of (its declaration and layer), so nobody has
to take its name apart again.

Phases: :func:`size_memory` (refuse before allocating anything) ->
:func:`lay_out` (buffers, per-layer instances in layer order, then f32
weights) -> :func:`allocate_arena`.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Union

import numpy as np

from ..errors import FirError
from ..fir import syntax as S
from .decls import BufferDecl, Buffers, WeightDecl, file_start
from .ref import Ref

Decl = Union[BufferDecl, WeightDecl]


@dataclass(frozen=True)
class Region:
    """A named extent of the arena: a buffer instance or an f32 weight."""

    name: str  # str(self.ref): "scores", "key_cache@3", "ln1w@0"
    base: int
    size: int
    # What this is an instance of; None only for scratch regions made by tests.
    decl: Decl | None = field(default=None, compare=False, repr=False)
    layer: int | None = None

    @classmethod
    def of(cls, decl: Decl, layer: int | None, base: int, size: int) -> "Region":
        return cls(str(Ref(decl.name, layer)), base, size, decl, layer)

    @property
    def ref(self) -> Ref:
        return Ref(self.decl.name, self.layer) if self.decl is not None else Ref(self.name)

    @property
    def is_buffer(self) -> bool:
        return isinstance(self.decl, BufferDecl)

    @property
    def is_weight(self) -> bool:
        return isinstance(self.decl, WeightDecl)

    @property
    def stop(self) -> int:
        return self.base + self.size


# -- memory budget ---------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryBudget:
    arena_bytes: int
    q4_bytes: int  # packed codes, scales and mins, and the dequantized f32 copy
    limit: int | None  # bytes available (None: unknown, nothing is refused)

    @property
    def need(self) -> int:
        return self.arena_bytes + self.q4_bytes


def available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def size_memory(fir: S.FirFile, buffers: Buffers, weights: Mapping[str, WeightDecl],
                layers: int, group: int, limit: int | None,
                q4_path: str = "packed") -> MemoryBudget:
    """Size everything before allocating anything; refuse a model that cannot fit."""
    arena_elems = 0
    largest = (0, "", None)  # bytes, what, where: the error points at the biggest declaration
    for b in buffers.decls.values():
        n = b.size * (layers if b.per_layer else 1)
        arena_elems += n
        largest = max(largest, (n * 4, f"buffer '{b.name}'", b.loc), key=lambda t: t[0])
    q4_bytes = 0
    for w in weights.values():
        n = math.prod(w.shape) * (layers if w.per_layer else 1)  # Python ints: no overflow
        if w.in_arena:
            arena_elems += n
            nbytes = 4 * n
        else:
            # by dtype (an ``except`` clause may give layers another dtype or group): packed
            # codes + scales/mins (+ the dequantized f32 copy on the dequant path), or 4 bytes
            # a weight for f32 layers
            each = math.prod(w.shape)
            kinds: dict[tuple[str, int | None], int] = {}
            for layer in (range(layers) if w.per_layer else (None,)):
                kinds[w.precision(layer)] = kinds.get(w.precision(layer), 0) + each
            nbytes = 0
            for (kind, g), m in kinds.items():
                nbytes += 4 * m if kind == "f32" else (
                    m // 2 + 2 * 4 * (m // (g or group) + 1)
                    + (4 * m if q4_path == "dequant" else 0))
            q4_bytes += nbytes
        largest = max(largest, (nbytes, f"weight '{w.name}'", w.loc), key=lambda t: t[0])
    budget = MemoryBudget(arena_elems * 4, q4_bytes, limit)
    if limit is not None and budget.need > limit:
        size, what, where = largest
        raise FirError(f"model needs {mib(budget.need)} (arena {mib(budget.arena_bytes)}, q4 "
                       f"weights {mib(q4_bytes)}) but only {mib(limit)} of memory is available; "
                       f"the largest is {what} with {mib(size)}", where or file_start(fir))
    return budget


def mib(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.1f} MiB"


# -- layout ----------------------------------------------------------------------------
@dataclass(frozen=True)
class WeightSlot:
    """One weight instance (``qkvw@3``) before its data is read."""

    decl: WeightDecl
    layer: int | None
    region: Region | None  # f32 weights: where in the arena

    @property
    def name(self) -> str:
        return str(Ref(self.decl.name, self.layer))

    @property
    def size(self) -> int:
        return math.prod(self.decl.shape)


@dataclass(frozen=True)
class Layout:
    regions: Mapping[str, Region]  # every arena region by name, buffers first
    slots: tuple[WeightSlot, ...]  # every weight instance, in declaration order
    arena_size: int  # elements


def _instances(per_layer: bool, layers: int):
    return range(layers) if per_layer else (None,)


def lay_out(buffers: Buffers, weights: Mapping[str, WeightDecl], layers: int) -> Layout:
    """Buffers (per-layer instances in layer order), then f32 weights, back to back."""
    regions: dict[str, Region] = {}
    offset = 0
    for b in buffers.decls.values():
        for layer in _instances(b.per_layer, layers):
            r = Region.of(b, layer, offset, b.size)
            regions[r.name] = r
            offset += b.size
    slots = []
    for w in weights.values():
        for layer in _instances(w.per_layer, layers):
            region = None
            if w.in_arena:
                region = Region.of(w, layer, offset, math.prod(w.shape))
                regions[region.name] = region
                offset += region.size
            slots.append(WeightSlot(w, layer, region))
    return Layout(MappingProxyType(regions), tuple(slots), offset)


def allocate_arena(layout: Layout) -> np.ndarray:
    try:
        return np.zeros(layout.arena_size, dtype=np.float32)
    except MemoryError:
        raise FirError(f"cannot allocate the arena ({mib(layout.arena_size * 4)})") from None

