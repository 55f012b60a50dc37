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
from ..runtime import NodeKind


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
        # --isolate: each node also judged on its own, from the dump's inputs (compare/isolate)
        self.isolate = False  # judge from now on (break diverge --isolate, the UI's --isolate)
        self.view_own = False  # the UI colours nodes by their own error
        self.own: dict[tuple[int, int], tuple[OutputResult, ...]] = {}
        self.not_judged: dict[tuple[int, int], str] = {}
        self._inputs = None
        self.own_lane: dict[int, int | None] = {}  # break diverge --isolate: its stop's lane

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
                                    node.kind == NodeKind.MICRO, diff))
        res = tuple(out)
        if tolerance is None:
            self.results[(step, node.index)] = res
        return res

    def value(self, step: int, node: PlanNode, wanted) -> np.ndarray:
        """The dump's value of one wanted output (the input-source protocol of isolate)."""
        return self.dump.read(wanted.key)

    def judge(self, step: int, node: PlanNode, token: int, machine,
              tolerance: Tolerance | None = None) -> tuple[OutputResult, ...]:
        """``node`` run aside from the dump's inputs, its outputs compared with the dump's
        (the session's arena is left as it was). Kept in ``own``, or why not in
        ``not_judged``, unless ``tolerance`` is given."""
        from .isolate import DumpInputs, judge_aside
        tol = tolerance or self.tolerance
        key = (step, node.index)
        wanted = self.wanted(step, node)
        if not wanted or (self.tokens is not None and step < len(self.tokens)
                          and self.tokens[step] != token):
            self.own.pop(key, None)
            return ()
        if self._inputs is None:
            self._inputs = DumpInputs(self.model, self)
        loads = self._inputs.loads(step, node)
        if isinstance(loads, str):
            self.not_judged[key] = loads
            self.own.pop(key, None)
            return ()
        expected = [(w.out, self.dump.read(w.key),
                     tol if w.dtype == "F32" else tol.for_dtype(w.dtype)) for w in wanted]
        try:
            res = judge_aside(machine, node, step, loads, expected)
        except FirError as e:
            self.not_judged[key] = f"the reference faulted on the dump's inputs: {e.message}"
            return ()
        if tolerance is None:
            self.not_judged.pop(key, None)
            self.own[key] = res
        return res

    @property
    def shown(self) -> dict[tuple[int, int], tuple[OutputResult, ...]]:
        """What the UI colours by: each node's own error with --isolate, else the chain's."""
        return self.own if self.view_own else self.results

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

    def first_divergence(self, own: bool = False) -> OutputResult | None:
        """The earliest divergence among the nodes run so far (step, then graph order);
        ``own``: the earliest node wrong on its own."""
        results = self.own if own else self.results
        for k in sorted(results):
            for r in results[k]:
                if r.diff.diverged:
                    return r
        return None
