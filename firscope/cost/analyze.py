"""One decode step analysed node by node: counts, predictions, and sums per kernel and layer.

:func:`analyse_step` runs every node of one step on an arena (the model's, or a
copy a debugger hands over) at a position whose earlier steps are already in
the arena (the KV cache). A micro node is recorded on the step interpreter
(:mod:`.record`), except when an earlier node of the same step ran the same
program and the program is data-independent (:func:`.record.data_independent`):
then its trace is provably the same and its counts are reused, and the node
runs on the compiled engine where there is one. :func:`analyse_position` feeds
a prompt up to a position first, on the compiled engine.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..compare.lanes import program_regions
from ..errors import FirError
from ..runtime import NodeKind
from ..runtime.extops import EXT_IMPLS
from ..runtime.machine import DEFAULT_BUDGET, Machine
from ..vm.interp import Dispatch
from .batch import Copies, Unbatched
from .devices import Device
from .model import Prediction, ext_counts, line_times, predict, residency
from .record import Counts, LineStats, count, data_independent, identity_key, kernel_shape, \
    record


@dataclass
class NodeCost:
    index: int
    node: str  # full name, name@layer
    name: str
    layer: int | None
    kind: str  # micro / ext
    kernel: str  # kernel or ext op
    counts: Counts
    prediction: Prediction
    reused_from: str | None = None  # a node whose identical trace these counts are
    priced: list = field(default_factory=list)  # the advice with its price (price_advice)

    def as_dict(self) -> dict:
        c, p = self.counts, self.prediction
        out = {"index": self.index, "node": self.node, "layer": self.layer, "kind": self.kind,
               "kernel": self.kernel}
        out.update(counts_dict(c))
        out.update({"predicted_us": p.predicted_us, "bound": p.bound, "terms": dict(p.terms),
                    "occupancy": p.occupancy, "waves": p.waves, "advice": p.advice,
                    "advice_priced": [dict(a) for a in self.priced],
                    "reused_from": self.reused_from})
        if p.residency is not None:
            out.update(registers_dict(c), **p.residency.as_dict())
        return out


def registers_dict(c: Counts) -> dict:
    return {"max_live_r": c.max_live_r, "max_live_u": c.max_live_u, "max_live": c.max_live,
            "register_pressure": c.register_pressure}


def price_advice(p: Prediction, device: Device, recount=None) -> list[dict]:
    """Each advice item of ``p`` with the node's predicted time if it is taken: a new
    threadgroup size is the same trace counted again (``recount(tg) -> Counts``; the VM's
    lanes are independent, so the trace does not depend on tg) and predicted by the same
    model; anything else says why it is not computed."""
    out = []
    for a in p.advice_items:
        if a.tg is not None and recount is not None:
            after = predict(recount(a.tg), device).predicted_us
            out.append({"text": a.text, "predicted_us_after": after, "not_computed": None})
        else:
            why = a.why_not or "not computed: the recorded trace is not at hand"
            out.append({"text": a.text, "predicted_us_after": None, "not_computed": why})
    return out


def counts_dict(c: Counts) -> dict:
    return {"lanes": c.lanes, "threadgroups": c.threadgroups, "tg": c.tg, "tgbytes": c.tgbytes,
            "warps": c.warps, "simd_width": c.simd_width,
            "lane_instructions": c.lane_instructions,
            "max_lane_instructions": c.max_lane_instructions,
            "warp_instructions": c.warp_instructions, "simd_efficiency": c.simd_efficiency,
            "flops": c.flops, "sfu_ops": c.sfu_ops, "bytes_read": c.bytes_read,
            "bytes_written": c.bytes_written, "unique_bytes": c.unique_bytes,
            "dram_bytes": c.dram_bytes, "requests": c.requests, "sectors": c.sectors,
            "sectors_per_request": c.sectors_per_request,
            "coalescing_efficiency": c.coalescing_efficiency,
            "bytes_per_sector": c.bytes_per_sector}


def line_dict(ls: LineStats, width: int, us: float = 0.0, kernel_us: float = 0.0) -> dict:
    """A source line's counters; ``us``: its part of the kernel's predicted time."""
    return {"line": ls.line, "text": ls.text, "executions": ls.executions,
            "lane_instructions": ls.lane_instructions, "warp_instructions": ls.warp_instructions,
            "active_lane_share": ls.active_lane_share, "flops": ls.flops,
            "requests": ls.requests, "sectors": ls.sectors,
            "sectors_per_request": ls.sectors_per_request,
            "coalescing_efficiency": ls.coalescing_efficiency,
            "simd_efficiency": ls.simd_efficiency(width), "predicted_us": us,
            "time_share": us / kernel_us if kernel_us else 0.0,
            "live_r": ls.live_r, "live_u": ls.live_u}


def _add_advice(k: dict, n: "NodeCost") -> None:
    """Sum a node's priced advice into its kernel's (per advice text)."""
    for a in n.priced:
        acc = k["advice"].setdefault(a["text"], {"kernel": k["kernel"], "text": a["text"],
                                                 "nodes": 0, "predicted_us": 0.0,
                                                 "predicted_us_after": 0.0,
                                                 "not_computed": None})
        acc["nodes"] += 1
        acc["predicted_us"] += n.prediction.predicted_us
        if a["not_computed"] is not None:
            acc["not_computed"] = a["not_computed"]
        if acc["not_computed"] is None:
            acc["predicted_us_after"] += a["predicted_us_after"]


def _advice_list(k: dict) -> list[dict]:
    out = []
    for a in k["advice"].values():
        done = a["not_computed"] is None
        out.append(dict(a, predicted_us_after=a["predicted_us_after"] if done else None,
                        saving_us_per_token=a["predicted_us"] - a["predicted_us_after"]
                        if done else None))
    return out


def rank_advice(items: list[dict]) -> list[dict]:
    """By the time each would save per token, the most first; those the model cannot price
    after them, the kernels that take the most time first."""
    return sorted(items, key=lambda a: (a["saving_us_per_token"] is None,
                                        -(a["saving_us_per_token"] or 0.0),
                                        -a["predicted_us"]))


_SUMMED = ("lanes", "threadgroups", "warps", "lane_instructions", "warp_instructions", "flops",
           "sfu_ops", "bytes_read", "bytes_written", "unique_bytes", "dram_bytes", "requests",
           "sectors", "ideal_sectors")


@dataclass
class CostReport:
    device: Device
    position: int
    token: int
    nodes: list[NodeCost]
    seconds: float = 0.0  # the analysis itself, on this CPU
    recorded: int = 0  # micro nodes recorded on the interpreter (the rest reused counts)
    side_by_side: int = 0  # of those, recorded side by side with others (cost/batch)
    notes: list[str] = field(default_factory=list)
    devices: dict = field(default_factory=dict)  # more devices to give each occupancy on

    @property
    def total_us(self) -> float:
        return sum(n.prediction.predicted_us for n in self.nodes)

    def node(self, full_name: str) -> NodeCost | None:
        return next((n for n in self.nodes if n.node == full_name), None)

    def by_kernel(self) -> dict[str, dict]:
        """Per kernel (or ext op): counts summed over its nodes, per-line stats, predicted
        time and the bound that most of its time has."""
        out: dict[str, dict] = {}
        for n in self.nodes:
            k = out.get(n.kernel)
            if k is None:
                k = out[n.kernel] = {"kernel": n.kernel, "kind": n.kind, "nodes": 0,
                                     "predicted_us": 0.0, "terms": {}, "by_bound": {},
                                     "lines": {}, "line_us": {}, "advice": {},
                                     "max_lane_instructions": 0, "slowest": n,
                                     "simd_width": n.counts.simd_width,
                                     **{f: 0 for f in _SUMMED}}
            c = n.counts
            k["nodes"] += 1
            k["predicted_us"] += n.prediction.predicted_us
            for t, v in n.prediction.terms.items():
                k["terms"][t] = k["terms"].get(t, 0.0) + v
            b = n.prediction.bound
            k["by_bound"][b] = k["by_bound"].get(b, 0.0) + n.prediction.predicted_us
            for f in _SUMMED:
                k[f] += getattr(c, f)
            k["max_lane_instructions"] = max(k["max_lane_instructions"], c.max_lane_instructions)
            for line, ls in c.lines.items():
                acc = k["lines"].setdefault(line, LineStats(line, ls.text))
                acc.add(ls)
            for line, us in line_times(c, n.prediction, self.device).items():
                k["line_us"][line] = k["line_us"].get(line, 0.0) + us
            if n.prediction.predicted_us > k["slowest"].prediction.predicted_us:
                k["slowest"] = n
            _add_advice(k, n)
        total = self.total_us
        for k in out.values():
            self._kernel_registers(k)
            w = k["simd_width"]
            k["bound"] = max(k["by_bound"], key=k["by_bound"].get)
            k["share"] = k["predicted_us"] / total if total else 0.0
            k["simd_efficiency"] = (k["lane_instructions"] / (k["warp_instructions"] * w)
                                    if k["warp_instructions"] else None)
            k["sectors_per_request"] = k["sectors"] / k["requests"] if k["requests"] else None
            k["coalescing_efficiency"] = (k["ideal_sectors"] / k["sectors"] if k["sectors"]
                                          else None)
            k["bytes_per_sector"] = ((k["bytes_read"] + k["bytes_written"]) / k["sectors"]
                                     if k["sectors"] else None)
            k["arithmetic_intensity"] = k["flops"] / k["dram_bytes"] if k["dram_bytes"] else None
            k["lines"] = [line_dict(ls, w, k["line_us"].get(ln, 0.0), k["predicted_us"])
                          for ln, ls in sorted(k["lines"].items())]
            del k["line_us"]
            k["advice"] = rank_advice(_advice_list(k))
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["predicted_us"]))

    def _kernel_registers(self, k: dict) -> None:
        """A micro kernel's live registers and its occupancy (and limiter) on the report's
        device and on ``devices``, from its slowest node's geometry."""
        n = k.pop("slowest")
        if n.prediction.residency is None:
            return
        k.update(registers_dict(n.counts))
        k["occupancy"] = n.prediction.residency.as_dict()
        others = self.devices or {self.device.key: self.device}
        k["occupancy_by_device"] = {key: residency(n.counts, d).as_dict()
                                    for key, d in others.items()}

    def advice(self) -> list[dict]:
        """Every kernel's advice, ranked by the time it would save per token."""
        return rank_advice([a for k in self.by_kernel().values() for a in k["advice"]])

    def by_layer(self) -> dict:
        out: dict = {}
        for n in self.nodes:
            out[n.layer] = out.get(n.layer, 0.0) + n.prediction.predicted_us
        return out

    def ranked(self) -> list[NodeCost]:
        return sorted(self.nodes, key=lambda n: -n.prediction.predicted_us)

    def as_dict(self) -> dict:
        """report.json's ``gpu`` section (and ``firscope cost --json``)."""
        kernels = self.by_kernel()
        advice = rank_advice([a for k in kernels.values() for a in k["advice"]])
        return {"device": self.device.as_dict(), "position": self.position, "token": self.token,
                "predicted_us_per_token": self.total_us,
                "tokens_per_s": 1e6 / self.total_us if self.total_us else None,
                "nodes": [n.as_dict() for n in self.nodes],
                "kernels": [{k: v for k, v in d.items() if k not in ("by_bound",)}
                            for d in kernels.values()],
                "layers": [{"layer": la, "predicted_us": us}
                           for la, us in self.by_layer().items()],
                "advice": advice,
                "analysis_seconds": self.seconds, "recorded_nodes": self.recorded,
                "recorded_side_by_side": self.side_by_side,
                "notes": list(self.notes),
                "model": "predicted, not measured: see docs/cost-model.md"}


