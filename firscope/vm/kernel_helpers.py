"""numba helpers every generated kernel calls (imported by vm/compiled on first use).

``record`` writes a lane's fault record and ``tick`` looks at the budget and
the stop flag: the slow paths of every kernel, shared so that a kernel's own
code stays small (numba's compile time grows with it). Each is compiled for
exactly one signature (constant arguments would otherwise give a
specialization per value: sixty compiles of ``record`` for one kernel) and
cached on disk. Trip numbers of the enclosing loops are passed as eight
arguments (at most :data:`~firscope.vm.compiled.MAX_COMPILED_NESTING` loops
enclose an op), unused ones 0.
"""
from __future__ import annotations

from ..jitcache import prepare_numba
from .kernel_abi import C_ABORT, C_EPOCH, F_BUDGET, F_STOP, POLL, REC_FIXED, TRIP_ARGS

prepare_numba()

from numba import njit, prange  # noqa: E402 - after prepare_numba (numba's cache folder)
from numba.core import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402



@intrinsic
def poll(typingctx, cell):
    """cell[0], re-read from memory every time (another thread may set it)."""
    sig = types.int64(cell)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(ary.data, "monotonic", 8)
    return sig, codegen


def _prefetch(locality: int, where: str):
    """A prefetch intrinsic bringing a line into ``where`` (llvm.prefetch's locality)."""
    @intrinsic
    def prefetch(typingctx, arr, index):
        sig = types.void(arr, index)

        def codegen(context, builder, signature, args):
            from llvmlite import ir
            from numba.core import cgutils
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            i64 = ir.IntType(64)
            i = builder.sext(args[1], i64) if args[1].type.width < 64 else args[1]
            last = builder.sub(builder.extract_value(ary.shape, 0), ir.Constant(i64, 1))
            i = builder.select(builder.icmp_signed(">", i, last), last, i)
            i = builder.select(builder.icmp_signed("<", i, ir.Constant(i64, 0)),
                               ir.Constant(i64, 0), i)
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
            # read (0), the locality (3: prefetcht0 on x86, 2: prefetcht1), data cache (1)
            builder.call(fn, [builder.bitcast(builder.gep(ary.data, [i]), i8p),
                              ir.Constant(i32, 0), ir.Constant(i32, locality),
                              ir.Constant(i32, 1)])
            return context.get_dummy_value()
        return sig, codegen
    prefetch.__doc__ = (f"A hint to bring ``arr``'s element ``index`` (clamped into the array) "
                        f"into {where}: no value, no fault, nothing a kernel computes depends on "
                        "it (vm/jam: where each is used and what it gained).")
    return prefetch


# vm/jam's wide groups (V rows: into L1 made decode faster than into L2, 0.95-0.97x) and
# its QK groups (key rows: into L2; into L1 made attention slower), see AHEAD and
# GROUPS_AHEAD there
prefetch_l1 = _prefetch(3, "L1")
prefetch_l2 = _prefetch(2, "L2")


_I = "int64"
_TRIPS = ", ".join([_I] * TRIP_ARGS)
_OPTS = dict(cache=True, nogil=True, _nrt=False, error_model="numpy")


@njit(f"{_I}(int64[:, ::1], int64[::1], {_I}, {_I}, {_I}, {_I}, {_I}, {_I}, {_I}, {_TRIPS})",
      **_OPTS)
def record(rec, ctl, lane, j, code, pc, arg, flag, depth, t0, t1, t2, t3, t4, t5, t6,
           t7):  # pragma: no cover - compiled
    """Write a lane's fault record (code, pc, arg, trip numbers of the ``depth`` enclosing
    loops) and raise the dispatch's ``flag``; returns j (the journal position)."""
    rec[lane, 1] = code
    rec[lane, 2] = pc
    rec[lane, 3] = arg
    trips = (t0, t1, t2, t3, t4, t5, t6, t7)
    for k in range(depth):
        rec[lane, REC_FIXED + k] = trips[k] + 1
    rec[lane, 0] = ctl[C_EPOCH]
    ctl[flag] = 1
    return j


@njit(f"{_I}({_I}, {_I}, {_I}, int64[::1], int64[::1], int64[:, ::1], {_I}, {_I}, {_I}, {_I}, "
      f"{_TRIPS})", **_OPTS)
def tick(cnt, n, budget, stop, ctl, rec, lane, j, first, depth, t0, t1, t2, t3, t4, t5, t6,
         t7):  # pragma: no cover - compiled
    """A lane is about to run the n ops from pc ``first`` past its look-again mark: -1 if it
    must leave (over budget or stopped: recorded; or another lane aborted the dispatch),
    else its next mark."""
    if cnt + n > budget:
        record(rec, ctl, lane, j, F_BUDGET, first + (budget - cnt), 0, C_ABORT, depth,
               t0, t1, t2, t3, t4, t5, t6, t7)
        return -1
    if poll(stop) != 0:
        record(rec, ctl, lane, j, F_STOP, first, 0, C_ABORT, depth, t0, t1, t2, t3, t4, t5,
               t6, t7)
        return -1
    if poll(ctl) != 0:  # ctl[0]: another lane aborted the dispatch
        return -1
    return budget if budget - cnt < POLL else cnt + POLL


@intrinsic
def call_plain(typingctx, addr, arena, bases, kf, ki, l0, l1, sf, si):
    """A generated kernel's run_plain, called through its machine-code address ``addr``
    (numba's own calling convention, the arguments as run_plain is compiled for them:
    kernel_abi.DRIVERS)."""
    sig = types.int64(addr, arena, bases, kf, ki, l0, l1, sf, si)

    def codegen(context, builder, signature, args):
        from numba.core import cgutils
        argtys = signature.args[1:]
        fnty = context.call_conv.get_function_type(types.int64, argtys)
        status, res = context.call_conv.call_function(
            builder, builder.inttoptr(args[0], fnty.as_pointer()), types.int64, argtys,
            args[1:])
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return res
    return sig, codegen


@njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def run_par(addr, arena, bases, kf, ki, l0, l1, sf, si, parts):  # pragma: no cover - compiled
    """The threaded driver of every kernel: the run_plain at ``addr`` on ``parts`` ranges of
    lanes at once on numba's threads (OpenMP: its workers take a range in microseconds,
    where waking a Python thread took tens), each range in its own part of the scratch; a
    range that stops early makes the result negative. One function for all kernels,
    compiled once (vm/kernel_cache): generated into each kernel's module, it took 2-3 s of
    compiling per kernel (LLVM optimizing run_plain again inside the threaded loop)."""
    bad = 0
    for c in prange(parts):
        a = l0 + (l1 - l0) * c // parts
        b = l0 + (l1 - l0) * (c + 1) // parts
        w = sf.shape[0] // parts
        wi = si.shape[0] // parts
        if call_plain(addr, arena, bases, kf, ki, a, b, sf[c * w:(c + 1) * w],
                      si[c * wi:(c + 1) * wi]) < 0:
            bad += 1
    return -bad
