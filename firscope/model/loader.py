"""Syntax tree + config + checkpoint -> a loaded, checked :class:`Model`.

Everything that can be checked before running is checked here, with the
position of the directive at fault: config ``require`` lines, symbols,
buffer sizes, weight names and shapes, kernel text, node operands, and the
``size=``/``expect=`` contracts of every node (naming node, layer, sizes).
"""
from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import FirError, Loc
from ..fir import syntax as S
from ..fir.expr import Env, eval_int
from ..fir.parser import parse_file
from ..vm.assembler import NREGS, KernelCode, Program, Region, bind, check_kernel
from .checkpoint import Checkpoint
from .config import (config_matches, integer_symbols, load_config, parse_require_value,
                     show_json)
from .q4 import DEFAULT_GROUP, Q4_PATHS, Q4Matrix, Q4RangeError, quantize, warm_kernels

EXT_OPS = {
    # name: (number of args, number of outs, usage)
    "fir.embedding": (2, 1, "fir.embedding IDS TABLE -> OUT"),
    "fir.linear": (2, 1, "fir.linear X W -> Y"),
    "fir.linear_t": (2, 1, "fir.linear_t X W -> Y"),
}
INPUT_KEYS = ("token", "position")
OUTPUT_KEYS = ("logits",)
MAX_ELEMENTS = 1 << 40
# The unrolled plan costs ~330 bytes and ~80 us to bind per kernel instruction;
# these bound a hostile `repeat` (GPT-2 XL needs ~700 nodes, ~10k instructions).
MAX_PLAN_NODES = 50_000
MAX_PLAN_INSTRUCTIONS = 200_000
# Per dispatched lane: the R and U register files plus the engines' scratch.
LANE_BYTES = 2 * NREGS * 4 + 256


@dataclass(frozen=True)
class BufferDecl:
    name: str
    size: int
    per_layer: bool
    input_key: str | None
    output_key: str | None
    loc: Loc


@dataclass
class WeightEntry:
    """One weight instance (``qkvw@3``), however it is stored."""

    name: str  # display name
    decl: str  # name in the model file
    layer: int | None
    dtype: str  # declared dtype: f32 or q4
    tensor: str  # checkpoint tensor name actually used
    shape: tuple[int, ...]  # declared (checkpoint) shape
    loc: Loc
    region: Region | None = None  # arena placement (f32 weights)
    q4: Q4Matrix | None = None  # q4 weights: codes, scales, mins ([out, in])
    matrix: np.ndarray | None = None  # [out, in] f32: --fir-f32 copy, or q4 with q4_path="dequant"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def stored(self) -> str:
        if self.region is not None:
            return "arena f32"
        return "q4" if self.q4 is not None else "f32 [out,in]"

    @property
    def nbytes(self) -> int:
        if self.q4 is not None:
            return self.q4.nbytes
        return self.size * 4

    def dense(self) -> np.ndarray | None:
        """[out, in] f32 for a viewer: the stored matrix, or the q4 one dequantized on demand
        (kept until :meth:`Q4Matrix.drop_dense`); None for arena weights (view the arena)."""
        if self.matrix is not None:
            return self.matrix
        return self.q4.dense() if self.q4 is not None else None


@dataclass(frozen=True)
class Operand:
    """A node argument or output bound to a buffer instance or a weight."""

    name: str  # as written in the node
    display: str  # "key_cache@3"
    kind: str  # "buffer" or "weight"
    size: int
    region: Region | None
    weight: WeightEntry | None = None


@dataclass(frozen=True)
class PlanNode:
    index: int
    name: str
    layer: int | None
    kind: str  # "ext" or "micro"
    target: str  # ext op or kernel name
    args: tuple[Operand, ...]
    outs: tuple[Operand, ...]
    loc: Loc
    program: Program | None = None

    @property
    def full_name(self) -> str:
        return self.name if self.layer is None else f"{self.name}@{self.layer}"