# The most scratch memory one side-by-side recording takes (cost/batch: each node's regions,
# attention's K/V caches included: GPT-2 small 6.3 MB a layer); more nodes are recorded in
# several.
SIDE_BY_SIDE_BYTES = 256 << 20


def analyse_step(model, device: Device, *, arena: np.ndarray | None = None, position: int,
                 token: int, budget: int | None = DEFAULT_BUDGET, runner=None,
                 stop=None, dedup: bool = True) -> CostReport:
    """Run one decode step (``token`` at ``position``) on ``arena`` and cost every node.
    ``arena`` (default: the model's) must hold positions 0..position-1's KV cache."""
    t0 = time.perf_counter()
    arena = model.arena if arena is None else arena
    arena[model.inputs["token"].base] = token
    arena[model.inputs["position"].base] = position
    width = device.simd_width
    seen: dict[tuple, tuple[Counts, str, list]] = {}
    keys, sides = _side_by_side(model) if dedup else ({}, {})
    waiting: dict[tuple, list[Copies]] = {}  # side-by-side nodes' regions as they were
    nodes, recorded = [], 0
    for node in model.nodes:
        reused, priced, c = None, None, None
        if node.kind == NodeKind.EXT:
            with np.errstate(all="ignore"):
                EXT_IMPLS[node.target](arena, node)
            c = ext_counts(node, width)
        else:
            key = keys.get(node.index)
            if key in sides:  # recorded with the others after the step (cost/batch)
                groups = waiting.setdefault(key, [])
                if not groups or groups[-1].full:
                    left = sides[key] - sum(g.n for g in groups)
                    groups.append(Copies(node.program, left, SIDE_BY_SIDE_BYTES))
                groups[-1].keep(node, arena)
                _run_unobserved(node, arena, budget, stop, runner)
            elif key is not None and key in seen:
                c, reused, priced = seen[key]
                _run_unobserved(node, arena, budget, stop, runner)
            else:
                trace, _ = record(node.program, arena, budget, stop)
                tg, tgbytes = kernel_shape(model, node.program)
                c = count(node.program, trace, tg, tgbytes, width)
                priced = _priced(node.program, trace, c, tgbytes, device)
                recorded += 1
                if key is not None:
                    seen[key] = (c, node.full_name, priced)
        nodes.append((node, c, reused, priced))
    counted, side_by_side = {}, 0
    for copies in (c for groups in waiting.values() for c in groups):
        got, wide = _record_side_by_side(model, copies, budget, stop, device)
        counted.update(got)
        recorded += copies.n
        side_by_side += copies.n if wide and copies.n > 1 else 0
    out = []
    for node, c, reused, priced in nodes:
        if c is None:
            c, priced = counted[node.index]
        p = predict(c, device, library=node.kind == NodeKind.EXT, op=node.target)
        out.append(NodeCost(node.index, node.full_name, node.name, node.layer, str(node.kind),
                            node.target, c, p, reused,
                            priced if priced is not None else price_advice(p, device)))
    return CostReport(device, position, int(token), out, time.perf_counter() - t0, recorded,
                      side_by_side)


