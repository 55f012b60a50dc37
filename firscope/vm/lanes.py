"""Which lane owns which elements: the affine lane-partition analysis.

The compiled engine (vm/compiled) runs lanes one after the other, the step
interpreter in lockstep; the two agree when lanes do not communicate through
memory within a dispatch. :func:`lane_partition` decides, before compiling,
whether every region a kernel stores to can be cut into per-lane slices: an
abstract execution tracks each U register as an affine form
``lane * L + sum(coef * symbol) + [lo, hi]`` (:class:`Aff`) and records every
access to memory. For each written region, a per-lane stride L > 0 shared by
every access must exist; the slice of lane l is then the elements i with
``(i mod M) div L == l`` (M: the gcd of the unbounded symbol coefficients
when it is at least threads * L, i.e. rows of a [rows, threads * L] layout,
else no modulus). The generated code checks at run time that every access to
such a region stays in the accessing lane's slice.

The transfer functions of the instructions are the ``lanes`` fields of the
opcode table's rows (vm/opcodes); the ones defined here are instantiated
there. A row without one makes the registers it writes unknown.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .isa import MAX_TRIPS, NREGS, FrameKind


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
class LaneState:
    U: dict  # reg -> Aff | None
    # reg -> "lane" | ("const", float) | ("range", lo, hi) (a value in lo..hi, both finite f32,
    # the same in every lane) | None
    R: dict

    def copy(self) -> "LaneState":
        return LaneState(dict(self.U), dict(self.R))


class Analysis:
    """Abstract execution of a program over affine U-register values.

    ``params``: pc of a uniform read (see :attr:`uniform`) -> (lo, hi): assume the value it
    loads lies in lo..hi (the runner reads it before the dispatch and picks a proof made
    for a range holding it: :class:`PlainProofs`). Integers derived from such a value are
    symbols with a known range (:attr:`ranges`), so accesses indexed by them can be proved
    in bounds, and loops counted by it have a bounded number of trips."""

    def __init__(self, program, params: dict[int, tuple[float, float]] | None = None,
                 slicing: dict[int, "Slicing"] | None = None):
        self.p = program
        self.ops = program.ops
        self.params = params or {}
        self.slicing = slicing or {}  # with params: see infallible_for
        self.ranges: dict[str, tuple[int, int]] = {}  # symbol -> the integers it can be
        # pc of a load whose index is one constant in every lane and on every path, from a
        # region no store of the kernel touches -> the arena address it reads (None: it
        # does not qualify): its value is the same in every lane for the whole dispatch
        self.uniform: dict[int, int | None] = {}
        self.written = [(r.base, r.base + r.size) for r in program.written_regions()]
        # (region, Aff | None of the index plus offset, is a store, the address offset)
        self.sites: list[tuple] = []
        self._fresh = 0
        # What the walk that records accesses found out about each op it reached: whether
        # every time it proved the op cannot fault (see infallible_steps), and the trip
        # count of each loop (None: not known before run time).
        self.reached: set[int] = set()
        self.proved: dict[int, bool] = {}
        self.trips: dict[int, int | None] = {}
        # loop pc -> whether its count was one known constant every time (every lane runs
        # exactly self.trips[pc] trips)
        self.exact: dict[int, bool] = {}

    def prove(self, op, ok: bool) -> None:
        self.proved[op.pc] = self.proved.get(op.pc, True) and ok

    def fresh(self, base: str = "s") -> str:
        self._fresh += 1
        return f"{base}{self._fresh}"

    def run(self) -> None:
        st = LaneState({u: ZERO_AFF for u in range(NREGS)},
                       {r: ("const", 0.0) for r in range(NREGS)})
        st.R[0] = "lane"
        self.seq(0, len(self.ops), st, True)

    def seq(self, a: int, b: int, st: LaneState, record: bool) -> LaneState:
        """The state after ops a..b-1; an opener's transfer covers its block."""
        pc = a
        while pc < b:
            op = self.ops[pc]
            spec = op.spec
            if record:
                self.reached.add(pc)
            st = (spec.lanes or unknown_results)(self, op, st, record)
            pc = op.match + 1 if spec.opens is not None else pc + 1
        return st

    def loop(self, op, s0: LaneState, record: bool) -> LaneState:
        """A forbegin block: one symbolic trip finds how each U register changes per
        trip (unchanged, an induction variable, set from entry values, or unknown); the
        body is then walked once more from the header state to record its accesses."""
        c = s0.R[op.args[0]]
        span = _trip_span(c)  # (fewest, most) trips, None: unknown at analysis time
        trips = span[0] if span is not None and span[0] == span[1] else None
        if record:  # a count known to be finite: the loop cannot fault on it
            self.prove(op, span is not None)
            most = None if span is None else span[1]
            seen = self.trips.setdefault(op.pc, most)
            if seen != most:
                self.trips[op.pc] = None
            self.exact[op.pc] = self.exact.get(op.pc, True) and trips is not None
        if span is not None and span[1] == 0:
            return s0
        body = (op.pc + 1, op.match)
        # One symbolic trip: every U register starts as its own entry symbol.
        sym = s0.copy()
        for r in range(NREGS):
            sym.U[r] = Aff(0, ((f"v{r}", 1),), 0, 0)
        end = self.seq(*body, sym.copy(), False)  # a copy: the transfers change it in place
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
                header.U[r], exit_.U[r] = self.induction(s0.U[r], d, span)
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
                exit_.U[r] = val if span is not None and span[0] >= 1 else header.U[r]
        self.seq(*body, header.copy(), record)  # the accesses of every trip
        return exit_

    def induction(self, base: Aff | None, d: Aff, span: tuple[int, int] | None):
        """(value at the loop header, value after the loop) of a register that each trip
        adds ``d`` to, starting from ``base``; ``span``: the fewest and most trips."""
        if base is None:
            return None, None
        if d == ZERO_AFF:
            return base, base
        if not d.syms and d.lo == d.hi and span is not None:
            step, (few, most) = d.lo, span
            reach = step * (most - 1)
            after = sorted((step * few, step * most))
            return (base.plus(Aff(0, (), min(0, reach), max(0, reach))),
                    base.plus(Aff(0, (), after[0], after[1])))
        if d.lo == d.hi:
            g = math.gcd(d.lo, *[k for _, k in d.syms])
            header = base.plus(Aff(0, ((self.fresh("t"), g),), 0, 0))
            return header, base.plus(Aff(0, ((self.fresh("t"), g),), 0, 0))
        return None, None


