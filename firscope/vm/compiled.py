"""Compiled micro-kernels: the runner of the per-lane code vm/codegen writes.

For each bound :class:`Program`, vm/codegen writes one Python function that
runs a single lane, from its table of renderers, and two drivers that run a
range of lanes. vm/kernel_cache writes that source to
``$XDG_CACHE_HOME/firscope/kernels/k<sha>.py`` (a temp dir if that is not
writable), imports it, and JIT-compiles it with numba with ``cache=True``, so
a second process loads machine code from disk; vm/kernel_plan holds what the
runner decides per node once; vm/proofs proves when a dispatch may take the
plain driver. The sha is of the generated
source, which depends on the kernel's instructions only (and on which
operands alias a written region): every number a node binds (constants,
offsets, extents, lane slices) is an argument. So one compiled function
serves every node, layer and model shape running the same instructions
(GPT-2 of any size: four functions for its micro nodes). Drivers are
compiled once per process, on first use or all at once by
:meth:`CompiledRunner.warmup`; the slow paths every kernel shares (fault
records, budget and stop checks) are compiled once, in vm/kernel_helpers.

Semantics are the step interpreter's, checked bit for bit by
tests/test_compiled.py: f32 arithmetic (np.float32 constants, the shared
libm expf of vm/handlers), uint32 wrapping for U registers, rtou faults,
bounds checks of every load and store against its region, non-finite loop
counts. A fault is recorded per lane as (code, pc, value, trip numbers of the
enclosing loops) and raised from Python with the interpreter's own message
builders; of several faulting lanes the one the lockstep interpreter would
have hit first is reported (earliest (loop, trip, ..., pc) position, then
lowest lane).

A compiled dispatch is all or nothing: every store is first journaled (arena
address, old value), and whenever lanes stop early (a fault, the budget, a
stop request) the runner undoes the journal before it raises, so the arena is
exactly as before the dispatch (the interpreter instead leaves the lockstep
state at the faulting instruction; the debugger replays it there, and nodes
the runner interprets behave as the interpreter does). A full
journal aborts the dispatch at once; the runner undoes it and runs the node
again with a larger one (tests/test_lane_conflict.py). Journaling costs a
compare, a load and two stores per store, so the runner avoids it where it
can: a kernel the lane analysis proves unable to stop early (every index in
bounds and in its lane's slice in every lane, finite loop counts:
vm/lanes.infallible_steps) runs on the plain driver (no budget, journal or
slice checks; 2-3x faster for attention's loops) when the budget covers its
longest lane and all its lanes together run at most PLAIN_MAX_WORK
instructions (the seed's adds, gelu and layernorm). A kernel whose loop
counts or indices come from a value it reads at one constant address of a
region it does not write (attention: the position) is proved per dispatch:
the runner reads that value first and looks for a proof made for a range of
values holding it (:class:`PlainProofs`, vm/lanes.infallible_for), so
attention takes the plain driver at every position but past the last. A
kernel that stores into every element it can write has those regions copied
instead of journaled (benchmarks/micro_kernels.py measures the rest).

Limits, on purpose:

* Lanes run one after the other (or, with ``CompiledRunner(parallel=N)``,
  in N ranges on N threads for kernels with loops and enough work: the same
  compiled driver called per range through model/threads, each range with
  its own segment of the journal; on the plain driver a kernel's first top-level jammed
  loop runs its lanes side by side, group by group, vm/sink); the interpreter runs them
  in lockstep. The two agree when lanes do not communicate through memory within a
  dispatch. Rule (vm/lanes): every
  region a kernel stores to must split into per-lane slices. Kernels where
  no such split is found run on the interpreter (:attr:`CompiledRunner.fallbacks`
  says why). Every access to a written region is then checked at run time to
  lie in the accessing lane's slice; when one does not (a loop count read
  from memory can send a lane into its neighbour's slice), the runner undoes
  the dispatch, runs the node on the interpreter, and interprets that node
  from then on; the caller sees the interpreter's result and no error. The
  seed's g2.attn_decode passes: each lane owns its head's columns of
  key_cache/value_cache ([positions, hidden], L = headdim, M = hidden) and
  its row of scores (L = positions).
* The instruction budget is counted per lane, a basic block at a time (the
  interpreter counts lockstep steps). With non-divergent lanes both stop at
  the same pc with the same message; with divergent lanes the interpreter
  can stop earlier, since lockstep steps are at least every lane's own count.
* Stopping: pass a :class:`StopFlag` (a threading.Event) and the kernel sees
  it within about 16k instructions per lane on the checked driver, and after
  the dispatch on the plain one (Interrupted names kernel, node,
  lane, pc and line); a plain threading.Event is only looked at before a
  dispatch.
* A dispatch with zero lanes executes nothing (the interpreter still steps
  through its instructions and can hit a budget smaller than the kernel).

size: what is left here is one job, the runner's dispatch: the checked, plain, split and
journaled paths and the undo and fault reports after them read and update the same plan
(vm/kernel_plan), and spreading them over modules would only pass it around.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, NamedTuple

import numpy as np

from ..errors import FirError
from ..fir.syntax import NodeKind
from ..jitcache import entry_for
from ..model.threads import matvec_threads, run_split
from .assembler import Address, Program
from .codegen import Generated, fault_message, generate, generation_key
from .faults import budget_error, fault_error, interrupted_error, stopped_before
from .interp import Dispatch
from .isa import FrameKind
from .kernel_abi import (C_ABORT, C_EPOCH, C_FAULTED, F_BUDGET, F_COUNT, F_JOURNAL, F_LOAD, F_OWNER,
                         F_RTOU, F_STOP, F_STORE, REC_FIXED)
from .kernel_plan import COPY_WRITTEN, JOURNAL_GROWTH, KernelPlan, journal_plan, lane_key
from .lanes import analyse, infallible_steps, lane_partition, uniform_reads
from .proofs import PlainProofs, plain_within, takes_plain

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


class _LaneFacts(NamedTuple):
    """What a kernel's lane analysis said, without region bases (CompiledRunner.plan)."""

    slicing: dict  # region's order of first use (kernel_plan.lane_key) -> Slicing
    infallible: int | None
    reads: dict  # uniform read's pc -> its address's offset from its region's base
    program: object  # the program analysed, kept alive: lane_key holds its ops' ids


