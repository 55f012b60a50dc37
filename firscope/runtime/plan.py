"""Kernels and the unrolled node plan: the runtime's phases of loading.

These need both the model layer (declarations, arena regions, weights) and
the assembler (vm/), so they live here. Phases:

* :func:`assemble_kernels` checks every kernel's text once
  (:func:`~firscope.vm.assembler.check_kernel`) and its ``size=``/``expect=``
  operand names.
* :func:`unroll_plan` unrolls ``repeat`` blocks into :class:`PlanNode` rows,
  binds each node's operands to buffer or weight instances, checks the
  ext ops' shapes and the kernels' ``size=``/``expect=`` contracts (naming
  node, layer and sizes), binds each micro node's program, and refuses a
  program that stores into a weight (weights are read-only in the format).
* :func:`check_lane_memory` refuses a dispatch whose registers cannot fit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Mapping

from ..errors import FirError, Loc
from ..fir import syntax as S
from ..fir.syntax import NodeKind
from ..fir.expr import Env, eval_int
from ..model.decls import Buffers, WeightDecl
from ..model.layout import MemoryBudget, Region, mib
from ..model.loader import ModelParts
from ..model.ref import Ref
from ..model.weights import WeightEntry
from ..vm.assembler import NREGS, Address, KernelCode, Program, bind, check_kernel

EXT_OPS = {
    # name: (number of args, number of outs, usage)
    "fir.embedding": (2, 1, "fir.embedding IDS TABLE -> OUT"),
    "fir.linear": (2, 1, "fir.linear X W -> Y"),
    "fir.linear_t": (2, 1, "fir.linear_t X W -> Y"),
}
# Per dispatched lane: the R and U register files plus the engines' scratch.
LANE_BYTES = 2 * NREGS * 4 + 256


class OperandKind(StrEnum):
    BUFFER = "buffer"
    WEIGHT = "weight"


@dataclass(frozen=True)
class Operand:
    """A node argument or output bound to a buffer instance or a weight."""

    name: str  # as written in the node
    display: str  # "key_cache@3"
    kind: OperandKind
    size: int
    region: Region | None  # None: a q4 or --fir-f32 weight stored beside the arena
    weight: WeightEntry | None = None


@dataclass(frozen=True)
class PlanNode:
    index: int
    name: str
    layer: int | None
    kind: NodeKind
    target: str  # ext op or kernel name
    args: tuple[Operand, ...]
    outs: tuple[Operand, ...]
    loc: Loc
    program: Program | None = None  # micro nodes: the kernel bound to this node's operands

    @property
    def ref(self) -> Ref:
        return Ref(self.name, self.layer)

    @property
    def full_name(self) -> str:
        return str(self.ref)

    def written_spans(self) -> list[tuple[int, int]]:
        """Arena (start, end) of everything this node may write: an ext op's outputs, a
        kernel's store targets (undo logs, the logit lens's put-back)."""
        regs = [o.region for o in self.outs] if self.kind == NodeKind.EXT else \
            self.program.written_regions()
        return list(dict.fromkeys((r.base, r.base + r.size) for r in regs))


# -- kernels -----------------------------------------------------------------------------
def assemble_kernels(fir: S.FirFile, buffers: Buffers,
                     weight_decls: Mapping[str, WeightDecl]) -> Mapping[str, KernelCode]:
    """Check every kernel's text once; ``@NAME`` may name a buffer or an f32 weight."""
    def is_named(name: str) -> bool:
        return name in buffers.decls or (name in weight_decls and weight_decls[name].in_arena)

    kernels: dict[str, KernelCode] = {}
    for k in fir.of(S.Kernel):
        if k.name.text in kernels:
            raise FirError(f"kernel '{k.name.text}' is defined twice (first at line "
                           f"{kernels[k.name.text].syntax.loc.line})", k.name.loc)
        code = check_kernel(k, is_named)
        for tok in k.size_groups:
            _check_operand_name(tok, k)
        for tok, _ in k.expects:
            _check_operand_name(tok, k)
        kernels[k.name.text] = code
    return MappingProxyType(kernels)


