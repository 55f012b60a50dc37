"""Compiled micro-kernels: per-lane code generated from the opcode table.

For each bound :class:`Program` the generator walks its ops and writes one
Python function that runs a single lane: every op contributes its OpSpec
``code`` template (``R1 = R1 + R2``); ``forbegin``/``forend`` become a
``for`` loop over floor(count) trips read once on entry, ``ifbegin``/``ifend``
an ``if R[c] != 0:``. Registers are f32 / int64 locals, constants are baked
in as module-level ``np.float32`` values, region bases come in at run time.
The source is written to ``$XDG_CACHE_HOME/firscope/kernels/k<sha>.py`` (a temp
dir if that is not writable), imported, and JIT-compiled by numba with
``cache=True``, so a second process loads machine code from disk. The sha is
of the generated source, which depends on the kernel's instructions and
everything in ``Program.constants_key()`` plus which operands alias a
written region; so one compiled function serves every node and layer with
the same constants (GPT-2: six functions for 122 micro nodes). Kernels are
compiled once per process, on first use or all at once by
:meth:`CompiledRunner.warmup`.

Semantics are the step interpreter's, checked bit for bit by
tests/test_compiled.py: f32 arithmetic (np.float32 constants, the shared
libm expf of vm/opcodes), uint32 wrapping for U registers, rtou faults,
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
  not communicate through memory within a dispatch. Rule: for every region a
  kernel stores to, a small affine analysis of the U registers
  (lane * L + sum of symbols * coefficients + [lo, hi]) must find a per-lane
  stride L > 0 shared by every access to that region; the slice of lane l is
  then the elements i with ``(i mod M) div L == l`` (M: the gcd of the
  unbounded symbol coefficients when it is at least threads * L, i.e. rows of
  a [rows, threads * L] layout, else no modulus). Kernels where no such L is
  found run on the interpreter (:attr:`CompiledRunner.fallbacks` says why).
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

import hashlib
import importlib.util
import math
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import FirError, Interrupted
from ..jitcache import cache_dir, prepare_numba
from .assembler import NREGS, Address, Program, Region
from .interp import (MAX_TRIPS, Dispatch, bounds_message, budget_error, fault_error,
                     loop_count_message, rtou_message)

GENERATOR_VERSION = 4  # bump when the generated code's meaning changes
POLL = 1 << 14  # instructions between looks at the stop flag
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

_JIT = "error_model='numpy', fastmath=False, cache=True, nogil=True, _nrt=False"

# Fault codes written by compiled lanes into their record row.
F_LOAD, F_STORE, F_RTOU, F_COUNT, F_OWNER, F_BUDGET, F_STOP = 1, 2, 3, 4, 5, 6, 7
# ctl slots
C_ABORT, C_EPOCH, C_FAULTED = 0, 1, 2
REC_FIXED = 4  # epoch, code, pc, arg; then one trip number per enclosing loop


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


# --- lane-partition analysis -----------------------------------------------------
@dataclass(frozen=True)
class Aff:
    """lane * lane_coef + sum(coef * symbol) + c, c in [lo, hi]; symbols are any integers."""

    lane: int
    syms: tuple  # sorted ((name, coef), ...)
    lo: int
    hi: int

    def plus(self, o: "Aff") -> "Aff":
        d = dict(self.syms)
        for k, v in o.syms:
            d[k] = d.get(k, 0) + v
        return Aff(self.lane + o.lane, _syms(d), self.lo + o.lo, self.hi + o.hi)

    def times(self, k: int) -> "Aff":
        lo, hi = sorted((self.lo * k, self.hi * k))
        return Aff(self.lane * k, _syms({s: c * k for s, c in self.syms}), lo, hi)

    def shift(self, k: int) -> "Aff":
        return Aff(self.lane, self.syms, self.lo + k, self.hi + k)

    def coef(self, name: str) -> int:
        return dict(self.syms).get(name, 0)

    def without(self, name: str) -> "Aff":
        return Aff(self.lane, _syms({s: c for s, c in self.syms if s != name}), self.lo, self.hi)


def _syms(d: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in d.items() if v))


ZERO_AFF = Aff(0, (), 0, 0)


def _const(k: int) -> Aff:
    return Aff(0, (), k, k)


def _join(a: Aff | None, b: Aff | None) -> Aff | None:
    if a is None or b is None or a.lane != b.lane:
        return None
    if a == b:
        return a
    da, db = dict(a.syms), dict(b.syms)
    out = {}
    for k in set(da) | set(db):
        if k in da and k in db and da[k] != db[k]:
            return None
        out[k] = da.get(k, db.get(k))
    return Aff(a.lane, _syms(out), min(a.lo, b.lo), max(a.hi, b.hi))


def _subst(f: Aff, env: dict) -> Aff | None:
    """Replace entry symbols ``v<reg>`` in f by the abstract values in env."""
    out = Aff(f.lane, (), f.lo, f.hi)
    for s, c in f.syms:
        if s in env:
            if env[s] is None:
                return None
            out = out.plus(env[s].times(c))
        else:
            out = out.plus(Aff(0, ((s, c),), 0, 0))
    return out


@dataclass
class _State:
    U: dict  # reg -> Aff | None
    R: dict  # reg -> "lane" | ("const", float) | None

    def copy(self) -> "_State":
        return _State(dict(self.U), dict(self.R))


class _Analysis:
    """Abstract execution of a program over affine U-register values."""

    def __init__(self, program: Program):
        self.p = program
        self.ops = program.ops
        self.sites: list[tuple[Region, Aff | None, bool]] = []
        self._fresh = 0

    def fresh(self, base: str = "s") -> str:
        self._fresh += 1
        return f"{base}{self._fresh}"

    def run(self) -> None:
        st = _State({u: ZERO_AFF for u in range(NREGS)},
                    {r: ("const", 0.0) for r in range(NREGS)})
        st.R[0] = "lane"
        self.seq(0, len(self.ops), st, True)

    def seq(self, a: int, b: int, st: _State, record: bool) -> _State:
        pc = a
        while pc < b:
            op = self.ops[pc]
            m = op.spec.mnemonic
            if m == "forbegin":
                st = self.loop(op, st, record)
                pc = op.match + 1
            elif m == "ifbegin":
                body = self.seq(pc + 1, op.match, st.copy(), record)
                st = _State({r: _join(st.U[r], body.U[r]) for r in st.U},
                            {r: st.R[r] if st.R[r] == body.R[r] else None for r in st.R})
                pc = op.match + 1
            else:
                self.transfer(op, st, record)
                pc += 1
        return st

    def transfer(self, op, st: _State, record: bool) -> None:
        m = op.spec.mnemonic
        a = op.args
        if m == "rtou":
            src = st.R[a[1]]
            if src == "lane":
                st.U[a[0]] = Aff(1, (), 0, 0)
            elif isinstance(src, tuple) and math.isfinite(src[1]) and 0 <= src[1] < 2 ** 32:
                st.U[a[0]] = _const(int(src[1]))
            else:
                st.U[a[0]] = Aff(0, ((self.fresh(), 1),), 0, 0)
        elif m == "uconst":
            st.U[a[0]] = _const(a[1])
        elif m == "uaddk":
            v = st.U[a[1]]
            st.U[a[0]] = None if v is None else v.shift(_signed(a[2]))
        elif m == "umulk":
            v = st.U[a[1]]
            st.U[a[0]] = None if v is None else v.times(a[2])
        elif m == "uadd":
            x, y = st.U[a[1]], st.U[a[2]]
            st.U[a[0]] = None if x is None or y is None else x.plus(y)
        elif m == "loadconstf32":
            st.R[a[0]] = ("const", float(a[1]))
        elif m in ("uloadf32", "ustoref32"):
            addr: Address = a[2]
            if record:
                v = st.U[a[1]]
                self.sites.append((addr.region, None if v is None else v.shift(addr.offset),
                                   m == "ustoref32"))
            if m == "uloadf32":
                st.R[a[0]] = None
        else:
            for file, i in op.spec.writes:  # any other opcode: its results are unknown
                if file == "R":
                    st.R[a[i]] = None
                else:
                    st.U[a[i]] = Aff(0, ((self.fresh(), 1),), 0, 0)

    def loop(self, op, s0: _State, record: bool) -> _State:
        c = s0.R[op.args[0]]
        trips = None  # unknown at analysis time
        if isinstance(c, tuple) and math.isfinite(c[1]):
            trips = int(min(max(math.floor(c[1]), 0), MAX_TRIPS))
        if trips == 0:
            return s0
        body = (op.pc + 1, op.match)
        # One symbolic trip: every U register starts as its own entry symbol.
        sym = s0.copy()
        for r in range(NREGS):
            sym.U[r] = Aff(0, ((f"v{r}", 1),), 0, 0)
        end = self.seq(*body, sym, False)
        header = s0.copy()
        exit_ = s0.copy()
        for r in range(NREGS):
            if end.R[r] != sym.R[r]:
                header.R[r] = None
                exit_.R[r] = None
        kinds: dict[int, str] = {}
        entry = {f"v{r}": None for r in range(NREGS)}
        for r in range(NREGS):
            f = end.U[r]
            v = f"v{r}"
            if f is None:
                header.U[r] = exit_.U[r] = None
                kinds[r] = "top"
                continue
            d = f.without(v)
            if f.coef(v) == 1 and not any(s.startswith("v") for s, _ in d.syms) and d.lane == 0:
                kinds[r] = "ind"
                base = s0.U[r]
                if base is None:
                    header.U[r] = exit_.U[r] = None
                elif d == ZERO_AFF:
                    header.U[r] = exit_.U[r] = base
                elif not d.syms and d.lo == d.hi and trips is not None:
                    step = d.lo
                    header.U[r] = base.plus(Aff(0, (), min(0, step * (trips - 1)),
                                                max(0, step * (trips - 1))))
                    exit_.U[r] = base.shift(step * trips)
                elif d.lo == d.hi:
                    g = math.gcd(d.lo, *[k for _, k in d.syms])
                    header.U[r] = base.plus(Aff(0, ((self.fresh("t"), g),), 0, 0))
                    exit_.U[r] = base.plus(Aff(0, ((self.fresh("t"), g),), 0, 0))
                else:
                    header.U[r] = exit_.U[r] = None
                entry[v] = header.U[r]
            elif f.coef(v) == 0:
                kinds[r] = "set"
            else:
                kinds[r] = "top"
                header.U[r] = exit_.U[r] = None
        for r, k in kinds.items():
            if k == "set":
                val = _subst(end.U[r], entry)
                header.U[r] = _join(s0.U[r], val)
                exit_.U[r] = val if trips is not None else header.U[r]
        self.seq(*body, header.copy(), record)  # the accesses of every trip
        return exit_


def _signed(k: int) -> int:
    return k - (1 << 32) if k >= 1 << 31 else k


@dataclass(frozen=True)
class Slicing:
    """Lane l owns elements i of a region with (i mod modulus) div stride == l."""

    stride: int
    modulus: int  # 0: no modulus


def lane_partition(program: Program) -> tuple[dict[int, Slicing] | None, str]:
    """Slicing per written region base, or (None, reason) when lanes may share memory."""
    if program.threads <= 1:
        return {}, ""
    an = _Analysis(program)
    an.run()
    by_region: dict[int, list] = {}
    for region, aff, store in an.sites:
        by_region.setdefault(region.base, []).append((region, aff, store))
    out: dict[int, Slicing] = {}
    for base, sites in by_region.items():
        if not any(st for _, _, st in sites):
            continue
        region = sites[0][0]
        if any(aff is None for _, aff, _ in sites):
            return None, f"cannot tell which lane each access to {region.name} belongs to"
        lanes = {aff.lane for _, aff, _ in sites}
        if len(lanes) != 1 or next(iter(lanes)) <= 0:
            return None, (f"lanes are not offset by one common stride in {region.name} "
                          f"(lane coefficients {sorted(lanes)})")
        stride = next(iter(lanes))
        g = 0
        for _, aff, _ in sites:
            for _, k in aff.syms:
                g = math.gcd(g, k)
        modulus = g if g >= program.threads * stride else 0
        # The bounded part of each access must stay inside one lane's slice.
        for _, aff, _ in sites:
            if aff.lo < 0 or aff.hi >= stride:
                return None, (f"an access to {region.name} reaches {aff.hi - aff.lo + 1} "
                              f"elements around lane * {stride}: wider than one lane's slice")
        out[base] = Slicing(stride, modulus)
    return out, ""


# --- code generation ---------------------------------------------------------------
def _f32_literal(c) -> str:
    v = float(c)
    if math.isnan(v):
        return "np.float32(np.nan)"
    if math.isinf(v):
        return "np.float32(np.inf)" if v > 0 else "np.float32(-np.inf)"
    return f"np.float32({v!r})"


@dataclass
class Generated:
    source: str
    sha: str
    slots: tuple[str, ...]  # address operand names, in bases[] order
    parallel: bool
    max_loops: int  # nesting depth of loops (trip numbers in a fault record)
    loop_pcs: dict[int, tuple[int, ...]]  # pc -> pcs of enclosing forbegins, outermost first


class _Gen:
    def __init__(self, program: Program, slicing: dict[int, Slicing]):
        self.p = program
        self.ops = program.ops
        self.slicing = slicing
        self.consts: dict[str, str] = {}
        self.slots: dict[str, int] = {}
        self.lines: list[str] = []
        self.max_loops = 0
        self.loop_pcs: dict[int, tuple[int, ...]] = {}
        self.tmp = 0

    def const(self, c) -> str:
        lit = _f32_literal(c)
        if lit not in self.consts:
            self.consts[lit] = f"C{len(self.consts)}"
        return self.consts[lit]

    def slot(self, addr: Address) -> int:
        return self.slots.setdefault(addr.operand, len(self.slots))

    def fault(self, ind: str, code: int, pc, arg: str, loops: tuple,
              flag: int = C_FAULTED) -> list[str]:
        """Record (code, pc, arg, trip numbers) in this lane's row and leave the lane."""
        out = [f"{ind}rec[lane, 1] = {code}", f"{ind}rec[lane, 2] = {pc}",
               f"{ind}rec[lane, 3] = {arg}"]
        for i in range(len(loops)):
            out.append(f"{ind}rec[lane, {REC_FIXED + i}] = t{i} + 1")
        out += [f"{ind}rec[lane, 0] = ctl[{C_EPOCH}]", f"{ind}ctl[{flag}] = 1",
                f"{ind}return"]
        return out

    def generate(self) -> Generated:
        body = self.seq(0, len(self.ops), "    ", ())
        regs_r = sorted({op.args[i] for op in self.ops for i, k in enumerate(op.spec.operands)
                         if k in ("Rd", "Rs")} | {0})
        regs_u = sorted({op.args[i] for op in self.ops for i, k in enumerate(op.spec.operands)
                         if k in ("Ud", "Us")})
        p = self.p
        has_loops = any(op.spec.mnemonic == "forbegin" for op in self.ops)
        parallel = p.threads >= 2 and (has_loops or p.threads * len(self.ops) >= 200_000)
        head = [f"# Generated by firscope.vm.compiled (generator {GENERATOR_VERSION}) from kernel "
                f"'{p.name}' ({len(self.ops)} ops); do not edit.",
                "import numpy as np",
                "from numba import njit, prange",
                "from firscope.vm.compiled import poll",
                "",
                "ONE = np.float32(1.0)",
                "ZERO = np.float32(0.0)",
                "M32 = 0xFFFFFFFF"]
        head += [f"{name} = {lit}" for lit, name in self.consts.items()]
        # Region bases are scalar arguments (kept in registers across lanes); no
        # NRT: nothing here allocates, and its reference counting of the array
        # arguments on every early return cost more than the kernels themselves.
        bnames = [f"B{i}" for i in range(len(self.slots))]
        blist = "".join(f"{b}, " for b in bnames)
        fn = ["", "",
              f"@njit({_JIT}, inline='always')",
              f"def lane_fn(lane, arena, {blist}budget, ctl, rec, frec, stop):"]
        fn.append("    R0 = np.float32(lane)")
        fn += [f"    R{r} = ZERO" for r in regs_r if r != 0]
        fn += [f"    U{u} = 0" for u in regs_u]
        fn += ["    cnt = 0", f"    lim = budget if budget < {POLL} else {POLL}"]
        fn += body
        entry = ["", "",
                 f"@njit({_JIT})",
                 "def run_serial(arena, bases, threads, budget, ctl, rec, frec, stop):",
                 *[f"    {b} = bases[{i}]" for i, b in enumerate(bnames)],
                 "    for lane in range(threads):",
                 f"        lane_fn(lane, arena, {blist}budget, ctl, rec, frec, stop)",
                 "", "",
                 f"@njit({_JIT}, parallel=True)",
                 "def run_parallel(arena, bases, threads, budget, ctl, rec, frec, stop):",
                 *[f"    {b} = bases[{i}]" for i, b in enumerate(bnames)],
                 "    for lane in prange(threads):",
                 f"        lane_fn(np.int64(lane), arena, {blist}budget, ctl, rec, frec, stop)",
                 ""]
        source = "\n".join(head + fn + entry)
        sha = hashlib.sha256(source.encode()).hexdigest()[:24]
        slots = tuple(sorted(self.slots, key=self.slots.get))
        return Generated(source, sha, slots, parallel, self.max_loops, self.loop_pcs)

    # A block is a run of ops that always execute together; its size is
    # charged to the lane's instruction count before it runs.
    def seq(self, a: int, b: int, ind: str, loops: tuple) -> list[str]:
        out: list[str] = []
        block: list[int] = []
        stmts: list[str] = []

        def flush():
            if block:
                out.extend(self.block_check(block, ind, loops))
                out.extend(stmts)
                block.clear()
                stmts.clear()

        pc = a
        while pc < b:
            op = self.ops[pc]
            self.loop_pcs[pc] = loops
            m = op.spec.mnemonic
            block.append(pc)
            if m == "forbegin":
                flush()
                depth = len(loops)
                self.max_loops = max(self.max_loops, depth + 1)
                v, n = f"v{depth}", f"n{depth}"
                out.append(f"{ind}{v} = R{op.args[0]}")
                out.append(f"{ind}if not np.isfinite({v}):")
                out.append(f"{ind}    frec[lane] = {v}")
                out.extend(self.fault(ind + "    ", F_COUNT, pc, "0", loops))
                out.append(f"{ind}{n} = int(np.floor({v})) if {v} < 4.0e18 else {MAX_TRIPS}")
                out.append(f"{ind}for t{depth} in range({n}):")
                inner = self.seq(pc + 1, op.match + 1, ind + "    ", loops + (pc,))
                out.extend(inner)
                self.loop_pcs[op.match] = loops + (pc,)
                pc = op.match + 1
            elif m == "ifbegin":
                flush()
                out.append(f"{ind}if R{op.args[0]} != 0:")
                out.extend(self.seq(pc + 1, op.match + 1, ind + "    ", loops))
                pc = op.match + 1
            elif m in ("forend", "ifend"):
                pc += 1
            else:
                stmts.extend(self.statement(op, ind, loops))
                pc += 1
        flush()
        if not out:
            out.append(f"{ind}pass")
        return out

    def block_check(self, block: list[int], ind: str, loops: tuple) -> list[str]:
        n = len(block)
        first = block[0]
        i2 = ind + "    "
        i3 = i2 + "    "
        # Over budget: the interpreter would stop before the (budget+1)-th instruction,
        # which is this block's op number budget - cnt (blocks are consecutive pcs).
        out = [f"{ind}if cnt + {n} > lim:",
               f"{i2}if cnt + {n} > budget:",
               *self.fault(i3, F_BUDGET, f"{first} + (budget - cnt)", "0", loops, C_ABORT),
               f"{i2}if poll(stop) != 0:",
               *self.fault(i3, F_STOP, first, "0", loops, C_ABORT),
               f"{i2}if poll(ctl) != 0:",  # ctl[0]: another lane aborted the dispatch
               f"{i3}return",
               f"{i2}lim = budget if budget - cnt < {POLL} else cnt + {POLL}",
               f"{ind}cnt += {n}"]
        return out

    def statement(self, op, ind: str, loops: tuple) -> list[str]:
        spec = op.spec
        args = []
        for kind, a in zip(spec.operands, op.args):
            if kind == "F":
                args.append(self.const(a))
            elif kind == "A":
                args.append(str(self.slot(a)))
            else:
                args.append(str(int(a)))
        text = spec.code.format(*args)
        if "RTOU(" in text:
            dst, src = text.split(" = RTOU(")
            src = src.rstrip(")")
            return [f"{ind}if not ({src} >= 0 and {src} < 4294967296.0):",
                    f"{ind}    frec[lane] = {src}",
                    *self.fault(ind + "    ", F_RTOU, op.pc, "0", loops),
                    f"{ind}{dst} = int({src})"]
        if "LOAD(" in text:
            dst, rest = text.split(" = LOAD(")
            _, ureg = rest.rstrip(")").split(", ")
            return self.access(op, ind, loops, ureg, f"{ind}{dst} = arena[{{base}} + i]")
        if "STORE(" in text:
            _, ureg, src = text[len("STORE("):].rstrip(")").split(", ")
            return self.access(op, ind, loops, ureg, f"{ind}arena[{{base}} + i] = {src}")
        text = text.replace("EXP(", "np.exp(").replace("SQRT(", "np.sqrt(")
        return [ind + text]

    def access(self, op, ind: str, loops: tuple, ureg: str, action: str) -> list[str]:
        addr: Address = op.args[2]
        slot = self.slot(addr)
        store = op.spec.mnemonic == "ustoref32"
        off = addr.offset
        out = [f"{ind}i = {ureg} + {off}" if off else f"{ind}i = {ureg}",
               f"{ind}if i < 0 or i >= {addr.extent}:"]
        out += self.fault(ind + "    ", F_STORE if store else F_LOAD, op.pc, "i", loops)
        sl = self.slicing.get(addr.region.base)
        if sl is not None:
            owner = f"(i % {sl.modulus}) // {sl.stride}" if sl.modulus else f"i // {sl.stride}"
            out.append(f"{ind}if {owner} != lane:")
            out += self.fault(ind + "    ", F_OWNER, op.pc, "i", loops)
        out.append(action.format(base=f"B{slot}"))
        return out


