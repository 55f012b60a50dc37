"""The instruction set as data: one :class:`~firscope.vm.isa.OpSpec` row per mnemonic.

The row drives everything: the assembler checks operand kinds and block
nesting from it, the step interpreter runs its ``interp`` handler
(lane-vectorized NumPy, vm/handlers), the compiled engine's code generator
writes per-lane code with its ``render`` callable (vm/codegen), the lane
analysis uses its ``lanes`` transfer (vm/lanes), the debugger learns which
registers an instruction reads and writes, and the profiler groups
instructions by ``category``. A new opcode is one row here, one entry in each
further backend's table of renderers (vm/wgsl.RENDERERS), and its tests
(docs/extending.md); the generic handlers, renderers and transfers cover plain
arithmetic, so most rows need no new function anywhere.
"""
from __future__ import annotations

import numpy as np

from . import codegen as G
from . import handlers as H
from . import lanes as L
from .isa import AccessKind, Category, FrameKind, MemAccess, Operand, OpSpec

ALU, MEM, CONST, CTRL = Category.ALU, Category.MEM, Category.CONST, Category.CTRL
FOR, IF = FrameKind.FOR, FrameKind.IF
# arena[address + U[index]] <-> R[value], with the operand order of `d u @addr` / `s u @addr`
LOAD = MemAccess(AccessKind.LOAD, address=2, index=1, value=0)
STORE = MemAccess(AccessKind.STORE, address=2, index=1, value=0)


def _row(mnemonic: str, operands: str, names: str, category: Category, summary: str, *,
         interp, render, lanes=None, opens=None, closes=None, mem=None, sfu=False) -> OpSpec:
    return OpSpec(mnemonic, tuple(Operand(k) for k in operands.split()), tuple(names.split()),
                  category, summary, interp, render, lanes, opens, closes, mem, sfu)


# Templates are per-lane Python for vm/codegen: Rn/Un are the lane's registers (f32 and
# int64 locals), {i} is operand i (a register number, a constant's name, an address
# slot), ONE/ZERO are f32 constants, M32 masks uint32 wrap-around; exp_f32/sigmoid_f32
# are model/numeric_kernels' (the reference's definitions, which the interpreter's
# handlers call too), so both engines round alike on every CPU.
_ROWS = [
    _row("rtou", "Ud Rs", "d s", ALU, "U[d] = uint(R[s]) (truncate)",
         interp=H.rtou, render=G.rtou, lanes=L.rtou),
    _row("uconst", "Ud K", "d k", CONST, "U[d] = k",
         interp=H.const("Ur"), render=G.template("U{0} = {1}"), lanes=L.u_const),
    _row("uaddk", "Ud Us K", "d s k", ALU, "U[d] = U[s] + k",
         interp=H.u_binary_k(np.add), render=G.template("U{0} = (U{1} + {2}) & M32"),
         lanes=L.u_add_k),
    _row("umulk", "Ud Us K", "d s k", ALU, "U[d] = U[s] * k",
         interp=H.u_binary_k(np.multiply), render=G.template("U{0} = (U{1} * {2}) & M32"),
         lanes=L.u_mul_k),
    _row("uadd", "Ud Us Us", "d a b", ALU, "U[d] = U[a] + U[b]",
         interp=H.binary(np.add, "Ur"), render=G.template("U{0} = (U{1} + U{2}) & M32"),
         lanes=L.u_add),
    _row("uloadf32", "Rd Us A", "d u @addr", MEM, "R[d] = arena[addr + U[u]]",
         interp=H.load, render=G.access, lanes=L.access, mem=LOAD),
    _row("ustoref32", "Rs Us A", "s u @addr", MEM, "arena[addr + U[u]] = R[s]",
         interp=H.store, render=G.access, lanes=L.access, mem=STORE),
    _row("loadconstf32", "Rd F", "d c", CONST, "R[d] = c",
         interp=H.const("Rr"), render=G.template("R{0} = {1}"), lanes=L.r_const),
    _row("add", "Rd Rs Rs", "d a b", ALU, "R[d] = R[a] + R[b]",
         interp=H.binary(np.add), render=G.template("R{0} = R{1} + R{2}")),
    _row("sub", "Rd Rs Rs", "d a b", ALU, "R[d] = R[a] - R[b]",
         interp=H.binary(np.subtract), render=G.template("R{0} = R{1} - R{2}")),
    _row("mul", "Rd Rs Rs", "d a b", ALU, "R[d] = R[a] * R[b]",
         interp=H.binary(np.multiply), render=G.template("R{0} = R{1} * R{2}")),
    _row("div", "Rd Rs Rs", "d a b", ALU, "R[d] = R[a] / R[b]",
         interp=H.binary(np.divide), render=G.template("R{0} = R{1} / R{2}")),
    _row("mulconst", "Rd Rs F", "d a c", ALU, "R[d] = R[a] * c",
         interp=H.const_binary(np.multiply), render=G.template("R{0} = R{1} * {2}"),
         lanes=L.r_const_arith(np.multiply)),
    _row("addconst", "Rd Rs F", "d a c", ALU, "R[d] = R[a] + c",
         interp=H.const_binary(np.add), render=G.template("R{0} = R{1} + {2}"),
         lanes=L.r_const_arith(np.add)),
    _row("sigmoid", "Rd Rs", "d a", ALU, "R[d] = 1 / (1 + exp(-R[a]))",
         interp=H.unary(H.sigmoid_into), render=G.template("R{0} = sigmoid_f32(R{1})"),
         sfu=True),
    _row("exp", "Rd Rs", "d a", ALU, "R[d] = exp(R[a])",
         interp=H.unary(H.exp_into), render=G.template("R{0} = exp_f32(R{1})"),
         sfu=True),
    _row("rsqrt", "Rd Rs", "d a", ALU, "R[d] = 1 / sqrt(R[a])",
         interp=H.unary(H.rsqrt_into), render=G.template("R{0} = ONE / np.sqrt(R{1})"),
         sfu=True),
    _row("cmplt", "Rd Rs Rs", "d a b", ALU, "R[d] = 1.0 if R[a] < R[b] else 0.0",
         interp=H.compare(np.less), render=G.template("R{0} = ONE if R{1} < R{2} else ZERO")),
    _row("forbegin", "Rs", "c", CTRL, "run the body floor(R[c]) times",
         interp=H.for_begin, render=G.for_header, lanes=L.for_block, opens=FOR),
    _row("forend", "", "", CTRL, "end of the innermost forbegin",
         interp=H.for_end, render=G.nothing, closes=FOR),
    _row("ifbegin", "Rs", "c", CTRL, "run the body where R[c] != 0",
         interp=H.if_begin, render=G.if_header, lanes=L.if_block, opens=IF),
    _row("ifend", "", "", CTRL, "end of the innermost ifbegin",
         interp=H.if_end, render=G.nothing, closes=IF),
]

OPCODES: dict[str, OpSpec] = {row.mnemonic: row for row in _ROWS}

# The mnemonics that open and close each kind of block (for the assembler's messages).
OPENER: dict[FrameKind, str] = {r.opens: r.mnemonic for r in _ROWS if r.opens is not None}
CLOSER: dict[FrameKind, str] = {r.closes: r.mnemonic for r in _ROWS if r.closes is not None}

# Re-exported: the f32 functions both engines share.
exp_f32, sigmoid_f32 = H.exp_f32, H.sigmoid_f32