@dataclass
class Model:
    path: Path
    fir: S.FirFile
    family: str
    config_path: Path
    config: dict
    symbols: dict[str, Fraction]
    prefix: str
    layers: int
    fir_f32: bool
    group: int
    buffers: dict[str, BufferDecl]
    regions: dict[str, Region]  # every arena region by display name
    weights: dict[str, WeightEntry]  # every weight instance by display name
    kernels: dict[str, KernelCode]
    nodes: list[PlanNode]
    arena: np.ndarray
    inputs: dict[str, Region]  # "token", "position"
    outputs: dict[str, Region]  # "logits"
    timings: dict[str, float] = field(default_factory=dict)

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

    def buffer_region(self, name: str, layer: int | None) -> Region:
        decl = self.buffers[name]
        return self.regions[name if not decl.per_layer else f"{name}@{layer}"]

    def view(self, region: Region) -> np.ndarray:
        return self.arena[region.base: region.base + region.size]

    def node_index(self, full_name: str) -> int:
        for n in self.nodes:
            if n.full_name == full_name:
                return n.index
        raise KeyError(full_name)

    @property
    def buffer_elements(self) -> int:
        return sum(r.size for n, r in self.regions.items() if n.split("@")[0] in self.buffers)


def _single(fir: S.FirFile, kind, what: str, required: bool):
    found = fir.of(kind)
    if len(found) > 1:
        raise FirError(f"'{what}' given more than once (first at line {found[0].loc.line})",
                       found[1].loc)
    if required and not found:
        raise FirError(f"missing '{what}' directive", Loc(fir.path, 1, 1,
                                                          fir.lines[0] if fir.lines else ""))
    return found[0] if found else None


