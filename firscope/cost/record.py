"""What a GPU would see of one dispatch, counted from the step interpreter's execution.

:class:`Trace` observes the one instruction loop (vm/interp ``Dispatch.run``)
and keeps, per executed instruction, its pc and its active mask (a mask is
stored once, by identity: the interpreter replaces masks, never edits them),
and for each load and store its index register (the address is the
region's base + offset + index, as ``handlers.lane_addresses`` computes it
for one instruction; here all at once, at the end).
:func:`count` turns that into GPU terms with NumPy over lanes and executions:

* lanes are grouped into threadgroups of ``tg`` and each threadgroup into warps
  of the device's SIMD width (a threadgroup of 1 lane is a warp of 1 lane);
* a warp instruction is issued when at least one of its lanes is active:
  ``simd_efficiency`` = active lane-instructions / (warp instructions x width);
* a memory request is one (instruction execution, warp); it touches the
  distinct 32-byte sectors of its active lanes' 4-byte elements, addresses
  counted from the start of each buffer (on a GPU each buffer instance is its
  own aligned allocation); the ideal is ceil(active lanes x 4 / 32) sectors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..fir.expr import Env, eval_int
from ..vm.interp import Dispatch, Observer
from ..vm.liveness import liveness

SECTOR_BYTES = 32
ELEMENT_BYTES = 4
PER_SECTOR = SECTOR_BYTES // ELEMENT_BYTES
_REGION_SHIFT = 40  # sector keys: region ordinal << 40 | sector within the region


class Trace(Observer):
    """Records what a dispatch executed: per stretch of one active mask, the executions of
    each pc (the interpreter's own counts, read when the mask changes), and for each
    memory instruction its pc, its mask and its index register (``before`` is called at
    those alone: an observer call per instruction was ~40% of a recorded dispatch)."""

    wants_before = True
    wants_mask = True

    def __init__(self, d: Dispatch):
        self._d = d
        self.masks: list[np.ndarray] = [np.ones(d.lanes, dtype=bool)]  # 0: every lane
        self._ids: dict[int, int] = {}
        self._key = 0  # the mask now
        # stretches: the mask key of each and its executions per pc
        self._seg_keys: list[int] = []
        self._seg_counts: list[np.ndarray] = []
        self._counted = np.zeros(len(d.ops), dtype=np.int64)  # counts at the last change
        # memory instructions in execution order: pc, mask key, and the index register's
        # value in every lane (an access outside its region faults, so every active lane's
        # access happened)
        self.mem_pc: list[int] = []
        self.mem_key: list[int] = []
        self.index: list[np.ndarray] = []
        # (arrays, record._Accesses): the accesses' figures that the threadgroup size does
        # not change, made once (the advice counts one trace at several: analyze._priced)
        self.accesses: tuple | None = None
        self._arrays: TraceArrays | None = None
        self._liveness = None  # of the recorded program (vm/liveness), made once
        # each memory op's (pc, index register row), by identity, looked up once
        self._at = {id(op): (op.pc, d.Ur[op.args[op.spec.mem.index]])
                    for op in d.ops if op.spec.mem is not None}
        self.before_only_at = frozenset(pc for pc, _ in self._at.values())

    def _close(self, counts: np.ndarray) -> None:
        """End the stretch under the current mask at ``counts`` (executions per pc)."""
        delta = counts - self._counted
        if delta.any():
            self._seg_keys.append(self._key)
            self._seg_counts.append(delta)
        self._counted = counts

    def mask(self, d) -> None:
        counts = d.line_counts
        counts[d.pc] += 1  # the instruction that changes the mask ran under the old one
        self._close(counts)
        if d.full:
            self._key = 0
        else:
            m = d.mask
            k = self._ids.get(id(m))
            if k is None:
                k = self._ids[id(m)] = len(self.masks)
                self.masks.append(m)
            self._key = k

    def before(self, d, op) -> bool:
        pc, index = self._at[id(op)]
        self.mem_pc.append(pc)
        self.mem_key.append(self._key)
        self.index.append(index.copy())  # as it is before the access (all lanes)
        return False

    def arrays(self) -> "TraceArrays":
        """The recorded lists as arrays, made once (a trace is counted at several
        threadgroup sizes); the trace must be complete. Masks are numbered in the order
        instructions first ran under them (0: every lane)."""
        if self._arrays is None or len(self._seg_keys) != self._arrays.closed:
            counts = self._d.line_counts
            if (counts != self._counted).any():
                self._close(counts)
            keys = np.asarray(self._seg_keys, dtype=np.int64)
            mem_key = np.asarray(self.mem_key, dtype=np.int64)
            # masks set but never run under are left out, the rest numbered by first use
            used = [0] + [k for k in dict.fromkeys(self._seg_keys) if k]
            renumber = np.zeros(len(self.masks), dtype=np.int64)
            renumber[used] = np.arange(len(used))
            lanes = self.masks[0].size
            index = (np.concatenate(self.index).reshape(len(self.index), lanes) if self.index
                     else np.zeros((0, lanes), np.int64))  # np.stack: 4x the time
            seg = (np.stack(self._seg_counts) if self._seg_counts
                   else np.zeros((0, len(self._counted)), np.int64))
            self._arrays = TraceArrays(seg, renumber[keys], np.stack([self.masks[k] for k in used]),
                                       np.asarray(self.mem_pc, np.int64), renumber[mem_key],
                                       index, len(self._seg_keys))
        return self._arrays

    def liveness(self, ops):
        """The recorded program's registers live at each pc (vm/liveness), made once."""
        if self._liveness is None:
            self._liveness = liveness(ops)
        return self._liveness


@dataclass(frozen=True)
class TraceArrays:
    """A trace as arrays: executions per pc of each stretch under one mask [stretches,
    pcs] and the stretch's mask key, the distinct masks [masks, lanes], and per memory
    execution (in order) its pc, its mask key and its index register [.., lanes]."""

    seg_counts: np.ndarray
    seg_keys: np.ndarray
    masks: np.ndarray
    mem_pc: np.ndarray
    mem_key: np.ndarray
    index: np.ndarray
    closed: int  # stretches recorded when made


class _Coalescing:
    """Rates from ``requests``, ``sectors`` and ``ideal_sectors`` (a line's or a node's)."""

    requests: int
    sectors: int
    ideal_sectors: int

    @property
    def sectors_per_request(self) -> float | None:
        return self.sectors / self.requests if self.requests else None

    @property
    def coalescing_efficiency(self) -> float | None:
        return self.ideal_sectors / self.sectors if self.sectors else None


@dataclass
class LineStats(_Coalescing):
    """One kernel source line (all its instructions), summed over what ran."""

    line: int
    text: str
    executions: int = 0
    lane_instructions: int = 0
    warp_instructions: int = 0
    requests: int = 0  # memory requests (instruction execution x warp)
    sectors: int = 0
    ideal_sectors: int = 0
    flops: int = 0
    lane_slots: int = 0  # executions x the dispatch's lanes (active_lane_share's denominator)
    critical: int = 0  # instructions of this line on the longest lane
    critical_loads: int = 0  # load batches of this line on the longest lane
    live_r: int = 0  # the most R / U registers live on entry to one of its instructions
    live_u: int = 0

    def add(self, o: "LineStats") -> None:
        for f in _SUMMED_LINE:
            setattr(self, f, getattr(self, f) + getattr(o, f))
        self.live_r, self.live_u = max(self.live_r, o.live_r), max(self.live_u, o.live_u)

    def simd_efficiency(self, width: int) -> float | None:
        return self.lane_instructions / (self.warp_instructions * width) \
            if self.warp_instructions else None

    @property
    def active_lane_share(self) -> float | None:
        """Active lanes per execution over the dispatch's lanes: 1.0 when every lane runs
        the line each time it issues, 0.5 in an if half the lanes take."""
        return self.lane_instructions / self.lane_slots if self.lane_slots else None


_SUMMED_LINE = ("executions", "lane_instructions", "warp_instructions", "requests", "sectors",
                "ideal_sectors", "flops", "lane_slots", "critical", "critical_loads")


@dataclass
class Counts(_Coalescing):
    """What one node does, in GPU terms (the fields of report.json's ``gpu.nodes``)."""

    lanes: int = 0
    tg: int = 1
    tgbytes: int = 0
    threadgroups: int = 0
    warps: int = 0
    simd_width: int = 32
    instructions: int = 0  # lockstep issues over the whole dispatch (the interpreter's steps)
    warp_instructions: int = 0
    lane_instructions: int = 0
    max_lane_instructions: int = 0
    max_lane_load_batches: int = 0  # load groups on the longest lane (each waits for memory)
    flops: int = 0
    sfu_ops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    unique_bytes: int = 0
    dram_bytes: int = 0  # distinct sectors touched x 32: the traffic a sector-grained DRAM moves
    requests: int = 0
    sectors: int = 0
    ideal_sectors: int = 0
    load_sectors: int = 0  # (load request, sector) pairs
    load_hits: int = 0  # of those, sectors an earlier instruction of the node touched
    # registers (vm/liveness): the most live R, U, and R + U + loop counters at one pc
    max_live_r: int = 0
    max_live_u: int = 0
    max_live: int = 0
    register_pressure: int = 0
    lines: dict[int, LineStats] = field(default_factory=dict)
    loops: list[tuple[int, float]] = field(default_factory=list)  # (line, trips per entry)
    per_pc: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def simd_efficiency(self) -> float | None:
        if not self.warp_instructions:
            return None
        return self.lane_instructions / (self.warp_instructions * self.simd_width)

    @property
    def bytes_per_sector(self) -> float | None:
        """Bytes the lanes asked for per 32-byte sector the requests fetched: 32 when every
        byte of every sector is used, 4 when each lane reads its own sector alone (a warp of
        one lane is 'coalesced' by itself: coalescing is judged per warp, this is not)."""
        if not self.sectors:
            return None
        return (self.bytes_read + self.bytes_written) / self.sectors

    @property
    def cache_hit_fraction(self) -> float:
        """Load sector requests whose sector an earlier instruction of this node touched (L1/L2
        hits under the model's assumption of perfect reuse). Warps asking for one sector in
        the same instruction all miss: on a GPU they wait on the same fill (the miss queue
        merges them), they do not find it in the cache."""
        return self.load_hits / self.load_sectors if self.load_sectors else 0.0


def geometry(lanes: int, tg: int, width: int) -> tuple[int, int, np.ndarray]:
    """(threadgroups, warps, warp of each lane): warps are formed inside each threadgroup."""
    tg = max(int(tg), 1)
    per_tg = -(-min(tg, max(lanes, 1)) // width)
    lane = np.arange(lanes, dtype=np.int64)
    warp = (lane // tg) * per_tg + (lane % tg) // width
    groups = -(-lanes // tg)
    full, rest = divmod(lanes, tg)
    warps = full * (-(-tg // width)) + (-(-rest // width) if rest else 0)
    return groups, warps, warp


def kernel_shape(model, program) -> tuple[int, int]:
    """(tg, tgbytes) of the program's kernel, evaluated for its node."""
    k = program.kernel.syntax
    env = Env(model.symbols, {name: r.size for name, r in program.operands})
    return (max(eval_int(k.tg, env, "tg"), 1), max(eval_int(k.tgbytes, env, "tgbytes"), 0))


def load_batch_leaders(program) -> np.ndarray:
    """bool [n_ops]: loads not directly preceded by a load. A run of back-to-back loads
    waits for memory once: in-order issue stalls at the first use of the first result."""
    ops = program.ops
    out = np.zeros(len(ops), dtype=bool)
    for i, op in enumerate(ops):
        m = op.spec.mem
        if m is not None and not m.stores:
            prev = ops[i - 1].spec.mem if i else None
            out[i] = prev is None or prev.stores
    return out


def record(program, arena: np.ndarray, budget: int | None, stop=None) -> tuple[Trace, Dispatch]:
    """Run ``program`` once on the step interpreter, recording it (the arena changes as a
    plain run would change it)."""
    d = Dispatch(program, arena)
    trace = Trace(d)
    d.run(budget, stop, observer=trace)
    return trace, d


def count(program, trace: Trace, tg: int, tgbytes: int, width: int) -> Counts:
    """length: one pass of vectorized bookkeeping over the trace, kept in one place so each
    quantity is computed from the same arrays the others are."""
    ops = program.ops
    n_ops = len(ops)
    lanes = program.threads
    groups, n_warps, warp_of = geometry(lanes, tg, width)
    c = Counts(lanes=lanes, tg=tg, tgbytes=tgbytes, threadgroups=groups, warps=n_warps,
               simd_width=width)
    arrays = trace.arrays()
    seg, keys = arrays.seg_counts, arrays.seg_keys
    c.instructions = int(seg.sum())
    masks = arrays.masks if lanes else np.zeros((arrays.masks.shape[0], 0), dtype=bool)
    n_masks = masks.shape[0]
    active = masks.sum(axis=1)
    if lanes:
        starts = np.flatnonzero(np.r_[True, warp_of[1:] != warp_of[:-1]])
        warps_active = np.logical_or.reduceat(masks, starts, axis=1).sum(axis=1)
    else:
        warps_active = np.zeros(n_masks, dtype=np.int64)
    # per pc, summed over the stretches: each stretch's executions weighted by its mask's
    lane_pc = active[keys].astype(np.int64) @ seg
    warp_pc = warps_active[keys].astype(np.int64) @ seg
    exec_pc = seg.sum(axis=0)
    c.lane_instructions = int(lane_pc.sum())
    c.warp_instructions = int(warp_pc.sum())
    uses = np.bincount(keys, weights=seg.sum(axis=1), minlength=n_masks)
    per_lane = uses @ masks if lanes else np.zeros(0)
    c.max_lane_instructions = int(per_lane.max()) if lanes else 0
    longest = masks[:, int(per_lane.argmax())] if lanes else np.zeros(n_masks, dtype=bool)
    crit_pc = longest[keys].astype(np.int64) @ seg
    leaders = load_batch_leaders(program)
    lead_uses = np.bincount(keys, weights=seg[:, leaders].sum(axis=1), minlength=n_masks)
    c.max_lane_load_batches = int((lead_uses @ masks).max()) if lanes else 0
    arith = np.array([op.spec.is_f32_arith for op in ops], dtype=bool)
    sfu = np.array([op.spec.sfu for op in ops], dtype=bool)
    c.flops = int(lane_pc[arith].sum())
    c.sfu_ops = int(lane_pc[sfu].sum())
    req_pc, sec_pc, ideal_pc = _memory(c, program, trace, arrays, warp_of, n_warps, lane_pc)
    c.per_pc = {"executions": exec_pc, "lane": lane_pc, "warp": warp_pc, "requests": req_pc,
                "sectors": sec_pc, "ideal": ideal_pc, "flops": np.where(arith, lane_pc, 0),
                "critical": crit_pc, "critical_loads": np.where(leaders, crit_pc, 0)}
    for op in ops:
        if op.spec.opens is not None and op.spec.opens.value == "for" and lane_pc[op.pc] \
                and op.pc + 1 < n_ops:
            c.loops.append((op.line, float(lane_pc[op.pc + 1] / lane_pc[op.pc])))
    _per_line(c, program, trace.liveness(ops))
    return c


def _per_line(c: Counts, program, lv) -> None:
    """``c.lines`` from ``c.per_pc``, and the kernel's live registers (``lv``: its
    vm/liveness)."""
    c.max_live_r, c.max_live_u = lv.max_r, lv.max_u
    c.max_live, c.register_pressure = lv.max_live, lv.pressure
    pp = c.per_pc
    for op in program.ops:
        pc = op.pc
        ls = c.lines.get(op.line)
        if ls is None:
            ls = c.lines[op.line] = LineStats(op.line, op.loc.text.strip() or op.text)
        live_r, live_u = lv.count(pc)
        ls.add(LineStats(op.line, "", int(pp["executions"][pc]), int(pp["lane"][pc]),
                         int(pp["warp"][pc]), int(pp["requests"][pc]), int(pp["sectors"][pc]),
                         int(pp["ideal"][pc]), int(pp["flops"][pc]),
                         int(pp["executions"][pc]) * c.lanes, int(pp["critical"][pc]),
                         int(pp["critical_loads"][pc]), live_r, live_u))


def _memory(c: Counts, program, trace: Trace, arrays: TraceArrays, warp_of, n_warps,
            lane_pc):
    """Bytes, distinct elements and sectors, and per pc requests / sectors / ideal sectors."""
    ops = program.ops
    n_ops = len(ops)
    zeros = np.zeros(n_ops, dtype=np.int64)
    is_store = np.array([op.spec.stores for op in ops], dtype=bool)
    is_load = np.array([op.spec.mem is not None and not op.spec.stores for op in ops])
    c.bytes_read = int(lane_pc[is_load].sum()) * ELEMENT_BYTES
    c.bytes_written = int(lane_pc[is_store].sum()) * ELEMENT_BYTES
    if not trace.mem_pc or not program.threads:
        return zeros, zeros.copy(), zeros.copy()
    acc = _accesses(program, trace, arrays)
    c.unique_bytes = acc.distinct_elements * ELEMENT_BYTES
    c.dram_bytes = acc.distinct_sectors * SECTOR_BYTES
    # the rest depends on the accesses and the warps alone: traces that share their
    # accesses (cost/batch: attention's layers) count them once per geometry
    key = (n_warps, warp_of.tobytes())
    got = acc.by_geometry.get(key)
    if got is None:
        got = acc.by_geometry[key] = _requests(acc, warp_of, n_warps, n_ops, is_store)
    (c.load_sectors, c.load_hits, c.requests, c.sectors, c.ideal_sectors,
     req_pc, sec_pc, ideal_pc) = got
    return req_pc.copy(), sec_pc.copy(), ideal_pc.copy()


def _requests(acc: "_Accesses", warp_of, n_warps: int, n_ops: int, is_store) -> tuple:
    """Load sectors and hits, requests, sectors and ideal sectors (all, and per pc) of
    ``acc``'s accesses made by warps ``warp_of``."""
    execs, lanes, pc, sector = acc.execs, acc.lanes, acc.pc, acc.sector
    # executions in order and a warp's lanes side by side: requests never decrease; the
    # accesses are in (request, sector) order already when each request's sectors do not
    # decrease either (lanes reading ascending addresses: the usual case), else sorted
    request = execs * max(n_warps, 1) + warp_of[lanes]
    same = request[1:] == request[:-1]
    if np.any(same & (sector[1:] < sector[:-1])):
        order = np.lexsort((sector, request))
        req_s, sec_s, pc_s, ex_s = request[order], sector[order], pc[order], execs[order]
        first_s = acc.first[order]
    else:
        req_s, sec_s, pc_s, ex_s, first_s = request, sector, pc, execs, acc.first
    new_req = np.r_[True, req_s[1:] != req_s[:-1]]
    new_sec = new_req | np.r_[True, sec_s[1:] != sec_s[:-1]]
    # one row per distinct (request, sector): a load's row hits when an earlier
    # instruction execution touched its sector
    loads = ~is_store[pc_s[new_sec]]
    load_sectors = int(loads.sum())
    load_hits = int((loads & (ex_s[new_sec] > first_s[new_sec])).sum())
    req_pc = np.bincount(pc_s[new_req], minlength=n_ops).astype(np.int64)
    sec_pc = np.bincount(pc_s[new_sec], minlength=n_ops).astype(np.int64)
    starts = np.flatnonzero(new_req)
    in_request = np.diff(np.r_[starts, req_s.size])  # active lanes of each request
    group = np.cumsum(new_req) - 1
    actual = np.bincount(group, weights=new_sec).astype(np.int64)
    # a broadcast (lanes sharing a sector) needs fewer sectors than its lanes' bytes: it
    # is as good as it gets, not better than ideal
    ideal = np.minimum(-(-in_request * ELEMENT_BYTES // SECTOR_BYTES), actual)
    ideal_pc = np.bincount(pc_s[starts], weights=ideal, minlength=n_ops).astype(np.int64)
    return (load_sectors, load_hits, int(req_pc.sum()), int(sec_pc.sum()),
            int(ideal_pc.sum()), req_pc, sec_pc, ideal_pc)


@dataclass(frozen=True)
class _Accesses:
    """A trace's active lane accesses, in execution order and lanes ascending: what
    :func:`_memory` needs that does not depend on the threadgroup size (made once per
    trace: the advice counts one trace at several sizes)."""

    execs: np.ndarray  # the memory execution (numbered in order) of each access
    lanes: np.ndarray
    pc: np.ndarray
    sector: np.ndarray  # region ordinal << _REGION_SHIFT | sector within the region
    first: np.ndarray  # the first execution that touched each access's sector
    distinct_elements: int
    distinct_sectors: int
    # _requests's figures by warp geometry, made once for every trace sharing these
    by_geometry: dict = field(default_factory=dict, compare=False, repr=False)


def _accesses(program, trace: Trace, arrays: TraceArrays) -> _Accesses:
    if trace.accesses is not None and trace.accesses[0] is arrays:
        return trace.accesses[1]
    ops = program.ops
    regions: dict[str, int] = {}
    ordinal = np.zeros(len(ops), dtype=np.int64)
    offset = np.zeros(len(ops), dtype=np.int64)
    for op in ops:
        if op.spec.mem is not None:
            a = op.args[op.spec.mem.address]
            ordinal[op.pc] = regions.setdefault(a.region.name, len(regions))
            offset[op.pc] = a.offset
    index = arrays.index  # [memory executions, lanes]
    active = arrays.masks[arrays.mem_key]
    row, lanes = np.nonzero(active)  # row-major: executions in order, lanes ascending
    execs = row  # memory executions are numbered in order: enough to tell which came first
    pc = arrays.mem_pc[row]
    rel = index[row, lanes].astype(np.int64) + offset[pc]  # element within its region
    region = ordinal[pc] << _REGION_SHIFT
    sector = region | (rel // PER_SECTOR)
    got = _Accesses(execs, lanes, pc, sector, _first_touch(execs, sector),
                    _distinct(region | rel), _distinct(sector))
    trace.accesses = (arrays, got)
    return got


def _distinct(keys: np.ndarray) -> int:
    """How many different values ``keys`` (region ordinal << _REGION_SHIFT | position in
    the region, non-negative) holds: per region, marked in a table the size of the
    highest position (GPT-2 small's attention: 4 ms where np.unique's sort took 13), or
    np.unique where that table would be much larger than the region's keys."""
    if not keys.size:
        return 0
    region = keys >> _REGION_SHIFT
    low = keys & ((1 << _REGION_SHIFT) - 1)
    regions = np.flatnonzero(np.bincount(region))  # ordinals are small: no sort
    total = 0
    for r in regions:
        pos = low if regions.size == 1 else low[region == r]
        top = int(pos.max())
        if top > 8 * pos.size + 4096:
            total += int(np.unique(pos).size)
            continue
        seen = np.zeros(top + 1, dtype=bool)
        seen[pos] = True
        total += int(np.count_nonzero(seen))
    return total


def _first_touch(execs: np.ndarray, sectors: np.ndarray) -> np.ndarray:
    """For each access (``execs`` non-decreasing: in execution order), the first
    execution that touched its sector: a stable sort by sector orders each sector's
    accesses by execution, and the first of each run is the earliest."""
    if not sectors.size:
        return execs.copy()
    order = np.argsort(sectors, kind="stable")
    s_sorted = sectors[order]
    starts = np.r_[True, s_sorted[1:] != s_sorted[:-1]]
    run_start = np.maximum.accumulate(np.where(starts, np.arange(s_sorted.size), 0))
    first = np.empty_like(execs)
    first[order] = execs[order][run_start]
    return first


def data_independent(program) -> bool:
    """True when no loop count, branch condition or memory index can depend on a loaded
    value: then the whole trace (pcs, masks, region offsets) is a function of the program's
    constants, and two nodes with the same constants and aliasing execute alike.

    A flow-insensitive taint over registers: a load's value is tainted, and so is every
    register written from a tainted one, anywhere in the program (sound for loops)."""
    tainted: set[tuple[str, int]] = set()
    changed = True
    while changed:
        changed = False
        for op in program.ops:
            spec = op.spec
            if spec.mem is not None:
                if not spec.mem.stores:
                    reg = ("R", op.args[spec.mem.value])
                    if reg not in tainted:
                        tainted.add(reg)
                        changed = True
                continue
            src = any((f, op.args[i]) in tainted for f, i in spec.reads)
            for f, i in spec.writes:
                if src and (f, op.args[i]) not in tainted:
                    tainted.add((f, op.args[i]))
                    changed = True
    for op in program.ops:
        spec = op.spec
        if spec.opens is not None and ("R", op.args[0]) in tainted:
            return False
        if spec.mem is not None and ("U", op.args[spec.mem.index]) in tainted:
            return False
    return True


def identity_key(program, tg: int, tgbytes: int) -> tuple:
    """What a data-independent program's trace depends on: kernel, lanes, every constant,
    offset and extent, and which of its addresses name the same buffer."""
    seen: dict[str, int] = {}
    alias = tuple(seen.setdefault(op.args[op.spec.mem.address].region.name, len(seen))
                  for op in program.ops if op.spec.mem is not None)
    return (program.name, program.threads, tg, tgbytes, program.constants_key(), alias)