def _read_base(program, pc: int) -> int:
    """The base of the region the load at ``pc`` reads."""
    op = program.ops[pc]
    return op.args[op.spec.mem.address].base


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


# --- the runner -------------------------------------------------------------------------
# Lanes are spread over threads only for kernels with loops (vm/codegen: Generated.parallel)
# whose previous dispatch's lanes took at least this long together (on one thread, or the
# sum of each range's own call when split): handing a range of lanes to a worker costs
# tens of microseconds. The time a split dispatch spends waking workers and waiting for
# them is not counted: counted (elapsed x ranges), a dispatch split once (its first run,
# cold, after the head) stayed split for good, its hand-off alone keeping it above the
# threshold -- attention@0 at 3x the other layers' attention with two threads.
PARALLEL_MIN_SECONDS = 100e-6
# A dispatch on the plain driver spreads its lanes over numba's threads (run_par: OpenMP,
# whose workers take a range in microseconds) from this much work on: attention in the
# decode at positions 0..65, forced each way on alternate steps, 65-107 us a layer alone
# and 45-76 us on two threads (two runs; its K and V rows, cold after the linears'
# streams, read by both cores).
PARALLEL_PLAIN_MIN_SECONDS = 10e-6


class CompiledRunner:
    """Runs micro nodes of one model through compiled per-lane kernels.

    ``run(node, arena, budget)`` works on any 1-D contiguous float32 arena
    laid out like the model's (the debugger interleaves it with the step
    interpreter on the same arena). Not for concurrent use from two threads.

    A compiled dispatch either completes or leaves the arena exactly as it was
    before it: every store is journaled (address, old value) first, and when a lane
    faults, runs out of budget, is stopped, or fills the journal, the runner
    undoes the journal before it raises (or, for a full journal, runs the
    node again with a larger one). When lanes stray into each other's slices
    the runner undoes the dispatch, runs it on the interpreter (the reference)
    and interprets that node from then on (:attr:`fallbacks` says why).

    ``parallel``: spread the lanes of kernels with loops over this many threads
    (1 or False: the calling thread only; True: numba's current thread count, which
    model/threads.adapt sets, for dispatches that took long enough to gain from it).
    """

    def __init__(self, model, *, stop: threading.Event | None = None,
                 parallel: bool | int = False):
        self.model = model
        self.stop = stop
        # Lanes over threads only on request (see Machine for the default).
        self.parallel = parallel
        self._plans: dict[int, KernelPlan] = {}
        self._proof_cache: dict[tuple, PlainProofs] = {}
        # kernel_plan.lane_key -> _LaneFacts: the lane analysis of a kernel made once for
        # all the nodes that bind it alike (GPT-2 small's 122 micro nodes: 0.18 s of the
        # first step's ~0.45 s)
        self._lane_facts: dict[tuple, _LaneFacts] = {}
        # generated code by codegen.generation_key (with the program it was made for, which
        # keeps the ops whose ids the key holds alive): GPT-2 small's 122 micro nodes run 4
        # kernels; generating each node's source anew took 60 ms of every warm-up
        self._generated: dict[tuple, tuple[Generated, object]] = {}
        self.fallbacks: dict[str, str] = {}  # kernel@node -> why it is interpreted
        self._ctl = np.zeros(4, dtype=np.int64)
        self._epoch = 0
        self._no_stop = np.zeros(1, dtype=np.int64)
        max_threads, max_loops = 1, 0
        for node in model.nodes:
            if node.kind == NodeKind.MICRO:
                max_threads = max(max_threads, node.program.threads)
                max_loops = max(max_loops, sum(op.spec.opens is FrameKind.FOR
                                               for op in node.program.ops))
        # One fault record per lane: REC_FIXED fields, then a trip number per loop level.
        self._rec = np.zeros((max_threads, REC_FIXED + max(max_loops, 1)), dtype=np.int64)
        self._frec = np.zeros(max_threads, dtype=np.float32)
        # The store journal, shared by all plans (each uses its first plan.journal entries),
        # and where each range of lanes' part of it ends (self._jn[k]: range k).
        self._jaddr = np.zeros(0, dtype=np.int64)
        self._jval = np.zeros(0, dtype=np.float32)
        self._jn: list[tuple[int, int]] = []  # (first entry, end) of each range's segment
        self._usable_arena: np.ndarray | None = None
        self.split_dispatches = 0  # dispatches whose lanes ran on more than one thread
        self.plain_dispatches = 0  # dispatches run() gave the plain driver
        self.clock: Callable[[], float] = time.perf_counter  # tests inject a fake one
        self._range_seconds: list[float] = []  # each range's own call, in a split dispatch

    # -- planning and compiling ---------------------------------------------------------
    def plan(self, node) -> KernelPlan:
        plan = self._plans.get(node.index)
        if plan is not None:
            return plan
        program = node.program
        slicing, why = None, _too_big_to_compile(program)
        keyed = facts = None
        if not why:
            keyed = lane_key(program)
            facts = self._lane_facts.get(keyed[0]) if keyed is not None else None
            if facts is not None:  # another node of the same kernel and shapes: rebased
                slicing = {keyed[1][k]: sl for k, sl in facts.slicing.items()}
            else:
                an = analyse(program)
                slicing, why = lane_partition(program, an)
        gen = None
        if slicing is not None:
            key = generation_key(program, slicing)
            gen = self._generated.get(key, (None,))[0]
            try:
                if gen is None:
                    gen = generate(program, slicing)
                    self._generated[key] = gen, program
            except ValueError as e:
                why = str(e)
        if gen is None:
            plan = KernelPlan(program, None, why)
            self.fallbacks[node.full_name] = why
        else:
            addrs = {a.operand: a for op in program.ops for a in op.args
                     if isinstance(a, Address)}
            bases = np.array([addrs[s].base for s in gen.slots] or [0], dtype=np.int64)
            need = max((a.base + a.extent for a in addrs.values()), default=0)
            written, journal = journal_plan(program)
            if facts is not None:
                infallible = facts.infallible
                reads = {pc: _read_base(program, pc) + d for pc, d in facts.reads.items()}
            else:
                infallible = infallible_steps(an, gen.fault_pcs)
                reads = uniform_reads(an) if infallible is None else {}
                if keyed is not None:
                    order = {b: k for k, b in enumerate(keyed[1])}
                    self._lane_facts[keyed[0]] = _LaneFacts(
                        {order[b]: sl for b, sl in slicing.items()}, infallible,
                        {pc: a - _read_base(program, pc) for pc, a in reads.items()}, program)
            plan = KernelPlan(program, gen, "", bases, slicing=slicing, need=need, written=written,
                         journal=journal, infallible=infallible,
                         reads=tuple(reads[pc] for pc in sorted(reads)),
                         proofs=self._proofs_for(program, gen, slicing, reads, key)
                         if reads else None,
                         one_range=[(0, program.threads)])
        self._plans[node.index] = plan
        return plan

    def _proofs_for(self, program, gen: Generated, slicing: dict, reads: dict[int, int],
                    generated: tuple) -> PlainProofs:
        """The PlainProofs of every node with the same generated code, numbers (the
        extents, offsets, strides and constants) and aliasing of regions as ``program``:
        its codegen.generation_key ``generated`` (the PlainProofs keeps the program, whose
        op ids the key holds, alive) and the uniform reads."""
        key = (generated, tuple(sorted(reads)))
        proofs = self._proof_cache.get(key)
        if proofs is None:
            proofs = self._proof_cache[key] = PlainProofs(program, gen, slicing, reads)
        return proofs

    def kernels(self) -> list[KernelPlan]:
        """One plan per distinct generated kernel of the model (what warmup compiles)."""
        seen: dict[str, KernelPlan] = {}
        for node in self.model.nodes:
            if node.kind == NodeKind.MICRO:
                p = self.plan(node)
                if p.gen is not None:
                    seen.setdefault(p.gen.sha, p)
        return list(seen.values())

    def warmup(self, progress: Callable[[str, float], None] | None = None) -> None:
        """Generate and compile every kernel now (e.g. in a UI worker thread): the driver
        each node will use (run_plain for nodes that cannot stop early, and run_par where
        their lanes may be spread over threads, else run_lanes), loaded from numba's cache
        when an earlier process compiled it. A kernel proved per dispatch (attention) gets
        its plain drivers only: it takes run_lanes only past its proofs (a position past
        the last, whose fault it reports) or under a budget smaller than it, and compiles
        it then (~3 s once, cached on disk) rather than on every cold start."""
        todo: dict[tuple[str, str], KernelPlan] = {}
        for node in self.model.nodes:
            if node.kind == NodeKind.MICRO:
                p = self.plan(node)
                if p.gen is None:
                    continue
                # a kernel proved per dispatch (p.proofs) may take either driver
                if p.infallible is not None or p.proofs is not None:
                    todo.setdefault((p.gen.sha, "run_plain"), p)
                    if self._may_split(p):
                        todo.setdefault((p.gen.sha, "run_par"), p)
                if p.infallible is None and p.proofs is None:
                    todo.setdefault((p.gen.sha, "run_lanes"), p)
        spent: list[float] = []  # seconds each driver took (numba's cache: milliseconds)
        for i, ((_, name), p) in enumerate(todo.items()):
            if progress:
                progress(_compiling(p.program.name, name, i, len(todo), spent),
                         i / max(len(todo), 1))
            t = time.perf_counter()
            p.driver(name)
            spent.append(time.perf_counter() - t)
        if progress:
            progress("compiled", 1.0)

    # -- running ---------------------------------------------------------------------------
    def run(self, node, arena: np.ndarray, budget: int | None = None,
            stop: threading.Event | None = None) -> None:
        plan = self._plans.get(node.index) or self.plan(node)
        stop = stop if stop is not None else self.stop
        if stop is not None and stop.is_set():
            raise stopped_before(node)
        if plan.gen is None or not self._usable(arena, plan):
            Dispatch(plan.program, arena).run(budget, stop=stop)
            return
        limit = UNLIMITED if budget is None else max(int(budget), 0)
        if self._plain_now(plan, arena, limit):
            self._plain_dispatch(plan, arena)
            return
        t = self.clock()
        ranges = self._dispatch(plan, node, arena, limit, budget, stop)
        while ranges is None:  # the journal was full: undone, the journal has grown
            ranges = self._dispatch(plan, node, arena, limit, budget, stop)
        self._account(plan, arena, False, ranges, self.clock() - t)

    def _plain_dispatch(self, plan: KernelPlan, arena: np.ndarray, threads: int | None = None) -> None:
        """A dispatch on the plain driver (_run_plain), timed for the next one's ranges."""
        t = self.clock()
        ranges = self._run_plain(plan, arena, threads)
        self._account(plan, arena, True, ranges, self.clock() - t)

    def _account(self, plan: KernelPlan, arena: np.ndarray, plain: bool, ranges: int,
                 elapsed: float) -> None:
        """After a dispatch that took ``elapsed`` seconds on ``ranges`` ranges of lanes: what
        the next dispatch of ``plan`` decides its ranges from (see _ranges)."""
        # The lanes' work: on one thread the dispatch; split, the sum of the ranges' own
        # calls, without the hand-off to the workers (PARALLEL_MIN_SECONDS says why).
        if not plan.dispatched:
            # The first dispatch loads the driver (milliseconds from numba's cache): not
            # the lanes' work. Counted, it made the next dispatch split, paying for the
            # thread pool's start (attention@0: 783 us in profile's first timed step).
            plan.dispatched = True
            if plain and self._may_split(plan):
                # ... and so does the first call of run_par (5.7 ms, a later dispatch of
                # attention@0 in profile): made here, on no lanes, so that it is not
                # charged to a dispatch that splits.
                plan.driver("run_par")(*plan.plain_args(arena, lanes=0, parts=1))
            return
        if ranges == 1:
            plan.work = plan.alone = elapsed
            return
        plan.work = sum(self._range_seconds)
        if plain:
            # run_par: numba's workers take a range in microseconds, so a split is not
            # given up on one dispatch that took as long as the last one alone (layers'
            # dispatches differ by more than the split gains: PARALLEL_PLAIN_MIN_SECONDS).
            # Only adapt() choosing one thread (a busy machine) stops splitting.
            return
        alone = plan.alone or plan.work
        if elapsed >= alone:
            # The split took as long as the last dispatch on one thread: the ranges
            # waited on each other (memory, a core other processes took) or on the
            # hand-off. Back to one thread until its work has doubled -- attention@0, the
            # first dispatch after the head's 154 MB stream, crossed the threshold cold
            # and then ran split at 2-3x the other layers' attention (issue 27).
            plan.retry_split_at = 2 * alone

    def _split(self, calls: list[tuple[Callable, tuple]]) -> list:
        """run_split of the ranges' calls, each timed on the thread that runs it
        (self._range_seconds), so that waking a worker is not taken for work."""
        seconds = [0.0] * len(calls)
        clock = self.clock

        def timed(k: int, fn: Callable, args: tuple):
            t = clock()
            try:
                return fn(*args)
            finally:
                seconds[k] = clock() - t
        out = run_split([(timed, (k, fn, args)) for k, (fn, args) in enumerate(calls)])
        self._range_seconds = seconds
        return out

    def _usable(self, arena: np.ndarray, plan: KernelPlan) -> bool:
        """Whether the compiled code can run on ``arena`` (1-D contiguous writable f32,
        large enough); the last arena that passed is remembered (a Machine passes the
        same one for every node)."""
        if arena is not self._usable_arena:
            if (arena.dtype != np.float32 or arena.ndim != 1 or not arena.flags.c_contiguous
                    or not arena.flags.writeable):
                return False
            self._usable_arena = arena
        return arena.size >= plan.need

    def _spreads(self, plan: KernelPlan) -> bool:
        """Whether this runner spreads ``plan``'s lanes over threads when it is worth it
        (asked to, a kernel with loops, two lanes or more)."""
        return bool(self.parallel and plan.gen.parallel and plan.program.threads >= 2)

    def _may_split(self, plan: KernelPlan) -> bool:
        """Whether a dispatch of ``plan`` may ever run on more than one thread."""
        if not self._spreads(plan):
            return False
        if self.parallel is not True:
            return int(self.parallel) > 1
        from numba import config
        return config.NUMBA_NUM_THREADS > 1

    def _ranges(self, plan: KernelPlan, plain: bool = False,
                threads: int | None = None) -> list[tuple[int, int]]:
        """Lane ranges [l0, l1), one per thread the dispatch runs on. Only kernels with
        loops run on more than one; with ``parallel=True`` only those whose previous
        dispatch took long enough to pay for handing ranges to other threads (on the
        ``plain`` driver PARALLEL_PLAIN_MIN_SECONDS of one thread's work, else
        PARALLEL_MIN_SECONDS, and twice the work of a split that did not pay), on numba's
        current thread count (``threads`` when the caller knows it)."""
        least = PARALLEL_PLAIN_MIN_SECONDS if plain else PARALLEL_MIN_SECONDS
        n = plan.program.threads
        if not self._spreads(plan):
            return plan.one_range
        if self.parallel is True:
            if plan.work < max(least, plan.retry_split_at):
                return plan.one_range
            threads = min(matvec_threads() if threads is None else threads, n)
        else:
            threads = min(int(self.parallel), n)
        if threads <= 1:
            return plan.one_range
        self.split_dispatches += 1
        return [(n * k // threads, n * (k + 1) // threads) for k in range(threads)]

    def plain_call(self, node, arena: np.ndarray, budget: int | None,
                   stop: threading.Event | None = None,
                   threads: int | None = None) -> tuple[Callable, tuple] | None:
        """(function, arguments) that run ``node`` on ``arena`` exactly as :meth:`run` does
        (under ``budget``, with ``stop``), for a caller that runs the same node again and
        again (runtime.Machine's plain loop) past most of the per-dispatch planning, which
        cost a tenth to a third of a small dispatch in a decode step:

        * a node every dispatch of which takes the plain driver on one range of lanes (it
          cannot stop early under ``budget``, its lanes are never split): the driver's
          machine-code entry with its arguments;
        * a node whose dispatches may take the plain driver and spread its lanes over
          ``threads`` threads (numba's count when the call is made: None, look each
          time), or that is proved per dispatch (attention: its position): a bound
          method that takes the plain driver when run would, else calls run.

        The call returns a negative status if the lane analysis was wrong; pass the node
        to :meth:`plain_broke` then. None for any other node (run it with :meth:`run`).
        Still the caller's: the stop flag before the call."""
        plan = self._plans.get(node.index) or self.plan(node)
        if plan.gen is None or not self._usable(arena, plan):
            return None
        limit = UNLIMITED if budget is None else max(int(budget), 0)
        if takes_plain(plan, limit) and not self._spreads(plan):
            # its machine-code entry: no matching of types to signatures, a fifth of a
            # micro node's dispatch on the plain path
            args = plan.plain_args(arena)
            return entry_for(plan.driver("run_plain"), args), args
        if plan.infallible is None and plan.proofs is None:
            return None  # always the checked driver
        return self._plain_bound, (plan, node, arena, budget, limit, stop, threads)

    def _plain_bound(self, plan: KernelPlan, node, arena: np.ndarray, budget: int | None,
                     limit: int, stop, threads: int | None) -> int:
        """One dispatch of a node plain_call bound: run's plain path, or run itself."""
        if self._plain_now(plan, arena, limit):
            self._plain_dispatch(plan, arena, threads)
        else:
            self.run(node, arena, budget, stop=stop)
        return 0

    def direct(self, fn: Callable) -> bool:
        """Whether a function :meth:`plain_call` returned is a driver's own entry (False:
        this runner's wrapper, which decides per dispatch)."""
        return getattr(fn, "__func__", None) is not CompiledRunner._plain_bound

    def plain_broke(self, node) -> None:
        """A plain call of ``node`` returned a negative status: never trust the analysis
        again, and raise."""
        self._plain_broke(self._plans[node.index])

    def _plain_broke(self, plan: KernelPlan) -> None:
        plan.infallible = None
        plan.proofs = None
        program = plan.program
        raise FirError(f"internal error: kernel '{program.name}' at node {program.node} "
                       "stopped early although no lane could; the arena may hold part "
                       "of its stores (please report)")

    def _plain_now(self, plan: KernelPlan, arena: np.ndarray, limit: int) -> bool:
        """Whether this dispatch takes the plain driver under ``limit`` instructions a
        lane: every dispatch of ``plan`` does (takes_plain), or, for a kernel proved per
        dispatch (PlainProofs), a proof holds for the values its uniform reads hold now."""
        if takes_plain(plan, limit):
            return True
        if plan.proofs is None:
            return False
        steps = plan.proofs.steps(tuple([float(arena[a]) for a in plan.reads]))
        return plain_within(steps, limit, plan.program.threads)

    def _run_plain(self, plan: KernelPlan, arena: np.ndarray, threads: int | None = None) -> int:
        """A node that cannot stop early: the plain driver, nothing to undo; its lanes on
        numba's threads (run_par) when it is worth it (``threads``: numba's count, None:
        look). Returns how many ranges of lanes ran at once."""
        self.plain_dispatches += 1
        ranges = self._ranges(plan, plain=True, threads=threads)
        if len(ranges) == 1:
            status = plan.driver("run_plain")(*plan.plain_args(arena))
        else:
            fn = plan.driver("run_par")
            t = self.clock()
            status = fn(*plan.plain_args(arena, parts=len(ranges)))
            # the ranges ran together: each took about the whole call
            self._range_seconds = [self.clock() - t] * len(ranges)
        if status < 0:  # the analysis was wrong: never trust it again
            self._plain_broke(plan)
        return len(ranges)

    def _dispatch(self, plan: KernelPlan, node, arena, limit: int, budget, stop) -> int | None:
        """Run the checked driver once: how many ranges of lanes ran at once when the node
        has run, None when the dispatch was undone to be run again with a larger journal."""
        fn = plan.driver("run_lanes")
        program = plan.program
        ranges = self._ranges(plan)
        jend = self._journal_room(plan, len(ranges))
        if jend < 0:
            plan.save_written(arena)
        ctl = self._ctl
        self._epoch += 1
        ctl[C_ABORT] = 0
        ctl[C_FAULTED] = 0
        ctl[C_EPOCH] = self._epoch
        cell = stop.cell if isinstance(stop, StopFlag) else self._no_stop
        if program.threads > self._rec.shape[0]:  # a node from outside the model
            self._rec = np.zeros((program.threads, self._rec.shape[1]), dtype=np.int64)
            self._frec = np.zeros(program.threads, dtype=np.float32)
        g = plan.gen
        seg = jend // len(ranges) if jend >= 0 else -1
        starts = [k * seg if seg >= 0 else 0 for k in range(len(ranges))]
        calls = [(fn, (arena, plan.bases, g.kf, g.ki, a, b, limit, ctl, self._rec, self._frec,
                       cell, self._jaddr, self._jval, start, start + seg if seg >= 0 else -1))
                 for (a, b), start in zip(ranges, starts)]
        ends = [fn(*calls[0][1])] if len(calls) == 1 else self._split(calls)
        self._jn = list(zip(starts, ends))
        if not (ctl[C_FAULTED] or ctl[C_ABORT]):
            return len(ranges)
        self._undo(plan, arena, jend)
        by_code = self._records(program)
        if F_JOURNAL in by_code:
            self._grow_journal(plan)
            return None
        if F_OWNER in by_code:
            self._fall_back(plan, node, min(by_code[F_OWNER], key=self._order(plan)))
            Dispatch(program, arena).run(budget, stop=stop)
            return 1
        raise self._error(plan, by_code, budget)

    # -- the journal -------------------------------------------------------------------------
    def _journal_room(self, plan: KernelPlan, ranges: int) -> int:
        """jend for the generated code: the plan's journal entries (at least one per range
        of lanes, each range in its own segment), or -1 for no journal (a copy)."""
        if plan.journal == COPY_WRITTEN:
            return -1
        room = max(plan.journal // ranges, 1) * ranges
        if room > self._jaddr.size:
            self._jaddr = np.zeros(room, dtype=np.int64)
            self._jval = np.zeros(room, dtype=np.float32)
        return room

    def _grow_journal(self, plan: KernelPlan) -> None:
        grown = min(plan.journal * JOURNAL_GROWTH, plan.written_size)
        plan.journal = grown if grown > plan.journal else COPY_WRITTEN

    def _undo(self, plan: KernelPlan, arena, jend: int) -> None:
        """Put back what the dispatch stored: the arena is as before it."""
        if jend < 0:  # the regions were saved before the lanes ran
            k = 0
            for a, b in plan.written:
                arena[a:b] = plan.saved[k: k + b - a]
                k += b - a
            return
        used = np.concatenate([np.arange(a, e) for a, e in self._jn])
        # A lane may have stored to one address several times: its first entry holds the
        # value from before the dispatch (different lanes never share an address).
        where, first = np.unique(self._jaddr[used], return_index=True)
        arena[where] = self._jval[used][first]

    # -- what stopped the lanes --------------------------------------------------------------
    def _records(self, program: Program) -> dict[int, list[int]]:
        """Fault code -> lanes that recorded it in this dispatch."""
        rec = self._rec[:program.threads]
        by_code: dict[int, list[int]] = {}
        for lane in np.flatnonzero(rec[:, 0] == self._epoch):
            by_code.setdefault(int(rec[lane, 1]), []).append(int(lane))
        return by_code

    def _order(self, plan: KernelPlan) -> Callable:
        """Sort key of a lane's record: the lockstep interpreter meets the smallest first
        (earliest (loop, trip, ..., pc) position, then lowest lane)."""
        rec, loops = self._rec, plan.gen.loop_pcs

        def key(lane):
            row = rec[lane]
            pc = int(row[2])
            k = []
            for i, lpc in enumerate(loops.get(pc, ())):
                k += [lpc, int(row[REC_FIXED + i])]
            return tuple(k) + (pc,), lane
        return key

    def _fall_back(self, plan: KernelPlan, node, lane: int) -> None:
        """Lanes shared memory: interpret this node from now on, and say why."""
        program = plan.program
        pc, arg = int(self._rec[lane, 2]), int(self._rec[lane, 3])
        op = program.ops[pc]
        addr: Address = op.args[op.spec.mem.address]
        sl = plan.slicing[addr.region.base]
        owner = ((arg % sl.modulus) if sl.modulus else arg) // sl.stride
        why = (f"lanes shared memory at run time: lane {lane} accessed {addr.region.name}[{arg}] "
               f"(pc {pc}, line {op.loc.line}: {op.text}), which is in lane {owner}'s slice")
        self._plans[node.index] = KernelPlan(program, None, why)
        self.fallbacks[node.full_name] = why

    def _error(self, plan: KernelPlan, by_code: dict[int, list[int]], budget) -> FirError:
        """The error the interpreter would have raised first."""
        program = plan.program
        key = self._order(plan)
        faults = [ln for c in (F_LOAD, F_STORE, F_RTOU, F_COUNT) for ln in by_code.get(c, [])]
        if faults:
            lane = min(faults, key=key)
            code, pc, arg = (int(v) for v in self._rec[lane, 1:4])
            op = program.ops[pc]
            message, address = fault_message(code, op, lane, arg, self._frec[lane])
            return fault_error(program, op, lane, message, address=address)
        if F_BUDGET in by_code:
            lane = min(by_code[F_BUDGET], key=key)
            return budget_error(program, int(self._rec[lane, 2]), budget)
        if F_STOP in by_code:
            lane = min(by_code[F_STOP], key=key)
            return interrupted_error(program, program.ops[int(self._rec[lane, 2])], lane=lane)
        return FirError(f"kernel '{program.name}' at node {program.node} was aborted")


DRIVER_WORDS = {"run_plain": "the plain driver", "run_par": "the threaded driver",
                "run_lanes": "the checked driver"}


def _compiling(kernel: str, driver: str, done: int, total: int, spent: list[float]) -> str:
    """The load's progress line while a driver compiles: which kernel and driver, how many
    are left, and, once one took seconds (numba compiling rather than loading its cache),
    about how long the rest will take at that pace."""
    text = (f"compiling {kernel} ({DRIVER_WORDS.get(driver, driver)}, {done + 1} of {total})")
    slow = [t for t in spent if t > 0.5]
    if slow and done < total:
        left = sum(slow) / len(slow) * (total - done)
        text += f", about {left:.0f} s left (a first run; later runs load them from the cache)"
    return text