def _trip_span(c) -> tuple[int, int] | None:
    """(fewest, most) trips of a loop counted by R value ``c``, or None (not known finite)."""
    if isinstance(c, tuple) and all(math.isfinite(v) for v in c[1:]):
        # vm/codegen.for_header's count (monotone in the value, so the ends' are the ends)
        return tuple(max(math.floor(v), 0) if v < 4.0e18 else MAX_TRIPS for v in (c[1], c[-1]))
    return None


# --- transfer functions (the ``lanes`` fields of the opcode table) -----------------------
def unknown_results(an: Analysis, op, st: LaneState, record: bool) -> LaneState:
    """Any op without a transfer of its own: what it writes is unknown."""
    a = op.args
    for file, i in op.spec.writes:
        if file == "R":
            st.R[a[i]] = None
        else:
            st.U[a[i]] = Aff(0, ((an.fresh(), 1),), 0, 0)
    return st


def rtou(an: Analysis, op, st: LaneState, record: bool) -> LaneState:
    dst, s = op.args
    src = st.R[s]
    # a constant or a range of values, all in 0..2^32 (truncated toward zero: floor)
    known = isinstance(src, tuple) and 0 <= src[1] and src[-1] < 2 ** 32
    if record:
        an.prove(op, src == "lane" or known)
    if src == "lane":
        st.U[dst] = Aff(1, (), 0, 0)
    elif known and math.floor(src[1]) == math.floor(src[-1]):
        st.U[dst] = _const(int(src[1]))
    elif known:
        name = an.fresh("p")
        an.ranges[name] = (math.floor(src[1]), math.floor(src[-1]))
        st.U[dst] = Aff(0, ((name, 1),), 0, 0)
    else:
        st.U[dst] = Aff(0, ((an.fresh(), 1),), 0, 0)
    return st


