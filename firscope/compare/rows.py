"""A KV cache compared by the rows written this step, once its earlier rows were equal.

A decode step writes one row of each KV cache (the row of its position) and
dumps the cache whole; comparing all of it at every step is most of what a
full-dump diff costs. A *persistent* output (a buffer the node reads and
writes, of ``n_positions`` rows) whose whole value compared bit for bit at
the previous step is compared at this step only in the row of this step's
position: the other rows are the ones already found equal. A row that
differs is compared whole again (the report's figures are the whole
buffer's). The last step is always compared whole, so a stray write of the
other run outside the rows it should write is found by the end of the run;
the report then says that the step it is named at may be later than the one
that wrote it.
"""
from __future__ import annotations

import numpy as np

from ..runtime import Model, PlanNode
from .metrics import OutputDiff, Tolerance, compare_arrays, exact_diff

MIN_ELEMENTS = 1 << 16  # smaller buffers are compared whole (it costs little)


class RowComparer:
    def __init__(self, model: Model, steps: int):
        self.positions = model.n_positions
        self.last = steps - 1
        self.exact_through: dict[tuple[int, int], int] = {}  # (node, out) -> step
        self._width: dict[tuple[int, int], int] = {}
        self.by_rows = 0  # comparisons made by one row
        self.stray: list[str] = []
        for n in model.nodes:
            reads = {a.region.base for a in n.args if a.region is not None}
            for i, o in enumerate(n.outs):
                if (o.region is not None and o.region.base in reads and self.positions
                        and o.size >= MIN_ELEMENTS and o.size % self.positions == 0):
                    self._width[(n.index, i)] = o.size // self.positions

    def compare(self, step: int, node: PlanNode, out: int, ref: np.ndarray,
                other: np.ndarray, tol: Tolerance) -> OutputDiff:
        key = (node.index, out)
        width = self._width.get(key)
        if width is None:
            return compare_arrays(ref, other, tol)
        by_rows = self.exact_through.get(key) == step - 1 and step < self.positions
        if by_rows and step != self.last:
            row = slice(step * width, (step + 1) * width)
            if compare_arrays(ref[row], other[row], tol).exact:
                self.by_rows += 1
                self.exact_through[key] = step
                return exact_diff(ref.size)
        diff = compare_arrays(ref, other, tol)
        if diff.exact:
            self.exact_through[key] = step
        elif by_rows:
            row = slice(step * width, (step + 1) * width)
            if compare_arrays(ref[row], other[row], tol).exact:
                self.stray.append(f"{node.full_name}/{node.outs[out].name}")
        return diff

    def notes(self) -> list[str]:
        out = []
        for name in self.stray:
            out.append(f"{name} differs at the last step outside the row that step wrote: "
                       "earlier steps compared it by the rows they wrote, so the step that "
                       "wrote the stray value may be earlier than the one named")
        return out
