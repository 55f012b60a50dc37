"""Unroll and jam for ``run_plain``: eight trips of an outer loop run their inner loops at once.

Attention's dot products (``g2.attn_decode``: per position, a chain of ``headdim``
dependent adds; per output element, a chain of ``position + 1``) run at the latency of an
f32 add, a few cycles each, far from the rate at which the K and V rows could be read.
Eight trips of the loop around such an inner loop are independent chains: run side by
side, one op of each trip in turn, the core overlaps them. Every trip keeps its own
order of operations, so the bits are the interpreter's. (Measured on GPT-2 small's
attention, two threads: 4 trips 1.7x, 8 trips 1.8-1.9x at position 1000, +3 and +4 s of
cold compile; 16 trips 15% slower than 8 (registers spill); a software prefetch of the
next group's rows or of the trips ahead gained nothing measurable and is not written:
tried again with the heads side by side (vm/sink), the next group's rows of each trip
made attention slower, 253 -> 375 us hot at position 1000, into L1 (prefetcht0); into L2
(prefetcht1) and two groups on, decode is 4-6% faster: see GROUPS_AHEAD. The wide groups
below prefetch too: see AHEAD.)

A loop is jammed when (:func:`plan`) its body is a straight prologue P, one inner ``for``
whose body I is straight, and an epilogue E (straight, or with ``if`` blocks), and:

* P and I store nothing (E may store: the code checks at run time that no region E
  stores to overlaps one P or I loads from, else the loop runs as written);
* the inner loop's count register is not written in the body (every trip runs it the
  same number of times: it is read once, and the jam needs at least one inner trip);
* every register that P or I reads before writing it in the same trip either is not
  written in the body, or is written only by steps ``U = U + k`` outside ``if`` blocks:
  its value at the start of trip t + j is then its value at trip t plus j times the
  trip's total step (P's steps + the inner count x I's steps + E's), mod 2^32.

Each register P or I writes, and each such stepped register, gets one copy per trip
(``R3_0`` .. ``R3_7``), except those that hold the same value in every trip (:func:`_shared`:
attention's query element and score, their indices), which are computed once; the
prologues and inner loops run op by op interleaved, then the epilogues one after the
other in trip order (registers only E writes, such as attention's running maximum, pass
from one to the next as in the loop), and the copies of the last trip become the
registers. The inner loop runs without its bounds checks and wrap masks where the
accesses of all eight trips are proved in bounds before it (as vm/codegen's innermost
loops); a group where they are not leaves the jam (nothing is stored before that
check), and the trips left over, or every trip where the run-time conditions fail, run
the loop as written.

Wide groups (:func:`wide_plan`, :func:`wide_lines`): where the trips' indices step by one
element from trip to trip (attention's V loop), up to WIDE_MAX trips run the other way
round, the inner loop outside them, their sums in the runner's scratch (measured on
GPT-2 small's attention at position 1000: 776 -> 517 us a dispatch, the same bits). Such
a loop has no eight-wide groups besides (its trips left, fewer than WIDE_MIN, or all of
them where D is not 1 at run time, run as written): both made GPT-2 small's first
compile ~2 s longer for code attention never takes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .isa import FrameKind
from .lanes import u_add_k
from .render import indent

JAM = 8  # trips run together
LINE = 16  # f32 elements of a 64-byte cache line
# Each group prefetches (kernel_helpers.prefetch_l2: a hint) the inner loop's rows of
# the trips GROUPS_AHEAD groups on: attention's key rows, read 256 bytes of each 3 KB row
# per head, are demand misses the hardware prefetchers do not follow. Measured in one
# process, two GPT-2 small machines stepping alternately at positions 960-1020 (each
# step's pair): decode 0.964x and 0.942x the time without it (two runs); attention alone
# with K in cache 179 -> 210 us, with the cache cold 504 -> 455 us (medians).
GROUPS_AHEAD = 2
REGISTER = re.compile(r"\b([RU]\d+)\b")
# the line vm/codegen writes for ``uaddk U U k``: a register stepped by a constant
STEP = re.compile(r"(U\d+) = \(\1 \+ (K\d+)\) & M32")


@dataclass
class JamPlan:
    inner: object  # the inner loop's forbegin
    prologue: list  # P's ops
    body: list  # I's ops
    epilogue: tuple[int, int]  # E's pcs, a..b-1
    renamed: list[str]  # registers with a copy per trip ("R3", "U4")
    stepped: list[str]  # of those, the ones read before written (their copies start apart)
    shared: list[str]  # the same in every trip: not copied
    e_reads: set[str]  # registers E reads


@dataclass
class Pieces:
    """The inner loop as the plain pass rendered it (each op once: slots are taken once)."""
    header: list[str]
    ops: list[list[str]]  # each op's lines
    steps: dict[str, tuple[str, int]]  # register -> (K slot, pc) of its one step a trip
    # pc -> (index register, offset, slot); None: an index the trip number does not give
    accesses: dict[int, tuple[str, str, int]] | None
    body: list = ()  # the ops


def regs(op, which) -> set[str]:
    return {f"{file}{op.args[i]}" for file, i in which}


def _is_step(op) -> bool:
    return op.spec.lanes is u_add_k and op.args[0] == op.args[1]


def plan(ops, opener) -> JamPlan | None:
    """How to jam ``opener``'s loop, or None where the rules above do not hold."""
    body = ops[opener.pc + 1: opener.match]
    fors = [op for op in body if op.spec.opens is FrameKind.FOR]
    if len(fors) != 1:
        return None
    inner = fors[0]
    p_ops = ops[opener.pc + 1: inner.pc]
    i_ops = ops[inner.pc + 1: inner.match]
    e_ops = ops[inner.match + 1: opener.match]
    if any(op.spec.opens is not None or op.spec.stores for op in p_ops + i_ops):
        return None
    if any(op.spec.opens is FrameKind.FOR for op in e_ops):
        return None
    written_body = set().union(*(regs(op, op.spec.writes) for op in body))
    if regs(inner, inner.spec.reads) & written_body:
        return None  # the inner count changes from trip to trip
    exposed, written = set(), set()
    for op in p_ops + i_ops:
        exposed |= regs(op, op.spec.reads) - written
        written |= regs(op, op.spec.writes)
    depth, conditional = 0, set()  # E's ops inside an if block
    for op in e_ops:
        depth -= op.spec.closes is not None
        if depth:
            conditional.add(op.pc)
        depth += op.spec.opens is not None
    stepped = sorted(exposed & written_body)
    for reg in stepped:
        writers = [op for op in body if reg in regs(op, op.spec.writes)]
        if not all(_is_step(op) and op.pc not in conditional for op in writers):
            return None
    shared = _shared(p_ops + i_ops, written - set(stepped), written_body,
                     set().union(*(regs(op, op.spec.writes) for op in e_ops)))
    return JamPlan(inner, p_ops, i_ops, (inner.match + 1, opener.match),
                   sorted((written | set(stepped)) - shared), stepped, sorted(shared),
                   set().union(set(), *(regs(op, op.spec.reads) for op in e_ops)))