def u_const(an: Analysis, op, st: LaneState, record: bool) -> LaneState:
    st.U[op.args[0]] = _const(op.args[1])
    return st


def u_add_k(an: Analysis, op, st: LaneState, record: bool) -> LaneState:
    v = st.U[op.args[1]]
    st.U[op.args[0]] = None if v is None else v.shift(_signed(op.args[2]))
    return st


def u_mul_k(an: Analysis, op, st: LaneState, record: bool) -> LaneState:
    v = st.U[op.args[1]]
    st.U[op.args[0]] = None if v is None else v.times(op.args[2])
    return st


def u_add(an: Analysis, op, st: LaneState, record: bool) -> LaneState:
    x, y = st.U[op.args[1]], st.U[op.args[2]]
    st.U[op.args[0]] = None if x is None or y is None else x.plus(y)
    return st


def r_const(an: Analysis, op, st: LaneState, record: bool) -> LaneState:
    st.R[op.args[0]] = ("const", float(op.args[1]))
    return st


def r_const_arith(fn):
    """``R[d] = R[a] <fn> c`` (addconst, mulconst): a constant stays one, and a range of
    values maps to the range between its ends' images (f32 rounding is monotone, and so
    are adding and multiplying by a constant); anything else is unknown."""
    def transfer(an: Analysis, op, st: LaneState, record: bool) -> LaneState:
        d, a, c = op.args
        x = st.R[a]
        st.R[d] = None
        if isinstance(x, tuple):
            with np.errstate(all="ignore"):
                ends = sorted(float(fn(np.float32(v), np.float32(c))) for v in x[1:])
            if all(math.isfinite(v) for v in ends):
                st.R[d] = ("const", ends[0]) if x[0] == "const" else ("range", *ends)
        return st
    return transfer


def access(an: Analysis, op, st: LaneState, record: bool) -> LaneState:
    """A load or store (the row's ``mem``): record where it goes, then its result is unknown."""
    mem = op.spec.mem
    addr = op.args[mem.address]
    if record:
        v = st.U[op.args[mem.index]]
        an.sites.append((addr.region, None if v is None else v.shift(addr.offset), mem.stores,
                         addr.offset))
        an.prove(op, _inside(v, addr.offset, addr.extent, an.p.threads, an.ranges)
                 and _in_slice(v, addr, an))
        if not mem.stores:
            an.uniform[op.pc] = _uniform_address(an, op, v, addr)
    st = unknown_results(an, op, st, record)
    if op.pc in an.params:
        st.R[op.args[mem.value]] = ("range", *an.params[op.pc])
    return st


def _in_slice(v: Aff, addr, an: Analysis) -> bool:
    """For an index into a written region without a modulus, in an analysis with ranges:
    whether it lies in ``lane * stride + 0..stride-1`` for every value of its symbols (see
    infallible_for; ranges widen even a part without symbols, e.g. the induction variable
    of a loop counted by a range). Anything else needs no proof here."""
    sl = an.slicing.get(addr.region.base)
    if v is None or sl is None or sl.modulus:
        return True
    lo, hi = _span(v.shift(addr.offset), an.ranges)
    return v.lane == sl.stride and lo >= 0 and hi < sl.stride