def available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def load_model(path: str | Path, *, fir_f32: bool = False, group: int = DEFAULT_GROUP,
               progress: Callable[[str, float], None] | None = None,
               memory_limit: int | None = None, q4_path: str = "packed") -> Model:
    """Load and check a model file; raise :class:`FirError` on any problem.

    ``q4_path``: "packed" (q4 linears multiply by the packed codes) or "dequant"
    (each q4 matrix is also dequantized to f32 at load, ``WeightEntry.matrix``, and
    linears multiply by that f32 copy: the comparison path, 4 bytes per weight more).
    """
    t0 = time.perf_counter()
    if q4_path not in Q4_PATHS:
        raise FirError(f"unknown q4 path '{q4_path}' ({', '.join(Q4_PATHS)})")
    if not fir_f32:
        # numba's import and kernel load overlap parsing and reading
        warm_kernels(matvec=q4_path == "packed")
    path = Path(path)
    report = progress or (lambda what, frac: None)
    report("parse", 0.0)
    fir = parse_file(path)
    t_parse = time.perf_counter()

    _single(fir, S.Version, "fir", True)
    model_name = _single(fir, S.ModelName, "model", False)
    cfg_dir = _single(fir, S.ConfigPath, "config", True)
    _single(fir, S.RuntimeKind, "runtime", False)
    eps_dir = _single(fir, S.Epsilon, "epsilon", False)
    prefix_dir = _single(fir, S.Prefix, "prefix", False)

    config_path = path.parent / cfg_dir.path.text
    try:
        config = load_config(config_path)
    except FirError as e:
        if e.loc is not None:  # a position inside config.json
            raise
        # a missing or unusable file: the 'config' line that names it is where to look
        raise FirError(e.message, cfg_dir.path.loc, e.hint) from None
    symbols: dict[str, Fraction | float] = dict(integer_symbols(config))
    sym_origin = {k: "config.json" for k in symbols}
    if eps_dir is not None:
        key = eps_dir.key.text
        value = config.get(key)
        if isinstance(value, float) and not math.isfinite(value):  # 1e999 or NaN in the JSON
            raise FirError(f"epsilon: config key '{key}' must be a finite number, found "
                           f"{value}", eps_dir.key.loc)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FirError(f"epsilon: config key '{key}' must be a number, found "
                           f"{show_json(value) if key in config else 'nothing'}", eps_dir.key.loc)
        symbols["eps"] = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
        sym_origin["eps"] = f"epsilon at line {eps_dir.loc.line}"

    # Checks and symbols, in file order.
    for d in fir.directives:
        if isinstance(d, S.RequireConfig):
            key = d.key.text
            if key not in config:
                continue  # an absent key passes
            expected = parse_require_value(d.value.text)
            if not config_matches(expected, config[key]):
                raise FirError(f"config check failed: {key} must be {d.value.text}, "
                               f"{config_path.name} has {show_json(config[key])}", d.value.loc)
        elif isinstance(d, S.Sym):
            name = d.name.text
            if name in symbols or name in ("pi",):
                origin = sym_origin.get(name, "built in")
                raise FirError(f"symbol '{name}' is already defined ({origin})", d.name.loc)
            symbols[name] = eval_int(d.expr, Env(symbols), f"sym {name}")
            symbols[name] = Fraction(symbols[name])
            sym_origin[name] = f"line {d.loc.line}"
        elif isinstance(d, S.RequireSym):
            env = Env(symbols)
            from ..fir.expr import evaluate
            left, right = evaluate(d.left, env), evaluate(d.right, env)
            if left != right:
                raise FirError(f"require failed: left side is {_show(left)}, right side is "
                               f"{_show(right)}", d.loc)

    env = Env(symbols)
    repeats = fir.of(S.Repeat)
    counts = []
    for r in repeats:
        c = eval_int(r.count, env, "repeat count")
        if c < 0 or c > 100000:
            raise FirError(f"repeat count {c} is out of range", r.count.loc)
        counts.append(c)
    layers = max(counts) if counts else 0

    # Buffers.
    buffers: dict[str, BufferDecl] = {}
    inputs_decl: dict[str, BufferDecl] = {}
    outputs_decl: dict[str, BufferDecl] = {}
    for b in fir.of(S.Buf):
        name = b.name.text
        if name in buffers:
            raise FirError(f"buffer '{name}' is declared twice (first at line "
                           f"{buffers[name].loc.line})", b.name.loc)
        size = eval_int(b.size, env, f"size of buffer '{name}'")
        if size < 0 or size > MAX_ELEMENTS:
            raise FirError(f"buffer '{name}' has size {size}; a buffer holds 0 to "
                           f"{MAX_ELEMENTS} elements", b.size.loc)
        if b.per_layer and not repeats:
            raise FirError(f"buffer '{name}' is per_layer but the file has no 'repeat'", b.loc)
        inp = b.input_key.text if b.input_key else None
        out = b.output_key.text if b.output_key else None
        if inp is not None:
            if inp not in INPUT_KEYS:
                raise FirError(f"unknown input key '{inp}' (token, position)", b.input_key.loc)
            if inp in inputs_decl:
                raise FirError(f"two buffers are input:{inp}", b.input_key.loc)
            if b.per_layer or size < 1:
                raise FirError(f"input buffer '{name}' must hold at least 1 element and not be "
                               "per_layer", b.loc)
        if out is not None:
            if out not in OUTPUT_KEYS:
                raise FirError(f"unknown output key '{out}' (logits)", b.output_key.loc)
            if out in outputs_decl:
                raise FirError(f"two buffers are output:{out}", b.output_key.loc)
            if b.per_layer:
                raise FirError(f"output buffer '{name}' cannot be per_layer", b.loc)
        decl = BufferDecl(name, size, b.per_layer, inp, out, b.loc)
        buffers[name] = decl
        if inp:
            inputs_decl[inp] = decl
        if out:
            outputs_decl[out] = decl
    for key in INPUT_KEYS:
        if key not in inputs_decl:
            raise FirError(f"no buffer is marked input:{key}",
                           Loc(fir.path, 1, 1, fir.lines[0] if fir.lines else ""))
    if "logits" not in outputs_decl:
        raise FirError("no buffer is marked output:logits",
                       Loc(fir.path, 1, 1, fir.lines[0] if fir.lines else ""))

    # Weight declarations.
    wdecls: dict[str, tuple[S.Weight, tuple[int, ...]]] = {}
    for w in fir.of(S.Weight):
        name = w.name.text
        if name in wdecls or name in buffers:
            first = wdecls[name][0].loc.line if name in wdecls else buffers[name].loc.line
            raise FirError(f"name '{name}' is already declared at line {first}", w.name.loc)
        shape = tuple(eval_int(e, env, "dimension") for e in w.shape)
        for e, dim in zip(w.shape, shape):
            if dim < 1 or dim > MAX_ELEMENTS:
                raise FirError(f"dimension {dim} is out of range (1 to {MAX_ELEMENTS})", e.loc)
        if w.dtype.text == "q4" and len(shape) != 2:
            raise FirError(f"q4 weight '{name}' must be 2-D [input, output], declared {list(shape)}",
                           w.loc)
        if w.per_layer and not repeats:
            raise FirError(f"weight '{name}' uses {{i}} but the file has no 'repeat'",
                           w.source.loc)
        wdecls[name] = (w, shape)

    _check_plan_size(fir, counts)

    # Size everything before allocating anything.
    arena_elems = 0
    largest = (0, "", None)  # bytes, what, where: the error points at the biggest declaration
    for b in buffers.values():
        n = b.size * (layers if b.per_layer else 1)
        arena_elems += n
        largest = max(largest, (n * 4, f"buffer '{b.name}'", b.loc),
                      key=lambda t: t[0])
    q4_bytes = 0
    for w, shape in wdecls.values():
        n = math.prod(shape) * (layers if w.per_layer else 1)  # Python ints: no overflow
        if w.dtype.text == "f32":
            arena_elems += n
            nbytes = 4 * n
        else:
            # packed codes + scales/mins (+ the dequantized f32 copy on the dequant path)
            nbytes = n // 2 + 2 * 4 * (n // group + 1) + (4 * n if q4_path == "dequant" else 0)
            q4_bytes += nbytes
        largest = max(largest, (nbytes, f"weight '{w.name.text}'", w.loc), key=lambda t: t[0])
    need = arena_elems * 4 + q4_bytes
    limit = memory_limit if memory_limit is not None else available_memory()
    if limit is not None and need > limit:
        size, what, where = largest
        raise FirError(f"model needs {_mib(need)} (arena {_mib(arena_elems * 4)}, q4 weights "
                       f"{_mib(q4_bytes)}) but only {_mib(limit)} of memory is available; the "
                       f"largest is {what} with {_mib(size)}",
                       where or Loc(fir.path, 1, 1, fir.lines[0] if fir.lines else ""))

    # Arena layout: buffers (per-layer instances in layer order), then f32 weights.
    regions: dict[str, Region] = {}
    offset = 0
    for b in buffers.values():
        for layer in (range(layers) if b.per_layer else [None]):
            disp = b.name if layer is None else f"{b.name}@{layer}"
            regions[disp] = Region(disp, offset, b.size)
            offset += b.size
    weights: dict[str, WeightEntry] = {}
    for w, shape in wdecls.values():
        for layer in (range(layers) if w.per_layer else [None]):
            disp = w.name.text if layer is None else f"{w.name.text}@{layer}"
            entry = WeightEntry(disp, w.name.text, layer, w.dtype.text, "", shape, w.loc)
            if w.dtype.text == "f32":
                entry.region = Region(disp, offset, entry.size)
                regions[disp] = entry.region
                offset += entry.size
            weights[disp] = entry
    report("allocate", 0.05)
    try:
        arena = np.zeros(offset, dtype=np.float32)
    except MemoryError:
        raise FirError(f"cannot allocate the arena ({_mib(offset * 4)})") from None

    # Weights from the checkpoint.
    prefix = prefix_dir.prefix.text if prefix_dir else ""
    ckpt = Checkpoint(config_path.parent)
    jobs = []
    for entry in weights.values():
        w, shape = wdecls[entry.decl]
        source = w.source.text.replace("{i}", str(entry.layer)) if entry.layer is not None \
            else w.source.text
        if source in ckpt:
            tensor = source
        elif prefix and prefix + source in ckpt:
            tensor = prefix + source
        else:
            tried = f" (also tried '{prefix + source}')" if prefix else ""
            raise FirError(f"weight '{entry.name}': tensor '{source}' not found in "
                           f"{ckpt.folder.name}/model.safetensors{tried}", w.source.loc)
        info = ckpt.info(tensor)
        if info.shape != shape:
            raise FirError(f"weight '{entry.name}': tensor '{tensor}' has shape {list(info.shape)}, "
                           f"the model file declares {list(shape)}", w.shape[0].loc if w.shape
                           else w.loc)
        entry.tensor = tensor
        jobs.append(entry)

    def load_one(entry: WeightEntry):
        data = ckpt.read(entry.tensor)
        if entry.region is not None:
            arena[entry.region.base: entry.region.base + entry.size] = data.reshape(-1)
            if not np.isfinite(arena[entry.region.base: entry.region.base + entry.size]).all():
                return entry
        else:
            t = np.ascontiguousarray(data.T)  # Conv1D [in, out] -> [out, in]
            if not np.isfinite(t).all():
                return entry
            if fir_f32:
                entry.matrix = t
            else:
                try:
                    entry.q4 = quantize(t, group)
                except Q4RangeError as e:
                    raise FirError(f"weight '{entry.name}': tensor '{entry.tensor}' {e} (load it "
                                   "as f32 with --fir-f32)", entry.loc) from None
                if q4_path == "dequant":
                    entry.matrix = entry.q4.dequantize()
        return None

    t_w = time.perf_counter()
    done = 0
    workers = min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for bad in pool.map(load_one, jobs):
            done += 1
            report("weights", 0.05 + 0.85 * done / max(len(jobs), 1))
            if bad is not None:
                raise FirError(f"weight '{bad.name}': tensor '{bad.tensor}' contains NaN or Inf",
                               bad.loc)
    t_weights = time.perf_counter()

    # Kernels.
    def is_named(name: str) -> bool:
        return name in buffers or (name in wdecls and wdecls[name][0].dtype.text == "f32")

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

    # Nodes, unrolled.
    inputs = {key: regions[d.name] for key, d in inputs_decl.items()}
    outputs = {key: regions[d.name] for key, d in outputs_decl.items()}
    model = Model(path, fir, model_name.name.text if model_name else "model", config_path, config,
                  symbols, prefix, layers, fir_f32, group, buffers, regions, weights, kernels, [],
                  arena, inputs, outputs)
    nodes: list[PlanNode] = []
    for d in fir.directives:
        if isinstance(d, S.Node):
            nodes.append(_plan_node(model, d, None, len(nodes), wdecls))
        elif isinstance(d, S.Repeat):
            count = eval_int(d.count, env)
            for layer in range(count):
                for n in d.body:
                    nodes.append(_plan_node(model, n, layer, len(nodes), wdecls))
    if not nodes:
        raise FirError("the model file has no nodes", Loc(fir.path, len(fir.lines) or 1, 1))
    # The dispatch with the most lanes allocates registers per lane when it runs.
    widest = max((n for n in nodes if n.kind == "micro"), key=lambda n: n.program.threads,
                 default=None)
    if widest is not None and limit is not None:
        lane_bytes = widest.program.threads * LANE_BYTES
        if need + lane_bytes > limit:
            k = model.kernels[widest.target].syntax
            raise FirError(f"node {widest.full_name}: kernel '{widest.target}' dispatches "
                           f"{widest.program.threads} threads, whose registers need "
                           f"{_mib(lane_bytes)}; with the model's {_mib(need)} that exceeds the "
                           f"{_mib(limit)} of memory available", k.threads.loc)
    model.nodes = nodes
    t_end = time.perf_counter()
    model.timings = {"parse": t_parse - t0, "weights": t_weights - t_w,
                     "plan": t_end - t_weights, "total": t_end - t0}
    report("ready", 1.0)
    return model


