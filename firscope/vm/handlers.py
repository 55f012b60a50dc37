"""The step interpreter's meaning of each opcode: lane-vectorized NumPy handlers.

A row's ``interp(d, op)`` (see vm/isa.OpSpec) returns a closure that executes
``op`` once on dispatch ``d`` and returns the next pc, or None for pc + 1.
The closure is built once per dispatch with the register rows it touches
already looked up, so the interpreter loop pays one Python call per
instruction. ``d.mask`` is the active-lane mask; ``d.full`` says every lane
is active, which lets the common case skip masking. ``d.Rr``/``d.Ur`` are the
rows of ``d.R``/``d.U`` (views; the register files are only ever written in
place).

The handlers here are generic (a NumPy ufunc, a register file, a memory
access described by the row's ``mem``); the table (vm/opcodes) instantiates
them, so a new opcode rarely needs a new handler.
"""
from __future__ import annotations

import numpy as np

from .faults import rtou_message

F32 = np.float32
ONE = F32(1.0)
ZERO = F32(0.0)


# --- f32 transcendental functions, shared by both engines ----------------------
# Defined to the last bit by model/numerics (computed in f64 with IEEE operations only,
# rounded once to f32): not NumPy's SIMD exp, whose result depends on the CPU, nor libm's
# expf. Both engines run the same numba functions (model/numeric_kernels), so they agree
# bit for bit, and every machine agrees with them.
def _f32_kernels():
    from ..model import numeric_kernels as K  # imports numba
    return K


