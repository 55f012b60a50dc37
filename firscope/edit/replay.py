"""Replaying edited kernels on the inputs the original run gave their nodes.

The original model runs the tokens (its chosen engine). Before each node that dispatches an
edited kernel, the regions the node's original and edited programs touch are copied; after
it, the edited program runs on a small scratch arena made of those copies (the step
interpreter, watched for races and out-of-bounds accesses: sanitize.check_dispatch) and its
outputs are compared with the original's bit for bit. A differing output names its first
differing element, the lane that stored it and the edited kernel's line (compare/lanes'
replay of the edited program); a store outside the node's outputs is reported as such. This
is ``diff --isolate`` for one edit: each node on the original's own inputs, so a wrong node
is found wherever it is, not only the first.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..compare.lanes import program_regions, relocate, scratch_arena, writers
from ..compare.metrics import Tolerance, compare_arrays
from ..errors import FirError, FirFault, UsageError
from ..fir.parser import parse_kernels
from ..runtime import Machine, Model, NodeKind
from ..runtime.load import with_kernels
from ..runtime.machine import DEFAULT_BUDGET, Hooks
from ..text import printable

EXACT = Tolerance(ulp=0)


@dataclass(frozen=True)
class Edit:
    """The original model and the same model with the file's kernels in place of its own."""

    original: Model
    edited: Model
    path: Path
    kernels: tuple[str, ...]  # the names replaced

    def nodes(self, pattern: str | None = None) -> list[int]:
        """Plan indices of the nodes that dispatch an edited kernel (``pattern``: only those
        whose instance name matches it, ``attention@*`` or ``ln1@0``)."""
        out = []
        for n in self.edited.nodes:
            if n.kind != NodeKind.MICRO or n.target not in self.kernels:
                continue
            if pattern is None or fnmatch.fnmatchcase(n.full_name, pattern) or \
                    fnmatch.fnmatchcase(n.name, pattern):
                out.append(n.index)
        return out


def load_edit(model: Model, path: str | Path) -> Edit:
    """Parse ``path`` (one or more ``kernel ... endkernel`` blocks) and put its kernels in
    place of the model's. Any error in the file, or a signature the nodes cannot take, is a
    :class:`~firscope.errors.UsageError` positioned in the file (or at the node)."""
    path = Path(path)
    try:
        kernels = parse_kernels(path)
        edited = with_kernels(model, kernels)
    except FirFault:
        raise
    except FirError as e:
        raise UsageError(e.message, e.loc, e.hint) from None
    return Edit(model, edited, path, tuple(k.name.text for k in kernels))


@dataclass
class OutputAB:
    buffer: str  # the output's instance ("norm", "key_cache@0")
    identical: bool
    elements: int = 0
    differing: int = 0
    max_abs: float = 0.0
    max_ulp: int = 0
    rel_l2: float = 0.0
    first: int | None = None  # the first differing element
    a: float | None = None  # the original's value there
    b: float | None = None  # the edit's
    lane: int | None = None  # the lane of the edited kernel that stored it
    line: int | None = None  # and the line of that store (in the edit's file)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class StepAB:
    step: int
    outputs: list[OutputAB]
    faults: list[str] = field(default_factory=list)  # sanitizer findings, runaway, ...

    @property
    def identical(self) -> bool:
        return not self.faults and all(o.identical for o in self.outputs)


@dataclass
class NodeAB:
    index: int
    instance: str
    kernel: str
    steps: list[StepAB] = field(default_factory=list)
    cost: dict | None = None  # {"before": {...}, "after": {...}}

    @property
    def identical(self) -> bool:
        return all(s.identical for s in self.steps)

    def first_difference(self) -> tuple[StepAB, OutputAB | None] | None:
        for s in self.steps:
            if s.faults:
                return s, None
            for o in s.outputs:
                if not o.identical:
                    return s, o
        return None


@dataclass
class ReplayReport:
    edit: Edit
    tokens: list[int]  # every token fed, in order
    nodes: list[NodeAB]
    chained: dict | None = None  # --chained: the whole decode with the edit
    cost_position: int | None = None
    device: str | None = None
    cost_note: str | None = None  # why there is no cost after the edit

    @property
    def identical(self) -> bool:
        chained_ok = self.chained is None or (self.chained.get("identical", False)
                                              and not self.chained.get("fault"))
        return all(n.identical for n in self.nodes) and chained_ok


class _Replayer:
    """The hooks on the original machine that replay each target node's edited program."""

    def __init__(self, edit: Edit, targets: list[int], budget: int | None):
        self.edit = edit
        self.budget = budget
        self.targets = set(targets)
        self.results = {i: NodeAB(i, edit.edited.nodes[i].full_name,
                                  edit.edited.nodes[i].target) for i in targets}
        self.start: dict[int, np.ndarray] = {}
        self.step = 0

    def before(self, machine, node) -> None:
        if node.index not in self.targets:
            return
        self.start = start_of(node, self.edit.edited.nodes[node.index], machine.arena)

    def after(self, machine, node, _seconds) -> None:
        if node.index not in self.targets:
            return
        self.results[node.index].steps.append(self.judge(machine, node))

    def judge(self, machine, node) -> StepAB:
        b = self.edit.edited.nodes[node.index]
        return judge_edit(node, b, self.start,
                          lambda r: machine.arena[r.base: r.stop], self.budget, self.step)


def start_of(node_a, node_b, arena: np.ndarray) -> dict[int, np.ndarray]:
    """Copies of every region either program touches, as ``arena`` holds them now."""
    regions = {r.base: r for r in program_regions(node_b.program) +
               program_regions(node_a.program)}
    return {base: arena[r.base: r.stop].copy() for base, r in regions.items()}