def generate(program: Program, slicing: dict[int, Slicing] | None = None) -> Generated:
    """Per-lane source for ``program`` (see the module docstring)."""
    if slicing is None:
        slicing, why = lane_partition(program)
        if slicing is None:
            raise FirError(f"kernel '{program.name}' at node {program.node} cannot be compiled: "
                           f"{why}")
    return _Gen(program, slicing).generate()


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
                max_loops = max(max_loops, sum(op.spec.mnemonic == "forbegin"
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
                addr: Address = op.args[2]
                sl = plan.slicing[addr.region.base]
                owner = ((arg % sl.modulus) if sl.modulus else arg) // sl.stride
                raise LaneConflict(
                    f"kernel '{program.name}' at node {program.node}: lane {lane} accessed "
                    f"{addr.region.name}[{arg}] (pc {pc}, line {op.loc.line}: {op.text}), which "
                    f"is in lane {owner}'s slice; lanes share memory here, so lockstep and "
                    "compiled execution may differ. The dispatch ran partly; this kernel "
                    "is interpreted from now on (or use --engine interp).", op.loc)
            if code in (F_LOAD, F_STORE):
                addr = op.args[2]
                raise fault_error(program, op, lane, bounds_message(op, addr, arg),
                                  address=addr.base + arg)
            if code == F_RTOU:
                raise fault_error(program, op, lane,
                                  rtou_message(op.args[1], self._frec[lane], lane))
            raise fault_error(program, op, lane,
                              loop_count_message(op.args[0], self._frec[lane], lane))
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
