"""The instruction set as data: one :class:`OpSpec` row per mnemonic.

The row drives everything: the assembler checks operand kinds from it, the
step interpreter runs its ``interp`` handler (lane-vectorized NumPy), the
compiled path generates per-lane code from its ``code`` template, the
debugger learns which registers an instruction reads and writes, and the
profiler groups instructions by ``category``. A new opcode is one row plus
one handler.

Operand kinds:
  ``Rd``/``Rs``  f32 register written / read (0..31)
  ``Ud``/``Us``  uint32 register written / read (0..31)
  ``K``          integer constant expression (uint32, wraps like the GPU)
  ``F``          float constant expression, rounded once to f32
  ``A``          address ``@in0``, ``@out1``, ``@buffer`` plus an offset expression
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

F32 = np.float32
ONE = F32(1.0)
ZERO = F32(0.0)


@dataclass(frozen=True)
class OpSpec:
    mnemonic: str
    operands: tuple[str, ...]
    names: tuple[str, ...]  # operand names as the format documents them
    category: str  # "alu", "mem", "const", "ctrl"
    summary: str
    # Per-lane statement for the compiled path; {0},{1},... are operands.
    # Addresses are written {Aidx:2} style by the generator, see vm/compiled.
    code: str = ""
    interp: Callable | None = field(default=None, compare=False, repr=False)

    @property
    def reads(self) -> tuple[tuple[str, int], ...]:
        """(file, operand index) pairs of registers read."""
        return tuple(("R" if k == "Rs" else "U", i) for i, k in enumerate(self.operands)
                     if k in ("Rs", "Us"))

    @property
    def writes(self) -> tuple[tuple[str, int], ...]:
        return tuple(("R" if k == "Rd" else "U", i) for i, k in enumerate(self.operands)
                     if k in ("Rd", "Ud"))

    @property
    def is_control(self) -> bool:
        return self.category == "ctrl"

    @property
    def usage(self) -> str:
        return " ".join((self.mnemonic,) + self.names)


# --- lane-vectorized handlers ------------------------------------------------
# Each takes (dispatch, op) and returns the next pc, or None for pc + 1.
# ``d.mask`` is the active-lane mask; ``d.full`` says every lane is active,
# which lets the common case skip masking.

def _binary(ufunc):
    def run(d, op):
        a = op.args
        R = d.R
        if d.full:
            ufunc(R[a[1]], R[a[2]], out=R[a[0]])
        else:
            ufunc(R[a[1]], R[a[2]], out=R[a[0]], where=d.mask)
    return run


def _const_binary(ufunc):
    def run(d, op):
        a = op.args
        R = d.R
        if d.full:
            ufunc(R[a[1]], a[2], out=R[a[0]])
        else:
            ufunc(R[a[1]], a[2], out=R[a[0]], where=d.mask)
    return run


def _unary(fn):
    def run(d, op):
        a = op.args
        R = d.R
        if d.full:
            R[a[0]] = fn(R[a[1]])
        else:
            np.copyto(R[a[0]], fn(R[a[1]]), where=d.mask)
    return run


def _sigmoid(x):
    return ONE / (ONE + np.exp(-x))


def _rsqrt(x):
    return ONE / np.sqrt(x)


def _i_rtou(d, op):
    dst, src = op.args
    v = d.R[src]
    bad = ~np.isfinite(v) | (v < 0) | (v >= 4294967296.0)
    if not d.full:
        bad &= d.mask
    if bad.any():
        lane = int(np.flatnonzero(bad)[0])
        d.fault(op, lane, f"rtou of R{src} = {float(v[lane])!r} in lane {lane}: "
                          "needs a finite value in 0..2^32-1")
    u = np.trunc(v).astype(np.uint32) if d.full else np.trunc(np.where(d.mask, v, 0)).astype(np.uint32)
    if d.full:
        d.U[dst] = u
    else:
        np.copyto(d.U[dst], u, where=d.mask)


def _i_uconst(d, op):
    dst, k = op.args
    if d.full:
        d.U[dst] = k
    else:
        d.U[dst][d.mask] = k


def _i_uaddk(d, op):
    dst, src, k = op.args
    if d.full:
        np.add(d.U[src], np.uint32(k), out=d.U[dst])
    else:
        np.add(d.U[src], np.uint32(k), out=d.U[dst], where=d.mask)


def _i_umulk(d, op):
    dst, src, k = op.args
    if d.full:
        np.multiply(d.U[src], np.uint32(k), out=d.U[dst])
    else:
        np.multiply(d.U[src], np.uint32(k), out=d.U[dst], where=d.mask)


def _i_uadd(d, op):
    dst, a, b = op.args
    if d.full:
        np.add(d.U[a], d.U[b], out=d.U[dst])
    else:
        np.add(d.U[a], d.U[b], out=d.U[dst], where=d.mask)


def _i_uloadf32(d, op):
    dst, u, addr = op.args
    idx = d.U[u].astype(np.int64)
    if addr.offset:
        idx += addr.offset
    if d.full:
        d.check_bounds(op, addr, idx, None)
        d.R[dst] = d.arena[addr.base + idx]
    else:
        lanes = np.flatnonzero(d.mask)
        ii = idx[lanes]
        d.check_bounds(op, addr, ii, lanes)
        d.R[dst][lanes] = d.arena[addr.base + ii]


def _i_ustoref32(d, op):
    src, u, addr = op.args
    idx = d.U[u].astype(np.int64)
    if addr.offset:
        idx += addr.offset
    if d.full:
        d.check_bounds(op, addr, idx, None)
        d.store(addr.base + idx, d.R[src])
    else:
        lanes = np.flatnonzero(d.mask)
        ii = idx[lanes]
        d.check_bounds(op, addr, ii, lanes)
        d.store(addr.base + ii, d.R[src][lanes])


def _i_loadconstf32(d, op):
    dst, c = op.args
    if d.full:
        d.R[dst] = c
    else:
        d.R[dst][d.mask] = c


def _i_cmplt(d, op):
    dst, a, b = op.args
    res = (d.R[a] < d.R[b]).astype(F32)
    if d.full:
        d.R[dst] = res
    else:
        np.copyto(d.R[dst], res, where=d.mask)


def _i_forbegin(d, op):
    return d.enter_loop(op)


def _i_forend(d, op):
    return d.loop_back(op)


def _i_ifbegin(d, op):
    return d.enter_if(op)


def _i_ifend(d, op):
    return d.leave_if(op)


def _spec(mnemonic, operands, names, category, summary, code, interp):
    return OpSpec(mnemonic, tuple(operands.split()), tuple(names.split()), category, summary,
                  code, interp)


_ROWS = [
    _spec("rtou", "Ud Rs", "d s", "alu", "U[d] = uint(R[s]) (truncate)",
          "U[{0}] = rtou(R[{1}])", _i_rtou),
    _spec("uconst", "Ud K", "d k", "const", "U[d] = k", "U[{0}] = {1}", _i_uconst),
    _spec("uaddk", "Ud Us K", "d s k", "alu", "U[d] = U[s] + k", "U[{0}] = (U[{1}] + {2}) & M32",
          _i_uaddk),
    _spec("umulk", "Ud Us K", "d s k", "alu", "U[d] = U[s] * k", "U[{0}] = (U[{1}] * {2}) & M32",
          _i_umulk),
    _spec("uadd", "Ud Us Us", "d a b", "alu", "U[d] = U[a] + U[b]",
          "U[{0}] = (U[{1}] + U[{2}]) & M32", _i_uadd),
    _spec("uloadf32", "Rd Us A", "d u @addr", "mem", "R[d] = arena[addr + U[u]]",
          "R[{0}] = LOAD({2}, U[{1}])", _i_uloadf32),
    _spec("ustoref32", "Rs Us A", "s u @addr", "mem", "arena[addr + U[u]] = R[s]",
          "STORE({2}, U[{1}], R[{0}])", _i_ustoref32),
    _spec("loadconstf32", "Rd F", "d c", "const", "R[d] = c", "R[{0}] = {1}", _i_loadconstf32),
    _spec("add", "Rd Rs Rs", "d a b", "alu", "R[d] = R[a] + R[b]", "R[{0}] = R[{1}] + R[{2}]",
          _binary(np.add)),
    _spec("sub", "Rd Rs Rs", "d a b", "alu", "R[d] = R[a] - R[b]", "R[{0}] = R[{1}] - R[{2}]",
          _binary(np.subtract)),
    _spec("mul", "Rd Rs Rs", "d a b", "alu", "R[d] = R[a] * R[b]", "R[{0}] = R[{1}] * R[{2}]",
          _binary(np.multiply)),
    _spec("div", "Rd Rs Rs", "d a b", "alu", "R[d] = R[a] / R[b]", "R[{0}] = R[{1}] / R[{2}]",
          _binary(np.divide)),
    _spec("mulconst", "Rd Rs F", "d a c", "alu", "R[d] = R[a] * c", "R[{0}] = R[{1}] * {2}",
          _const_binary(np.multiply)),
    _spec("addconst", "Rd Rs F", "d a c", "alu", "R[d] = R[a] + c", "R[{0}] = R[{1}] + {2}",
          _const_binary(np.add)),
    _spec("sigmoid", "Rd Rs", "d a", "alu", "R[d] = 1 / (1 + exp(-R[a]))",
          "R[{0}] = ONE / (ONE + exp(-R[{1}]))", _unary(_sigmoid)),
    _spec("exp", "Rd Rs", "d a", "alu", "R[d] = exp(R[a])", "R[{0}] = exp(R[{1}])",
          _unary(np.exp)),
    _spec("rsqrt", "Rd Rs", "d a", "alu", "R[d] = 1 / sqrt(R[a])",
          "R[{0}] = ONE / sqrt(R[{1}])", _unary(_rsqrt)),
    _spec("cmplt", "Rd Rs Rs", "d a b", "alu", "R[d] = 1.0 if R[a] < R[b] else 0.0",
          "R[{0}] = ONE if R[{1}] < R[{2}] else ZERO", _i_cmplt),
    _spec("forbegin", "Rs", "c", "ctrl", "run the body floor(R[c]) times", "", _i_forbegin),
    _spec("forend", "", "", "ctrl", "end of the innermost forbegin", "", _i_forend),
    _spec("ifbegin", "Rs", "c", "ctrl", "run the body where R[c] != 0", "", _i_ifbegin),
    _spec("ifend", "", "", "ctrl", "end of the innermost ifbegin", "", _i_ifend),
]

OPCODES: dict[str, OpSpec] = {row.mnemonic: row for row in _ROWS}

# Block structure: opener -> closer, used by the assembler's matcher.
BLOCKS = {"forbegin": "forend", "ifbegin": "ifend"}
CLOSERS = {v: k for k, v in BLOCKS.items()}