def _apply_f32(name: str, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = np.empty_like(x)
    getattr(_f32_kernels(), name)(x.reshape(-1), out.reshape(-1))
    return out


def exp_f32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """exp in f32 exactly as the reference defines it (model/numerics.exp_f32_numpy)."""
    return _apply_f32("exp_array", x, out)


def sigmoid_f32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """1 / (1 + exp(-x)) in f32 as the reference defines it (computed in f64, rounded once)."""
    return _apply_f32("sigmoid_array", x, out)


def rsqrt_into(x, out):
    # f32 sqrt, then f32 division: two correctly rounded IEEE operations, the same on
    # every CPU (and what the compiled engine's ONE / np.sqrt(x) computes)
    np.sqrt(x, out=out)
    np.divide(ONE, out, out=out)
    return out


def exp_into(a, out):
    _f32_kernels().exp_array(a, out)


def sigmoid_into(a, out):
    _f32_kernels().sigmoid_array(a, out)


# --- arithmetic -------------------------------------------------------------------
def binary(ufunc, file: str = "Rr"):
    """R[d] = ufunc(R[a], R[b]); with file "Ur" the same on U registers (uint32 wraps)."""
    def make(d, op):
        rows = getattr(d, file)
        dst, a, b = rows[op.args[0]], rows[op.args[1]], rows[op.args[2]]

        def run():
            if d.full:
                ufunc(a, b, out=dst)
            else:
                ufunc(a, b, out=dst, where=d.mask)
        return run
    return make


def const_binary(ufunc):
    """R[d] = ufunc(R[a], c) with an f32 constant c."""
    def make(d, op):
        dst, a, c = d.Rr[op.args[0]], d.Rr[op.args[1]], op.args[2]

        def run():
            if d.full:
                ufunc(a, c, out=dst)
            else:
                ufunc(a, c, out=dst, where=d.mask)
        return run
    return make


def unary(fn):
    """R[d] = fn(R[a]); ``fn(x, out)`` is elementwise, so out may be x."""
    def make(d, op):
        dst, a = d.Rr[op.args[0]], d.Rr[op.args[1]]
        tmp = d.tmp_f32

        def run():
            if d.full:
                fn(a, dst)
            else:
                fn(a, tmp)
                np.copyto(dst, tmp, where=d.mask)
        return run
    return make


def compare(ufunc):
    """R[d] = 1.0 if ufunc(R[a], R[b]) else 0.0."""
    def make(d, op):
        dst, a, b = d.Rr[op.args[0]], d.Rr[op.args[1]], d.Rr[op.args[2]]
        tmp = d.tmp_bool

        def run():
            ufunc(a, b, out=tmp)
            if d.full:
                np.copyto(dst, tmp)
            else:
                np.copyto(dst, tmp, where=d.mask)
        return run
    return make


_TWO32 = 4294967296.0


def rtou(d, op):
    """U[d] = uint(R[s]), truncating; negative, too large or non-finite is a fault."""
    dst_i, src = op.args
    dst, v = d.Ur[dst_i], d.Rr[src]

    def slow():
        bad = ~np.isfinite(v) | (v < 0) | (v >= _TWO32)
        if not d.full:
            bad &= d.mask
        if bad.any():
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


def const(file: str):
    """A constant into one register (file "Rr" or "Ur") of the active lanes."""
    def make(d, op):
        dst, k = getattr(d, file)[op.args[0]], op.args[1]

        def run():
            if d.full:
                dst.fill(k)
            else:
                dst[d.mask] = k
        return run
    return make


def u_binary_k(ufunc):
    """U[d] = ufunc(U[s], k), wrapping in uint32."""
    def make(d, op):
        dst, a, k = d.Ur[op.args[0]], d.Ur[op.args[1]], np.uint32(op.args[2])

        def run():
            if d.full:
                ufunc(a, k, out=dst)
            else:
                ufunc(a, k, out=dst, where=d.mask)
        return run
    return make


# --- memory ------------------------------------------------------------------------
def _index_plan(d, addr):
    """(view, limit, need) for a region access: index U is valid iff need <= U < limit,
    and then lives at view[U] (view ends where the region does); view is None when the
    fast path does not apply."""
    off = addr.offset
    start = addr.base + off
    limit = addr.extent - off  # U + off < extent
    need = -off if off < 0 else 0
    if start < 0 or limit <= 0 or d.lanes == 0:
        return None, limit, need
    return d.arena[start: start + limit], limit, need


def _checked_indices(d, op, addr, u):
    """Region indices and lanes (None: every lane) of the active lanes' accesses that go
    ahead, bounds-checked, and the lanes skipped as out of bounds (memcheck; else None)."""
    idx = u.astype(np.int64)
    if addr.offset:
        idx += addr.offset
    if d.full:
        return d.check_bounds(op, addr, idx, None)
    lanes = np.flatnonzero(d.mask)
    return d.check_bounds(op, addr, idx[lanes], lanes)


def lane_addresses(d, op) -> tuple[np.ndarray, np.ndarray]:
    """(arena addresses, lanes) of the accesses the load or store ``op`` is about to make
    in the active lanes, without the out-of-bounds ones (they fault, or memcheck skips
    them). For observers that look before the instruction runs (vm/interp.Observer)."""
    mem = op.spec.mem
    addr = op.args[mem.address]
    u = d.Ur[op.args[mem.index]]
    if d.full:
        lanes, idx = np.arange(d.lanes), u.astype(np.int64)
    else:
        lanes = np.flatnonzero(d.mask)
        idx = u[lanes].astype(np.int64)
    if addr.offset:
        idx += addr.offset
    if idx.size and (idx.min() < 0 or idx.max() >= addr.extent):
        ok = (idx >= 0) & (idx < addr.extent)
        lanes, idx = lanes[ok], idx[ok]
    return addr.base + idx, lanes


def load(d, op):
    """R[value] = arena[address + U[index]], checked against the address's region."""
    mem = op.spec.mem
    addr = op.args[mem.address]
    dst, u = d.Rr[op.args[mem.value]], d.Ur[op.args[mem.index]]
    view, _, need = _index_plan(d, addr)
    take = view.take if view is not None else None  # its bounds check is the region's

    def general():
        idx, lanes, skipped = _checked_indices(d, op, addr, u)
        if lanes is None:
            dst[...] = d.arena[addr.base + idx]
        else:
            dst[lanes] = d.arena[addr.base + idx]
        if skipped is not None:  # memcheck: a lane whose access was skipped reads 0
            dst[skipped] = ZERO

    def run():
        # U is unsigned: with no lower bound (need 0) take's check is the region's. It
        # raises before writing dst (out is buffered with mode="raise"), and general()
        # then faults naming the lane, or lets memcheck skip it. A quarter of the time
        # of checking U's maximum first (12 lanes: 1.2 against 5.2 us).
        if d.full and take is not None and (not need or u.min() >= need):
            try:
                take(u, out=dst, mode="raise")
                return
            except IndexError:
                pass
        general()
    return run


def store(d, op):
    """arena[address + U[index]] = R[value], checked against the address's region."""
    mem = op.spec.mem
    addr = op.args[mem.address]
    src, u = d.Rr[op.args[mem.value]], d.Ur[op.args[mem.index]]
    view, limit, need = _index_plan(d, addr)

    def general():
        idx, lanes, _ = _checked_indices(d, op, addr, u)
        d.store(addr.base + idx, src if lanes is None else src[lanes])

    def run():
        if (d.full and view is not None and d.store_hook is None and u.max() < limit
                and (not need or u.min() >= need)):
            view[u] = src
            return
        general()
    return run


# --- blocks ------------------------------------------------------------------------
def for_begin(d, op):
    return lambda: d.enter_loop(op)


def for_end(d, op):
    return lambda: d.loop_back(op)


def if_begin(d, op):
    return lambda: d.enter_if(op)


def if_end(d, op):
    return lambda: d.leave_if(op)