def _check_plan_size(fir: S.FirFile, counts: list[int]) -> None:
    """Refuse a plan too big to unroll, before unrolling it (or allocating anything)."""
    kernel_len: dict[str, int] = {}
    for k in fir.of(S.Kernel):
        kernel_len.setdefault(k.name.text, len(k.body))

    def cost(n: S.Node) -> int:
        return kernel_len.get(n.target.text, 0) if n.kind.text == "micro" else 0

    nodes = instructions = 0
    biggest, biggest_size = None, -1
    repeat_counts = iter(counts)  # one per Repeat, in file order
    for d in fir.directives:
        if isinstance(d, S.Node):
            nodes += 1
            instructions += cost(d)
        elif isinstance(d, S.Repeat):
            c = next(repeat_counts)
            body = c * len(d.body)
            nodes += body
            instructions += c * sum(cost(n) for n in d.body)
            if body > biggest_size:
                biggest, biggest_size = d, body
    if nodes > MAX_PLAN_NODES or instructions > MAX_PLAN_INSTRUCTIONS:
        loc = biggest.count.loc if biggest is not None else Loc(
            fir.path, 1, 1, fir.lines[0] if fir.lines else "")
        raise FirError(f"the model unrolls to {nodes} nodes with {instructions} kernel "
                       f"instructions; firscope plans at most {MAX_PLAN_NODES} nodes and "
                       f"{MAX_PLAN_INSTRUCTIONS} instructions", loc)


