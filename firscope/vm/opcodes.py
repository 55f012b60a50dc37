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
    # Per-lane statement for the compiled path; {0},{1},... are operands
    # (see the template notes above _ROWS and vm/compiled).
    code: str = ""
    # (dispatch, op) -> next pc or None: executes the op once (lane-vectorized).
    interp: Callable | None = field(default=None, compare=False, repr=False)
    # (dispatch, op) -> closure(): the same, prepared once per dispatch (fast path).
    make: Callable | None = field(default=None, compare=False, repr=False)

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


# --- f32 transcendental functions, shared by both engines ----------------------
# NumPy's SIMD float32 exp is off by up to 2 ulp and differs between CPUs;
# libm's expf (what numba calls) is correctly rounded in nearly all cases.
# Both the step interpreter and the compiled kernels use the latter, through
# the same numba-compiled expression, so the two engines agree bit for bit.
_F32_KERNELS: dict = {}


def _f32_kernels():
    if not _F32_KERNELS:
        from ..jitcache import prepare_numba
        prepare_numba()
        from numba import njit

        one = np.float32(1.0)

        @njit(error_model="numpy", cache=True, nogil=True)
        def exp_f32(x, out):  # pragma: no cover - compiled
            for i in range(x.size):
                out[i] = np.exp(x[i])

        @njit(error_model="numpy", cache=True, nogil=True)
        def sigmoid_f32(x, out):  # pragma: no cover - compiled
            for i in range(x.size):
                out[i] = one / (one + np.exp(-x[i]))

        _F32_KERNELS["exp"] = exp_f32
        _F32_KERNELS["sigmoid"] = sigmoid_f32
    return _F32_KERNELS


