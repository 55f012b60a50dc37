"""The other side of a diff: a dump file, or a second model run in lockstep.

Both say up front which node outputs they can give at which step (a
:class:`Plan`) and what does not fit the reference model (a list of
:class:`Mismatch`, never skipped silently: a naming slip in a user's dumper
would otherwise hide everything), then hand out values as the reference
reaches each node.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

import numpy as np

from ..dump import dump_key
from ..errors import FirError
from ..model.checkpoint import shown
from ..model.ref import Ref
from ..runtime import Machine, Model, PlanNode
from .dumpfile import Dump


@dataclass(frozen=True)
class Mismatch:
    """A key (or, between two models, an instance or output) that matches nothing."""

    key: str
    problem: str


@dataclass(frozen=True)
class Wanted:
    """One output of one node to compare at one step: ``node.outs[out]``, under ``key``."""

    out: int
    key: str
    dtype: str = "F32"  # as stored: f16/bf16 widen the tolerance (Tolerance.for_dtype)


@dataclass
class Plan:
    """What the other side holds: step -> node index -> outputs to compare."""

    by_step: dict[int, dict[int, list[Wanted]]] = field(default_factory=dict)
    mismatches: list[Mismatch] = field(default_factory=list)  # the diff exits 1 for these
    unmatched: list[Mismatch] = field(default_factory=list)  # reported only (graphs differ)
    beyond: list[str] = field(default_factory=list)  # keys at steps past the compared tokens

    def add(self, step: int, node: int, wanted: Wanted) -> None:
        self.by_step.setdefault(step, {}).setdefault(node, []).append(wanted)

    @property
    def outputs(self) -> int:
        return sum(len(w) for nodes in self.by_step.values() for w in nodes.values())

    def nodes(self) -> set[int]:
        return {n for nodes in self.by_step.values() for n in nodes}


def instance_hint(model: Model, instance: str) -> str:
    """What to say after "no node X": its layers, the @ it lacks, or the closest names."""
    names = [n.full_name for n in model.nodes]
    base, _, layer = instance.partition("@")
    if layer and any(n.name == base for n in model.nodes):
        layered = sorted({n.layer for n in model.nodes if n.name == base and n.layer is not None})
        if layered:
            return f" (its layers are {layered[0]}..{layered[-1]})"
        return f" ('{base}' is outside the repeat: name it without @)"
    if not layer and any(n.name == instance and n.layer is not None for n in model.nodes):
        return f" (a node inside the repeat is named with its layer: {Ref(instance, 0)})"
    close = difflib.get_close_matches(instance, names, n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _output_problem(node: PlanNode, buffer: str) -> str:
    outs = ", ".join(o.name for o in node.outs)
    if any(a.name == buffer for a in node.args):
        return f"'{buffer}' is an input of {node.full_name}, not an output (outputs: {outs})"
    return f"{node.full_name} has no output '{shown(buffer)}' (outputs: {outs})"


def match_dump(model: Model, dump: Dump, steps: int) -> Plan:
    """Every key of ``dump`` against ``model``'s node instances and output buffers."""
    plan = Plan()
    nodes = {n.full_name: n for n in model.nodes}
    seen: dict[tuple[int, int, int], str] = {}
    for key, e in dump.entries.items():
        if e.step is None:
            plan.mismatches.append(Mismatch(key, "not a step{S}/{instance}/{buffer} key"))
            continue
        node = nodes.get(e.instance)
        if node is None:
            plan.mismatches.append(Mismatch(key, f"no node instance '{shown(e.instance)}' in "
                                                 f"{model.path.name}"
                                                 f"{instance_hint(model, e.instance)}"))
            continue
        out = next((i for i, o in enumerate(node.outs) if o.name == e.buffer), None)
        if out is None:
            plan.mismatches.append(Mismatch(key, _output_problem(node, e.buffer)))
            continue
        operand = node.outs[out]
        if not e.is_float:
            plan.mismatches.append(Mismatch(key, f"dtype {shown(e.dtype)}: dumps hold f32 "
                                                 "(f16, bf16 and f64 are converted)"))
            continue
        if e.elements != operand.size:
            plan.mismatches.append(Mismatch(key, f"{e.elements} elements (shape {list(e.shape)}), "
                                                 f"but '{operand.display}' has {operand.size}"))
            continue
        first = seen.setdefault((e.step, node.index, out), key)
        if first != key:
            plan.mismatches.append(Mismatch(key, f"the same output as '{shown(first)}'"))
            continue
        if e.step >= steps:
            plan.beyond.append(key)
            continue
        plan.add(e.step, node.index, Wanted(out, key, e.dtype))
    return plan


