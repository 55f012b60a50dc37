"""The declaration phases of loading: header, symbols, repeats, buffers, weights.

Each phase is a function of the parsed file (and the results of the phases
before it) returning a frozen record, and raises a located :class:`FirError`
for the first problem it finds. None of them reads a checkpoint or touches
memory beyond the declarations, so each can be run alone, e.g. the buffer
phase on a parsed file with a hand-made symbol table.

Order (each needs the ones before): :func:`read_header` ->
:func:`~firscope.model.config.read_config` -> :func:`define_symbols` ->
:func:`count_repeats` -> :func:`declare_buffers` -> :func:`declare_weights`
-> :func:`check_plan_size`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Mapping

from ..errors import FirError, Loc
from ..fir import syntax as S
from ..fir.expr import Env, SymbolTable, eval_int, evaluate
from .config import (ConfigFile, config_matches, integer_symbols, non_integer_keys,
                     parse_require_value, show_json)

INPUT_KEYS = ("token", "position")
OUTPUT_KEYS = ("logits",)
MAX_ELEMENTS = 1 << 40
MAX_REPEAT = 100_000
# The unrolled plan costs ~330 bytes and ~80 us to bind per kernel instruction;
# these bound a hostile `repeat` (GPT-2 XL needs ~700 nodes, ~10k instructions).
MAX_PLAN_NODES = 50_000
MAX_PLAN_INSTRUCTIONS = 200_000


def file_start(fir: S.FirFile) -> Loc:
    """Where an error about the whole file points: its first line."""
    return Loc(fir.path, 1, 1, fir.lines[0] if fir.lines else "")


# -- header --------------------------------------------------------------------------
@dataclass(frozen=True)
class Header:
    family: str  # the 'model' line, "model" without one
    config: S.Tok  # the 'config' line's path, relative to the .fir file's folder
    epsilon: S.Epsilon | None
    prefix: str  # tried before a tensor name missing from the checkpoint


def _single(fir: S.FirFile, kind, what: str, required: bool):
    found = fir.of(kind)
    if len(found) > 1:
        raise FirError(f"'{what}' given more than once (first at line {found[0].loc.line})",
                       found[1].loc)
    if required and not found:
        raise FirError(f"missing '{what}' directive", file_start(fir))
    return found[0] if found else None


def read_header(fir: S.FirFile) -> Header:
    _single(fir, S.Version, "fir", True)
    model_name = _single(fir, S.ModelName, "model", False)
    config = _single(fir, S.ConfigPath, "config", True)
    _single(fir, S.RuntimeKind, "runtime", False)
    epsilon = _single(fir, S.Epsilon, "epsilon", False)
    prefix = _single(fir, S.Prefix, "prefix", False)
    return Header(model_name.name.text if model_name else "model", config.path, epsilon,
                  prefix.prefix.text if prefix else "")


# -- symbols and checks, in file order -------------------------------------------------
def define_symbols(fir: S.FirFile, header: Header, config: ConfigFile) -> SymbolTable:
    """Config integers, ``eps``, then ``sym`` lines; ``require`` lines checked on the way."""
    values: dict[str, Fraction | float] = dict(integer_symbols(config.data))
    origins = {k: "config.json" for k in values}
    table = SymbolTable(values, origins, non_integer_keys(config.data, config.path.name))
    if header.epsilon is not None:
        values["eps"] = _epsilon(header.epsilon, config.data)
        origins["eps"] = f"epsilon at line {header.epsilon.loc.line}"
    for d in fir.directives:
        if isinstance(d, S.RequireConfig):
            _require_config(d, config)
        elif isinstance(d, S.Sym):
            name = d.name.text
            if name in values or name in ("pi",):
                raise FirError(f"symbol '{name}' is already defined ({table.origin(name)})",
                               d.name.loc)
            values[name] = Fraction(eval_int(d.expr, Env(table), f"sym {name}"))
            origins[name] = f"line {d.loc.line}"
        elif isinstance(d, S.RequireSym):
            env = Env(table)
            left, right = evaluate(d.left, env), evaluate(d.right, env)
            if left != right:
                raise FirError(f"require failed: left side is {_show(left)}, right side is "
                               f"{_show(right)}", d.loc)
    return SymbolTable(MappingProxyType(values), MappingProxyType(origins),
                       table.not_symbols)


def _epsilon(d: S.Epsilon, config: Mapping) -> Fraction:
    key = d.key.text
    value = config.get(key)
    if isinstance(value, float) and not math.isfinite(value):  # 1e999 or NaN in the JSON
        raise FirError(f"epsilon: config key '{key}' must be a finite number, found "
                       f"{value}", d.key.loc)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FirError(f"epsilon: config key '{key}' must be a number, found "
                       f"{show_json(value) if key in config else 'nothing'}", d.key.loc)
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def _require_config(d: S.RequireConfig, config: ConfigFile) -> None:
    key = d.key.text
    if key not in config.data:
        return  # an absent key passes
    found = config.data[key]
    if not config_matches(parse_require_value(d.value.text), found):
        raise FirError(f"config check failed: {key} must be {d.value.text}, "
                       f"{config.path.name} has {show_json(found)}", d.value.loc)


def _show(v) -> str:
    if isinstance(v, Fraction):
        return str(v.numerator) if v.denominator == 1 else f"{v} ({float(v):g})"
    return repr(v)


# -- repeats -------------------------------------------------------------------------
@dataclass(frozen=True)
class Repeats:
    counts: tuple[int, ...]  # one per 'repeat', in file order

    @property
    def layers(self) -> int:
        """Instances of a per-layer buffer or weight: the longest repeat."""
        return max(self.counts, default=0)

    @property
    def any(self) -> bool:
        return bool(self.counts)


def count_repeats(fir: S.FirFile, symbols: Mapping) -> Repeats:
    env = Env(symbols)
    counts = []
    for r in fir.of(S.Repeat):
        c = eval_int(r.count, env, "repeat count")
        if c < 0 or c > MAX_REPEAT:
            raise FirError(f"repeat count {c} is out of range", r.count.loc)
        counts.append(c)
    return Repeats(tuple(counts))


def check_plan_size(fir: S.FirFile, repeats: Repeats) -> None:
    """Refuse a plan too big to unroll, before unrolling it (or allocating anything)."""
    kernel_len: dict[str, int] = {}
    for k in fir.of(S.Kernel):
        kernel_len.setdefault(k.name.text, len(k.body))

    def cost(n: S.Node) -> int:
        return kernel_len.get(n.target.text, 0) if n.kind.text == S.NodeKind.MICRO else 0

    nodes = instructions = 0
    biggest, biggest_size = None, -1
    repeat_counts = iter(repeats.counts)  # one per Repeat, in file order
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
        loc = biggest.count.loc if biggest is not None else file_start(fir)
        raise FirError(f"the model unrolls to {nodes} nodes with {instructions} kernel "
                       f"instructions; firscope plans at most {MAX_PLAN_NODES} nodes and "
                       f"{MAX_PLAN_INSTRUCTIONS} instructions", loc)


# -- buffers -------------------------------------------------------------------------
@dataclass(frozen=True)
class BufferDecl:
    name: str
    size: int
    per_layer: bool
    input_key: str | None
    output_key: str | None
    loc: Loc


@dataclass(frozen=True)
class Buffers:
    decls: Mapping[str, BufferDecl]  # in file order
    inputs: Mapping[str, BufferDecl]  # "token", "position"
    outputs: Mapping[str, BufferDecl]  # "logits"


def declare_buffers(fir: S.FirFile, symbols: Mapping, repeats: Repeats) -> Buffers:
    env = Env(symbols)
    decls: dict[str, BufferDecl] = {}
    inputs: dict[str, BufferDecl] = {}
    outputs: dict[str, BufferDecl] = {}
    for b in fir.of(S.Buf):
        name = b.name.text
        if name in decls:
            raise FirError(f"buffer '{name}' is declared twice (first at line "
                           f"{decls[name].loc.line})", b.name.loc)
        size = eval_int(b.size, env, f"size of buffer '{name}'")
        if size < 0 or size > MAX_ELEMENTS:
            raise FirError(f"buffer '{name}' has size {size}; a buffer holds 0 to "
                           f"{MAX_ELEMENTS} elements", b.size.loc)
        if b.per_layer and not repeats.any:
            raise FirError(f"buffer '{name}' is per_layer but the file has no 'repeat'", b.loc)
        decl = BufferDecl(name, size, b.per_layer, b.input_key.text if b.input_key else None,
                          b.output_key.text if b.output_key else None, b.loc)
        for direction, tok, known, marked in (("input", b.input_key, INPUT_KEYS, inputs),
                                              ("output", b.output_key, OUTPUT_KEYS, outputs)):
            if tok is not None:
                _check_io(b, decl, direction, tok, known, marked)
                marked[tok.text] = decl
        decls[name] = decl
    for key in INPUT_KEYS:
        if key not in inputs:
            raise FirError(f"no buffer is marked input:{key}", file_start(fir))
    if "logits" not in outputs:
        raise FirError("no buffer is marked output:logits", file_start(fir))
    return Buffers(MappingProxyType(decls), MappingProxyType(inputs), MappingProxyType(outputs))


def _check_io(b: S.Buf, decl: BufferDecl, direction: str, tok: S.Tok, known: tuple,
              marked: Mapping) -> None:
    """An ``input:KEY``/``output:KEY`` flag: a known key, on one buffer, of a usable shape."""
    if tok.text not in known:
        raise FirError(f"unknown {direction} key '{tok.text}' ({', '.join(known)})", tok.loc)
    if tok.text in marked:
        raise FirError(f"two buffers are {direction}:{tok.text}", tok.loc)
    if direction == "input" and (decl.per_layer or decl.size < 1):
        raise FirError(f"input buffer '{decl.name}' must hold at least 1 element and not be "
                       "per_layer", b.loc)
    if direction == "output" and decl.per_layer:
        raise FirError(f"output buffer '{decl.name}' cannot be per_layer", b.loc)


# -- weights -------------------------------------------------------------------------
@dataclass(frozen=True)
class WeightDecl:
    """A ``weight`` line with its shape evaluated."""

    name: str
    dtype: str  # "f32" or "q4": how the line declares every instance but its exceptions
    shape: tuple[int, ...]  # declared (checkpoint) shape
    syntax: S.Weight
    group: int | None = None  # q4:gN's N; None: the --group default
    # ``except 0,11:f32 4-6:q4:g16``: layer -> (dtype, group) for the layers that differ
    overrides: Mapping[int, tuple[str, int | None]] = field(
        default_factory=lambda: MappingProxyType({}))

    def precision(self, layer: int | None) -> tuple[str, int | None]:
        """(dtype, group) of one instance: "f32" or "q4", and q4's group (None: --group)."""
        if layer is not None and layer in self.overrides:
            return self.overrides[layer]
        return self.dtype, self.group

    def dtype_at(self, layer: int | None, default_group: int | None = None) -> str:
        """One instance's dtype as a .fir line spells it: f32, q4 or q4:gN (q4 with the
        ``default_group`` given spelled q4)."""
        kind, group = self.precision(layer)
        return precision_text(kind, group, default_group)

    @property
    def per_layer(self) -> bool:
        return self.syntax.per_layer

    @property
    def loc(self) -> Loc:
        return self.syntax.loc

    @property
    def in_arena(self) -> bool:
        """f32 weights live in the arena (kernels read them); q4 ones beside it."""
        return self.dtype == "f32"

    def source(self, layer: int | None) -> str:
        """The checkpoint tensor name of one instance (``h.{i}.ln_1.weight`` -> ``h.3...``)."""
        text = self.syntax.source.text
        return text.replace("{i}", str(layer)) if layer is not None else text


