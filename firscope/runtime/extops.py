"""The ext ops built into the graph runtime, one function per op.

``fir.linear`` on a q4 weight multiplies by the matrix dequantized once at
load (exactly ``q * scale + min`` in f32), so the result is the Q4 scheme's
and runs at BLAS speed.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import FirFault
from .plan import Operand, PlanNode


def _view(arena: np.ndarray, o: Operand) -> np.ndarray:
    return arena[o.region.base: o.region.base + o.region.size]


def embedding(arena: np.ndarray, node: PlanNode) -> None:
    ids, table = node.args
    out = node.outs[0]
    raw = float(arena[ids.region.base])
    rows, cols = table.weight.shape
    if not math.isfinite(raw) or raw < 0 or int(raw) >= rows:
        raise FirFault(f"node {node.full_name}: fir.embedding id {raw!r} read from "
                       f"'{ids.display}' is outside table '{table.display}' rows 0..{rows - 1}",
                       node.loc, node=node.full_name, layer=node.layer)
    row = int(raw)
    base = table.region.base + row * cols
    arena[out.region.base: out.region.base + cols] = arena[base: base + cols]


def linear_matrix(arena: np.ndarray, w: Operand, transposed_decl: bool) -> np.ndarray:
    """The weight as an [out, in] f32 matrix (a view where possible)."""
    entry = w.weight
    if entry.matrix is not None:
        return entry.matrix
    m = arena[entry.region.base: entry.region.base + entry.size].reshape(entry.shape)
    return m if transposed_decl else m.T


def linear(arena: np.ndarray, node: PlanNode) -> None:
    x, w = node.args
    y = node.outs[0]
    mat = linear_matrix(arena, w, transposed_decl=False)
    _view(arena, y)[...] = mat @ _view(arena, x)


def linear_t(arena: np.ndarray, node: PlanNode) -> None:
    x, w = node.args
    y = node.outs[0]
    mat = linear_matrix(arena, w, transposed_decl=True)
    _view(arena, y)[...] = mat @ _view(arena, x)


EXT_IMPLS = {
    "fir.embedding": embedding,
    "fir.linear": linear,
    "fir.linear_t": linear_t,
}
