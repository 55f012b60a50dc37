"""The syntax tree of a .fir file: frozen records, each knowing its position."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..errors import Loc
from .expr import Expr


class NodeKind(StrEnum):
    """What a graph node runs (the second word of a ``node`` line)."""

    EXT = "ext"  # an op built into the runtime (runtime/extops.py)
    MICRO = "micro"  # a kernel of the model file, dispatched over lanes


@dataclass(frozen=True)
class Tok:
    text: str
    loc: Loc


@dataclass(frozen=True)
class Directive:
    loc: Loc  # the directive keyword


@dataclass(frozen=True)
class Version(Directive):
    version: Tok


@dataclass(frozen=True)
class ModelName(Directive):
    name: Tok


@dataclass(frozen=True)
class ConfigPath(Directive):
    path: Tok


@dataclass(frozen=True)
class RuntimeKind(Directive):
    kind: Tok


@dataclass(frozen=True)
class Epsilon(Directive):
    key: Tok


@dataclass(frozen=True)
class Prefix(Directive):
    prefix: Tok


@dataclass(frozen=True)
class RequireConfig(Directive):
    key: Tok
    value: Tok


@dataclass(frozen=True)
class RequireSym(Directive):
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Sym(Directive):
    name: Tok
    expr: Expr


@dataclass(frozen=True)
class Buf(Directive):
    name: Tok
    dtype: Tok
    size: Expr
    per_layer: bool
    input_key: Tok | None
    output_key: Tok | None


MAX_Q4_GROUP = 4096


def weight_dtype(text: str) -> tuple[str, int | None] | None:
    """``f32`` -> ("f32", None), ``q4`` -> ("q4", None: the --group default), ``q4:g16`` ->
    ("q4", 16); None for anything else (a group outside 2..MAX_Q4_GROUP too)."""
    if text in ("f32", "q4"):
        return text, None
    if text.startswith("q4:g") and text[4:].isascii() and text[4:].isdigit():
        group = int(text[4:])
        if 2 <= group <= MAX_Q4_GROUP and not text[4:].startswith("0"):
            return "q4", group
    return None


@dataclass(frozen=True)
class LayerSpan:
    """``4-6`` (or ``11``) in an ``except`` clause: layers first..last, where it was written."""

    first: int
    last: int
    loc: Loc


@dataclass(frozen=True)
class WeightException:
    """One group of an ``except`` clause, ``0,11:f32``: these layers take this dtype."""

    layers: tuple[LayerSpan, ...]
    dtype: Tok  # f32, q4 or q4:gN


@dataclass(frozen=True)
class Weight(Directive):
    name: Tok
    dtype: Tok  # f32, q4 or q4:gN
    source: Tok
    shape: tuple[Expr, ...]
    exceptions: tuple[WeightException, ...] = ()  # ``except 0,11:f32 4-6:q4:g16``

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.source.text


@dataclass(frozen=True)
class Instr:
    mnemonic: Tok
    operands: tuple[Tok, ...]

    @property
    def loc(self) -> Loc:
        return self.mnemonic.loc


@dataclass(frozen=True)
class Kernel(Directive):
    name: Tok
    n_in: int
    n_out: int
    size_groups: tuple[Tok, ...]  # operands that must have equal element counts
    threads: Expr
    tg: Expr
    tgbytes: Expr
    expects: tuple[tuple[Tok, Expr], ...]
    body: tuple[Instr, ...]
    end: Loc


@dataclass(frozen=True)
class Node(Directive):
    name: Tok
    kind: Tok  # a NodeKind value
    target: Tok  # ext op name or kernel name
    args: tuple[Tok, ...]
    outs: tuple[Tok, ...]


@dataclass(frozen=True)
class Repeat(Directive):
    count: Expr
    body: tuple[Node, ...]
    end: Loc


@dataclass(frozen=True)
class FirFile:
    path: str
    lines: tuple[str, ...]
    directives: tuple[Directive, ...]

    def of(self, kind):
        return [d for d in self.directives if isinstance(d, kind)]