def _apply_f32(name: str, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = np.empty_like(x)
    _f32_kernels()[name](x.reshape(-1), out.reshape(-1))
    return out


def exp_f32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """exp in f32 exactly as the compiled kernels compute it (libm expf)."""
    return _apply_f32("exp", x, out)


def sigmoid_f32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """1 / (1 + exp(-x)) in f32, as the compiled kernels compute it."""
    return _apply_f32("sigmoid", x, out)


def _rsqrt(x, out):
    np.sqrt(x, out=out)
    np.divide(ONE, out, out=out)
    return out


# --- lane-vectorized handlers ------------------------------------------------
# A row's ``make(d, op)`` returns a closure that executes ``op`` once on
# dispatch ``d`` and returns the next pc, or None for pc + 1. The closure is
# built once per dispatch with the register rows it touches already looked
# up, so the interpreter loop pays one Python call per instruction.
# ``d.mask`` is the active-lane mask; ``d.full`` says every lane is active,
# which lets the common case skip masking. ``d.Rr``/``d.Ur`` are the rows of
# ``d.R``/``d.U`` (views; the register files are only ever written in place).

def _binary(ufunc):
    def make(d, op):
        dst, a, b = d.Rr[op.args[0]], d.Rr[op.args[1]], d.Rr[op.args[2]]

        def run():
            if d.full:
                ufunc(a, b, out=dst)
            else:
                ufunc(a, b, out=dst, where=d.mask)
        return run
    return make


def _const_binary(ufunc):
    def make(d, op):
        dst, a, c = d.Rr[op.args[0]], d.Rr[op.args[1]], op.args[2]

        def run():
            if d.full:
                ufunc(a, c, out=dst)
            else:
                ufunc(a, c, out=dst, where=d.mask)
        return run
    return make


def _unary(fn):
    def make(d, op):
        dst, a = d.Rr[op.args[0]], d.Rr[op.args[1]]
        tmp = d.tmp_f32

        def run():
            if d.full:
                fn(a, dst)  # elementwise, so dst may be a
            else:
                fn(a, tmp)
                np.copyto(dst, tmp, where=d.mask)
        return run
    return make


def _exp_into(a, out):
    _f32_kernels()["exp"](a, out)


def _sigmoid_into(a, out):
    _f32_kernels()["sigmoid"](a, out)


_TWO32 = 4294967296.0


def _m_rtou(d, op):
    dst_i, src = op.args
    dst, v = d.Ur[dst_i], d.Rr[src]

    def slow():
        bad = ~np.isfinite(v) | (v < 0) | (v >= _TWO32)
        if not d.full:
            bad &= d.mask
        if bad.any():
            from .interp import rtou_message
            lane = int(np.flatnonzero(bad)[0])
            d.fault(op, lane, rtou_message(src, v[lane], lane))
        u = np.trunc(np.where(d.mask, v, 0)).astype(np.uint32)
        np.copyto(dst, u, where=d.mask)

    def run():
        if d.full and d.lanes:
            lo, hi = v.min(), v.max()
            if lo >= 0 and hi < _TWO32:  # False for NaN
                np.copyto(dst, v, casting="unsafe")  # truncates toward zero
                return
        slow()
    return run


def _m_const(file: str):
    """uconst and loadconstf32: a constant into one register of the active lanes."""
    def make(d, op):
        dst, k = getattr(d, file)[op.args[0]], op.args[1]

        def run():
            if d.full:
                dst.fill(k)
            else:
                dst[d.mask] = k
        return run
    return make


def _u_binary_k(ufunc):
    def make(d, op):
        dst, a, k = d.Ur[op.args[0]], d.Ur[op.args[1]], np.uint32(op.args[2])

        def run():
            if d.full:
                ufunc(a, k, out=dst)
            else:
                ufunc(a, k, out=dst, where=d.mask)
        return run
    return make


def _m_uadd(d, op):
    dst, a, b = d.Ur[op.args[0]], d.Ur[op.args[1]], d.Ur[op.args[2]]

    def run():
        if d.full:
            np.add(a, b, out=dst)
        else:
            np.add(a, b, out=dst, where=d.mask)
    return run


def _index_plan(d, addr):
    """(view, limit, need) for a region access: index U is valid iff need <= U < limit,
    and then lives at view[U]; view is None when the fast path does not apply."""
    off = addr.offset
    start = addr.base + off
    limit = addr.extent - off  # U + off < extent
    need = -off if off < 0 else 0
    if start < 0 or limit <= 0 or d.lanes == 0:
        return None, limit, need
    return d.arena[start:], limit, need


def _checked_indices(d, op, addr, u):
    """Region indices of the active lanes (all lanes: lanes is None), bounds-checked."""
    idx = u.astype(np.int64)
    if addr.offset:
        idx += addr.offset
    if d.full:
        d.check_bounds(op, addr, idx, None)
        return idx, None
    lanes = np.flatnonzero(d.mask)
    idx = idx[lanes]
    d.check_bounds(op, addr, idx, lanes)
    return idx, lanes


def _m_uloadf32(d, op):
    dst_i, u_i, addr = op.args
    dst, u = d.Rr[dst_i], d.Ur[u_i]
    view, limit, need = _index_plan(d, addr)

    def general():
        idx, lanes = _checked_indices(d, op, addr, u)
        if lanes is None:
            dst[...] = d.arena[addr.base + idx]
        else:
            dst[lanes] = d.arena[addr.base + idx]

    def run():
        if d.full and view is not None and u.max() < limit and (not need or u.min() >= need):
            np.take(view, u, out=dst, mode="clip")  # indices checked above
            return
        general()
    return run


def _m_ustoref32(d, op):
    src_i, u_i, addr = op.args
    src, u = d.Rr[src_i], d.Ur[u_i]
    view, limit, need = _index_plan(d, addr)

    def general():
        idx, lanes = _checked_indices(d, op, addr, u)
        d.store(addr.base + idx, src if lanes is None else src[lanes])

    def run():
        if (d.full and view is not None and d.store_hook is None and u.max() < limit
                and (not need or u.min() >= need)):
            view[u] = src
            return
        general()
    return run




def _m_cmplt(d, op):
    dst, a, b = d.Rr[op.args[0]], d.Rr[op.args[1]], d.Rr[op.args[2]]
    tmp = d.tmp_bool

    def run():
        np.less(a, b, out=tmp)
        if d.full:
            np.copyto(dst, tmp)
        else:
            np.copyto(dst, tmp, where=d.mask)
    return run


def _m_forbegin(d, op):
    return lambda: d.enter_loop(op)


def _m_forend(d, op):
    return lambda: d.loop_back(op)


def _m_ifbegin(d, op):
    return lambda: d.enter_if(op)


def _m_ifend(d, op):
    return lambda: d.leave_if(op)


def _one_shot(make):
    """The (dispatch, op) handler form: build the closure and run it once."""
    def interp(d, op):
        return make(d, op)()
    return interp


def _spec(mnemonic, operands, names, category, summary, code, make):
    return OpSpec(mnemonic, tuple(operands.split()), tuple(names.split()), category, summary,
                  code, _one_shot(make), make)


# Code templates: one per-lane Python statement for vm/compiled. Rn/Un are the
# lane's registers, {i} is operand i (a register number, a constant, or an
# address slot); RTOU/LOAD/STORE are expanded by the generator into the checked
# forms that record faults; EXP is the shared f32 exp.
_ROWS = [
    _spec("rtou", "Ud Rs", "d s", "alu", "U[d] = uint(R[s]) (truncate)",
          "U{0} = RTOU(R{1})", _m_rtou),
    _spec("uconst", "Ud K", "d k", "const", "U[d] = k", "U{0} = {1}", _m_const("Ur")),
    _spec("uaddk", "Ud Us K", "d s k", "alu", "U[d] = U[s] + k", "U{0} = (U{1} + {2}) & M32",
          _u_binary_k(np.add)),
    _spec("umulk", "Ud Us K", "d s k", "alu", "U[d] = U[s] * k", "U{0} = (U{1} * {2}) & M32",
          _u_binary_k(np.multiply)),
    _spec("uadd", "Ud Us Us", "d a b", "alu", "U[d] = U[a] + U[b]",
          "U{0} = (U{1} + U{2}) & M32", _m_uadd),
    _spec("uloadf32", "Rd Us A", "d u @addr", "mem", "R[d] = arena[addr + U[u]]",
          "R{0} = LOAD({2}, U{1})", _m_uloadf32),
    _spec("ustoref32", "Rs Us A", "s u @addr", "mem", "arena[addr + U[u]] = R[s]",
          "STORE({2}, U{1}, R{0})", _m_ustoref32),
    _spec("loadconstf32", "Rd F", "d c", "const", "R[d] = c", "R{0} = {1}", _m_const("Rr")),
    _spec("add", "Rd Rs Rs", "d a b", "alu", "R[d] = R[a] + R[b]", "R{0} = R{1} + R{2}",
          _binary(np.add)),
    _spec("sub", "Rd Rs Rs", "d a b", "alu", "R[d] = R[a] - R[b]", "R{0} = R{1} - R{2}",
          _binary(np.subtract)),
    _spec("mul", "Rd Rs Rs", "d a b", "alu", "R[d] = R[a] * R[b]", "R{0} = R{1} * R{2}",
          _binary(np.multiply)),
    _spec("div", "Rd Rs Rs", "d a b", "alu", "R[d] = R[a] / R[b]", "R{0} = R{1} / R{2}",
          _binary(np.divide)),
    _spec("mulconst", "Rd Rs F", "d a c", "alu", "R[d] = R[a] * c", "R{0} = R{1} * {2}",
          _const_binary(np.multiply)),
    _spec("addconst", "Rd Rs F", "d a c", "alu", "R[d] = R[a] + c", "R{0} = R{1} + {2}",
          _const_binary(np.add)),
    _spec("sigmoid", "Rd Rs", "d a", "alu", "R[d] = 1 / (1 + exp(-R[a]))",
          "R{0} = ONE / (ONE + EXP(-R{1}))", _unary(_sigmoid_into)),
    _spec("exp", "Rd Rs", "d a", "alu", "R[d] = exp(R[a])", "R{0} = EXP(R{1})",
          _unary(_exp_into)),
    _spec("rsqrt", "Rd Rs", "d a", "alu", "R[d] = 1 / sqrt(R[a])",
          "R{0} = ONE / SQRT(R{1})", _unary(_rsqrt)),
    _spec("cmplt", "Rd Rs Rs", "d a b", "alu", "R[d] = 1.0 if R[a] < R[b] else 0.0",
          "R{0} = ONE if R{1} < R{2} else ZERO", _m_cmplt),
    _spec("forbegin", "Rs", "c", "ctrl", "run the body floor(R[c]) times", "", _m_forbegin),
    _spec("forend", "", "", "ctrl", "end of the innermost forbegin", "", _m_forend),
    _spec("ifbegin", "Rs", "c", "ctrl", "run the body where R[c] != 0", "", _m_ifbegin),
    _spec("ifend", "", "", "ctrl", "end of the innermost ifbegin", "", _m_ifend),
]

OPCODES: dict[str, OpSpec] = {row.mnemonic: row for row in _ROWS}

# Block structure: opener -> closer, used by the assembler's matcher.
BLOCKS = {"forbegin": "forend", "ifbegin": "ifend"}
CLOSERS = {v: k for k, v in BLOCKS.items()}
