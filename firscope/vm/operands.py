"""Operand kinds as data: one :class:`OperandKind` row per kind of isa.Operand.

Each row says what the kind is at every stage: how its text is checked
(vm/assembler.check_kernel), how it is bound for one node (vm/assembler.bind),
what it contributes to a program's constants key, how the disassembler writes
it, and which method of a code generator (vm/render.Renderer) writes it as a
renderer's template sees it. The values: a register number (Rd Rs Ud Us), an
unevaluated :class:`~firscope.fir.expr.Expr` then an int (K) or np.float32
(F), an :class:`AddrRef` then an :class:`Address` (A).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from ..errors import FirError, Loc
from ..fir import syntax as S
from ..fir.expr import Env, Expr, eval_f32, eval_int, parse_expr
from ..model.layout import Region
from .isa import NREGS, Operand

_ADDR = re.compile(r"@([A-Za-z_][A-Za-z0-9_]*)")
_OPERAND = re.compile(r"(in|out)(\d+)$")
_REGNUM = re.compile(r"-?[0-9]{1,9}")


@dataclass(frozen=True)
class AddrRef:
    target: str  # "in0", "out2" or a buffer name
    offset: Expr | None
    loc: Loc | None = None  # the operand as written, for errors found at bind


@dataclass(frozen=True)
class Address:
    operand: str  # as written: "in2", "scores"
    region: Region
    offset: int

    @property
    def base(self) -> int:
        return self.region.base

    @property
    def extent(self) -> int:
        return self.region.size

    def __str__(self) -> str:
        off = f"{self.offset:+d}" if self.offset else ""
        return f"@{self.operand}{off}"


@dataclass(frozen=True)
class Checking:
    """What checking one operand's text needs: the kernel, and which buffers exist."""

    kernel: S.Kernel
    is_buffer: Callable[[str], bool]


@dataclass(frozen=True)
class Binding:
    """What binding one operand for a node needs."""

    env: Env
    node: str
    operands: Mapping[str, Region]
    resolve_buffer: Callable[[str], Region]


@dataclass(frozen=True)
class OperandKind:
    """One kind of operand (isa.Operand) through every stage, a row of :data:`OPERAND_KINDS`:

    * ``check(kind, tok, checking)``: the operand as written -> its static value (a
      register number, an unevaluated Expr, an :class:`AddrRef`), or a located FirError;
    * ``bind(value, binding)``: the static value -> the node's (int, np.float32, Address);
    * ``key(arg)``: the bound value as :meth:`Program.constants_key` sees it;
    * ``show(kind, arg)``: the bound value as :func:`disassemble` writes it;
    * ``text``: the name of the code generators' method (vm/render.Renderer) that writes
      the bound value as a renderer's template sees it (a number, a slot's name).
    """

    check: Callable
    bind: Callable
    key: Callable
    show: Callable
    text: str


def _check_register(kind: Operand, tok: S.Tok, checking: Checking) -> int:
    file, text = kind.register_file, tok.text
    # ASCII digits only: str.isdigit() accepts "²", which int() refuses
    if text[:1] in ("R", "U", "r", "u") and _REGNUM.fullmatch(text[1:]):
        if text[0].upper() != file:
            raise FirError(f"expected a {file} register, found {text}", tok.loc)
        text = text[1:]
    if not _REGNUM.fullmatch(text):
        raise FirError(f"expected a register number 0..{NREGS - 1}, found {tok.text!r}",
                       tok.loc)
    n = int(text)
    if not 0 <= n < NREGS:
        raise FirError(f"register {file}{n} is outside 0..{NREGS - 1}", tok.loc)
    return n


def _check_expression(kind: Operand, tok: S.Tok, checking: Checking) -> Expr:
    return parse_expr(tok.text, tok.loc)


