"""Weights from the checkpoint: finding each instance's tensor, then reading it.

Phases: :func:`find_tensors` (every name and shape checked before any data
is read) -> :func:`read_weights` (threaded: f32 weights read straight into
the arena, q4 weights quantized to ``[out, in]`` codes from the checkpoint's
``[in, out]`` layout, without a transposed copy, or read back from the q4
cache: :mod:`.q4_cache`). Tensors are read with plain reads
(:meth:`~firscope.model.checkpoint.Checkpoint.load`), so a tensor's bytes leave
the process once it is quantized.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from ..errors import FirError, Loc
from . import q4_cache
from .checkpoint import Checkpoint
from .layout import Region, WeightSlot
from .q4 import Q4Matrix, Q4NonFiniteError, Q4RangeError, count_nonfinite, quantize_conv1d
from .ref import Ref

MAX_READ_THREADS = 4


@dataclass(frozen=True)
class WeightEntry:
    """One weight instance (``qkvw@3``), however it is stored."""

    name: str  # display name, str(self.ref)
    decl: str  # name in the model file
    layer: int | None
    dtype: str  # declared dtype: f32 or q4
    tensor: str  # checkpoint tensor name actually used
    shape: tuple[int, ...]  # declared (checkpoint) shape
    loc: Loc
    region: Region | None = None  # arena placement (f32 weights)
    q4: Q4Matrix | None = None  # q4 weights: codes, scales, mins ([out, in])
    matrix: np.ndarray | None = None  # [out, in] f32: --fir-f32 copy, or q4 with q4_path="dequant"
    # the instance's dtype as the file declares it (its ``except`` clause applied): f32, q4
    # or q4:gN; a q4 one loaded with --fir-f32 still says q4
    declared: str = ""

    def dense(self) -> np.ndarray | None:
        """[out, in] f32 for a viewer: the stored matrix, or the q4 one dequantized on demand
        (kept until :meth:`Q4Matrix.drop_dense`); None for arena weights (view the arena)."""
        if self.matrix is not None:
            return self.matrix
        return self.q4.dense() if self.q4 is not None else None

    @property
    def ref(self) -> Ref:
        return Ref(self.decl, self.layer)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def stored(self) -> str:
        if self.region is not None:
            return "arena f32"
        return "q4" if self.q4 is not None else "f32 [out,in]"

    @property
    def nbytes(self) -> int:
        if self.q4 is not None:
            return self.q4.nbytes
        return self.size * 4


def find_tensors(slots: tuple[WeightSlot, ...], ckpt: Checkpoint,
                 prefix: str) -> Mapping[str, str]:
    """The checkpoint tensor of every weight instance, by instance name; shapes checked."""
    found: dict[str, str] = {}
    for slot in slots:
        w = slot.decl.syntax
        source = slot.decl.source(slot.layer)
        if source in ckpt:
            tensor = source
        elif prefix and prefix + source in ckpt:
            tensor = prefix + source
        else:
            tried = f" (also tried '{prefix + source}')" if prefix else ""
            raise FirError(f"weight '{slot.name}': tensor '{source}' not found in "
                           f"{ckpt.folder.name}/model.safetensors{tried}", w.source.loc)
        info = ckpt.info(tensor)
        if info.shape != slot.decl.shape:
            raise FirError(f"weight '{slot.name}': tensor '{tensor}' has shape "
                           f"{list(info.shape)}, the model file declares {list(slot.decl.shape)}",
                           w.shape[0].loc if w.shape else w.loc)
        found[slot.name] = tensor
    return MappingProxyType(found)


def read_weights(slots: tuple[WeightSlot, ...], tensors: Mapping[str, str], ckpt: Checkpoint,
                 arena: np.ndarray, *, fir_f32: bool, group: int, q4_path: str = "packed",
                 progress: Callable[[float], None] | None = None) -> Mapping[str, WeightEntry]:
    """Read every weight: f32 ones into their arena regions (the one thing this phase
    writes), q4 ones transposed and quantized (or kept f32 with ``fir_f32``); on the
    ``dequant`` q4 path each q4 matrix also keeps an f32 copy (the comparison path)."""
    def load_one(slot: WeightSlot) -> WeightEntry | None:
        tensor = tensors[slot.name]
        q4 = matrix = None
        kind, own_group = slot.decl.precision(slot.layer)
        if slot.region is not None:  # read straight into the arena
            view = arena[slot.region.base: slot.region.stop]
            ckpt.load(tensor, out=view)
            finite = count_nonfinite(view) == 0
        elif fir_f32 or kind == "f32":  # every q4 weight (--fir-f32), or an except'd layer
            matrix = np.ascontiguousarray(ckpt.load(tensor).T)  # Conv1D [in, out] -> [out, in]
            finite = count_nonfinite(matrix) == 0
        else:
            g = own_group or group
            kept = q4_cache.entry_path(ckpt, tensor, g)
            q4 = q4_cache.read(kept, slot.decl.shape, g)
            finite = True
            try:  # quantized from the checkpoint's [in, out] layout: no transposed copy
                if q4 is None:
                    q4 = quantize_conv1d(ckpt.load(tensor), g)
                    if q4_cache.write(kept, q4):
                        wrote.append(kept)
            except Q4NonFiniteError:
                finite = False
            except Q4RangeError as e:
                raise FirError(f"weight '{slot.name}': tensor '{tensor}' {e} (load it as f32 "
                               "with --fir-f32)", slot.decl.loc) from None
            if finite and q4_path == "dequant":
                matrix = q4.dequantize()
        d = slot.decl
        entry = WeightEntry(slot.name, d.name, slot.layer, d.dtype, tensor, d.shape, d.loc,
                            slot.region, q4, matrix, d.dtype_at(slot.layer, group))
        return entry if finite else None

    wrote: list = []  # q4 cache entries written (then the cache is pruned)
    entries: dict[str, WeightEntry] = {}
    workers = min(MAX_READ_THREADS, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for slot, entry in zip(slots, pool.map(load_one, slots)):
            if progress is not None:
                progress((len(entries) + 1) / max(len(slots), 1))
            if entry is None:
                raise FirError(f"weight '{slot.name}': tensor '{tensors[slot.name]}' contains "
                               "NaN or Inf", slot.decl.loc)
            entries[slot.name] = entry
    if wrote:
        q4_cache.prune()
    return MappingProxyType(entries)
