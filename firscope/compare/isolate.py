"""Each node judged on its own inputs (``firscope diff --isolate``).

The plain diff runs the reference's own chain, so after the first wrong node
every later node differs too and a second, independent bug is hidden. Here
every node of every step is run by the reference **from the other run's
inputs to that node** and only that node's outputs are compared: a node that
is wrong on its own is found wherever it is, and a node that is right on its
own but was fed a wrong value is only *downstream* of one (its error is
inherited).

The pieces, for reuse by other engines (a GPU runner judged the same way):

* an **input source** says, for one node at one step, which arena regions to
  fill and with what (:meth:`DumpInputs.loads`, :meth:`ModelInputs.loads`), or
  why it cannot (:class:`NotJudged`): the other run's value of a buffer a node
  reads is the output of the last node that wrote it before (this step or an
  earlier one), which a dump holds when it holds that node's output; a buffer
  nothing wrote yet holds its initial value on both sides;
* :func:`judge_node` fills those regions, runs the node on a machine and
  compares its outputs with the given ones;
* :func:`run_isolated` walks every node of every step with them.

Another engine judged this way (a GPU runner) is a source like
:class:`~.sources.DumpSource` (``plan``, ``begin_step``, ``value``,
``end_step``: its outputs) plus an input source (``loads``: its buffers before
each node); :func:`isolating` of the latter goes to ``run_lockstep``.

An output that compared bit for bit leaves the arena holding exactly the
other run's value, so it is not copied in again for the next reader (a KV
cache is read back at every step). A buffer a micro-kernel writes without
reading it (an output only) is loaded when the other side holds it and
otherwise assumed to be written whole.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np

from ..errors import FirError
from ..model.layout import Region
from ..runtime import Machine, Model, PlanNode
from .lanes import program_regions, writers
from .lockstep import MAX_LANE_LOOKUPS, DiffReport, OutputResult
from .metrics import Tolerance, compare_arrays
from .rows import RowComparer
from .dumpfile import DumpChanged
from .sources import OtherRunFailed, Wanted
from ..runtime import NodeKind


@dataclass(frozen=True)
class NotJudged:
    """A node at a step that was not run on its own, and why."""

    step: int
    node: int
    instance: str
    reason: str


@dataclass(frozen=True)
class Load:
    """One arena region to fill before a node runs on its own.

    ``tag`` names the value (a dump key): a region already holding the value of that
    tag is not copied again; None: always copied. ``fetch`` gives the flat f32 values."""

    region: Region
    tag: object
    fetch: Callable[[], np.ndarray]


class InputSource(Protocol):
    def loads(self, step: int, node: PlanNode,
              held: dict[int, object] | None = None) -> list[Load] | str:
        """The regions to fill for ``node`` at ``step``, or why the other side lacks them;
        those ``held`` already says the arena holds (by tag) may be left out."""


def input_regions(model: Model, node: PlanNode,
                  buffers: set[int] | None = None) -> tuple[list[Region], list[Region]]:
    """(buffers the node reads, buffers a micro-kernel only writes) as arena regions; weights
    are the reference's own and never loaded. ``buffers``: the buffer regions' bases, when
    the caller has them."""
    if buffers is None:
        buffers = {r.base for r in model.buffer_regions()}
    reads: dict[int, Region] = {}
    for a in node.args:
        if a.region is not None and a.region.base in buffers:
            reads[a.region.base] = a.region
    written: dict[int, Region] = {}
    if node.program is not None:
        for r in program_regions(node.program):
            if r.base in buffers and r.base not in reads:
                if any(o.region is not None and o.region.base == r.base for o in node.outs):
                    written[r.base] = r
                else:  # an @NAME buffer the kernel reads
                    reads[r.base] = r
    return list(reads.values()), list(written.values())


class LastWriters:
    """Which node output holds a buffer's value when a node starts: the last writer before
    it in this step's graph order, else the last one in the previous step; None: nothing
    wrote it yet (its initial value). Static: every step runs the same graph."""

    def __init__(self, model: Model):
        self.by_base: dict[int, list[tuple[int, int]]] = {}  # base -> [(node, out)] in order
        for n in model.nodes:
            for i, o in enumerate(n.outs):
                if o.region is not None:
                    self.by_base.setdefault(o.region.base, []).append((n.index, i))

    def before(self, base: int, step: int, node: int) -> tuple[int, int, int] | None:
        """(step, node, output index) of the value ``base`` holds when ``node`` starts."""
        writes = self.by_base.get(base)
        if not writes:
            return None
        earlier = [w for w in writes if w[0] < node]
        if earlier:
            return (step, *earlier[-1])
        if step == 0:
            return None
        return (step - 1, *writes[-1])


class DumpInputs:
    """A node's inputs read from a dump: the outputs of the nodes that wrote them."""

    def __init__(self, model: Model, source):
        self.model = model
        self.source = source
        self.writers = LastWriters(model)
        self.keys: dict[tuple[int, int, int], Wanted] = {}
        for step, nodes in source.plan.by_step.items():
            for node, ws in nodes.items():
                for w in ws:
                    self.keys[(step, node, w.out)] = w
        self._buffers = {r.base for r in model.buffer_regions()}
        # (node, step > 0) -> [(region, needed, (steps back, writer node, output))]: the
        # same for every step after the first, so found once
        self._plans: dict[tuple[int, bool], list] = {}

    def _plan(self, step: int, node: PlanNode) -> list:
        key = (node.index, step > 0)
        plan = self._plans.get(key)
        if plan is None:
            reads, written = input_regions(self.model, node, self._buffers)
            plan = []
            for needed, group in ((True, reads), (False, written)):
                for r in group:
                    at = self.writers.before(r.base, step, node.index)
                    if at is not None:  # else nothing wrote it yet: its initial value
                        plan.append((r, needed, (step - at[0], at[1], at[2])))
            self._plans[key] = plan
        return plan

    def loads(self, step: int, node: PlanNode,
              held: dict[int, object] | None = None) -> list[Load] | str:
        """``held``: region base -> the tag the arena holds there; a region already holding
        its value is left out (judge_node would skip it)."""
        out = []
        keys = self.keys
        for r, needed, (back, wnode, wout) in self._plan(step, node):
            at = (step - back, wnode, wout)
            w = keys.get(at)
            if w is None:
                if not needed:
                    continue
                writer = self.model.nodes[wnode]
                return (f"the dump has no {writer.outs[wout].name} of {writer.full_name} at "
                        f"step {at[0]} (an input)")
            if held is not None and held.get(r.base) == w.key:
                continue  # the arena holds it: no Load, no fetcher made
            out.append(Load(r, w.key, _fetcher(self.source, at[0], self.model.nodes[wnode], w)))
        return out