def _span(v: Aff, ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """The least and greatest value of ``v`` in lane 0, each symbol anywhere in its range
    (every symbol must have one)."""
    lo, hi = v.lo, v.hi
    for name, k in v.syms:
        ends = (k * ranges[name][0], k * ranges[name][1])
        lo, hi = lo + min(ends), hi + max(ends)
    return lo, hi


def _uniform_address(an: Analysis, op, v: Aff | None, addr) -> int | None:
    """The arena address a load reads in every lane, when it is one constant in bounds of
    a region no store of the kernel touches (and was the same wherever the walk reached
    the load before), else None."""
    if v is None or v.lane or v.syms or v.lo != v.hi or not 0 <= v.lo + addr.offset < addr.extent:
        return None
    a = addr.base + v.lo + addr.offset
    if any(lo <= a < hi for lo, hi in an.written):
        return None
    return a if an.uniform.get(op.pc, a) == a else None


def _inside(v: Aff | None, offset: int, extent: int, threads: int,
            ranges: dict[str, tuple[int, int]]) -> bool:
    """Whether index register value ``v`` plus ``offset`` is in 0..extent-1 in every lane,
    with each symbol of ``v`` anywhere in its range (a symbol without one: unknown, no).
    The U register itself must stay in 0..2^32-1 too: Aff does not wrap, the machine does."""
    if v is None or v.lane < 0 or any(name not in ranges for name, _ in v.syms):
        return False
    lo, hi = _span(v, ranges)
    top = hi + v.lane * max(threads - 1, 0)
    return lo >= 0 and top < 1 << 32 and lo + offset >= 0 and top + offset < extent


def if_block(an: Analysis, op, st: LaneState, record: bool) -> LaneState:
    """A block run by some lanes: afterwards each register is the join of both paths."""
    body = an.seq(op.pc + 1, op.match, st.copy(), record)
    return LaneState({r: _join(st.U[r], body.U[r]) for r in st.U},
                     {r: st.R[r] if st.R[r] == body.R[r] else None for r in st.R})


def for_block(an: Analysis, op, st: LaneState, record: bool) -> LaneState:
    return an.loop(op, st, record)


def _signed(k: int) -> int:
    return k - (1 << 32) if k >= 1 << 31 else k


@dataclass(frozen=True)
class Slicing:
    """Lane l owns elements i of a region with (i mod modulus) div stride == l."""

    stride: int
    modulus: int  # 0: no modulus


def analyse(program) -> Analysis:
    an = Analysis(program)
    an.run()
    return an


def _sites_by_region(an: Analysis) -> dict[int, list]:
    by_region: dict[int, list] = {}
    for site in an.sites:
        by_region.setdefault(site[0].base, []).append(site)
    return by_region


def region_slicing(sites: list, threads: int) -> tuple[Slicing | None, str]:
    """The slicing of one written region from all its access sites, or (None, reason)."""
    region = sites[0][0]
    if any(aff is None for _, aff, _, _ in sites):
        return None, f"cannot tell which lane each access to {region.name} belongs to"
    lanes = {aff.lane for _, aff, _, _ in sites}
    if len(lanes) != 1 or next(iter(lanes)) <= 0:
        return None, (f"lanes are not offset by one common stride in {region.name} "
                      f"(lane coefficients {sorted(lanes)})")
    stride = next(iter(lanes))
    g = 0
    for _, aff, _, _ in sites:
        for _, k in aff.syms:
            g = math.gcd(g, k)
    modulus = g if g >= threads * stride else 0
    # The bounded part of each access must stay inside one lane's slice.
    for _, aff, _, _ in sites:
        if aff.lo < 0 or aff.hi >= stride:
            span = f"{aff.lo}" if aff.lo == aff.hi else f"{aff.lo}..{aff.hi}"
            return None, (f"an access to {region.name} reaches lane * {stride} + {span}, "
                          f"outside the lane's own {stride} element{'s' if stride > 1 else ''}")
    return Slicing(stride, modulus), ""


def lane_partition(program, an: Analysis | None = None) -> tuple[dict[int, Slicing] | None, str]:
    """Slicing per written region base, or (None, reason) when lanes may share memory."""
    if program.threads <= 1:
        return {}, ""
    an = an or analyse(program)
    out: dict[int, Slicing] = {}
    for base, sites in _sites_by_region(an).items():
        if not any(st for _, _, st, _ in sites):
            continue
        slicing, why = region_slicing(sites, program.threads)
        if slicing is None:
            return None, why
        out[base] = slicing
    return out, ""


def disjoint_regions(program, an: Analysis | None = None) -> dict[int, str]:
    """Each written region's base -> '' when lanes provably never share an element of it
    (no run-time check needed), else the reason they might.

    A slicing alone is not a proof: the compiled engine checks it at run time. It is
    one when every access to the region lands in its lane's slice whatever the unknown
    symbols are: an access without symbols is ``lane * L + c`` with c in 0..L-1 exactly
    when its index register cannot wrap around 2^32; an access with symbols keeps
    ``index mod M = lane * L + c`` only when the modulus M divides 2^32, the period of
    the wrap (a power of two), since the index is known only modulo 2^32."""
    if program.threads <= 1:
        return {}
    an = an or analyse(program)
    out: dict[int, str] = {}
    for base, sites in _sites_by_region(an).items():
        if not any(st for _, _, st, _ in sites):
            continue
        slicing, why = region_slicing(sites, program.threads)
        if slicing is not None:
            why = _unproven_site(sites, slicing, program.threads)
        out[base] = why
    return out


def _unproven_site(sites: list, sl: Slicing, threads: int) -> str:
    """Why some access to a sliced region may leave its lane's slice at run time, or ''."""
    region = sites[0][0]
    m = sl.modulus
    for _, aff, _, offset in sites:
        if not aff.syms:
            u = aff.shift(-offset)  # the index register's value
            if u.lo >= 0 and u.hi + u.lane * max(threads - 1, 0) < 1 << 32:
                continue
            return f"an index into {region.name} may wrap around 2^32"
        if not m:
            return (f"an index into {region.name} moves with a value known only at run time "
                    "(a loop count or a value loaded from memory) in steps smaller than "
                    f"{threads} lanes x {sl.stride}")
        if (1 << 32) % m:
            return (f"the rows of {region.name} ({m} elements) do not divide 2^32, the period "
                    "of index wrap-around")
    return ""


def infallible_steps(an: Analysis, fault_pcs) -> int | None:
    """The most instructions a lane can execute, when no lane can stop early; else None.

    ``fault_pcs`` are the ops whose compiled code can fault (vm/codegen says). Each one
    the lanes can reach must be proved safe by the analysis: every index in bounds in
    every lane (with no unknown symbol, so also in the lane's slice, which
    lane_partition checked for the symbol-free part), every rtou of the lane id or of a
    constant in range, every loop count a constant. Then only the budget and a stop
    request can end a lane early, and neither can within this many instructions."""
    for pc in fault_pcs:
        if pc in an.reached and not an.proved.get(pc, False):
            return None
    return most_steps(an.ops, 0, len(an.ops), an.trips)


def uniform_reads(an: Analysis) -> dict[int, int]:
    """pc -> arena address of every load whose value is the same in every lane for the
    whole dispatch (a constant index into a region the kernel does not write): the
    values a proof for one dispatch may assume (:func:`infallible_for`)."""
    return {pc: a for pc, a in an.uniform.items() if a is not None}


def infallible_for(program, fault_pcs, slicing: dict[int, "Slicing"],
                   params: dict[int, tuple[float, float]]) -> int | None:
    """:func:`infallible_steps` for the dispatches in which each uniform read ``pc`` of
    ``params`` loads a value in its range (lo, hi): the most instructions a lane can
    execute then, or None when the analysis cannot prove that no lane can stop early.

    ``slicing`` is :func:`lane_partition`'s, from the analysis without ranges. An index
    with a ranged symbol must be proved in its lane's slice too (without ranges, an index
    with a symbol is never proved in bounds): for a region sliced into rows (a modulus) the
    analysis without ranges proved ``index mod M`` in the slice for every value of the
    symbols, which holds for the machine's index when it does not wrap around 2^32, and
    this analysis proves it in bounds, so below 2^32; for a region without a modulus it
    proves the index in ``lane * stride + 0..stride-1`` (:func:`_in_slice`)."""
    an = Analysis(program, params, slicing)
    an.run()
    return infallible_steps(an, fault_pcs)


def most_steps(ops, a: int, b: int, trips: dict) -> int | None:
    """Upper bound of the instructions one lane executes in ops a..b-1 (blocks whole)."""
    n, pc = 0, a
    while pc < b:
        op = ops[pc]
        if op.spec.opens is None:
            n, pc = n + 1, pc + 1
            continue
        times = 1 if op.spec.opens is FrameKind.IF else trips.get(pc)
        if times is None:
            return None
        body = most_steps(ops, pc + 1, op.match + 1, trips) if times else 0
        if body is None:
            return None
        n, pc = n + 1 + times * body, op.match + 1
    return n

