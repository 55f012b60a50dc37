"""The ext ops built into the graph runtime, one function per op.

``fir.linear`` on a q4 weight multiplies by its packed codes
(:meth:`~firscope.model.q4.Q4Matrix.matvec`): no f32 copy of the matrix
exists, and the result equals "dequantize, then f32 matvec" up to the order
of the sum. A model loaded with ``q4_path="dequant"`` keeps that f32 copy
(``WeightEntry.matrix``) and multiplies by it instead, for comparison.
f32 products run in :mod:`firscope.runtime.gemv`.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import FirFault
from .gemv import f32_matvec, f32_matvec_call
from .plan import Operand, PlanNode


def _view(arena: np.ndarray, o: Operand) -> np.ndarray:
    return arena[o.region.base: o.region.base + o.region.size]


def embedding(arena: np.ndarray, node: PlanNode) -> None:
    ids, table = node.args
    out = node.outs[0]
    raw = float(arena[ids.region.base])
    rows, cols = table.weight.shape
    if not math.isfinite(raw) or raw < 0 or int(raw) >= rows:
        raise embedding_fault(node, raw)
    row = int(raw)
    base = table.region.base + row * cols
    arena[out.region.base: out.region.base + cols] = arena[base: base + cols]


def embedding_fault(node: PlanNode, raw: float) -> FirFault:
    """The fault of an id outside the table (also raised for the GPU engine's record)."""
    ids, table = node.args
    rows = table.weight.shape[0]
    return FirFault(f"node {node.full_name}: fir.embedding id {raw!r} read from "
                    f"'{ids.display}' is outside table '{table.display}' rows 0..{rows - 1}",
                    node.loc, node=node.full_name, layer=node.layer)


def linear_matrix(arena: np.ndarray, w: Operand, transposed_decl: bool) -> np.ndarray:
    """An f32 weight (or a q4 one on the dequant path) as an [out, in] matrix, a view
    where possible."""
    entry = w.weight
    if entry.matrix is not None:
        return entry.matrix
    m = arena[entry.region.base: entry.region.base + entry.size].reshape(entry.shape)
    return m if transposed_decl else m.T


def linear(arena: np.ndarray, node: PlanNode) -> None:
    x, w = node.args
    y = node.outs[0]
    entry = w.weight
    if entry.q4 is not None and entry.matrix is None:
        entry.q4.matvec(_view(arena, x), out=_view(arena, y))
        return
    f32_matvec(linear_matrix(arena, w, transposed_decl=False), _view(arena, x), _view(arena, y))


def linear_t(arena: np.ndarray, node: PlanNode) -> None:
    x, w = node.args
    y = node.outs[0]
    f32_matvec(linear_matrix(arena, w, transposed_decl=True), _view(arena, x), _view(arena, y))


def linear_call(arena: np.ndarray, node: PlanNode, threads: int):
    """(function, arguments) that run :func:`linear` ``node`` on ``arena`` on ``threads``
    threads, bound once (Q4Matrix.matvec_call, gemv.f32_matvec_call), or None."""
    x, w = node.args
    entry = w.weight
    xv, yv = _view(arena, x), _view(arena, node.outs[0])
    if entry.q4 is not None and entry.matrix is None:
        return entry.q4.matvec_call(xv, yv, threads)
    return f32_matvec_call(linear_matrix(arena, w, transposed_decl=False), xv, yv, threads)


def linear_t_call(arena: np.ndarray, node: PlanNode, threads: int):
    """The same for :func:`linear_t`."""
    x, w = node.args
    return f32_matvec_call(linear_matrix(arena, w, transposed_decl=True), _view(arena, x),
                           _view(arena, node.outs[0]), threads)


EXT_IMPLS = {
    "fir.embedding": embedding,
    "fir.linear": linear,
    "fir.linear_t": linear_t,
}

# Ops whose call can be bound once per arena and thread count (runtime.Machine's plain
# loop): (arena, node, threads) -> (function, arguments) or None (then EXT_IMPLS's).
EXT_CALLS = {
    "fir.linear": linear_call,
    "fir.linear_t": linear_t_call,
}