class DumpSource:
    """Values read from a dump file as the reference reaches each node."""

    kind = "dump"

    def __init__(self, model: Model, dump: Dump, steps: int):
        self.dump = dump
        self.name = str(dump.path)
        self.plan = match_dump(model, dump, steps)

    def begin_step(self, step: int, token: int) -> None:
        pass

    def value(self, step: int, node: PlanNode, wanted: Wanted) -> np.ndarray:
        return self.dump.read(wanted.key)

    def end_step(self, step: int) -> None:
        pass


class OtherRunFailed(FirError):
    """The other model faulted or ran out of budget: the diff ends there."""


class ModelSource:
    """A second model run in lockstep; nodes matched by instance, outputs by buffer name."""

    kind = "model"

    def __init__(self, model: Model, other: Model, steps: int, *, engine: str = "compiled",
                 budget: int | None = None):
        self.other = other
        self.name = str(other.path)
        self.machine = Machine(other, engine=engine, budget=budget)
        self.machine.reset()
        self.machine.check_room(steps)
        self.index = {n.full_name: n.index for n in other.nodes}
        self.plan = Plan()
        self._matched: dict[int, list[int]] = {}  # other node -> its compared output indexes
        self._match(model, steps)
        self.pos = 0
        self.live: dict[tuple[int, int], np.ndarray] = {}  # (other node, out) -> arena view
        self.pending: dict[tuple[int, int], np.ndarray] = {}  # outputs that ran ahead: copies

    def _match(self, model: Model, steps: int) -> None:
        ours = {n.full_name for n in model.nodes}
        for n in self.other.nodes:
            if n.full_name not in ours:
                self.plan.unmatched.append(Mismatch(n.full_name, f"instance only in "
                                                                 f"{self.other.path.name}"))
        for n in model.nodes:
            j = self.index.get(n.full_name)
            if j is None:
                self.plan.unmatched.append(Mismatch(n.full_name,
                                                    f"instance only in {model.path.name}"))
                continue
            theirs = {o.name: i for i, o in enumerate(self.other.nodes[j].outs)}
            for name in sorted(set(theirs) - {o.name for o in n.outs}):
                self.plan.unmatched.append(Mismatch(
                    f"{n.full_name}/{name}", f"output only in {self.other.path.name}"))
            for i, o in enumerate(n.outs):
                k = theirs.get(o.name)
                if k is None:
                    self.plan.unmatched.append(Mismatch(
                        f"{n.full_name}/{o.name}", f"output only in {model.path.name}"))
                    continue
                size = self.other.nodes[j].outs[k].size
                if size != o.size:
                    self.plan.mismatches.append(Mismatch(
                        f"{n.full_name}/{o.name}", f"{o.size} elements in {model.path.name}, "
                                                   f"{size} in {self.other.path.name}"))
                    continue
                self._matched.setdefault(j, []).append(k)
                for step in range(steps):
                    self.plan.add(step, n.index, Wanted(i, dump_key(step, n.full_name, o.name)))

    def begin_step(self, step: int, token: int) -> None:
        self._guard(lambda: self.machine.begin_token(token), step, None)
        self.pos = 0
        self.live.clear()
        self.pending.clear()

    def _run(self, step: int, j: int, target: int) -> None:
        node = self.other.nodes[j]
        self._guard(lambda: self.machine.run_node(node), step, node)
        for k in self._matched.get(j, ()):
            view = self.other.view(node.outs[k].region)
            if j == target:
                self.live[(j, k)] = view
            else:  # asked for later, after other nodes may have overwritten it
                self.pending[(j, k)] = view.copy()

    def value(self, step: int, node: PlanNode, wanted: Wanted) -> np.ndarray:
        j = self.index[node.full_name]
        name = node.outs[wanted.out].name
        k = next(i for i, o in enumerate(self.other.nodes[j].outs) if o.name == name)
        if (j, k) in self.pending:
            return self.pending.pop((j, k))
        if (j, k) not in self.live:
            self.live.clear()
            while self.pos <= j:
                self._run(step, self.pos, j)
                self.pos += 1
        return self.live[(j, k)]

    def run_before(self, step: int, j: int) -> None:
        """Run the other model up to (not including) its node ``j`` (``--isolate`` reads
        that node's inputs from its arena then)."""
        while self.pos < j:
            self._run(step, self.pos, -1)
            self.pos += 1

    def end_step(self, step: int) -> None:
        self.live.clear()
        while self.pos < len(self.other.nodes):
            self._run(step, self.pos, -1)
            self.pos += 1
        self.pending.clear()
        self.machine.finish_token()

    def _guard(self, fn, step: int, node: PlanNode | None) -> None:
        try:
            fn()
        except FirError as e:
            where = f" at {node.full_name}" if node is not None else ""
            raise OtherRunFailed(f"{self.other.path.name} failed at step {step}{where}: "
                                 f"{e}") from None