def _shared(ops, candidates: set[str], written_body: set[str], e_writes: set[str]) -> set[str]:
    """The registers that hold the same value in every trip wherever P or I read them
    (one register serves the trips of a group): written in P or I only from registers the body
    does not write or that are themselves shared (a load: at a shared index, as P and I
    store nothing), and not written in E (E's trips run one after the other)."""
    shared = candidates - e_writes
    changed = True
    while changed:
        changed = False
        for op in ops:
            outs = regs(op, op.spec.writes) & shared
            ins = regs(op, op.spec.reads)
            if outs and any(r in written_body and r not in shared for r in ins):
                shared -= outs
                changed = True
    return shared


def copy_of(lines: list[str], names: set[str], j: int) -> list[str]:
    """``lines`` with each register in ``names`` renamed to its copy for trip ``j``."""
    def sub(m):
        return f"{m[1]}_{j}" if m[1] in names else m[1]
    return [REGISTER.sub(sub, line) for line in lines]


def interleaved(per_op: list[list[str]], names: set[str], once: list[bool]) -> list[str]:
    """Each op's lines for each trip of a group in turn, op after op (once: an op that
    writes only shared registers, from shared or unwritten ones)."""
    out = []
    for lines, single in zip(per_op, once):
        out += lines if single else [ln for j in range(JAM) for ln in copy_of(lines, names, j)]
    return out


