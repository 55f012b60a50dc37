"""The speed-of-light model: counts + a device -> a predicted time, its terms and its bound.

Every node is one kernel launch. Its predicted time is

    max(memory, compute, latency) + launch

* ``memory``  = dram_bytes / DRAM bandwidth. dram_bytes is the distinct 32-byte
  sectors the node touches x 32: each byte is fetched from DRAM once (perfect
  cache reuse), but a whole sector moves for any byte of it, so uncoalesced
  (strided) access pays for the sectors it wastes.
* ``compute`` = warp instructions of f32 arithmetic x SIMD width / (f32 lane rate x
  share). The lane rate is the peak over 2 (an FMA is 2 flops, firscope's ops 1);
  ``share`` is the part of the device's f32 lanes the node's resident warps can
  occupy, so a one-warp kernel gets one warp's worth of the chip. Inactive lanes
  of an issued warp instruction cost as much as active ones (SIMD efficiency).
* ``latency`` = waves x (max_lane_instructions x dependent-issue cycles / clock +
  load batches on the longest lane x mean load latency). A wave is as many
  threadgroups as the device holds at once; the mean load latency mixes cache
  and DRAM latency by the node's cache hit fraction.
* ``launch``  = the device's launch overhead; ``bound`` is ``launch`` when it
  exceeds the largest other term.

ext ops are costed as a well-written library kernel of their definition (full
occupancy, coalesced): fir.linear reads the weight as stored (q4: packed codes,
scale and min per group) plus its input and writes its output, 2 x in x out flops.
What the model ignores is in docs/cost-model.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .devices import Device
from .record import SECTOR_BYTES, Counts

BOUNDS = ("memory", "compute", "latency", "launch")
LIMITERS = ("lanes", "threadgroups", "registers", "threadgroup memory")
# registers a lane needs beyond its live values: a 64-bit address formed for each load and
# store (the VM adds an index to a buffer's base; a GPU adds it to a 64-bit pointer)
REGISTER_OVERHEAD = 2


@dataclass(frozen=True)
class Residency:
    """What Nsight's occupancy section says of a kernel on a device: threadgroups per compute
    unit each resource allows (None: no limit), the least of them and which one it is."""

    limits: dict  # limiter -> threadgroups per compute unit
    per_cu: int  # resident threadgroups per compute unit (at least 1)
    limiter: str
    registers: int  # allocated per lane
    spills: bool  # the kernel needs more than the device's most registers per lane
    occupancy: float  # theoretical: resident lanes (whole warps) / max lanes, per unit

    def as_dict(self) -> dict:
        return {"theoretical_occupancy": self.occupancy, "limiter": self.limiter,
                "registers_per_lane": self.registers, "spills": self.spills,
                "threadgroups_per_cu": self.per_cu, "limits": dict(self.limits)}


@dataclass(frozen=True)
class Advice:
    """One piece of advice; ``tg``: the same kernel at this threadgroup size, which the model
    can cost from the recorded trace; else ``why_not``: why it cannot."""

    text: str
    tg: int | None = None
    why_not: str = ""


@dataclass(frozen=True)
class Prediction:
    terms: dict  # term -> microseconds (memory, compute, latency, launch)
    predicted_us: float
    bound: str
    occupancy: float  # resident lanes / device lanes
    waves: int
    advice: str
    residency: Residency | None = None  # None for an ext op (a library kernel)
    advice_items: tuple = ()  # Advice, the first the one the model can cost (if any)

    @property
    def work(self) -> str:
        """The largest of memory, compute and latency (the term the lines share)."""
        return max(("memory", "compute", "latency"), key=lambda k: self.terms[k])


def registers_per_lane(c: Counts, dev: Device) -> tuple[int, bool]:
    """(registers allocated per lane, spills): the register pressure (vm/liveness) plus
    REGISTER_OVERHEAD, rounded up to the device's granularity, at most its maximum."""
    g = dev.register_alloc_granularity
    need = c.register_pressure + REGISTER_OVERHEAD
    alloc = -(-need // g) * g
    if alloc > dev.max_registers_per_lane:
        return dev.max_registers_per_lane, need > dev.max_registers_per_lane
    return alloc, False


def residency(c: Counts, dev: Device) -> Residency:
    """Threadgroups per compute unit by lanes, threadgroups, registers and threadgroup
    memory (a threadgroup's lanes in whole warps); the limiter is the least (the first of
    LIMITERS on a tie). A threadgroup that does not fit at all is still run one at a time."""
    warps_per_tg = max(-(-min(c.tg, max(c.lanes, 1)) // dev.simd_width), 1)
    tg_lanes = warps_per_tg * dev.simd_width
    regs, spills = registers_per_lane(c, dev)
    limits = {"lanes": dev.max_lanes_per_cu // tg_lanes,
              "threadgroups": dev.max_threadgroups_per_cu,
              "registers": dev.registers_per_cu // (regs * tg_lanes),
              "threadgroup memory": dev.tg_memory_per_cu // c.tgbytes if c.tgbytes else None}
    limiter = min((k for k in LIMITERS if limits[k] is not None), key=lambda k: limits[k])
    per_cu = max(limits[limiter], 1)
    occ = min(per_cu * tg_lanes / dev.max_lanes_per_cu, 1.0)
    return Residency(limits, per_cu, limiter, regs, spills, occ)


def occupancy(c: Counts, dev: Device) -> tuple[int, int]:
    """(threadgroups resident per compute unit, waves of threadgroups)."""
    per_cu = residency(c, dev).per_cu
    waves = max(math.ceil(c.threadgroups / (per_cu * dev.compute_units)), 1)
    return per_cu, waves


def predict(c: Counts, dev: Device, *, library: bool = False, op: str = "") -> Prediction:
    """``library``: an ext op (``op``), costed as a tuned kernel (no recorded lanes)."""
    clock = dev.clock_ghz * 1e9
    lane_rate = dev.f32_tflops * 1e12 / 2
    total_lanes = dev.compute_units * dev.f32_lanes_per_cu
    launch = dev.launch_overhead_us
    memory = c.dram_bytes / (dev.dram_bandwidth_gbs * 1e9) * 1e6
    res = None
    if library:
        compute = c.flops / lane_rate * 1e6
        latency = (dev.memory_latency_ns + 2 * dev.cache_latency_ns) / 1e3
        occ, waves = 1.0, 1
    else:
        res = residency(c, dev)
        per_cu = res.per_cu
        waves = max(math.ceil(c.threadgroups / (per_cu * dev.compute_units)), 1)
        resident_tgs = min(c.threadgroups, per_cu * dev.compute_units)
        resident_warps = c.warps * resident_tgs / max(c.threadgroups, 1)
        occ = min(resident_warps * dev.simd_width / (dev.compute_units * dev.max_lanes_per_cu),
                  1.0)
        share = min(resident_warps * dev.simd_width / total_lanes, 1.0) or 1.0 / total_lanes
        eff = c.simd_efficiency or 1.0
        compute = c.flops / eff / (lane_rate * share) * 1e6
        load_ns = load_latency_ns(c, dev)
        path_ns = (c.max_lane_instructions * dev.alu_latency_cycles / clock * 1e9
                   + c.max_lane_load_batches * load_ns)
        latency = waves * path_ns / 1e3
    terms = {"memory": memory, "compute": compute, "latency": latency, "launch": launch}
    work = max(("memory", "compute", "latency"), key=lambda k: terms[k])
    bound = "launch" if launch > terms[work] else work
    total = terms[work] + launch
    return Prediction(terms, total, bound, occ, waves, advice(c, bound, dev, library, op), res,
                      advice_items(c, bound, dev, library, op))


def load_latency_ns(c: Counts, dev: Device) -> float:
    hit = c.cache_hit_fraction
    return hit * dev.cache_latency_ns + (1 - hit) * dev.memory_latency_ns


def line_times(c: Counts, p: Prediction, dev: Device) -> dict[int, float]:
    """Per source line, its part of the node's predicted time (us): the largest work term
    (memory, compute or latency; the launch overhead is no line's) shared by what that term
    counts: sectors for memory, flops for compute, and for latency the instructions and load
    batches of the longest lane, weighted as the term weighs them."""
    work = p.work
    if work == "memory":
        weight = {ln: float(ls.sectors) for ln, ls in c.lines.items()}
    elif work == "compute":
        weight = {ln: float(ls.flops) for ln, ls in c.lines.items()}
    else:
        alu_ns = dev.alu_latency_cycles / dev.clock_ghz
        load_ns = load_latency_ns(c, dev)
        weight = {ln: ls.critical * alu_ns + ls.critical_loads * load_ns
                  for ln, ls in c.lines.items()}
    total = sum(weight.values())
    if not total:
        return {ln: 0.0 for ln in c.lines}
    return {ln: p.terms[work] * w / total for ln, w in weight.items()}


def advice(c: Counts, bound: str, dev: Device, library: bool = False, op: str = "") -> str:
    """One line of plain advice for the bound."""
    if bound == "launch" and not library and c.tg < dev.simd_width:
        idle = dev.simd_width - c.tg
        return (f"launch-bound: the work is smaller than one launch; fuse this kernel into "
                f"its neighbour. Its threadgroups of {c.tg} lane{'s' if c.tg > 1 else ''} "
                f"also leave {idle} of {dev.simd_width} lanes of each warp idle (SIMD "
                f"efficiency {c.simd_efficiency or 0:.0%}): tg={dev.simd_width} fills them")
    if bound == "launch":
        if op == "fir.embedding":
            return ("launch-bound: a row copy; gather the token and position rows and add "
                    "them in one kernel")
        if library:
            return ("launch-bound: the work is smaller than one launch; fuse the bias add "
                    "(and residual) that follow into this op")
        return ("launch-bound: the work is smaller than one launch; fuse this kernel into "
                "its neighbour (a bias add into the linear before it)")
    if library:
        if bound == "memory":
            return ("memory-bound at the weight's stored size: fewer bytes per weight (q4) or "
                    "batching tokens is what helps")
        return "compute-bound: batch tokens so each weight byte does more work"
    if bound == "latency":
        if c.lanes <= dev.simd_width and c.max_lane_instructions > 1000:
            who = "one lane walks" if c.lanes == 1 else f"each of {c.lanes} lanes walks"
            return (f"latency-bound: {who} {_walks(c)} ({c.max_lane_instructions} "
                    "instructions in a row); split the rows over a threadgroup (tg lanes, "
                    "each a slice) and reduce")
        if (c.simd_efficiency or 1) < 0.5:
            return (f"latency-bound with SIMD efficiency {c.simd_efficiency:.0%}: give each "
                    f"threadgroup a multiple of {dev.simd_width} lanes (tg={c.tg} now) so "
                    "warps fill")
        return "latency-bound: shorten the longest lane's chain (more lanes, less per lane)"
    if bound == "memory":
        eff = c.coalescing_efficiency
        if eff is not None and eff < 0.5:
            worst = min((ls for ls in c.lines.values() if ls.sectors),
                        key=lambda ls: ls.coalescing_efficiency or 1, default=None)
            where = f" (line {worst.line})" if worst else ""
            return (f"memory-bound and uncoalesced{where}: {c.sectors_per_request:.1f} sectors "
                    "per request; make neighbouring lanes read neighbouring elements")
        return "memory-bound: it moves what it must; fuse it with the node that produced the data"
    return (f"compute-bound: {c.flops} flops at SIMD efficiency "
            f"{(c.simd_efficiency or 1):.0%}; more lanes per warp or fewer instructions")


# why the model cannot price a piece of advice: it costs code it has recorded running
_NEW_CODE = "not computed: it needs new kernel code, and the model costs only code it ran"
_WHY_NOT = {
    "fuse": "not computed: a fused kernel is code the model has not run (it costs the "
            "kernels it recorded, one launch each)",
    "library": "not computed: an ext op is costed as a tuned library kernel; batching or "
               "fusing it changes the step, which the model does not rewrite",
}


def fill_tg(c: Counts, dev: Device) -> int | None:
    """The threadgroup size that fills whole warps (the next multiple of the SIMD width),
    when the kernel has more lanes than one threadgroup and its tg leaves lanes idle."""
    w = dev.simd_width
    if c.tg % w == 0 or c.lanes <= c.tg:
        return None
    return -(-c.tg // w) * w


def advice_items(c: Counts, bound: str, dev: Device, library: bool = False,
                 op: str = "") -> tuple[Advice, ...]:
    """The advice as separate items, each priced later (analyze) where the model can: a
    threadgroup size that fills the warps is the same kernel's trace counted again."""
    items = []
    tg = None if library else fill_tg(c, dev)
    if tg is not None:
        items.append(Advice(f"tg={tg}: fill the warps (threadgroups of {c.tg} lane"
                            f"{'s' if c.tg > 1 else ''} use {c.simd_efficiency or 0:.0%} of "
                            "each warp's lanes)", tg=tg))
    text = advice(c, bound, dev, library, op)
    if bound == "launch":
        items.append(Advice(text.split(". Its threadgroups")[0], why_not=_WHY_NOT["fuse"]))
    elif library:
        items.append(Advice(text, why_not=_WHY_NOT["library"]))
    elif tg is None or "so warps fill" not in text:  # else it is the tg item above
        items.append(Advice(text, why_not=_NEW_CODE))
    return tuple(items)


def _walks(c: Counts) -> str:
    """'768 elements 3 times' from the kernel's loops (the outermost trip counts)."""
    if not c.loops:
        return "one long chain"
    trips = [round(t) for _, t in c.loops]
    common = max(set(trips), key=trips.count)
    same = trips.count(common)
    return f"{common} elements" + (f" {same} times" if same > 1 else "") + \
        (f" (and {len(trips) - same} other loop(s))" if same < len(trips) else "")


def ext_counts(node, width: int) -> Counts:
    """An ext op's work from its definition (the same fields a kernel's trace gives)."""
    x, w = node.args
    y = node.outs[0]
    c = Counts(simd_width=width)
    if node.target == "fir.embedding":
        cols = w.weight.shape[1]
        c.bytes_read = 4 + 4 * cols
        c.bytes_written = 4 * cols
        c.lanes = cols
    else:
        n_in, n_out = x.size, y.size
        entry = w.weight
        if entry.matrix is not None:  # an f32 copy (--fir-f32, or q4 on the dequant path)
            weight_bytes = entry.matrix.nbytes
        elif entry.q4 is not None:
            weight_bytes = entry.q4.nbytes  # packed codes + scale and min per group
        else:
            weight_bytes = 4 * entry.size
        c.bytes_read = weight_bytes + 4 * n_in
        c.bytes_written = 4 * n_out
        c.flops = 2 * n_in * n_out
        c.lanes = n_out
    # a tuned library kernel: its lanes in full warps, one warp a threadgroup (the geometry
    # is not recorded for an ext op; 0 warps beside 512 lanes read as nothing running)
    c.tg = width
    c.threadgroups = c.warps = -(-c.lanes // width)
    c.unique_bytes = c.bytes_read + c.bytes_written
    c.dram_bytes = -(-c.unique_bytes // SECTOR_BYTES) * SECTOR_BYTES
    c.lane_instructions = c.flops
    return c