# Written as the node binds them: "in00" or "in²" would pass int() but name no operand.
_OPERAND = re.compile(r"(in|out)(0|[1-9][0-9]{0,2})$")


def _check_operand_name(tok: S.Tok, k: S.Kernel) -> None:
    m = _OPERAND.match(tok.text)
    if not m or int(m.group(2)) >= (k.n_in if m.group(1) == "in" else k.n_out):
        raise FirError(f"'{tok.text}' is not an operand of kernel '{k.name.text}' "
                       f"(in0..in{k.n_in - 1}, out0..out{k.n_out - 1})", tok.loc)


# -- nodes ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Scope:
    """What a node's names can mean: the model's instances, and its kernels."""

    parts: ModelParts
    kernels: Mapping[str, KernelCode]

    def buffer_region(self, name: str, layer: int | None) -> Region:
        per_layer = self.parts.buffers.decls[name].per_layer
        return self.parts.layout.regions[str(Ref(name, layer if per_layer else None))]

    def weight(self, name: str, layer: int | None) -> WeightEntry:
        per_layer = self.parts.weight_decls[name].per_layer
        return self.parts.weights[str(Ref(name, layer if per_layer else None))]


def unroll_plan(parts: ModelParts, kernels: Mapping[str, KernelCode]) -> tuple[PlanNode, ...]:
    """Every node in run order, ``repeat`` bodies unrolled (layer 0, 1, ...), each checked."""
    scope = _Scope(parts, kernels)
    nodes: list[PlanNode] = []
    counts = iter(parts.repeats.counts)  # one per Repeat, in file order
    for d in parts.fir.directives:
        if isinstance(d, S.Node):
            nodes.append(_plan_node(scope, d, None, len(nodes)))
        elif isinstance(d, S.Repeat):
            for layer in range(next(counts)):
                for n in d.body:
                    nodes.append(_plan_node(scope, n, layer, len(nodes)))
    if not nodes:
        fir = parts.fir
        raise FirError("the model file has no nodes", Loc(fir.path, len(fir.lines) or 1, 1))
    return tuple(nodes)


def _resolve(scope: _Scope, tok: S.Tok, layer: int | None, node_name: str) -> Operand:
    name = tok.text
    if name in scope.parts.buffers.decls:
        if scope.parts.buffers.decls[name].per_layer and layer is None:
            raise FirError(f"node {node_name}: per_layer buffer '{name}' used outside 'repeat'",
                           tok.loc)
        r = scope.buffer_region(name, layer)
        return Operand(name, r.name, OperandKind.BUFFER, r.size, r)
    if name in scope.parts.weight_decls:
        if scope.parts.weight_decls[name].per_layer and layer is None:
            raise FirError(f"node {node_name}: per-layer weight '{name}' used outside 'repeat'",
                           tok.loc)
        entry = scope.weight(name, layer)
        return Operand(name, entry.name, OperandKind.WEIGHT, entry.size, entry.region, entry)
    raise FirError(f"node {node_name}: undefined buffer or weight '{name}'", tok.loc)


def _plan_node(scope: _Scope, d: S.Node, layer: int | None, index: int) -> PlanNode:
    full = str(Ref(d.name.text, layer))
    args = tuple(_resolve(scope, t, layer, full) for t in d.args)
    outs = tuple(_resolve(scope, t, layer, full) for t in d.outs)
    for tok, o in zip(d.outs, outs):
        if o.kind is OperandKind.WEIGHT:
            raise FirError(f"node {full}: output '{tok.text}' is a weight; outputs must be buffers",
                           tok.loc)
    where = f"node {full}" + (f" (layer {layer})" if layer is not None else "")
    if d.kind.text == NodeKind.EXT:
        _check_ext(d, args, outs, where)
        return PlanNode(index, d.name.text, layer, NodeKind.EXT, d.target.text, args, outs, d.loc)
    program = _bind_micro(scope, d, layer, args, outs, where)
    return PlanNode(index, d.name.text, layer, NodeKind.MICRO, d.target.text, args, outs, d.loc,
                    program)