def step_sum(lines: list[str], reg: str) -> str:
    """The K slots of ``reg``'s steps in ``lines``, added (or 0)."""
    ks = [m[2] for m in map(STEP.fullmatch, (line.strip() for line in lines))
          if m and m[1] == reg]
    return f"(({' + '.join(ks)}) & M32)" if ks else "0"


def disjoint(store_slots: set[int], load_slots: set[int]) -> list[str] | None:
    """Run-time conditions that no stored region overlaps a loaded one (None: one slot
    both, which never holds)."""
    if store_slots & load_slots:
        return None
    return [f"(B{s} + E{s} <= B{t} or B{t} + E{t} <= B{s})"
            for s in sorted(store_slots) for t in sorted(load_slots)]


@dataclass
class Parts:
    """A jammed loop's lines, piece by piece (:func:`lines` puts them together; vm/sink
    spreads them over the phases of a kernel whose lanes run side by side)."""
    d: int
    header: list[str]  # the outer count n{d}
    inner_header: list[str]  # the inner count n{d+1} (its finite check)
    alias: list[str]  # run-time conditions: no stored region overlaps a loaded one
    inits: list[str]  # every trip copy, typed
    deltas: list[str]  # D of each stepped register
    wide: list[str]
    head: list[str]  # a group up to its check: the copies' starts, the prologues
    checks: str | None  # the group's accesses all in bounds (None: not checked)
    rest: list[str]  # the inner loops, the epilogues, the last trip's copies, r -= JAM
    original: list[str]  # the body as written (the trips left over)

    def entry(self) -> str:
        """The condition for any group: JAM trips at least, no aliasing."""
        return " and ".join([f"n{self.d} >= {JAM}", *self.alias])

    def inner_fits(self) -> str:
        """The ``if`` line for an inner count the groups can take."""
        m = f"n{self.d + 1}"
        return f"if {m} >= 1 and {m} <= 1073741824:"


def parts(plan: JamPlan, d: int, header: list[str], p_lines: list[list[str]], inner: Pieces,
          inner_fast: tuple[list[list[str]], list[str]] | None, e_lines: list[str],
          alias: list[str], original: list[str], wide: list[str] = ()) -> Parts:
    names = set(plan.renamed)
    m = f"n{d + 1}"
    inner_loop = inner.header[-1]
    shared = set(plan.shared)
    p_once, i_once = ([bool(w) and w <= shared for w in (regs(op, op.spec.writes) for op in ops)]
                      for ops in (plan.prologue, plan.body))
    checks = None
    if inner_fast is not None:  # a group whose accesses are not all proved leaves the jam
        fast_ops, conds = inner_fast
        checks = " and ".join(dict.fromkeys(c for j in range(JAM)
                                            for c in copy_of(conds, names, j)))
        loops = [inner_loop, *indent(interleaved(fast_ops, names, i_once))]
    else:
        loops = [inner_loop, *indent(interleaved(inner.ops, names, i_once))]
    p_flat = [line for op in p_lines for line in op]
    i_flat = [line for op in inner.ops for line in op]
    deltas = [f"D{reg} = ({step_sum(p_flat, reg)} + (({m} * {step_sum(i_flat, reg)}) & M32)"
              f" + {step_sum(e_lines, reg)}) & M32" for reg in plan.stepped]
    inits = [f"{reg}_{j} = {'ZERO' if reg[0] == 'R' else '0'}"
             for reg in plan.renamed for j in range(JAM)]
    starts = [f"{reg}_{j} = {reg}" if j == 0 else f"{reg}_{j} = ({reg} + {j} * D{reg}) & M32"
              for reg in plan.stepped for j in range(JAM)]
    rest = [*_row_prefetches(plan, inner, m), *loops,
            *[line for j in range(JAM) for line in copy_of(e_lines, names, j)],
            *[f"{reg} = {reg}_{JAM - 1}" for reg in plan.renamed], f"r{d} -= {JAM}"]
    return Parts(d, header[:-1], inner.header[:-1], alias, inits, deltas, list(wide),
                 [*starts, *interleaved(p_lines, names, p_once)], checks, rest, original)


