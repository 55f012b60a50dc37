"""Compiled micro-kernels: the runner of the per-lane code vm/codegen writes.

For each bound :class:`Program`, vm/codegen writes one Python function that
runs a single lane, from the opcode table's renderers. This module writes
that source to ``$XDG_CACHE_HOME/firscope/kernels/k<sha>.py`` (a temp
dir if that is not writable), imports it, and JIT-compiles it with numba with
``cache=True``, so a second process loads machine code from disk. The sha is
of the generated source, which depends on the kernel's instructions and
everything in ``Program.constants_key()`` plus which operands alias a
written region; so one compiled function serves every node and layer with
the same constants (GPT-2: six functions for 122 micro nodes). Kernels are
compiled once per process, on first use or all at once by
:meth:`CompiledRunner.warmup`.

Semantics are the step interpreter's, checked bit for bit by
tests/test_compiled.py: f32 arithmetic (np.float32 constants, the shared
libm expf of vm/handlers), uint32 wrapping for U registers, rtou faults,
bounds checks of every load and store against its region, non-finite loop
counts. A fault is recorded per lane as (code, pc, value, trip numbers of the
enclosing loops) and raised from Python with the interpreter's own message
builders; of several faulting lanes the one the lockstep interpreter would
have hit first is reported (earliest (loop, trip, ..., pc) position, then
lowest lane). State after a fault is not the interpreter's: other lanes ran on.

Limits, on purpose:

* Lanes run one after the other (or, with ``CompiledRunner(parallel=True)``,
  spread over threads with numba ``prange`` for kernels with loops; off by
  default because on a 2-core machine the OpenMP workers' spinning starves
  the BLAS threads of the ext ops, costing far more than it gains); the
  interpreter runs them in lockstep. The two agree when lanes do
  not communicate through memory within a dispatch. Rule (vm/lanes): every
  region a kernel stores to must split into per-lane slices. Kernels where
  no such split is found run on the interpreter (:attr:`CompiledRunner.fallbacks` says why).
  Every access to a written region is then checked at run time to lie in the
  accessing lane's slice; a violation raises :class:`LaneConflict` (the
  dispatch has partly run; the kernel is interpreted from then on). The
  seed's g2.attn_decode passes: each lane owns its head's columns of
  key_cache/value_cache ([positions, hidden], L = headdim, M = hidden) and
  its row of scores (L = positions).
* The instruction budget is counted per lane, a basic block at a time (the
  interpreter counts lockstep steps). With non-divergent lanes both stop at
  the same pc with the same message; with divergent lanes the interpreter
  can stop earlier, since lockstep steps are at least every lane's own count.
* Stopping: pass a :class:`StopFlag` (a threading.Event) and the kernel sees
  it within about 16k instructions per lane (Interrupted names kernel, node,
  lane, pc and line); a plain threading.Event is only looked at before a
  dispatch.
* A dispatch with zero lanes executes nothing (the interpreter still steps
  through its instructions and can hit a budget smaller than the kernel).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import FirError, Interrupted
from ..jitcache import cache_dir, prepare_numba
from .assembler import Address, Program
from .codegen import (C_ABORT, C_EPOCH, C_FAULTED, F_BUDGET, F_COUNT, F_LOAD, F_OWNER, F_RTOU,
                      F_STOP, F_STORE, REC_FIXED, Generated, fault_message, generate)
from .faults import budget_error, fault_error
from .interp import Dispatch
from .isa import FrameKind
from .lanes import lane_partition

UNLIMITED = 1 << 62
# numba's compile time grows faster than linearly with straight-line code (250 ops ~1 s,
# 1000 ops ~13 s, 10000 ops > 15 min), and the lane analysis walks a loop body twice
# per enclosing loop (2^depth; Python also refuses 20 nested blocks): such kernels run
# on the interpreter instead.
MAX_COMPILED_OPS = 400
MAX_COMPILED_NESTING = 8


def _too_big_to_compile(program: Program) -> str:
    """Why a kernel is not worth compiling (a hostile model file's kernel), or ''."""
    if len(program.ops) > MAX_COMPILED_OPS:
        return (f"{len(program.ops)} instructions: longer than {MAX_COMPILED_OPS}, which "
                "numba would take minutes to compile")
    depth = max((op.depth for op in program.ops), default=0)
    if depth > MAX_COMPILED_NESTING:
        return f"blocks nested {depth} deep (more than {MAX_COMPILED_NESTING})"
    return ""


class LaneConflict(FirError):
    """Compiled lanes touched each other's slice of a written region."""


class StopFlag(threading.Event):
    """A threading.Event that running compiled kernels can also see."""

    def __init__(self):
        super().__init__()
        self.cell = np.zeros(1, dtype=np.int64)

    def set(self) -> None:
        self.cell[0] = 1
        super().set()

    def clear(self) -> None:
        self.cell[0] = 0
        super().clear()


# --- numba support used by the generated modules ---------------------------------
def _make_poll():
    prepare_numba()
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def poll(typingctx, cell):
        """cell[0], re-read from memory every time (another thread may set it)."""
        sig = types.int64(cell)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            return builder.load_atomic(ary.data, "monotonic", 8)
        return sig, codegen
    return poll


_POLL_FN = None


def __getattr__(name):  # lazy: importing numba costs time, only the compiled path needs it
    global _POLL_FN
    if name == "poll":
        if _POLL_FN is None:
            _POLL_FN = _make_poll()
        return _POLL_FN
    raise AttributeError(name)


# --- loading generated modules ------------------------------------------------------
_MODULES: dict[str, object] = {}
_MODULES_LOCK = threading.Lock()
_SIG = ("void(float32[::1], int64[::1], int64, int64, int64[::1], int64[:, ::1], "
        "float32[::1], int64[::1])")


def kernel_dir() -> Path:
    """Where generated kernel sources (and numba's cache of them) live: see firscope.jitcache."""
    return cache_dir("kernels")


def _load_module(gen: Generated):
    prepare_numba()
    with _MODULES_LOCK:
        mod = _MODULES.get(gen.sha)
        if mod is not None:
            return mod
        folder = kernel_dir()
        path = folder / f"k{gen.sha}.py"
        if not path.exists() or path.read_text() != gen.source:
            tmp = folder / f".k{gen.sha}.{os.getpid()}.tmp"
            tmp.write_text(gen.source)
            os.replace(tmp, path)  # atomic: another process may be importing it
        name = f"firscope_kernel_{gen.sha}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _MODULES[gen.sha] = mod
        return mod


# --- the runner -------------------------------------------------------------------------
@dataclass
class _Plan:
    program: Program
    gen: Generated | None  # None: runs on the interpreter
    why: str = ""
    bases: np.ndarray | None = None
    slicing: dict = field(default_factory=dict)
    need: int = 0  # arena elements the kernel's regions span
    fn: Callable | None = field(default=None, repr=False)


class CompiledRunner:
    """Runs micro nodes of one model through compiled per-lane kernels.

    ``run(node, arena, budget)`` works on any 1-D contiguous float32 arena
    laid out like the model's (the debugger interleaves it with the step
    interpreter on the same arena). Not for concurrent use from two threads.
    """

    def __init__(self, model, *, stop: threading.Event | None = None, parallel: bool = False):
        self.model = model
        self.stop = stop
        # Lanes over threads (numba prange) only on request: on a small machine the
        # OpenMP workers spin after each kernel and starve BLAS's threads in the
        # ext ops that follow, which costs far more than the kernels gain.
        self.parallel = parallel
        self._plans: dict[int, _Plan] = {}
        self.fallbacks: dict[str, str] = {}  # kernel@node -> why it is interpreted
        self._ctl = np.zeros(4, dtype=np.int64)
        self._epoch = 0
        self._no_stop = np.zeros(1, dtype=np.int64)
        self._lock = threading.Lock()
        max_threads, max_loops = 1, 0
        for node in model.nodes:
            if node.kind == "micro":
                max_threads = max(max_threads, node.program.threads)
                max_loops = max(max_loops, sum(op.spec.opens is FrameKind.FOR
                                               for op in node.program.ops))
        # One fault record per lane: REC_FIXED fields, then a trip number per loop level.
        self._rec = np.zeros((max_threads, REC_FIXED + max(max_loops, 1)), dtype=np.int64)
        self._frec = np.zeros(max_threads, dtype=np.float32)

    # -- planning and compiling ---------------------------------------------------------
    def plan(self, node) -> _Plan:
        plan = self._plans.get(node.index)
        if plan is not None:
            return plan
        program = node.program
        slicing, why = None, _too_big_to_compile(program)
        if not why:
            slicing, why = lane_partition(program)
        if slicing is None:
            plan = _Plan(program, None, why)
            self.fallbacks[node.full_name] = why
        else:
            gen = generate(program, slicing)
            addrs = {a.operand: a for op in program.ops for a in op.args
                     if isinstance(a, Address)}
            bases = np.array([addrs[s].base for s in gen.slots] or [0], dtype=np.int64)
            need = max((a.base + a.extent for a in addrs.values()), default=0)
            plan = _Plan(program, gen, "", bases, slicing=slicing, need=need)
        self._plans[node.index] = plan
        return plan

    def _compile(self, plan: _Plan) -> Callable:
        if plan.fn is None:
            mod = _load_module(plan.gen)
            fn = mod.run_parallel if plan.gen.parallel and self.parallel else mod.run_serial
            if not fn.signatures:
                fn.compile(_SIG)
            plan.fn = fn
        return plan.fn

    def kernels(self) -> list[_Plan]:
        """One plan per distinct generated kernel of the model (what warmup compiles)."""
        seen: dict[str, _Plan] = {}
        for node in self.model.nodes:
            if node.kind == "micro":
                p = self.plan(node)
                if p.gen is not None:
                    seen.setdefault(p.gen.sha + str(p.gen.parallel), p)
        return list(seen.values())

    def warmup(self, progress: Callable[[str, float], None] | None = None) -> None:
        """Generate and compile every kernel now (e.g. in a UI worker thread)."""
        todo = self.kernels()
        for i, p in enumerate(todo):
            if progress:
                progress(f"compiling {p.program.name}", i / max(len(todo), 1))
            self._compile(p)
        # Share the compiled function with every node using the same source.
        by_sha = {p.gen.sha + str(p.gen.parallel): p.fn for p in todo}
        for p in self._plans.values():
            if p.gen is not None and p.fn is None:
                p.fn = by_sha.get(p.gen.sha + str(p.gen.parallel))
        if progress:
            progress("compiled", 1.0)

    # -- running ---------------------------------------------------------------------------
    def run(self, node, arena: np.ndarray, budget: int | None = None,
            stop: threading.Event | None = None) -> None:
        plan = self.plan(node)
        stop = stop if stop is not None else self.stop
        if stop is not None and stop.is_set():
            raise Interrupted(f"stopped by the user before node {node.full_name}", node.loc)
        if (plan.gen is None or arena.dtype != np.float32 or arena.ndim != 1
                or not arena.flags.c_contiguous or not arena.flags.writeable
                or arena.size < plan.need):
            Dispatch(plan.program, arena).run(budget)
            return
        fn = plan.fn or self._compile(plan)
        program = plan.program
        ctl = self._ctl
        self._epoch += 1
        ctl[C_ABORT] = 0
        ctl[C_FAULTED] = 0
        ctl[C_EPOCH] = self._epoch
        cell = stop.cell if isinstance(stop, StopFlag) else self._no_stop
        limit = UNLIMITED if budget is None else max(int(budget), 0)
        if program.threads > self._rec.shape[0]:  # a node from outside the model
            self._rec = np.zeros((program.threads, self._rec.shape[1]), dtype=np.int64)
            self._frec = np.zeros(program.threads, dtype=np.float32)
        fn(arena, plan.bases, program.threads, limit, ctl, self._rec, self._frec, cell)
        if ctl[C_FAULTED] or ctl[C_ABORT]:
            self._raise(plan, node, budget)

    def _raise(self, plan: _Plan, node, budget) -> None:
        program = plan.program
        rec = self._rec[:program.threads]
        lanes = np.flatnonzero(rec[:, 0] == self._epoch)
        loops = plan.gen.loop_pcs

        def key(lane):
            row = rec[lane]
            pc = int(row[2])
            enclosing = loops.get(pc, ())
            k = []
            for i, lpc in enumerate(enclosing):
                k += [lpc, int(row[REC_FIXED + i])]
            return tuple(k) + (pc,), lane

        by_code: dict[int, list[int]] = {}
        for lane in lanes:
            by_code.setdefault(int(rec[lane, 1]), []).append(int(lane))
        faults = [ln for c in (F_LOAD, F_STORE, F_RTOU, F_COUNT, F_OWNER)
                  for ln in by_code.get(c, [])]
        if faults:
            lane = min(faults, key=key)
            code, pc, arg = int(rec[lane, 1]), int(rec[lane, 2]), int(rec[lane, 3])
            op = program.ops[pc]
            if code == F_OWNER:
                self._plans[node.index] = _Plan(program, None, "lanes shared memory at run time")
                self.fallbacks[node.full_name] = "lanes shared memory at run time"
                addr: Address = op.args[op.spec.mem.address]
                sl = plan.slicing[addr.region.base]
                owner = ((arg % sl.modulus) if sl.modulus else arg) // sl.stride
                raise LaneConflict(
                    f"kernel '{program.name}' at node {program.node}: lane {lane} accessed "
                    f"{addr.region.name}[{arg}] (pc {pc}, line {op.loc.line}: {op.text}), which "
                    f"is in lane {owner}'s slice; lanes share memory here, so lockstep and "
                    "compiled execution may differ. The dispatch ran partly; this kernel "
                    "is interpreted from now on (or use --engine interp).", op.loc)
            message, address = fault_message(code, op, lane, arg, self._frec[lane])
            raise fault_error(program, op, lane, message, address=address)
        if F_BUDGET in by_code:
            lane = min(by_code[F_BUDGET], key=key)
            raise budget_error(program, int(rec[lane, 2]), budget)
        if F_STOP in by_code:
            lane = min(by_code[F_STOP], key=key)
            pc = int(rec[lane, 2])
            op = program.ops[pc]
            raise Interrupted(f"interrupted in kernel '{program.name}' at node {program.node}, "
                              f"lane {lane}, pc {pc} (line {op.loc.line}: {op.text})", op.loc)
        raise FirError(f"kernel '{program.name}' at node {program.node} was aborted")