def _fetcher(source, step, node, wanted):
    return lambda: source.value(step, node, wanted)


class ModelInputs:
    """A node's inputs from a second model run in lockstep (``diff A.fir B.fir``): its
    arena's buffers of the same name, just before its node of the same instance runs."""

    def __init__(self, model: Model, source):
        self.model = model
        self.source = source  # a ModelSource
        other = source.other
        self.theirs: dict[str, Region] = {}
        for n in other.nodes:
            for o in (*n.args, *n.outs):
                if o.region is not None and o.kind == "buffer":
                    self.theirs[o.display] = o.region
        self.names: dict[int, str] = {}
        for n in model.nodes:
            for o in (*n.args, *n.outs):
                if o.region is not None:
                    self.names[o.region.base] = o.display

    def loads(self, step: int, node: PlanNode,
              held: dict[int, object] | None = None) -> list[Load] | str:
        j = self.source.index.get(node.full_name)
        if j is None:
            return f"{node.full_name} is not in {self.source.other.path.name}"
        reads, written = input_regions(self.model, node)
        out = []
        for r in (*reads, *written):
            name = self.names.get(r.base, "?")
            theirs = self.theirs.get(name)
            if theirs is None or theirs.size != r.size:
                if r in written:
                    continue
                return f"{self.source.other.path.name} has no buffer {name} of {r.size} elements"
            out.append(Load(r, None, _model_fetcher(self.source, step, j, theirs)))
        return out


def _model_fetcher(source, step, j, region):
    def fetch():
        source.run_before(step, j)
        return source.other.view(region)
    return fetch


def judge_node(machine: Machine, node: PlanNode, step: int, loads: Iterable[Load],
               expected: Sequence[tuple[int, object, Tolerance]], *,
               held: dict[int, object] | None = None,
               rows: RowComparer | None = None,
               name: str | None = None) -> tuple[OutputResult, ...]:
    """Fill ``loads`` into ``machine``'s arena, run ``node`` once, and compare its outputs
    ``node.outs[i]`` with the given values (``expected``: (i, values, tolerance); values
    may be a function giving them, called after the node ran).

    ``held``: region base -> the tag of the value the arena holds there: a load whose tag
    is held is not copied again; loaded regions are noted, the node's outputs forgotten
    (the caller notes an output that compared bit for bit under its expected value's tag).
    ``rows``: compare KV caches by rows (compare/rows). ``name``: the node's instance name
    when the caller has it. A FirError from the run propagates."""
    arena = machine.arena
    held = {} if held is None else held
    for ld in loads:
        base = ld.region.base
        if ld.tag is not None and held.get(base) == ld.tag:
            continue
        arena[base: ld.region.stop] = np.asarray(ld.fetch(), dtype=np.float32).reshape(-1)
        held[base] = ld.tag
    for o in node.outs:
        if o.region is not None:
            held.pop(o.region.base, None)
    machine.run_node(node)
    name = node.full_name if name is None else name
    micro = node.kind == NodeKind.MICRO
    out = []
    for i, values, tol in expected:
        o = node.outs[i]
        if callable(values):
            values = values()
        r = o.region
        ref = arena[r.base: r.base + r.size]
        diff = compare_arrays(ref, values, tol) if rows is None else \
            rows.compare(step, node, i, ref, values, tol)
        out.append(OutputResult(step, node.index, name, o.name, o.display, micro, diff))
    return tuple(out)