def _bind_micro(scope: _Scope, d: S.Node, layer: int | None, args, outs, where: str) -> Program:
    kname = d.target.text
    code = scope.kernels.get(kname)
    if code is None:
        raise FirError(f"{where}: undefined kernel '{kname}'", d.target.loc)
    k = code.syntax
    if len(args) != k.n_in or len(outs) != k.n_out:
        raise FirError(f"{where}: kernel '{kname}' takes in={k.n_in} out={k.n_out}, the node "
                       f"gives {len(args)} inputs and {len(outs)} outputs", d.target.loc)
    bound = {f"in{i}": o for i, o in enumerate(args)}
    bound.update({f"out{i}": o for i, o in enumerate(outs)})
    for o in bound.values():
        if o.region is None:
            raise FirError(f"{where}: '{o.name}' is a {o.weight.dtype} weight stored outside the "
                           "arena; only fir.linear can read it", d.loc)
    _check_contracts(scope, d, k, bound, where)
    full = str(Ref(d.name.text, layer))
    program = bind(code, symbols=scope.parts.symbols,
                   operands={n: o.region for n, o in bound.items()},
                   resolve_buffer=lambda name: _named_region(scope, name, layer, full, d.loc),
                   node=full, layer=layer)
    _refuse_weight_stores(program, where)
    return program


def _check_contracts(scope: _Scope, d: S.Node, k: S.Kernel, bound: Mapping[str, Operand],
                     where: str) -> None:
    """The kernel's ``size=`` (equal element counts) and ``expect=`` (a count) for this node."""
    kname = k.name.text
    if k.size_groups:
        first = k.size_groups[0].text
        for tok in k.size_groups[1:]:
            if bound[tok.text].size != bound[first].size:
                raise FirError(f"{where}: kernel '{kname}' needs size {first} = {tok.text}, but "
                               f"{first} is '{bound[first].display}' ({bound[first].size}) and "
                               f"{tok.text} is '{bound[tok.text].display}' "
                               f"({bound[tok.text].size})", d.loc)
    env = Env(scope.parts.symbols, {n: o.size for n, o in bound.items()})
    for tok, ex in k.expects:
        want = eval_int(ex, env, f"expect {tok.text}")
        if bound[tok.text].size != want:
            raise FirError(f"{where}: kernel '{kname}' expects {tok.text} to have {want} elements, "
                           f"'{bound[tok.text].display}' has {bound[tok.text].size}", d.loc)


def _named_region(scope: _Scope, name: str, layer: int | None, full: str, loc: Loc) -> Region:
    """What ``@NAME`` in a kernel means for one node: a buffer or an f32 weight instance."""
    if name in scope.parts.buffers.decls:
        if scope.parts.buffers.decls[name].per_layer and layer is None:
            raise FirError(f"node {full}: kernel uses per_layer buffer '@{name}' outside "
                           "'repeat'", loc)
        return scope.buffer_region(name, layer)
    weights = scope.parts.weights
    disp = name if name in weights else str(Ref(name, layer))
    entry = weights.get(disp)
    if entry is None or entry.region is None:
        raise FirError(f"node {full}: '@{name}' is not an arena buffer", loc)
    return entry.region


def _refuse_weight_stores(program: Program, where: str) -> None:
    """Weights are read-only: a store into one (through ``@NAME`` or an ``inN`` bound to a
    weight) would change the model for every later token and run, so it is refused here."""
    stored = {r.name for r in program.written_regions() if r.is_weight}
    if not stored:
        return
    for op in program.ops:
        if not op.spec.stores:
            continue
        for a in op.args:
            if isinstance(a, Address) and a.region.name in stored:
                raise FirError(f"{where}: kernel '{program.name}' stores into weight "
                               f"'{a.region.name}' through @{a.operand}; weights are read-only",
                               op.loc)
    raise FirError(f"{where}: kernel '{program.name}' stores into weight "
                   f"'{sorted(stored)[0]}'; weights are read-only", program.kernel.syntax.loc)