def _check_operand_name(tok: S.Tok, k: S.Kernel) -> None:
    import re
    m = re.match(r"(in|out)(\d+)$", tok.text)
    if not m or int(m.group(2)) >= (k.n_in if m.group(1) == "in" else k.n_out):
        raise FirError(f"'{tok.text}' is not an operand of kernel '{k.name.text}' "
                       f"(in0..in{k.n_in - 1}, out0..out{k.n_out - 1})", tok.loc)


def _resolve(model: Model, tok: S.Tok, layer: int | None, wdecls, node_name: str) -> Operand:
    name = tok.text
    if name in model.buffers:
        decl = model.buffers[name]
        if decl.per_layer and layer is None:
            raise FirError(f"node {node_name}: per_layer buffer '{name}' used outside 'repeat'",
                           tok.loc)
        r = model.buffer_region(name, layer)
        return Operand(name, r.name, "buffer", r.size, r)
    if name in wdecls:
        w, _ = wdecls[name]
        if w.per_layer and layer is None:
            raise FirError(f"node {node_name}: per-layer weight '{name}' used outside 'repeat'",
                           tok.loc)
        entry = model.weights[name if not w.per_layer else f"{name}@{layer}"]
        return Operand(name, entry.name, "weight", entry.size, entry.region, entry)
    raise FirError(f"node {node_name}: undefined buffer or weight '{name}'", tok.loc)