class _Taint:
    """Which buffers hold a value downstream of a node wrong on its own (data flow over the
    other run's values): origin "instance at step S", per region base."""

    def __init__(self, model: Model):
        self.model = model
        self.by_base: dict[int, str] = {}
        buffers = {r.base for r in model.buffer_regions()}
        self._reads = {n.index: input_regions(model, n, buffers)[0] for n in model.nodes}

    def origin(self, node: PlanNode) -> str | None:
        if not self.by_base:  # nothing wrong upstream yet (the common case): no lookups
            return None
        return next((self.by_base[r.base] for r in self._reads[node.index]
                     if r.base in self.by_base), None)

    def wrote(self, node: PlanNode, origin: str | None) -> None:
        if origin is None and not self.by_base:
            return
        for o in node.outs:
            if o.region is None:
                continue
            if origin is None:
                self.by_base.pop(o.region.base, None)
            else:
                self.by_base[o.region.base] = origin


def isolating(inputs: InputSource):
    """``run_lockstep(..., isolate=isolating(inputs))``: judge each node on ``inputs``."""
    def run(model, source, tokens, tol, report, machine, *, rows=True):
        run_isolated(model, source, inputs, tokens, tol, report, machine, rows=rows)
    return run


def run_isolated(model: Model, source, inputs: InputSource, tokens: list[int],
                 tol: Tolerance, report: DiffReport, machine: Machine, *,
                 rows: bool = True) -> None:
    """Every node of every step from the other run's inputs (``inputs``), compared with the
    other run's outputs (``source``); fills ``report`` (results: each node's own error)."""
    report.isolated = True
    report.lane_lookups = MAX_LANE_LOOKUPS
    by_step = source.plan.by_step
    held: dict[int, object] = {}
    taint = _Taint(model)
    comparer = RowComparer(model, len(tokens)) if rows else None
    names = {n.index: n.full_name for n in model.nodes}  # built once, not per output
    outs = {n.index: sum(o.region is not None for o in n.outs) for n in model.nodes}
    # In step: every node so far had all its outputs in the dump and each compared bit for
    # bit, so the arena holds the dump's value of every buffer written so far (``held`` says
    # so of each) and no input needs loading: loads() is not asked (it would return none).
    in_step = isinstance(inputs, DumpInputs)
    t0 = time.perf_counter()
    for step, token in enumerate(tokens):
        machine.begin_token(token)
        source.begin_step(step, token)
        wanted = by_step.get(step, {})
        for node in model.nodes:
            origin = taint.origin(node)
            ws = wanted.get(node.index, ())
            if not ws:
                in_step = False
                taint.wrote(node, origin)
                continue
            res = _judge_one(model, machine, source, inputs, node, step, ws, tol, held,
                             comparer, report, names[node.index], in_step)
            if res is None:
                in_step = False
                taint.wrote(node, origin)
                continue
            report.results.extend(res)
            if in_step:
                if len(ws) == outs[node.index] and all(r.diff.exact for r in res):
                    continue  # nothing is wrong upstream yet: no taint to carry
                in_step = False
            if any(r.diff.diverged for r in res):
                taint.wrote(node, f"{names[node.index]} at step {step}")
            else:
                if origin is not None:
                    report.inherited[(step, node.index)] = origin
                taint.wrote(node, origin)
        source.end_step(step)
        machine.finish_token()
    if comparer is not None:
        report.notes += comparer.notes()
    report.seconds = time.perf_counter() - t0


def _judge_one(model, machine, source, inputs, node, step, ws, tol, held, comparer,
               report, name, in_step=False) -> tuple[OutputResult, ...] | None:
    try:
        if in_step:  # no input to load (run_isolated): run it as the plain diff would
            res = _run_in_step(machine, node, step, ws, source, tol, held, comparer, name)
        else:
            loads = inputs.loads(step, node, held)  # what the arena does not hold already
            if isinstance(loads, str):
                report.not_judged.append(NotJudged(step, node.index, name, loads))
                return None
            expected = [(w.out, _fetcher(source, step, node, w),
                         tol if w.dtype == "F32" else tol.for_dtype(w.dtype)) for w in ws]
            res = judge_node(machine, node, step, loads, expected, held=held, rows=comparer,
                             name=name)
    except (OtherRunFailed, DumpChanged):  # the other model faulted (run_lockstep) or the
        raise  # dump is no longer the one opened: the diff ends there, as the plain one does
    except FirError as e:
        report.not_judged.append(NotJudged(step, node.index, name,
                                           f"the reference faulted on the other run's "
                                           f"inputs: {e.message}"))
        for o in node.outs:
            if o.region is not None:
                held.pop(o.region.base, None)
        return None
    for w, r in zip(ws, res):
        if r.diff.exact:
            held[node.outs[w.out].region.base] = w.key
    if report.lane_lookups > 0 and node.kind == NodeKind.MICRO and any(r.diff.diverged for r in res):
        report.lane_lookups -= 1
        every = inputs.loads(step, node)  # all of them: the node's run may have changed some
        res = _with_writers(machine, node, every if isinstance(every, list) else [], res)
    return res


