"""``firscope diff MODEL --engine gpu``: the reference and the GPU in lockstep, node by node.

The reference (compiled, or ``--reference-engine interp``) runs the tokens; just
before each of its nodes, the same node runs on the GPU and its outputs are read
back; after it, the lockstep (compare/lockstep) compares them, so the first
divergence is named as for a dump (step, node, buffer, element, and the lane and
instruction of the reference that wrote it).

Two modes (docs/gpu-engine.md):

* **isolate** (the default): before each node the GPU's copy of every region the
  node touches is overwritten with the reference's, so each node starts from the
  reference's inputs and a divergence is that kernel's own: the per-kernel
  conformance check.
* **chained** (``--chained``): the GPU runs the whole decode on its own values,
  as a GPU decode would; errors accumulate down the graph.

With ``--sanitize`` the reference is also run under the race checker on the same
tokens: a diverging node whose kernel races is said to be explained by that race.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..compare.lockstep import DiffReport, run_lockstep
from ..compare.sources import OtherRunFailed, Plan, Wanted
from ..defaults import DEFAULT_ENGINE
from ..dump import dump_key
from ..errors import FirError
from ..runtime import Machine, Model, PlanNode
from ..runtime.machine import DEFAULT_BUDGET
from ..runtime.opening import check_budget
from ..sanitize import Tool
from ..sanitize.runner import sanitize_run
from .runner import GpuRunner
from ..runtime import NodeKind

if TYPE_CHECKING:
    from ..compare.command import DiffOptions


def touched_regions(node: PlanNode) -> list:
    """Every buffer region a node may read or write (operands and ``@buffer`` addresses);
    weights are left out: nothing writes them, so the GPU's copy is the reference's."""
    seen = {}
    for o in node.args + node.outs:
        if o.region is not None:
            seen[o.region.name] = o.region
    if node.program is not None:
        for op in node.program.ops:
            mem = op.spec.mem
            if mem is not None:
                r = op.args[mem.address].region
                seen[r.name] = r
    return [r for r in seen.values() if r.is_buffer]


class GpuSource:
    """The other side of the lockstep: each node on the GPU, run from the reference's
    machine's ``before_node`` hook (so in isolate mode it sees the reference's inputs)."""

    kind = "gpu"

    def __init__(self, model: Model, reference: Machine, steps: int, *, isolate: bool = True,
                 budget: int | None = DEFAULT_BUDGET):
        self.model = model
        self.isolate = isolate
        self.runner = GpuRunner(model, budget=budget)
        gpu = self.runner.gpu
        mode = "isolate: each node from the reference's inputs" if isolate else \
            "chained: the GPU on its own values"
        self.name = f"GPU {gpu.name} ({gpu.backend}; {mode})"
        self.plan = Plan()
        for step in range(steps):
            for n in model.nodes:
                for i, o in enumerate(n.outs):
                    if o.region is not None:
                        self.plan.add(step, n.index, Wanted(i, dump_key(step, n.full_name,
                                                                        o.name)))
        self.values: dict[tuple[int, int], np.ndarray] = {}
        self.active = False
        self.failed: tuple | None = None
        reference.hooks.before_node.append(self._before_node)
        self.runner.upload_arena()

    def begin_step(self, step: int, token: int) -> None:
        self.active = True
        for region in self.model.inputs.values():
            self.runner.upload(region, self.model.view(region))

    def _before_node(self, machine: Machine, node: PlanNode) -> None:
        if not self.active:
            return  # the lockstep's second pass (finding lanes) replays the reference only
        if self.isolate:
            for r in touched_regions(node):
                self.runner.upload(r, self.model.view(r))
        self.values.clear()
        try:
            self.runner.run([node.index])
        except FirError as e:  # said by value(): raised here it would read as the reference's
            self.failed = (node, e)
            return
        for i, o in enumerate(node.outs):
            if o.region is not None:
                self.values[(node.index, i)] = self.runner.download(o.region)

    def value(self, step: int, node: PlanNode, wanted: Wanted) -> np.ndarray:
        if self.failed is not None:
            where, e = self.failed
            raise OtherRunFailed(f"the GPU failed at step {step} at {where.full_name}: "
                                 f"{e.message}")
        return self.values[(node.index, wanted.out)]

    def end_step(self, step: int) -> None:
        self.active = False
        self.values.clear()


def gpu_lockstep(model: Model, tokens: list[int], tol, *, isolate: bool = True,
                 engine: str = "compiled", budget: int | None = DEFAULT_BUDGET) -> DiffReport:
    reference = Machine(model, engine=engine, budget=budget)
    reference.reset()
    source = GpuSource(model, reference, len(tokens), isolate=isolate, budget=budget)
    report = run_lockstep(model, source, tokens, tol, engine=engine, budget=budget,
                          machine=reference)
    report.meta["gpu"] = dict(source.runner.gpu.info)
    report.meta["mode"] = "isolate" if isolate else "chained"
    return report


def explain_with_races(model: Model, tokens: list[int], report: DiffReport,
                       engine: str = "compiled") -> None:
    """--sanitize: run the race checker on the same tokens; name the diverging nodes whose
    kernel it finds racing (a GPU runs those lanes at once, the reference one order)."""
    diverged = {r.node for r in report.diverged}
    if not diverged:
        report.notes.append("--sanitize: nothing diverged, so there is nothing to explain")
        return
    san, _ = sanitize_run(model, tokens[:1], max(len(tokens) - 1, 0),
                          tools=frozenset({Tool.RACE}), engine=engine)
    kernels = {model.nodes[i].target for i in diverged if model.nodes[i].kind == NodeKind.MICRO}
    found = False
    for f in san.by_tool(Tool.RACE):
        if f.kernel not in kernels:
            continue
        nodes = [model.nodes[i].full_name for i in sorted(diverged)
                 if model.nodes[i].target == f.kernel]
        lanes = " and ".join(str(x) for x in f.lanes) or "several lanes"
        report.notes.append(
            f"the race explains it: the sanitizer finds a {f.kind} in kernel '{f.kernel}' "
            f"(lines {', '.join(map(str, f.lines))}; lanes {lanes} on {f.element}), and "
            f"{', '.join(nodes)} diverged on the GPU, where those lanes really run at once")
        found = True
    if not found:
        report.notes.append("--sanitize: the race checker finds no race in the diverging "
                            "kernels, so a race does not explain the difference")


def run_gpu_diff(args: DiffOptions) -> DiffReport:
    """The report behind ``firscope diff MODEL --engine gpu`` (see the module docstring)."""
    from ..compare.command import given_tokens, tolerance_of
    if args.other is not None or args.against is not None:
        raise FirError("--engine gpu compares the GPU with the reference itself: drop "
                       "--against/B.fir, or make a dump on the GPU (firscope run --engine gpu "
                       "--dump FILE) and compare that with --against")
    tol = tolerance_of(args)
    budget = check_budget(args.budget)
    model = args.source.load()
    ids, tokens_from = given_tokens(args.source, model)
    ref_engine = DEFAULT_ENGINE  # the reference the GPU is judged against
    isolate = not args.chained
    report = gpu_lockstep(model, list(ids), tol, isolate=isolate, engine=ref_engine,
                          budget=budget)
    report.meta["tokens_from"] = tokens_from
    if args.sanitize:
        explain_with_races(model, list(ids), report, ref_engine)
    return report


def gpu_diff_command(args: DiffOptions, *, out, err) -> int:
    from ..compare.report import format_json, format_text
    try:
        report = run_gpu_diff(args)
    except FirError as e:
        print(f"firscope: {e}" if e.loc is None else str(e), file=err)
        return 1
    text = format_json(report) if args.json else format_text(report, per_step=args.per_step)
    print(text, file=out)
    return report.exit_code

