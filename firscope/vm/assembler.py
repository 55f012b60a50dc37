"""Kernel text -> checked code -> a program bound to one node's operands.

Two stages, because a kernel is checked once when the model loads but its
constants (``in0.size``) and addresses (``@in0``, per-layer ``@buffer``)
depend on the node that dispatches it:

* :func:`check_kernel` validates mnemonics, operand counts and kinds,
  register numbers, and ``forbegin``/``ifbegin`` nesting. It yields a
  :class:`KernelCode` of :class:`StaticOp` rows with expressions unevaluated.
* :func:`bind` evaluates every expression for one node and resolves every
  address to ``(base, extent, offset)`` in the arena, giving a
  :class:`Program` the interpreter and the compiled path execute.
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
from .isa import NREGS, Operand, OpSpec
from .opcodes import CLOSER, OPCODES, OPENER

MAX_THREADS = 1 << 24  # lanes in one dispatch; R and U files are 256 bytes per lane

_ADDR = re.compile(r"@([A-Za-z_][A-Za-z0-9_]*)")
_OPERAND = re.compile(r"(in|out)(\d+)$")
_REGNUM = re.compile(r"-?[0-9]{1,9}")


@dataclass(frozen=True)
class AddrRef:
    target: str  # "in0", "out2" or a buffer name
    offset: Expr | None
    loc: Loc | None = None  # the operand as written, for errors found at bind


@dataclass(frozen=True)
class StaticOp:
    pc: int
    spec: OpSpec
    operands: tuple  # ints for registers, Expr for K/F, AddrRef for A
    loc: Loc
    text: str  # the instruction as written, for display
    match: int | None  # pc of the matching forbegin/forend/ifbegin/ifend
    depth: int  # block nesting depth (for indentation in the UI)


@dataclass(frozen=True)
class KernelCode:
    name: str
    syntax: S.Kernel
    ops: tuple[StaticOp, ...]

    @property
    def n_in(self) -> int:
        return self.syntax.n_in

    @property
    def n_out(self) -> int:
        return self.syntax.n_out

    def operand_names(self) -> list[str]:
        return [f"in{i}" for i in range(self.n_in)] + [f"out{i}" for i in range(self.n_out)]


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
class Op:
    """A :class:`StaticOp` with its operands bound for one node: ``args`` holds ints for
    registers and K, np.float32 for F, :class:`Address` for A. Everything else is the
    static op's, shared by every node that dispatches the kernel."""

    static: StaticOp
    args: tuple

    @property
    def pc(self) -> int:
        return self.static.pc

    @property
    def spec(self) -> OpSpec:
        return self.static.spec

    @property
    def loc(self) -> Loc:
        return self.static.loc

    @property
    def text(self) -> str:
        return self.static.text

    @property
    def match(self) -> int | None:
        return self.static.match

    @property
    def depth(self) -> int:
        return self.static.depth

    @property
    def line(self) -> int:
        return self.static.loc.line


@dataclass(frozen=True)
class Program:
    kernel: KernelCode
    node: str  # full node name, "attention@3"
    layer: int | None
    threads: int
    ops: tuple[Op, ...]
    operands: tuple[tuple[str, Region], ...]  # in0.. out0.. bindings

    @property
    def name(self) -> str:
        return self.kernel.name

    def written_regions(self) -> list[Region]:
        """Every region a store in this program can touch (for undo logs)."""
        seen: dict[str, Region] = {}
        for op in self.ops:
            if op.spec.stores:
                r = op.args[op.spec.mem.address].region
                seen[r.name] = r
        return list(seen.values())

    def constants_key(self) -> tuple:
        """Everything the compiled code depends on except region bases."""
        return tuple(OPERAND_KINDS[kind].key(a) for op in self.ops
                     for kind, a in zip(op.spec.operands, op.args))

    def registers(self) -> set[tuple[str, int]]:
        """(file, number) of every register an operand names, read or written."""
        return {(kind.register_file, a) for op in self.ops
                for kind, a in zip(op.spec.operands, op.args) if kind.register_file is not None}


# --- what each operand kind is, from text to disassembly ---------------------------------
@dataclass(frozen=True)
class _Checking:
    """What checking one operand's text needs: the kernel, and which buffers exist."""

    kernel: S.Kernel
    is_buffer: Callable[[str], bool]


@dataclass(frozen=True)
class _Binding:
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


def _check_register(kind: Operand, tok: S.Tok, checking: _Checking) -> int:
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


def _check_expression(kind: Operand, tok: S.Tok, checking: _Checking) -> Expr:
    return parse_expr(tok.text, tok.loc)


def _check_address(kind: Operand, tok: S.Tok, checking: _Checking) -> AddrRef:
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


def _bind_register(n: int, binding: _Binding) -> int:
    return n


def _bind_uint32(expr: Expr, binding: _Binding) -> int:
    v = _node_int(expr, binding.env, "integer constant", binding.node)
    if not -(1 << 31) <= v < (1 << 32):
        raise FirError(f"constant {v} does not fit in 32 bits", expr.loc)
    return v & 0xFFFFFFFF


def _bind_f32(expr: Expr, binding: _Binding) -> np.float32:
    try:
        return eval_f32(expr, binding.env)
    except FirError as e:
        raise FirError(f"{e.message} (for node {binding.node})", e.loc) from None


# An index register holds 0..2^32-1, so an offset below this reaches no element.
MIN_OFFSET = -(1 << 32) + 1