def _run_in_step(machine, node, step, ws, source, tol, held, comparer,
                 name) -> tuple[OutputResult, ...]:
    """:func:`judge_node` with nothing to load, each expected value read after the run."""
    for o in node.outs:
        if o.region is not None:
            held.pop(o.region.base, None)
    machine.run_node(node)
    arena = machine.arena
    micro = node.kind == NodeKind.MICRO
    out = []
    for w in ws:
        o = node.outs[w.out]
        t = tol if w.dtype == "F32" else tol.for_dtype(w.dtype)
        r = o.region
        ref, other = arena[r.base: r.base + r.size], source.value(step, node, w)
        diff = compare_arrays(ref, other, t) if comparer is None else \
            comparer.compare(step, node, w.out, ref, other, t)
        out.append(OutputResult(step, node.index, name, o.name, o.display, micro, diff))
    return tuple(out)


def _with_writers(machine: Machine, node: PlanNode, loads: list[Load],
                  res: tuple[OutputResult, ...]) -> tuple[OutputResult, ...]:
    """The lane that wrote the element each diverging output shows, replaying the node on
    the interpreter from the other run's inputs (as the plain diff does from its own)."""
    start = {r.base: machine.arena[r.base: r.stop].copy() for r in program_regions(node.program)}
    for ld in loads:
        if ld.region.base in start:
            start[ld.region.base] = np.asarray(ld.fetch(), dtype=np.float32).reshape(-1)
    outs = {o.name: o for o in node.outs}
    addresses = {r.buffer: outs[r.buffer].region.base + r.diff.index for r in res
                 if r.diff.diverged and r.diff.index is not None}
    try:
        found = writers(node.program, start, addresses.values(), machine.budget)
    except FirError:
        return res
    return tuple(replace(r, writer=found[addresses[r.buffer]], lane_looked_up=True)
                 if r.buffer in addresses else r for r in res)


def execute_plain(machine: Machine, node: PlanNode) -> None:
    """Run one node on ``machine``'s arena without its hooks (a debugger's observers and undo
    log must not see a run made aside)."""
    from ..runtime.extops import EXT_IMPLS
    from ..vm.interp import Dispatch
    if node.kind == NodeKind.EXT:
        with np.errstate(all="ignore"):
            EXT_IMPLS[node.target](machine.arena, node)
    elif machine.kernel_runner is not None:
        machine.kernel_runner.run(node, machine.arena, machine.budget)
    else:
        Dispatch(node.program, machine.arena).run(machine.budget)


def judge_aside(machine: Machine, node: PlanNode, step: int, loads: Sequence[Load],
                expected: Sequence[tuple[int, object, Tolerance]]) -> tuple[OutputResult, ...]:
    """:func:`judge_node` on a machine whose arena must stay as it was (a debugging session
    running its own chain): the regions the node's run touches are saved and put back, and
    no hook runs."""
    arena = machine.arena
    regions: dict[int, Region] = {ld.region.base: ld.region for ld in loads}
    for o in node.outs:
        if o.region is not None:
            regions[o.region.base] = o.region
    if node.program is not None:
        for r in node.program.written_regions():
            regions[r.base] = r
    saved = {b: arena[r.base: r.stop].copy() for b, r in regions.items()}
    try:
        for ld in loads:
            arena[ld.region.base: ld.region.stop] = np.asarray(ld.fetch(),
                                                                dtype=np.float32).reshape(-1)
        execute_plain(machine, node)
        out = []
        for i, values, tol in expected:
            o = node.outs[i]
            values = values() if callable(values) else values
            out.append(OutputResult(step, node.index, node.full_name, o.name, o.display,
                                    node.kind == NodeKind.MICRO,
                                    compare_arrays(machine.model.view(o.region), values, tol)))
        res = tuple(out)
        if node.kind == NodeKind.MICRO and any(r.diff.diverged for r in res):
            res = _with_writers(machine, node, list(loads), res)
        return res
    finally:
        for b, r in regions.items():
            arena[r.base: r.stop] = saved[b]
