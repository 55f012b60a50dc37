"""The reference run in lockstep with another run, node by node (``firscope diff``).

The reference (the model on firscope's VM) runs the given tokens from
position 0, one node at a time; after each node, every output the other
side holds for that step is compared (:func:`~.metrics.compare_arrays`).
Both runs are independent: the other run's values never feed the
reference, so the first divergence is where the other run first stops
agreeing, and everything after it is downstream.

The lane that wrote a diverging element of a micro-kernel output is found in
a second pass, only when something diverged: the reference runs again up to
the last of those nodes, and each of them is replayed alone on the
interpreter from its start (:mod:`.lanes`). A clean diff pays nothing for it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from ..errors import FirError
from ..runtime import Machine, Model
from ..runtime.machine import DEFAULT_BUDGET
from .lanes import Writer, start_values, writers
from .metrics import OutputDiff, Tolerance, compare_arrays
from .rows import RowComparer
from .sources import Mismatch, OtherRunFailed
from ..runtime import NodeKind

MAX_LANE_LOOKUPS = 16  # diverging micro-kernel outputs whose writing lane is looked up


@dataclass(frozen=True)
class OutputResult:
    """One node output at one step."""

    step: int
    node: int  # plan index in the reference
    instance: str  # "attention@3"
    buffer: str  # the output's buffer name, "attn"
    display: str  # the buffer instance, "key_cache@3"
    micro: bool  # written by a micro-kernel (lanes exist)
    diff: OutputDiff
    writer: Writer | None = None  # the lane that wrote diff.index (looked up for divergences)
    lane_looked_up: bool = False

    @property
    def key(self) -> str:
        return f"step{self.step}/{self.instance}/{self.buffer}"

    @property
    def name(self) -> str:
        return f"{self.instance}/{self.buffer}"


@dataclass
class DiffReport:
    reference: str  # the reference model's path
    engine: str
    other: str  # the dump's or the other model's path
    other_kind: str  # "dump" or "model"
    tokens: list[int]
    tolerance: Tolerance
    results: list[OutputResult] = field(default_factory=list)  # in run order
    mismatches: list[Mismatch] = field(default_factory=list)
    unmatched: list[Mismatch] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    possible: int = 0  # node outputs the run produced (steps x outputs per step)
    total_nodes: int = 0
    failure: str | None = None  # a run that faulted: where and why
    seconds: float = 0.0
    meta: dict = field(default_factory=dict)  # producer, model hashes, where tokens came from
    isolated: bool = False  # --isolate: results are each node's own error (compare/isolate)
    not_judged: list = field(default_factory=list)  # isolate.NotJudged, in run order
    inherited: dict = field(default_factory=dict)  # (step, node) -> the wrong node upstream
    lane_lookups: int = 0  # --isolate: writing lanes still to look up
    kernels: dict = field(default_factory=dict)  # node index -> kernel or ext op
    names: dict = field(default_factory=dict)  # node index -> instance ("attention@3")
    changes: list = field(default_factory=list)  # diff A B: textdiff.changes_dict rows
    links: list = field(default_factory=list)  # diff A B: the divergence tied to the changes

    @property
    def first_divergence(self) -> OutputResult | None:
        return next((r for r in self.results if r.diff.diverged), None)

    @property
    def diverged(self) -> list[OutputResult]:
        return [r for r in self.results if r.diff.diverged]

    def results_name(self, node: int) -> str:
        """The instance name of plan node ``node`` (as the results spell it)."""
        return self.names.get(node, f"node {node}")

    @property
    def steps_compared(self) -> int:
        return len({r.step for r in self.results})

    @property
    def nodes_compared(self) -> int:
        return len({r.node for r in self.results})

    @property
    def exit_code(self) -> int:
        # nothing compared is no evidence of agreement (a naming slip in a dumper looks so)
        bad = self.failure or self.mismatches or self.first_divergence or not self.results
        return 1 if bad else 0


def run_lockstep(model: Model, source, tokens: list[int], tol: Tolerance, *,
                 engine: str = "compiled", budget: int | None = DEFAULT_BUDGET,
                 lane_lookups: int = MAX_LANE_LOOKUPS,
                 machine: Machine | None = None, isolate=None,
                 rows: bool = True) -> DiffReport:
    """Run ``tokens`` on ``model`` and compare with ``source`` (a DumpSource or ModelSource).
    ``machine``: a machine of ``model`` to run on (it is reset first); default a new one.
    ``isolate``: :func:`.isolate.isolating` of an input source: judge every node on the
    other run's inputs instead of running the reference's own chain. ``rows``: compare a KV cache by
    the rows written this step once its earlier rows were equal (compare/rows)."""
    if not tokens:
        raise FirError("no tokens to run: give --tokens or --prompt")
    report = DiffReport(str(model.path), str(engine), source.name, source.kind, list(tokens),
                        tol, mismatches=list(source.plan.mismatches),
                        unmatched=list(source.plan.unmatched))
    report.possible = len(tokens) * sum(len(n.outs) for n in model.nodes)
    report.total_nodes = len(model.nodes)
    report.kernels = {n.index: n.target for n in model.nodes}
    report.names = {n.index: n.full_name for n in model.nodes}
    machine = machine or Machine(model, engine=engine, budget=budget)
    machine.reset()
    for t in tokens:
        machine.check_token(t)
    machine.check_room(len(tokens))
    t0 = time.perf_counter()
    try:
        if isolate is not None:
            isolate(model, source, tokens, tol, report, machine, rows=rows)
        else:
            _first_pass(model, machine, source, tokens, tol, report,
                        RowComparer(model, len(tokens)) if rows else None)
    except OtherRunFailed as e:
        report.failure = e.message
    if lane_lookups and report.first_divergence is not None and isolate is None:
        _look_up_lanes(model, machine, tokens, report, lane_lookups)
    report.seconds = time.perf_counter() - t0
    return report


def _first_pass(model: Model, machine: Machine, source, tokens, tol, report,
                rows: RowComparer | None) -> None:
    by_step = source.plan.by_step
    results = report.results
    names = {n.index: n.full_name for n in model.nodes}  # built once, not per output
    for step, token in enumerate(tokens):
        machine.begin_token(token)
        source.begin_step(step, token)
        wanted = by_step.get(step, {})
        for node in model.nodes:
            try:
                machine.run_node(node)
            except FirError as e:
                report.failure = (f"the reference run ({model.path.name}) failed at step "
                                  f"{step} at {node.full_name}: {e}")
                return
            for w in wanted.get(node.index, ()):
                out = node.outs[w.out]
                t = tol if w.dtype == "F32" else tol.for_dtype(w.dtype)
                ref, other = model.view(out.region), source.value(step, node, w)
                diff = compare_arrays(ref, other, t) if rows is None else \
                    rows.compare(step, node, w.out, ref, other, t)
                results.append(OutputResult(step, node.index, names[node.index], out.name,
                                            out.display, node.kind == NodeKind.MICRO, diff))
        source.end_step(step)
        machine.finish_token()
    if rows is not None:
        report.notes += rows.notes()


def _look_up_lanes(model: Model, machine: Machine, tokens, report: DiffReport,
                   limit: int) -> None:
    """Second pass: the writing lane of the shown element of the first diverging micro
    outputs (up to ``limit``), by replaying each such node from its start."""
    todo: dict[tuple[int, int], list[int]] = {}  # (step, node) -> result indexes
    for i, r in enumerate(report.results):
        if r.diff.diverged and r.micro and r.diff.index is not None:
            if len(todo) >= limit and (r.step, r.node) not in todo:
                break
            todo.setdefault((r.step, r.node), []).append(i)
    if not todo:
        return
    last = max(todo)
    machine.reset()
    try:
        for step, token in enumerate(tokens[: last[0] + 1]):
            machine.begin_token(token)
            for node in model.nodes:
                found = todo.get((step, node.index))
                if found is None:
                    machine.run_node(node)
                    continue
                start = start_values(node.program, model.arena)
                machine.run_node(node)
                addresses = [node.outs[_out_index(node, report.results[i])].region.base
                             + report.results[i].diff.index for i in found]
                lanes = writers(node.program, start, addresses, machine.budget)
                for i, a in zip(found, addresses):
                    report.results[i] = replace(report.results[i], writer=lanes[a],
                                                lane_looked_up=True)
                if (step, node.index) == last:
                    return
            machine.finish_token()
    except FirError as e:  # the first pass ran these nodes; a failure now is worth a note
        report.notes.append(f"looking up lanes stopped: {e}")


def _out_index(node, result: OutputResult) -> int:
    return next(i for i, o in enumerate(node.outs) if o.name == result.buffer)
