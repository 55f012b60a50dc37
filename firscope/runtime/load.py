"""Loading a model: the model layer's phases, then kernels and the node plan.

:func:`load_model` is the one entry point: it runs
:func:`firscope.model.load_parts` (parse, config, symbols, buffers,
weights, memory budget, layout, checkpoint), then
:func:`~firscope.runtime.plan.assemble_kernels`,
:func:`~firscope.runtime.plan.unroll_plan` and
:func:`~firscope.runtime.plan.check_lane_memory`, and builds the frozen
:class:`Model` the machine, the debugger and the profiler share. Everything
that can be checked before running is checked, with the position of the
directive at fault.
"""
from __future__ import annotations

import difflib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..errors import FirError
from ..fir import syntax as S
from ..fir.expr import SymbolTable
from ..model.decls import BufferDecl, WeightDecl
from ..model.layout import Region
from ..model.loader import ModelParts, Progress, load_parts
from ..model.q4 import DEFAULT_GROUP, warm_kernels
from ..model.ref import Ref
from ..model.threads import begin_watch
from ..model.weights import WeightEntry
from ..vm.assembler import KernelCode
from .gemv import warm as warm_gemv
from .plan import PlanNode, assemble_kernels, check_lane_memory, unroll_plan


@dataclass(frozen=True)
class Model:
    """A loaded, checked model. Frozen: only its arena changes, as it runs."""

    path: Path
    fir: S.FirFile
    family: str
    config_path: Path
    config: Mapping[str, object]
    symbols: SymbolTable
    prefix: str
    layers: int
    fir_f32: bool
    group: int
    buffers: Mapping[str, BufferDecl]
    weight_decls: Mapping[str, WeightDecl]
    regions: Mapping[str, Region]  # every arena region by display name
    weights: Mapping[str, WeightEntry]  # every weight instance by display name
    kernels: Mapping[str, KernelCode]
    nodes: tuple[PlanNode, ...]
    arena: np.ndarray
    inputs: Mapping[str, Region]  # "token", "position"
    outputs: Mapping[str, Region]  # "logits"
    timings: Mapping[str, float]  # seconds: "parse", "weights", "plan", "total"
    parts: ModelParts | None = None  # what the plan was made from (with_kernels remakes it)
    edited: tuple[str, ...] = ()  # kernels replaced by with_kernels, by name

    @property
    def vocab(self) -> int:
        return self.outputs["logits"].size

    @property
    def n_positions(self) -> int | None:
        v = self.config.get("n_positions")
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def name(self) -> str:
        """What the model is called where it is shown (headers, report and breakpoint file
        names): its folder's name, ``tiny-gpt2``, found from the absolute path (the folder
        of ``gpt2.fir`` given from inside it is ``.``, whose name is empty)."""
        resolved = self.path.resolve()
        return resolved.parent.name or resolved.stem

    def buffer_region(self, name: str, layer: int | None) -> Region:
        decl = self.buffers[name]
        return self.regions[str(Ref(name, layer if decl.per_layer else None))]

    def instance(self, ref: Ref) -> Region | WeightEntry | None:
        """What ``ref`` names: a buffer's region (``key_cache@3``, ``x``) or a weight instance
        (``qkvw@0``, ``wte``); None when there is no such instance (a layer out of range, a
        per-layer name without its layer, a name that is neither)."""
        if ref.name in self.buffers:
            return self.regions.get(str(ref))
        return self.weights.get(str(ref))

    def buffer_regions(self) -> list[Region]:
        """Every buffer instance (what a reset zeroes; weights are never written)."""
        return [r for r in self.regions.values() if r.is_buffer]

    def view(self, region: Region) -> np.ndarray:
        return self.arena[region.base: region.base + region.size]

    def node_index(self, full_name: str) -> int:
        for n in self.nodes:
            if n.full_name == full_name:
                return n.index
        raise KeyError(full_name)

    def with_own_arena(self) -> "Model":
        """The same model on a copy of the arena: a debugger session and another run can then
        use the model side by side (weights stored outside the arena, q4 ones, are shared:
        nothing writes them)."""
        return replace(self, arena=self.arena.copy())

    @property
    def buffer_elements(self) -> int:
        return sum(r.size for r in self.buffer_regions())


