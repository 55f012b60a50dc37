"""A dump attached to a debugging session: each node compared as the session runs it.

The debugger (``firscope debug --against DUMP``) calls :meth:`AttachedDump.compare`
from a node observer right after every node completes, whichever way it ran;
results are kept per (step, node) for ``info diff``, ``break diverge`` and
the UI's graph pane. Nothing here knows the session: it sees the model, the
step, the token fed and the arena as the node left it.
"""
from __future__ import annotations

import numpy as np

from ..errors import FirError
from ..runtime import Model, PlanNode
from .dumpfile import Dump
from .lockstep import OutputResult
from .metrics import Tolerance, compare_arrays
from .sources import Mismatch, match_dump


class AttachedDump:
    def __init__(self, model: Model, dump: Dump, steps: int, tolerance: Tolerance | None = None):
        self.model = model
        self.dump = dump
        self.tolerance = tolerance or Tolerance()
        self.plan = match_dump(model, dump, steps)
        self.warnings = list(dump.warnings)
        try:
            self.tokens = dump.tokens
        except FirError as e:
            self.tokens = None
            self.warnings.append(e.message)
        self.results: dict[tuple[int, int], tuple[OutputResult, ...]] = {}
        self.skipped: dict[int, str] = {}  # step -> why it is not compared
        self.last: tuple[int, int] | None = None  # the node compared last: (step, node index)

    @property
    def mismatches(self) -> list[Mismatch]:
        return self.plan.mismatches

    def wanted(self, step: int, node: PlanNode):
        return self.plan.by_step.get(step, {}).get(node.index, ())

    def compare(self, step: int, node: PlanNode, token: int,
                tolerance: Tolerance | None = None) -> tuple[OutputResult, ...]:
        """Compare ``node``'s outputs as they are in the arena now (right after it ran)."""
        tol = tolerance or self.tolerance
        self.last = (step, node.index)
        wanted = self.wanted(step, node)
        if not wanted:
            self.results.pop((step, node.index), None)
            return ()
        if self.tokens is not None and step < len(self.tokens) and self.tokens[step] != token:
            self.skipped[step] = (f"this session fed token {token} at step {step}, the dump "
                                  f"token {self.tokens[step]}")
            self.results.pop((step, node.index), None)
            return ()
        self.skipped.pop(step, None)
        out = []
        for w in wanted:
            o = node.outs[w.out]
            diff = compare_arrays(self.model.view(o.region), self.dump.read(w.key),
                                  tol if w.dtype == "F32" else tol.for_dtype(w.dtype))
            out.append(OutputResult(step, node.index, node.full_name, o.name, o.display,
                                    node.kind == "micro", diff))
        res = tuple(out)
        if tolerance is None:
            self.results[(step, node.index)] = res
        return res

    def other_value(self, step: int, node: PlanNode, buffer: str) -> np.ndarray | None:
        """The dump's value of one output (flat f32), or None when the dump has none."""
        for w in self.wanted(step, node):
            if node.outs[w.out].name == buffer:
                return self.dump.read(w.key)
        return None

    def step_results(self, step: int) -> list[OutputResult]:
        """Every result of one step, in graph order."""
        keys = sorted(k for k in self.results if k[0] == step)
        return [r for k in keys for r in self.results[k]]

    def first_divergence(self) -> OutputResult | None:
        """The earliest divergence among the nodes run so far (step, then graph order)."""
        for k in sorted(self.results):
            for r in self.results[k]:
                if r.diff.diverged:
                    return r
        return None