def _check_ext(d: S.Node, args, outs, where: str) -> None:
    op = d.target.text
    if op not in EXT_OPS:
        raise FirError(f"unknown ext op '{op}' (known: {', '.join(EXT_OPS)})", d.target.loc)
    n_args, n_outs, usage = EXT_OPS[op]
    if len(args) != n_args or len(outs) != n_outs:
        raise FirError(f"{where}: {op} takes {n_args} inputs and {n_outs} output "
                       f"(`{usage}`), found {len(args)} and {len(outs)}", d.target.loc)
    x, w = args
    if x.region is None:  # only the weight operand may live outside the arena
        raise FirError(f"{where}: {op} reads '{x.name}' from the arena, but it is a "
                       f"{x.weight.dtype} weight stored outside it", d.args[0].loc)
    if op == "fir.embedding":
        _check_embedding(d, x, w, outs[0], where)
    else:
        _check_linear(d, op, x, w, outs[0], where)


def _check_embedding(d: S.Node, ids: Operand, table: Operand, out: Operand, where: str) -> None:
    if table.kind is not OperandKind.WEIGHT or len(table.weight.shape) != 2:
        raise FirError(f"{where}: fir.embedding table '{table.name}' must be a 2-D weight",
                       d.args[1].loc)
    if table.weight.region is None:
        raise FirError(f"{where}: fir.embedding table '{table.name}' must be an f32 weight",
                       d.args[1].loc)
    if ids.size < 1:
        raise FirError(f"{where}: fir.embedding ids '{ids.name}' is empty", d.args[0].loc)
    if out.size != table.weight.shape[1]:
        raise FirError(f"{where}: fir.embedding output '{out.display}' has {out.size} elements, "
                       f"a row of '{table.display}' has {table.weight.shape[1]}", d.outs[0].loc)


def _check_linear(d: S.Node, op: str, x: Operand, w: Operand, y: Operand, where: str) -> None:
    if w.kind is not OperandKind.WEIGHT or len(w.weight.shape) != 2:
        raise FirError(f"{where}: {op} needs a 2-D weight, '{w.name}' is not one", d.args[1].loc)
    shape = w.weight.shape
    if op == "fir.linear":
        n_in, n_out = shape  # Conv1D [in, out]
    else:
        if w.weight.dtype == "q4":
            raise FirError(f"{where}: fir.linear_t reads [out, in] weights; '{w.name}' is q4 "
                           "declared [in, out], use fir.linear", d.args[1].loc)
        n_out, n_in = shape
    if x.size != n_in:
        raise FirError(f"{where}: {op} input '{x.display}' has {x.size} elements, weight "
                       f"'{w.display}' {list(shape)} needs {n_in}", d.args[0].loc)
    if y.size != n_out:
        raise FirError(f"{where}: {op} output '{y.display}' has {y.size} elements, weight "
                       f"'{w.display}' {list(shape)} gives {n_out}", d.outs[0].loc)


# -- memory for lanes ----------------------------------------------------------------------
def check_lane_memory(nodes: tuple[PlanNode, ...], kernels: Mapping[str, KernelCode],
                      budget: MemoryBudget) -> None:
    """The dispatch with the most lanes allocates registers per lane when it runs."""
    widest = max((n for n in nodes if n.kind is NodeKind.MICRO),
                 key=lambda n: n.program.threads, default=None)
    if widest is None or budget.limit is None:
        return
    lane_bytes = widest.program.threads * LANE_BYTES
    if budget.need + lane_bytes > budget.limit:
        k = kernels[widest.target].syntax
        raise FirError(f"node {widest.full_name}: kernel '{widest.target}' dispatches "
                       f"{widest.program.threads} threads, whose registers need "
                       f"{mib(lane_bytes)}; with the model's {mib(budget.need)} that exceeds the "
                       f"{mib(budget.limit)} of memory available", k.threads.loc)