def declare_weights(fir: S.FirFile, symbols: Mapping, repeats: Repeats,
                    buffers: Buffers) -> Mapping[str, WeightDecl]:
    env = Env(symbols)
    decls: dict[str, WeightDecl] = {}
    for w in fir.of(S.Weight):
        name = w.name.text
        if name in decls or name in buffers.decls:
            first = decls[name].loc.line if name in decls else buffers.decls[name].loc.line
            raise FirError(f"name '{name}' is already declared at line {first}", w.name.loc)
        shape = tuple(eval_int(e, env, "dimension") for e in w.shape)
        for e, dim in zip(w.shape, shape):
            if dim < 1 or dim > MAX_ELEMENTS:
                raise FirError(f"dimension {dim} is out of range (1 to {MAX_ELEMENTS})", e.loc)
        if w.dtype.text == "q4" and len(shape) != 2:
            raise FirError(f"q4 weight '{name}' must be 2-D [input, output], declared "
                           f"{list(shape)}", w.loc)
        if w.per_layer and not repeats.any:
            raise FirError(f"weight '{name}' uses {{i}} but the file has no 'repeat'",
                           w.source.loc)
        kind, group = S.weight_dtype(w.dtype.text)
        overrides = _overrides(w, kind, repeats.layers)
        decls[name] = WeightDecl(name, kind, shape, w, group, overrides)
    return MappingProxyType(decls)


