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
from ..fir.expr import Env, Expr, eval_f32, eval_int, parse_expr, uses_operand_size
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
    pc: int
    spec: OpSpec
    args: tuple  # ints, np.float32, Address
    loc: Loc
    text: str
    match: int | None
    depth: int

    @property
    def line(self) -> int:
        return self.loc.line


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
        out = []
        for op in self.ops:
            for a in op.args:
                if isinstance(a, Address):
                    out.append(("A", a.operand, a.offset, a.extent))
                elif isinstance(a, np.float32):
                    out.append(("F", int(a.view(np.uint32))))
                else:
                    out.append(a)
        return tuple(out)


def check_kernel(k: S.Kernel, is_buffer: Callable[[str], bool]) -> KernelCode:
    """Check a kernel's text once; ``is_buffer`` says whether ``@NAME`` exists."""
    ops: list[StaticOp] = []
    stack: list[tuple[OpSpec, int, Loc]] = []  # open blocks: opener, its pc, its place
    pending_match: dict[int, int] = {}
    for pc, ins in enumerate(k.body):
        m = ins.mnemonic
        spec = _spec_of(ins, k)
        operands = tuple(_static_operand(kind, tok, k, is_buffer)
                         for kind, tok in zip(spec.operands, ins.operands))
        depth = len(stack)
        match = None
        if spec.opens is not None:
            stack.append((spec, pc, m.loc))
        elif spec.closes is not None:
            match = _close_block(stack, spec, m.loc)
            pending_match[match] = pc
            depth = len(stack)
        text = " ".join([m.text] + [t.text for t in ins.operands])
        ops.append(StaticOp(pc, spec, operands, m.loc, text, match, depth))
    if stack:
        opener, _, loc = stack[-1]
        raise FirError(f"'{opener.mnemonic}' without a matching '{CLOSER[opener.opens]}' "
                       "before 'endkernel'", loc)
    ops = [StaticOp(o.pc, o.spec, o.operands, o.loc, o.text, pending_match.get(o.pc, o.match),
                    o.depth) for o in ops]
    return KernelCode(k.name.text, k, tuple(ops))


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


def _static_operand(kind: str, tok: S.Tok, k: S.Kernel, is_buffer):
    file = kind.register_file
    if file is not None:
        text = tok.text
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
    if kind in (Operand.K, Operand.F):
        return parse_expr(tok.text, tok.loc)
    if kind is Operand.A:
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
        elif not is_buffer(target):
            raise FirError(f"undefined buffer '@{target}'", tok.loc)
        rest = tok.text[m.end():]
        offset = None
        if rest:
            if rest[0] not in "+-":
                raise FirError(f"expected '+' or '-' after @{target}", tok.loc.shifted(m.end()))
            # "+2*hidden" parses as the unary/binary expression 0+2*hidden
            offset = parse_expr("0" + rest, tok.loc.shifted(m.end() - 1))
        return AddrRef(target, offset, tok.loc)
    raise AssertionError(kind)  # pragma: no cover


def kernel_threads_need_sizes(code: KernelCode) -> bool:
    return uses_operand_size(code.syntax.threads)


def bind(code: KernelCode, *, symbols: Mapping, operands: Mapping[str, Region],
         resolve_buffer: Callable[[str], Region], node: str, layer: int | None,
         node_loc: Loc | None = None) -> Program:
    """Resolve a kernel for one node: evaluate constants, place addresses."""
    sizes = {name: r.size for name, r in operands.items()}
    env = Env(symbols, sizes)
    k = code.syntax
    threads = _node_int(k.threads, env, "threads", node, node_loc)
    if threads < 0 or threads > MAX_THREADS:
        raise FirError(f"node {node}: kernel '{code.name}' dispatches {threads} threads "
                       f"(allowed 0..{MAX_THREADS})", k.threads.loc)
    ops = []
    for so in code.ops:
        args = []
        for kind, operand in zip(so.spec.operands, so.operands):
            if kind is Operand.K:
                v = _node_int(operand, env, "integer constant", node, node_loc)
                if not -(1 << 31) <= v < (1 << 32):
                    raise FirError(f"constant {v} does not fit in 32 bits", operand.loc)
                args.append(v & 0xFFFFFFFF)
            elif kind is Operand.F:
                args.append(_node_f32(operand, env, node, node_loc))
            elif kind is Operand.A:
                args.append(_bind_address(operand, operands, resolve_buffer, env, node, node_loc))
            else:
                args.append(operand)
        ops.append(Op(so.pc, so.spec, tuple(args), so.loc, so.text, so.match, so.depth))
    bound = tuple((name, operands[name]) for name in code.operand_names())
    return Program(code, node, layer, threads, tuple(ops), bound)


# An index register holds 0..2^32-1, so an offset below this reaches no element.
MIN_OFFSET = -(1 << 32) + 1


def _bind_address(ref: AddrRef, operands: Mapping[str, Region], resolve_buffer, env, node,
                  node_loc) -> Address:
    """Place ``@target+offset`` for one node. An offset with which no index register value
    reaches inside the region is an error here, at the operand: such an access could only
    fault, and an offset past int64 would not even fit the engines' index arithmetic."""
    region = operands.get(ref.target) or resolve_buffer(ref.target)
    off = 0
    if ref.offset is not None:
        off = _node_int(ref.offset, env, "address offset", node, node_loc)
    highest = max(region.size - 1, 0)
    if not MIN_OFFSET <= off <= highest:
        raise FirError(f"address offset {off} puts every access through @{ref.target} outside "
                       f"{region.name}[0:{region.size}] (an offset must be {MIN_OFFSET}.."
                       f"{highest}) (for node {node})", ref.loc or ref.offset.loc)
    return Address(ref.target, region, off)


def _node_int(expr, env, what, node, node_loc):
    try:
        return eval_int(expr, env, what)
    except FirError as e:
        raise FirError(f"{e.message} (for node {node})", e.loc) from None


def _node_f32(expr, env, node, node_loc):
    try:
        return eval_f32(expr, env)
    except FirError as e:
        raise FirError(f"{e.message} (for node {node})", e.loc) from None


def disassemble(program: Program) -> list[str]:
    """One line per op with resolved operands, for the UI and for debugging."""
    out = []
    for op in program.ops:
        parts = []
        for kind, a in zip(op.spec.operands, op.args):
            if kind.register_file is not None:
                parts.append(f"{kind.register_file}{a}")
            elif kind is Operand.A:
                parts.append(f"{a}=[{a.region.name}+{a.offset}]")
            else:
                parts.append(repr(float(a)) if isinstance(a, np.float32) else str(a))
        out.append(f"{op.pc:4d}  {'  ' * op.depth}{op.spec.mnemonic} {' '.join(parts)}")
    return out