def load_model(path: str | Path, *, fir_f32: bool = False, group: int = DEFAULT_GROUP,
               progress: Progress | None = None, memory_limit: int | None = None,
               q4_path: str = "packed", warm: bool = True) -> Model:
    """Load and check a model file; raise :class:`~firscope.errors.FirError` on any problem.

    ``q4_path="dequant"`` keeps an f32 copy of every q4 matrix and multiplies by it (the
    comparison path); the default multiplies by the packed int4 codes. ``warm``: load the
    compiled products' kernels (numba's import and cache) now, so that the first step does
    not; False leaves them to :func:`warm` (the UI's first stop waits for none of it)."""
    begin_watch()  # what other processes do while this loads decides the first token's threads
    parts = load_parts(path, fir_f32=fir_f32, group=group, progress=progress,
                       memory_limit=memory_limit, q4_path=q4_path, warm=warm)
    if warm:
        warm_gemv()  # the f32 head's kernels, loaded now rather than in the first step
    t_plan = time.perf_counter()
    kernels = assemble_kernels(parts.fir, parts.buffers, parts.weight_decls)
    nodes = unroll_plan(parts, kernels)
    check_lane_memory(nodes, kernels, parts.budget)
    plan_seconds = time.perf_counter() - t_plan
    model = _assemble(parts, kernels, nodes, plan_seconds)
    if progress is not None:
        progress("ready", 1.0)
    return model


def warm(model: Model) -> None:
    """Load the kernels a decode step of ``model`` calls outside its micro-kernels (the q4
    and f32 matrix-vector products): what ``load_model(warm=False)`` left for later."""
    q4 = [e for e in model.weights.values() if e.q4 is not None]
    if q4:
        warm_kernels(matvec=any(e.matrix is None for e in q4)).join()
    warm_gemv()


def _assemble(parts: ModelParts, kernels: Mapping[str, KernelCode],
              nodes: tuple[PlanNode, ...], plan_seconds: float) -> Model:
    regions = parts.layout.regions
    return Model(
        path=parts.path, fir=parts.fir, family=parts.header.family,
        config_path=parts.config.path, config=parts.config.data, symbols=parts.symbols,
        prefix=parts.header.prefix, layers=parts.repeats.layers, fir_f32=parts.fir_f32,
        group=parts.group, buffers=parts.buffers.decls, weight_decls=parts.weight_decls,
        regions=regions, weights=parts.weights, kernels=kernels, nodes=nodes, arena=parts.arena,
        inputs={key: regions[d.name] for key, d in parts.buffers.inputs.items()},
        outputs={key: regions[d.name] for key, d in parts.buffers.outputs.items()},
        timings={"parse": parts.timings["parse"], "weights": parts.timings["weights"],
                 "plan": plan_seconds, "total": parts.timings["total"] + plan_seconds},
        parts=parts)


def kernel_source(model: Model, k: S.Kernel) -> dict[int, str]:
    """Line number -> text of kernel ``k``'s lines (header to ``endkernel``) in the file it
    comes from: the model file's lines, or, for an edit (with_kernels), the edit's own as it
    was parsed (comments and blank lines between instructions come back empty)."""
    if k.loc.path == str(model.path) or not k.loc.text:
        lines = model.fir.lines
        return {ln: lines[ln - 1] if ln - 1 < len(lines) else ""
                for ln in range(k.loc.line, k.end.line + 1)}
    out = {ln: "" for ln in range(k.loc.line, k.end.line + 1)}
    out[k.loc.line] = k.loc.text
    for ins in k.body:
        out[ins.loc.line] = ins.loc.text
    out[k.end.line] = k.end.text or "endkernel"
    return out


def with_kernels(model: Model, kernels: Sequence[S.Kernel]) -> Model:
    """The same model with some kernels replaced by others of the same names (an edit: their
    positions are the edit's file's), on the same arena and weights: every node that
    dispatches one is bound again, so a signature its bindings cannot take is a FirError
    naming the node. Raises FirError for a name the model has no kernel of."""
    if model.parts is None:
        raise FirError("this model was not loaded by load_model: its kernels cannot be edited")
    new = {k.name.text: k for k in kernels}
    seen: dict[str, S.Kernel] = {}
    for k in kernels:
        name = k.name.text
        if name in seen:
            raise FirError(f"kernel '{name}' is given twice (first at line {seen[name].loc.line})",
                           k.name.loc)
        seen[name] = k
        if name not in model.kernels:
            known = sorted(model.kernels)
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else f" ({', '.join(known)})"
            raise FirError(f"the model has no kernel '{name}' to replace{hint}", k.name.loc)
    directives = tuple(new.get(d.name.text, d) if isinstance(d, S.Kernel) else d
                       for d in model.fir.directives)
    fir = replace(model.fir, directives=directives)
    parts = replace(model.parts, fir=fir)
    code = assemble_kernels(fir, parts.buffers, parts.weight_decls)
    nodes = unroll_plan(parts, code)
    check_lane_memory(nodes, code, parts.budget)
    return replace(model, fir=fir, kernels=code, nodes=nodes, parts=parts,
                   edited=tuple(sorted(set(model.edited) | set(new))))