def precision_text(kind: str, group: int | None, default_group: int | None = None) -> str:
    """("q4", 16) -> ``q4:g16``; ("q4", None) or the default group -> ``q4``; ``f32``."""
    if kind == "q4" and group is not None and group != default_group:
        return f"q4:g{group}"
    return kind


def _overrides(w: S.Weight, kind: str, layers: int) -> Mapping[int, tuple[str, int | None]]:
    """The ``except`` clause as layer -> (dtype, group), every layer checked."""
    if not w.exceptions:
        return MappingProxyType({})
    first = w.exceptions[0].layers[0].loc
    if kind != "q4":
        raise FirError(f"weight '{w.name.text}' is f32: only q4 weights take another dtype per "
                       "layer (f32 weights live in the arena, where kernels read them)", first)
    if not w.per_layer:
        raise FirError(f"weight '{w.name.text}' has one instance: 'except' needs a per-layer "
                       "weight (a source with {i})", first)
    out: dict[int, tuple[str, int | None]] = {}
    where: dict[int, Loc] = {}
    for group in w.exceptions:
        precision = S.weight_dtype(group.dtype.text)
        for span in group.layers:
            if span.last >= layers:
                bad = span.first if span.first >= layers else span.last
                raise FirError(f"layer {bad} is out of range: the file repeats {layers} layers "
                               f"(0..{layers - 1})", span.loc)
            for layer in range(span.first, span.last + 1):
                if layer in out:
                    raise FirError(f"layer {layer} is given a dtype twice (first at column "
                                   f"{where[layer].col})", span.loc)
                out[layer] = precision
                where[layer] = span.loc
    return MappingProxyType(dict(sorted(out.items())))