def _side_by_side(model) -> tuple[dict[int, tuple], dict[tuple, int]]:
    """Each micro node's identity key (record.identity_key), and how many nodes run each
    data-dependent program alike where two or more do: those are recorded side by side
    (cost/batch). A data-independent node's key lets a later one reuse its counts."""
    keys: dict[int, tuple] = {}
    dependent: dict[tuple, int] = {}
    independent: dict[int, bool] = {}  # by kernel: the taint reads registers, not buffers
    for node in model.nodes:
        if node.kind == NodeKind.EXT:
            continue
        tg, tgbytes = kernel_shape(model, node.program)
        key = identity_key(node.program, tg, tgbytes)
        kernel = id(node.program.kernel)
        if kernel not in independent:
            independent[kernel] = data_independent(node.program)
        if independent[kernel]:
            keys[node.index] = key
        else:
            sizes = tuple(r.size for r in program_regions(node.program))  # cost/batch's slots
            keys[node.index] = key = ("side by side", sizes) + key
            dependent[key] = dependent.get(key, 0) + 1
    return keys, {k: n for k, n in dependent.items() if n > 1}


def _run_unobserved(node, arena: np.ndarray, budget, stop, runner) -> None:
    if runner is not None:
        runner.run(node, arena, budget, stop=stop)
    else:
        Dispatch(node.program, arena).run(budget, stop)