def run_original(node_a, start: dict[int, np.ndarray], budget: int | None):
    """The original program on a scratch arena of ``start``: its output region -> values."""
    from ..vm.interp import Dispatch
    regions = program_regions(node_a.program)
    layout, scratch = scratch_arena(regions, start)
    Dispatch(relocate(node_a.program, layout), scratch).run(budget)
    return lambda r: scratch[layout[r.base]: layout[r.base] + r.size]


def judge_edit(node_a, node_b, start: dict[int, np.ndarray], a_values, budget: int | None,
               step: int) -> StepAB:
    """The edited program ``node_b`` from ``start`` against the original's outputs
    (``a_values(region)``): identical or not per output, the first differing element with
    the edit's lane and line, the sanitizer's findings, stores outside the outputs."""
    b = node_b
    regions = program_regions(b.program)
    layout, scratch = scratch_arena(regions, start)
    moved = replace(b, program=relocate(b.program, layout))
    faults: list[str] = []
    ended = False  # the edit stopped short: no replay to look up a lane in
    from ..sanitize import check_dispatch
    try:
        findings = check_dispatch(moved, scratch, budget, step)
        faults += [" ".join(f.text_lines()[:2]).replace("    ", " ") for f in findings]
    except FirError as e:  # a runaway loop, a division the reference refuses, ...
        faults.append(str(e).splitlines()[0])
        ended = True
    outs = []
    for o in node_a.outs:
        r = o.region
        a_val = a_values(r)
        b_val = scratch[layout[r.base]: layout[r.base] + r.size] if r.base in layout \
            else start.get(r.base, a_val)
        d = compare_arrays(a_val, b_val, EXACT)
        out = OutputAB(o.display, d.exact, d.elements, d.differing, d.max_abs, d.max_ulp,
                       d.rel_l2)
        if not d.exact:
            k = d.first_index if d.first_index is not None else d.index
            out.first, out.a, out.b = k, float(a_val[k]), float(b_val[k])
            if r.base in layout and not ended:
                w = writers(b.program, start, [r.base + k], budget).get(r.base + k)
                if w is not None:
                    out.lane, out.line = w.lane, w.line
        outs.append(out)
    faults += _stray_writes(b, node_a, layout, scratch, start)
    return StepAB(step, outs, faults)


def _stray_writes(b, node, layout, scratch, start) -> list[str]:
    """Stores of the edited kernel outside the node's outputs (a region it may write by its
    @NAME addresses, not bound as an output)."""
    outs = {o.region.base for o in node.outs if o.region is not None}
    found = []
    for r in b.program.written_regions():
        if r.base in outs or r.base not in layout:
            continue
        now = scratch[layout[r.base]: layout[r.base] + r.size]
        changed = np.flatnonzero(now.view(np.uint32) != start[r.base].view(np.uint32))
        if len(changed):
            found.append(f"writes outside its outputs: {printable(r.name)}[{int(changed[0])}] "
                         f"changed ({len(changed)} element(s)), and {printable(r.name)} is not "
                         f"an output of {node.full_name}")
    return found


def replay(edit: Edit, prompt: list[int], n: int, *, node: str | None = None,
           engine: str = "compiled", budget: int | None = DEFAULT_BUDGET,
           chained: bool = False) -> ReplayReport:
    """Run the original on ``prompt`` + ``n`` greedy tokens and replay every target node at
    every step (see the module docstring)."""
    targets = edit.nodes(node)
    if not targets:
        which = f" matching '{node}'" if node is not None else ""
        raise UsageError(f"no node{which} dispatches an edited kernel "
                         f"({', '.join(edit.kernels)})")
    rep = _Replayer(edit, targets, budget)
    a = edit.original.with_own_arena()
    machine = Machine(a, engine=engine, hooks=Hooks(before_node=[rep.before],
                                                     after_node=[rep.after]))
    fed: list[int] = []

    def on_step(res, _next):
        fed.append(res.token)
        rep.step += 1

    _, logits = machine.generate(list(prompt), n, on_step=on_step)
    report = ReplayReport(edit, fed, [rep.results[i] for i in targets])
    if chained:
        report.chained = chained_change(edit, fed, np.stack(logits), engine, budget)
    return report


def chained_change(edit: Edit, fed: list[int], logits_a: np.ndarray, engine: str,
                   budget: int | None) -> dict:
    """The whole decode with the edit, fed the original's tokens: how its logits change."""
    from ..quant.stats import token_stats
    b = Machine(edit.edited.with_own_arena(), engine=engine, budget=budget)
    rows = []
    try:
        for t in fed:
            rows.append(b.step(t).logits)
    except FirError as e:
        return {"steps": len(rows), "fault": str(e).splitlines()[0], "identical": False}
    lb = np.stack(rows)
    same_bits = bool(np.array_equal(lb.view(np.uint32), logits_a.view(np.uint32)))
    with np.errstate(all="ignore"):
        s = token_stats(lb, logits_a, np.zeros(len(fed), dtype=np.int64))
        finite = np.isfinite(lb).all() and np.isfinite(logits_a).all()
        max_abs = float(np.max(np.abs(lb.astype(np.float64) - logits_a))) if finite else None
    return {"steps": len(fed), "identical": same_bits, "max_abs": max_abs,
            "same_top": float(np.mean(s.same_top)),
            "kld_mean": float(np.mean(s.kld)) if finite else None}