def _plan_node(model: Model, d: S.Node, layer: int | None, index: int, wdecls) -> PlanNode:
    full = d.name.text if layer is None else f"{d.name.text}@{layer}"
    args = tuple(_resolve(model, t, layer, wdecls, full) for t in d.args)
    outs = tuple(_resolve(model, t, layer, wdecls, full) for t in d.outs)
    for tok, o in zip(d.outs, outs):
        if o.kind == "weight":
            raise FirError(f"node {full}: output '{tok.text}' is a weight; outputs must be buffers",
                           tok.loc)
    where = f"node {full}" + (f" (layer {layer})" if layer is not None else "")
    if d.kind.text == "ext":
        op = d.target.text
        if op not in EXT_OPS:
            raise FirError(f"unknown ext op '{op}' (known: {', '.join(EXT_OPS)})", d.target.loc)
        n_args, n_outs, usage = EXT_OPS[op]
        if len(args) != n_args or len(outs) != n_outs:
            raise FirError(f"{where}: {op} takes {n_args} inputs and {n_outs} output "
                           f"(`{usage}`), found {len(args)} and {len(outs)}", d.target.loc)
        _check_ext(op, d, args, outs, where)
        return PlanNode(index, d.name.text, layer, "ext", op, args, outs, d.loc)
    kname = d.target.text
    code = model.kernels.get(kname)
    if code is None:
        raise FirError(f"{where}: undefined kernel '{kname}'", d.target.loc)
    k = code.syntax
    if len(args) != k.n_in or len(outs) != k.n_out:
        raise FirError(f"{where}: kernel '{kname}' takes in={k.n_in} out={k.n_out}, the node "
                       f"gives {len(args)} inputs and {len(outs)} outputs", d.target.loc)
    bound: dict[str, Operand] = {}
    for i, o in enumerate(args):
        bound[f"in{i}"] = o
    for i, o in enumerate(outs):
        bound[f"out{i}"] = o
    for name, o in bound.items():
        if o.region is None:
            raise FirError(f"{where}: '{o.name}' is a {o.weight.dtype} weight stored outside the "
                           "arena; only fir.linear can read it", d.loc)
    env = Env(model.symbols, {n: o.size for n, o in bound.items()})
    if k.size_groups:
        first = k.size_groups[0].text
        for tok in k.size_groups[1:]:
            if bound[tok.text].size != bound[first].size:
                raise FirError(f"{where}: kernel '{kname}' needs size {first} = {tok.text}, but "
                               f"{first} is '{bound[first].display}' ({bound[first].size}) and "
                               f"{tok.text} is '{bound[tok.text].display}' "
                               f"({bound[tok.text].size})", d.loc)
    for tok, ex in k.expects:
        want = eval_int(ex, env, f"expect {tok.text}")
        if bound[tok.text].size != want:
            raise FirError(f"{where}: kernel '{kname}' expects {tok.text} to have {want} elements, "
                           f"'{bound[tok.text].display}' has {bound[tok.text].size}", d.loc)
    program = bind(code, symbols=model.symbols,
                   operands={n: o.region for n, o in bound.items()},
                   resolve_buffer=lambda name: _named_region(model, name, layer, full, d.loc),
                   node=full, layer=layer, node_loc=d.loc)
    return PlanNode(index, d.name.text, layer, "micro", kname, args, outs, d.loc, program)