def _record_side_by_side(model, copies: Copies, budget, stop,
                         device: Device) -> tuple[dict, bool]:
    """Node index -> (counts, priced advice) of nodes running one data-dependent program,
    from one wide recording of them all (cost/batch), or one by one on their regions where
    they cannot run as one (a fault: the single recording reports it); and which it was."""
    tg, tgbytes = kernel_shape(model, copies.program)
    try:
        traces, wide = copies.record(budget, stop), True
    except Unbatched:
        traces = [record(node.program, copies.arena_of(k, model.arena), budget, stop)[0]
                  for k, node in enumerate(copies.nodes)]
        wide = False
    out = {}
    for node, trace in zip(copies.nodes, traces):
        c = count(node.program, trace, tg, tgbytes, device.simd_width)
        out[node.index] = (c, _priced(node.program, trace, c, tgbytes, device))
    return out, wide


def _priced(program, trace, c: Counts, tgbytes: int, device: Device) -> list[dict]:
    """A recorded node's advice priced on its own trace."""
    def recount(tg: int) -> Counts:
        return count(program, trace, tg, tgbytes, device.simd_width)
    return price_advice(predict(c, device), device, recount)


def tokens_to(ids: list[int], at: int, machine: Machine) -> list[int]:
    """``ids`` cut or extended (greedily, from the model's own logits) to ``at + 1`` tokens;
    runs positions 0..at-1 on ``machine`` (reset first)."""
    machine.reset()
    toks = list(ids)
    for p in range(at):
        if p + 1 < len(toks):  # the next token is given: only the KV cache is wanted
            machine.feed(toks[p])
            continue
        res = machine.step(toks[p])
        toks.append(int(np.argmax(res.logits)))
    return toks[: at + 1]