def _check_address(kind: Operand, tok: S.Tok, checking: Checking) -> AddrRef:
    k = checking.kernel
    m = _ADDR.match(tok.text)
    if not m:
        raise FirError(f"expected an address like @in0, @out1 or @buffer, found {tok.text!r}",
                       tok.loc)
    target = m.group(1)
    om = _OPERAND.match(target)
    if om:
        limit = k.n_in if om.group(1) == "in" else k.n_out
        if int(om.group(2)) >= limit:
            raise FirError(f"kernel '{k.name.text}' has {limit} '{om.group(1)}' operand"
                           f"{'s' if limit != 1 else ''}; '@{target}' does not exist", tok.loc)
    elif not checking.is_buffer(target):
        raise FirError(f"undefined buffer '@{target}'", tok.loc)
    rest = tok.text[m.end():]
    offset = None
    if rest:
        if rest[0] not in "+-":
            raise FirError(f"expected '+' or '-' after @{target}", tok.loc.shifted(m.end()))
        # "+2*hidden" parses as the unary/binary expression 0+2*hidden
        offset = parse_expr("0" + rest, tok.loc.shifted(m.end() - 1))
    return AddrRef(target, offset, tok.loc)


def _bind_register(n: int, binding: Binding) -> int:
    return n


def _bind_uint32(expr: Expr, binding: Binding) -> int:
    v = node_int(expr, binding.env, "integer constant", binding.node)
    if not -(1 << 31) <= v < (1 << 32):
        raise FirError(f"constant {v} does not fit in 32 bits", expr.loc)
    return v & 0xFFFFFFFF


def _bind_f32(expr: Expr, binding: Binding) -> np.float32:
    try:
        return eval_f32(expr, binding.env)
    except FirError as e:
        raise FirError(f"{e.message} (for node {binding.node})", e.loc) from None


# An index register holds 0..2^32-1, so an offset below this reaches no element.
MIN_OFFSET = -(1 << 32) + 1


def _bind_address(ref: AddrRef, binding: Binding) -> Address:
    """Place ``@target+offset`` for one node. An offset with which no index register value
    reaches inside the region is an error here, at the operand: such an access could only
    fault, and an offset past int64 would not even fit the engines' index arithmetic."""
    region = binding.operands.get(ref.target) or binding.resolve_buffer(ref.target)
    off = 0
    if ref.offset is not None:
        off = node_int(ref.offset, binding.env, "address offset", binding.node)
    highest = max(region.size - 1, 0)
    if not MIN_OFFSET <= off <= highest:
        raise FirError(f"address offset {off} puts every access through @{ref.target} outside "
                       f"{region.name}[0:{region.size}] (an offset must be {MIN_OFFSET}.."
                       f"{highest}) (for node {binding.node})", ref.loc or ref.offset.loc)
    return Address(ref.target, region, off)


def node_int(expr, env, what, node):
    try:
        return eval_int(expr, env, what)
    except FirError as e:
        raise FirError(f"{e.message} (for node {node})", e.loc) from None


def _same(arg):
    return arg


def _f32_bits(arg: np.float32) -> tuple:
    return ("F", int(arg.view(np.uint32)))


def _address_key(arg: Address) -> tuple:
    return ("A", arg.operand, arg.offset, arg.extent)


def _show_register(kind: Operand, n: int) -> str:
    return f"{kind.register_file}{n}"


def _show_uint32(kind: Operand, v: int) -> str:
    return str(v)


def _show_f32(kind: Operand, v: np.float32) -> str:
    return repr(float(v))


def _show_address(kind: Operand, a: Address) -> str:
    return f"{a}=[{a.region.name}+{a.offset}]"


_REGISTER = OperandKind(_check_register, _bind_register, _same, _show_register, "register_text")
OPERAND_KINDS: dict[Operand, OperandKind] = {
    Operand.RD: _REGISTER, Operand.RS: _REGISTER, Operand.UD: _REGISTER, Operand.US: _REGISTER,
    Operand.K: OperandKind(_check_expression, _bind_uint32, _same, _show_uint32, "uint32_text"),
    Operand.F: OperandKind(_check_expression, _bind_f32, _f32_bits, _show_f32, "f32_text"),
    Operand.A: OperandKind(_check_address, _bind_address, _address_key, _show_address,
                           "address_text"),
}