def _bind_address(ref: AddrRef, binding: _Binding) -> Address:
    """Place ``@target+offset`` for one node. An offset with which no index register value
    reaches inside the region is an error here, at the operand: such an access could only
    fault, and an offset past int64 would not even fit the engines' index arithmetic."""
    region = binding.operands.get(ref.target) or binding.resolve_buffer(ref.target)
    off = 0
    if ref.offset is not None:
        off = _node_int(ref.offset, binding.env, "address offset", binding.node)
    highest = max(region.size - 1, 0)
    if not MIN_OFFSET <= off <= highest:
        raise FirError(f"address offset {off} puts every access through @{ref.target} outside "
                       f"{region.name}[0:{region.size}] (an offset must be {MIN_OFFSET}.."
                       f"{highest}) (for node {binding.node})", ref.loc or ref.offset.loc)
    return Address(ref.target, region, off)


def _node_int(expr, env, what, node):
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


# --- the two stages ----------------------------------------------------------------------
def check_kernel(k: S.Kernel, is_buffer: Callable[[str], bool]) -> KernelCode:
    """Check a kernel's text once; ``is_buffer`` says whether ``@NAME`` exists. Errors come
    in the order of the text: an instruction's mnemonic, its operands, then its block."""
    checking = _Checking(k, is_buffer)
    rows = []  # (spec, operands, loc, text, depth) per pc
    stack: list[tuple[OpSpec, int, Loc]] = []  # open blocks: opener, its pc, its place
    matches: dict[int, int] = {}  # pc of each opener's closer and back
    for pc, ins in enumerate(k.body):
        m = ins.mnemonic
        spec = _spec_of(ins, k)
        operands = tuple(OPERAND_KINDS[kind].check(kind, tok, checking)
                         for kind, tok in zip(spec.operands, ins.operands))
        depth = len(stack)
        if spec.opens is not None:
            stack.append((spec, pc, m.loc))
        elif spec.closes is not None:
            opener = _close_block(stack, spec, m.loc)
            matches[pc], matches[opener] = opener, pc
            depth = len(stack)
        rows.append((spec, operands, m.loc, " ".join([m.text] + [t.text for t in ins.operands]),
                     depth))
    if stack:
        opener, _, loc = stack[-1]
        raise FirError(f"'{opener.mnemonic}' without a matching '{CLOSER[opener.opens]}' "
                       "before 'endkernel'", loc)
    ops = tuple(StaticOp(pc, spec, operands, loc, text, matches.get(pc), depth)
                for pc, (spec, operands, loc, text, depth) in enumerate(rows))
    return KernelCode(k.name.text, k, ops)


def _spec_of(ins: S.Instr, k: S.Kernel) -> OpSpec:
    """The row of an instruction's mnemonic, with its operand count checked."""
    m = ins.mnemonic
    spec = OPCODES.get(m.text)
    if spec is None:
        near = [n for n in OPCODES if n[:3] == m.text[:3]]
        hint = f"did you mean {', '.join(near)}?" if near else None
        raise FirError(f"unknown instruction '{m.text}' in kernel '{k.name.text}'", m.loc, hint)
    want = len(spec.operands)
    if len(ins.operands) != want:
        where = ins.operands[want].loc if len(ins.operands) > want else m.loc
        raise FirError(f"'{m.text}' takes {want} operand{'s' if want != 1 else ''} "
                       f"(`{spec.usage}`), found {len(ins.operands)}", where)
    return spec


def _close_block(stack: list, closer: OpSpec, loc: Loc) -> int:
    """Pop the innermost open block for ``closer``; return the opener's pc."""
    if not stack:
        raise FirError(f"'{closer.mnemonic}' without a matching '{OPENER[closer.closes]}'", loc)
    opener, open_pc, open_loc = stack.pop()
    if opener.opens != closer.closes:
        raise FirError(f"'{closer.mnemonic}' closes the '{opener.mnemonic}' opened at line "
                       f"{open_loc.line}; expected '{CLOSER[opener.opens]}'", loc)
    return open_pc


def bind(code: KernelCode, *, symbols: Mapping, operands: Mapping[str, Region],
         resolve_buffer: Callable[[str], Region], node: str, layer: int | None) -> Program:
    """Resolve a kernel for one node: evaluate constants, place addresses."""
    sizes = {name: r.size for name, r in operands.items()}
    binding = _Binding(Env(symbols, sizes), node, operands, resolve_buffer)
    k = code.syntax
    threads = _node_int(k.threads, binding.env, "threads", node)
    if threads < 0 or threads > MAX_THREADS:
        raise FirError(f"node {node}: kernel '{code.name}' dispatches {threads} threads "
                       f"(allowed 0..{MAX_THREADS})", k.threads.loc)
    ops = tuple(Op(so, tuple(OPERAND_KINDS[kind].bind(operand, binding)
                             for kind, operand in zip(so.spec.operands, so.operands)))
                for so in code.ops)
    bound = tuple((name, operands[name]) for name in code.operand_names())
    return Program(code, node, layer, threads, ops, bound)


def disassemble(program: Program) -> list[str]:
    """One line per op with resolved operands, for the UI and for debugging."""
    out = []
    for op in program.ops:
        parts = [OPERAND_KINDS[kind].show(kind, a) for kind, a in zip(op.spec.operands, op.args)]
        out.append(f"{op.pc:4d}  {'  ' * op.depth}{op.spec.mnemonic} {' '.join(parts)}")
    return out