def _rows(inner: Pieces, per_trip: set[str]) -> list[tuple[str, str, int, str]]:
    """(index register, " + offset" or "", slot, K slot of its inner step) of each distinct
    access of the inner loop whose index differs from trip to trip of a group (a register
    in ``per_trip``) and steps in the inner loop: the rows a group's trips read."""
    return [(ureg, f" + {offset}" if offset else "", slot, inner.steps[ureg][0])
            for ureg, offset, slot in dict.fromkeys((inner.accesses or {}).values())
            if ureg in per_trip and ureg in inner.steps]


def _row_prefetches(plan: JamPlan, inner: Pieces, m: str) -> list[str]:
    """For each access of the inner loop whose index is a stepped register (a copy per
    trip) that the inner loop steps: prefetches of the ``m`` elements trip j of the group
    GROUPS_AHEAD groups on reads, one a cache line (see GROUPS_AHEAD)."""
    calls = [f"    prefetch_l2(arena, B{slot} + {ureg}_{j}{off} + "
             f"{GROUPS_AHEAD * JAM} * D{ureg} + pf * {k})"
             for ureg, off, slot, k in _rows(inner, set(plan.stepped)) for j in range(JAM)]
    # one loop for them all: a loop each made GPT-2 small's first compile ~1 s longer
    return [f"for pf in range(0, {m}, {LINE}):", *calls] if calls else []


def lines(jp: Parts) -> list[str]:
    """The jammed loop: the wide groups (see :func:`wide_lines`), the groups of JAM trips,
    then the rest as written."""
    d = jp.d
    check = [f"if not ({jp.checks}):", "    break"] if jp.checks else []
    group = [*jp.head, *check, *jp.rest]
    return [*jp.header,
            f"r{d} = n{d}",
            f"if {jp.entry()}:",
            *indent([*jp.inner_header,
                     jp.inner_fits(),
                     *indent([*jp.deltas, *jp.wide] if jp.wide else
                             [*jp.inits, *jp.deltas,
                              f"for g{d} in range(r{d} // {JAM}):", *indent(group)])]),
            f"for t{d} in range(r{d}):",
            *indent(jp.original or ["pass"])]


# -- wide groups: the trips of an outer loop side by side, its inner loop outside them ---------
# The V loop of attention (per output element d, a sum over the rows t of p[t] * V[t, d])
# jammed eight wide still reads each row eight times, 32 bytes at a time, each time a
# demand miss at a row's stride. Where the trips' indices step by one element from trip
# to trip, up to WIDE_MAX trips run as one group the other way round: for each inner
# trip t, every outer trip's ops in turn (a loop over them that LLVM vectorizes: one
# row's elements side by side), each trip's carried registers (its sum) in scratch
# memory (``sf``, given by the runner). Each trip still runs its own ops in its own
# order, so the bits are the loop's as written.
WIDE_MIN = 16  # fewer trips left: the loop as written
WIDE_MAX = 256  # trips in one group at most; sf holds WIDE_MAX floats per carried register
# Each trip's row of the inner loop is read once, lane after lane, at a row's stride (3 KB
# in GPT-2 small's V): demand misses the hardware prefetchers do not follow across pages.
# The row AHEAD inner trips on is prefetched (kernel_helpers.prefetch_l1: a hint, no value,
# no fault). Measured on attention's V loop alone, 12 heads on 2 threads, cache cold:
# 188 -> 151 us and 306 -> 238 us (two runs), 4 rows ahead about as good, 16 worse. Into
# L1: into L2 instead (as the key rows), decode at positions 960-1020 took 1.03-1.05x as
# long (two machines stepping alternately in one process, paired step by step).
AHEAD = 8


