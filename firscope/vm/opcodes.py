"""The instruction set as data: one :class:`~firscope.vm.isa.OpSpec` row per mnemonic.

The row drives everything: the assembler checks operand kinds and block
nesting from it, the step interpreter runs its ``interp`` handler
(lane-vectorized NumPy, vm/handlers), the lane analysis uses its ``lanes``
transfer (vm/lanes), the debugger learns which registers an instruction reads
and writes, and the profiler groups instructions by ``category``. Each code
generator keeps its own table of renderers keyed by mnemonic, as tinygrad keeps
one per backend: vm/codegen.RENDERERS (numba: per-lane Python) and
vm/wgsl.RENDERERS (WGSL); tests check both cover every row. A new opcode is one
row here, one entry in each backend's table, and its tests
(docs/extending.md); the generic handlers, renderers and transfers cover plain
arithmetic, so most rows need no new function anywhere.
"""
from __future__ import annotations

import numpy as np

from . import handlers as H
from . import lanes as L
from .isa import AccessKind, Category, FrameKind, MemAccess, Operand, OpSpec

ALU, MEM, CONST, CTRL = Category.ALU, Category.MEM, Category.CONST, Category.CTRL
FOR, IF = FrameKind.FOR, FrameKind.IF
# arena[address + U[index]] <-> R[value], with the operand order of `d u @addr` / `s u @addr`
LOAD = MemAccess(AccessKind.LOAD, address=2, index=1, value=0)
STORE = MemAccess(AccessKind.STORE, address=2, index=1, value=0)


def _row(mnemonic: str, operands: str, names: str, category: Category, summary: str, *,
         interp, lanes=None, opens=None, closes=None, mem=None, sfu=False) -> OpSpec:
    return OpSpec(mnemonic, tuple(Operand(k) for k in operands.split()), tuple(names.split()),
                  category, summary, interp, lanes, opens, closes, mem, sfu)


_ROWS = [
    _row("rtou", "Ud Rs", "d s", ALU, "U[d] = uint(R[s]) (truncate)",
         interp=H.rtou, lanes=L.rtou),
    _row("uconst", "Ud K", "d k", CONST, "U[d] = k",
         interp=H.const("Ur"), lanes=L.u_const),
    _row("uaddk", "Ud Us K", "d s k", ALU, "U[d] = U[s] + k",
         interp=H.u_binary_k(np.add), lanes=L.u_add_k),
    _row("umulk", "Ud Us K", "d s k", ALU, "U[d] = U[s] * k",
         interp=H.u_binary_k(np.multiply), lanes=L.u_mul_k),
    _row("uadd", "Ud Us Us", "d a b", ALU, "U[d] = U[a] + U[b]",
         interp=H.binary(np.add, "Ur"), lanes=L.u_add),
    _row("uloadf32", "Rd Us A", "d u @addr", MEM, "R[d] = arena[addr + U[u]]",
         interp=H.load, lanes=L.access, mem=LOAD),
    _row("ustoref32", "Rs Us A", "s u @addr", MEM, "arena[addr + U[u]] = R[s]",
         interp=H.store, lanes=L.access, mem=STORE),
    _row("loadconstf32", "Rd F", "d c", CONST, "R[d] = c",
         interp=H.const("Rr"), lanes=L.r_const),
    _row("add", "Rd Rs Rs", "d a b", ALU, "R[d] = R[a] + R[b]",
         interp=H.binary(np.add)),
    _row("sub", "Rd Rs Rs", "d a b", ALU, "R[d] = R[a] - R[b]",
         interp=H.binary(np.subtract)),
    _row("mul", "Rd Rs Rs", "d a b", ALU, "R[d] = R[a] * R[b]",
         interp=H.binary(np.multiply)),
    _row("div", "Rd Rs Rs", "d a b", ALU, "R[d] = R[a] / R[b]",
         interp=H.binary(np.divide)),
    _row("mulconst", "Rd Rs F", "d a c", ALU, "R[d] = R[a] * c",
         interp=H.const_binary(np.multiply), lanes=L.r_const_arith(np.multiply)),
    _row("addconst", "Rd Rs F", "d a c", ALU, "R[d] = R[a] + c",
         interp=H.const_binary(np.add), lanes=L.r_const_arith(np.add)),
    _row("sigmoid", "Rd Rs", "d a", ALU, "R[d] = 1 / (1 + exp(-R[a]))",
         interp=H.unary(H.sigmoid_into), sfu=True),
    _row("exp", "Rd Rs", "d a", ALU, "R[d] = exp(R[a])",
         interp=H.unary(H.exp_into), sfu=True),
    _row("rsqrt", "Rd Rs", "d a", ALU, "R[d] = 1 / sqrt(R[a])",
         interp=H.unary(H.rsqrt_into), sfu=True),
    _row("cmplt", "Rd Rs Rs", "d a b", ALU, "R[d] = 1.0 if R[a] < R[b] else 0.0",
         interp=H.compare(np.less)),
    _row("forbegin", "Rs", "c", CTRL, "run the body floor(R[c]) times",
         interp=H.for_begin, lanes=L.for_block, opens=FOR),
    _row("forend", "", "", CTRL, "end of the innermost forbegin",
         interp=H.for_end, closes=FOR),
    _row("ifbegin", "Rs", "c", CTRL, "run the body where R[c] != 0",
         interp=H.if_begin, lanes=L.if_block, opens=IF),
    _row("ifend", "", "", CTRL, "end of the innermost ifbegin",
         interp=H.if_end, closes=IF),
]

OPCODES: dict[str, OpSpec] = {row.mnemonic: row for row in _ROWS}

# The mnemonics that open and close each kind of block (for the assembler's messages).
OPENER: dict[FrameKind, str] = {r.opens: r.mnemonic for r in _ROWS if r.opens is not None}
CLOSER: dict[FrameKind, str] = {r.closes: r.mnemonic for r in _ROWS if r.closes is not None}

# Re-exported: the f32 functions both engines share.
exp_f32, sigmoid_f32 = H.exp_f32, H.sigmoid_f32