def _named_region(model: Model, name: str, layer, full: str, loc: Loc) -> Region:
    if name in model.buffers:
        if model.buffers[name].per_layer and layer is None:
            raise FirError(f"node {full}: kernel uses per_layer buffer '@{name}' outside "
                           "'repeat'", loc)
        return model.buffer_region(name, layer)
    disp = name if name in model.weights else f"{name}@{layer}"
    entry = model.weights.get(disp)
    if entry is None or entry.region is None:
        raise FirError(f"node {full}: '@{name}' is not an arena buffer", loc)
    return entry.region


def _check_ext(op: str, d: S.Node, args, outs, where: str) -> None:
    x, w = args
    y = outs[0]
    if x.region is None:  # only the weight operand may live outside the arena
        raise FirError(f"{where}: {op} reads '{x.name}' from the arena, but it is a "
                       f"{x.weight.dtype} weight stored outside it", d.args[0].loc)
    if op == "fir.embedding":
        if w.kind != "weight" or len(w.weight.shape) != 2:
            raise FirError(f"{where}: fir.embedding table '{w.name}' must be a 2-D weight",
                           d.args[1].loc)
        if w.weight.region is None:
            raise FirError(f"{where}: fir.embedding table '{w.name}' must be an f32 weight",
                           d.args[1].loc)
        if x.size < 1:
            raise FirError(f"{where}: fir.embedding ids '{x.name}' is empty", d.args[0].loc)
        if y.size != w.weight.shape[1]:
            raise FirError(f"{where}: fir.embedding output '{y.display}' has {y.size} elements, "
                           f"a row of '{w.display}' has {w.weight.shape[1]}", d.outs[0].loc)
        return
    if w.kind != "weight" or len(w.weight.shape) != 2:
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


def _show(v) -> str:
    if isinstance(v, Fraction):
        return str(v.numerator) if v.denominator == 1 else f"{v} ({float(v):g})"
    return repr(v)


def _mib(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.1f} MiB"