@dataclass
class WidePlan:
    stepped: list[str]  # the jam's stepped registers, stepped only in E (their D must be 1)
    affine: list[str]  # U registers P derives from them (trip j: the trip-0 value + j)
    carried: list[str]  # R registers kept per trip in sf (P writes, I reads first, E reads)
    p_kind: list[str]  # per P op: "once" (shared or affine: computed once) or "trip"
    i_kind: list[str]  # per I op: "shared" (before the trips), "trip", "step" (after)


def _prologue_kinds(plan: JamPlan, stepped: set[str], shared: set[str]):
    """P's ops as "once" (shared, or an affine U: a stepped or affine register plus a
    constant) or "trip" (per-trip R registers); None where another op is there."""
    affine, kinds = set(), []
    for op in plan.prologue:
        w = regs(op, op.spec.writes)
        if w and w <= shared:
            kinds.append("once")
        elif len(w) == 1 and next(iter(w))[0] == "U":
            if not (op.spec.lanes is u_add_k and f"U{op.args[1]}" in stepped | affine):
                return None  # not the trip-0 value plus the trip number
            affine |= w
            kinds.append("once")
        elif w and all(r[0] == "R" for r in w):
            kinds.append("trip")
        else:
            return None
    return affine, kinds


def _body_kinds(plan: JamPlan, shared: set[str], affine: set[str], per_trip_r: set[str]):
    """I's ops as "shared", "trip" or "step", in that order, and the R registers the trips'
    ops read before writing; None where I is not so."""
    kinds, order = [], {"shared": 0, "trip": 1, "step": 2}
    read_first, written = set(), set()
    for op in plan.body:
        w = regs(op, op.spec.writes)
        if _is_step(op) and w <= shared | affine:
            kind = "step"
        elif w and w <= shared:
            kind = "shared"
        elif w and w <= per_trip_r:
            kind = "trip"
            read_first |= regs(op, op.spec.reads) - written
            written |= w
        else:
            return None
        if kinds and order[kind] < order[kinds[-1]]:
            return None  # not shared ops, then the trips' ops, then the steps
        kinds.append(kind)
    return (kinds, read_first) if "trip" in kinds else None


def wide_plan(plan: JamPlan) -> WidePlan | None:
    """Whether ``plan``'s loop may also run in wide groups, and how; None where not."""
    shared, stepped = set(plan.shared), set(plan.stepped)
    p_writes = set().union(set(), *(regs(op, op.spec.writes) for op in plan.prologue))
    i_writes = set().union(set(), *(regs(op, op.spec.writes) for op in plan.body))
    if not stepped or stepped & (p_writes | i_writes):
        return None  # a stepped register written in P or I: its D depends on the count
    prologue = _prologue_kinds(plan, stepped, shared)
    if prologue is None:
        return None
    affine, p_kind = prologue
    per_trip_r = {r for r in plan.renamed if r[0] == "R"}
    if {r for r in plan.renamed if r[0] == "U"} - stepped - affine:
        return None
    body = _body_kinds(plan, shared, affine, per_trip_r)
    if body is None:
        return None
    i_kind, read_first = body
    carried = sorted(per_trip_r & (p_writes | read_first | plan.e_reads))
    return WidePlan(sorted(stepped), sorted(affine), carried, p_kind, i_kind)


