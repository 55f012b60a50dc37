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

from dataclasses import dataclass
from typing import Callable, Mapping

from ..errors import FirError, Loc
from ..fir import syntax as S
from ..fir.expr import Env
from ..model.layout import Region
from .isa import NREGS, OpSpec
from .opcodes import CLOSER, OPCODES, OPENER
from .operands import OPERAND_KINDS, Address, Binding, Checking, node_int

# NREGS and Address are imported from here by the layers below.
__all__ = ["NREGS", "Address", "KernelCode", "MAX_THREADS", "Op", "Program", "StaticOp", "bind",
           "check_kernel", "disassemble"]

MAX_THREADS = 1 << 24  # lanes in one dispatch; R and U files are 256 bytes per lane


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


# --- the two stages ----------------------------------------------------------------------
def check_kernel(k: S.Kernel, is_buffer: Callable[[str], bool]) -> KernelCode:
    """Check a kernel's text once; ``is_buffer`` says whether ``@NAME`` exists. Errors come
    in the order of the text: an instruction's mnemonic, its operands, then its block."""
    checking = Checking(k, is_buffer)
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
    binding = Binding(Env(symbols, sizes), node, operands, resolve_buffer)
    k = code.syntax
    threads = node_int(k.threads, binding.env, "threads", node)
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