def analyse_position(model, device: Device, ids: list[int], at: int | None = None, *,
                     engine: str = "compiled", dedup: bool = True) -> CostReport:
    """Feed ``ids`` up to position ``at`` (default: the last prompt token's) and cost that
    step. The model's buffers hold that step's results afterwards."""
    if not ids:
        raise FirError("no tokens: give a prompt or --tokens")
    at = len(ids) - 1 if at is None else at
    limit = model.n_positions
    if at < 0 or (limit is not None and at >= limit):
        top = f"0..{limit - 1}" if limit is not None else "0 or more"
        raise FirError(f"--at {at}: the position must be in {top} (n_positions {limit})")
    try:
        machine = Machine(model, engine=engine)
    except ImportError:
        machine = Machine(model, engine="interp")
    toks = tokens_to(ids, at, machine)
    runner = machine.kernel_runner or None
    report = analyse_step(model, device, position=at, token=toks[at], runner=runner,
                          dedup=dedup)
    if at >= len(ids):
        report.notes.append(f"positions {len(ids)}..{at} were fed the model's greedy tokens")
    return report


def analyse_node(model, node, device: Device, arena: np.ndarray, *,
                 budget: int | None = DEFAULT_BUDGET) -> NodeCost:
    """One node costed from a run on a copy of ``arena`` as it is now (a debugger's stop:
    the node's inputs are there); ``arena`` itself is not changed. Only the regions the
    kernel can touch are copied, at their own addresses (the sectors a warp fetches depend
    on them), into an arena of zeros the system gives page by page as written: on GPT-2
    small a whole copy took most of the time of costing one node."""
    if node.kind == NodeKind.EXT:
        c = ext_counts(node, device.simd_width)
    else:
        work = np.zeros_like(arena)
        for r in program_regions(node.program):
            work[r.base: r.stop] = arena[r.base: r.stop]
        tg, tgbytes = kernel_shape(model, node.program)
        trace, _ = record(node.program, work, budget)
        c = count(node.program, trace, tg, tgbytes, device.simd_width)
    p = predict(c, device, library=node.kind == NodeKind.EXT, op=node.target)
    priced = _priced(node.program, trace, c, tgbytes, device) \
        if node.kind != NodeKind.EXT else price_advice(p, device)
    return NodeCost(node.index, node.full_name, node.name, node.layer, str(node.kind),
                    node.target, c, p, priced=priced)


def current_step(machine) -> tuple[int, int] | None:
    """(position, token) of the step a debugger is in, or of the last one it finished;
    None before any token."""
    if machine.current_token is not None:
        return machine.position, int(machine.current_token)
    if machine.history:
        return machine.position - 1, int(machine.history[-1])
    return None


def analyse_current(model, machine, device: Device, *, stop=None) -> CostReport | None:
    """The step ``machine`` is in (or last finished), costed on a copy of its arena: the
    KV cache of earlier positions is there, and running the step again on the copy
    rewrites this position's entries with the same values. The machine is untouched."""
    at = current_step(machine)
    if at is None:
        return None
    position, token = at
    return analyse_step(model, device, arena=machine.arena.copy(), position=position,
                        token=token, runner=None, stop=stop)