def _per_trip(lines: list[str], wp: WidePlan, j: str) -> list[str]:
    """``lines`` for trip ``j`` of a wide group: a stepped or affine register is its
    trip-0 value plus j, a carried one its element of sf."""
    slot = {r: k * WIDE_MAX for k, r in enumerate(wp.carried)}
    moved = set(wp.stepped) | set(wp.affine)

    def sub(m):
        r = m[1]
        if r in slot:
            return f"sf[{slot[r]} + {j}]"
        return f"({r} + {j})" if r in moved else r
    return [REGISTER.sub(sub, line) for line in lines]


def _prefetches(wp: WidePlan, inner: Pieces, w: str) -> list[str]:
    """Prefetches of the row AHEAD inner trips on for each access whose index differs from
    trip to trip of the group (a stepped or affine register) and steps in the inner loop."""
    return [line for ureg, off, slot, k in _rows(inner, set(wp.stepped) | set(wp.affine))
            for line in (f"for pf in range(0, {w}, {LINE}):",
                         f"    prefetch_l1(arena, B{slot} + {ureg}{off} + {AHEAD} * {k} + pf)")]


def wide_lines(wp: WidePlan, d: int, p_lines: list[list[str]], fast_i: list[list[str]],
               conds: list[str], e_lines: list[str], inner: Pieces) -> list[str]:
    """Wide groups of the loop at depth ``d`` while at least WIDE_MIN trips are left
    (``r{d}``), where every stepped register's D is 1 (see WIDE_MIN's comment). A group
    whose inner accesses are not all in bounds (the first and the last trip's, the
    indices rising with the trip) leaves them before any store, for the loop as written."""
    r, w, j, m = f"r{d}", f"w{d}", f"j{d}", f"n{d + 1}"
    moved = wp.stepped + wp.affine
    last = {reg: f"({reg} + {w} - 1)" for reg in moved}
    checks = [*conds, *(REGISTER.sub(lambda x: last.get(x[1], x[1]), c) for c in conds),
              *(f"{reg} + {w} - 1 < 4294967296" for reg in moved)]
    once = [ln for lines, k in zip(p_lines, wp.p_kind) if k == "once" for ln in lines]
    p_trip = [ln for lines, k in zip(p_lines, wp.p_kind) if k == "trip" for ln in lines]
    by_kind = {k: [ln for lines, kk in zip(fast_i, wp.i_kind) if kk == k for ln in lines]
               for k in ("shared", "trip", "step")}
    inner_loop = f"for t{d + 1} in range({m}):"
    trip_regs = [f"{reg} = ({reg}s + {j}) & M32" for reg in moved]
    trip_regs += [f"{reg} = sf[{k * WIDE_MAX} + {j}]" for k, reg in enumerate(wp.carried)]
    group = [f"{w} = {r} if {r} <= {WIDE_MAX} else {WIDE_MAX}",
             *(f"{reg}s = {reg}" for reg in wp.stepped),
             *once,
             f"if not ({' and '.join(dict.fromkeys(checks))}):", "    break",
             *([f"for {j} in range({w}):", *indent(_per_trip(p_trip, wp, j))] if p_trip else []),
             inner_loop,
             *indent([*_prefetches(wp, inner, w), *by_kind["shared"], f"for {j} in range({w}):",
                      *indent(_per_trip(by_kind["trip"], wp, j)), *by_kind["step"]]),
             *(f"{reg}s = {reg}" for reg in wp.affine),
             f"for {j} in range({w}):",
             *indent([*trip_regs, *e_lines]),
             f"{r} -= {w}"]
    ones = " and ".join(f"D{reg} == 1" for reg in wp.stepped)
    return [f"if {ones}:", *indent([f"while {r} >= {WIDE_MIN}:", *indent(group)])]
