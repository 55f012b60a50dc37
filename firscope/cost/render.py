"""``firscope cost``: the analysis as text tables (or JSON), and the command itself."""
from __future__ import annotations

import json
import sys

from ..text import printable
from .analyze import CostReport, NodeCost
from .devices import device_table, find_device, load_devices
from ..runtime import NodeKind


def _pct(v) -> str:
    return "-" if v is None else f"{v:.0%}" if v >= 0.01 or v == 0 else f"{v:.1%}"


def _f(v, fmt=".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _bytes(n: int) -> str:
    for unit, div in (("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def text_table(header: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    """Aligned columns under a header and a rule: the first ``left`` columns flush left, the
    rest (numbers) flush right."""
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

    def line(r):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def node_rows(nodes: list[NodeCost], total: float) -> list[list[str]]:
    rows = []
    for n in nodes:
        c, p = n.counts, n.prediction
        t = p.terms
        rows.append([printable(n.node), printable(n.kernel), f"{p.predicted_us:.2f}",
                     _pct(p.predicted_us / total if total else 0), p.bound,
                     f"{t['memory']:.2f}", f"{t['compute']:.2f}", f"{t['latency']:.2f}",
                     f"{t['launch']:.2f}", str(c.lanes), str(c.warps),
                     _pct(c.simd_efficiency) if n.kind == NodeKind.MICRO else "-",
                     _f(c.sectors_per_request, ".1f"),
                     _pct(c.coalescing_efficiency), _f(c.bytes_per_sector, ".0f"),
                     _bytes(c.dram_bytes)])
    return rows


# "coalesced" is per warp (a warp of one lane is coalesced by itself); "B/sector" is what
# the lanes use of each 32-byte sector fetched, whatever the warp
NODE_HEADER = ["node", "kernel", "pred us", "share", "bound", "mem us", "alu us", "lat us",
               "launch", "lanes", "warps", "SIMD eff", "sect/req", "coalesced", "B/sector",
               "DRAM"]


def render(report: CostReport, *, limit: int | None = None) -> str:
    d = report.device
    total = report.total_us
    out = [f"speed of light on {printable(d.name)} (predicted, not measured): decode step at "
           f"position {report.position}, token {report.token}",
           f"  SIMD width {d.simd_width}, {d.compute_units} compute units, "
           f"{d.dram_bandwidth_gbs:g} GB/s, {d.f32_tflops:g} TFLOP/s f32, launch "
           f"{d.launch_overhead_us:g} us; model: max(memory, compute, latency) + launch "
           "(docs/cost-model.md)", ""]
    out.append(f"per token: {total:.1f} us predicted ({1e6 / total if total else 0:.0f} "
               f"tokens/s), {len(report.nodes)} nodes")
    out.append("")
    kernels = report.by_kernel()
    rows = [[printable(k), str(v["nodes"]), f"{v['predicted_us']:.1f}", _pct(v["share"]),
             v["bound"], _pct(v["simd_efficiency"]) if v["kind"] == NodeKind.MICRO else "-",
             _f(v["sectors_per_request"], ".1f"), _pct(v["coalescing_efficiency"]),
             _f(v["bytes_per_sector"], ".0f"), _f(v["arithmetic_intensity"], ".2f"),
             *_occupancy_cells(v)]
            for k, v in kernels.items()]
    out += ["per kernel"] + text_table(["kernel", "nodes", "pred us", "share", "bound",
                                        "SIMD eff", "sect/req", "coalesced", "B/sector",
                                        "flop/B", "live R/U", "regs", "occupancy",
                                        "limiter"], rows)
    out.append("coalesced: sectors a warp needs at least over those it fetched, per warp "
               "(a warp of one lane is coalesced by itself); B/sector: bytes the lanes use "
               "of each 32-byte sector fetched; live R/U: the most registers live at one "
               "instruction; regs: allocated per lane; occupancy: resident lanes per compute "
               "unit over its most, and what limits it")
    out.append("")
    layers = sorted(report.by_layer().items(), key=lambda kv: -1 if kv[0] is None else kv[0])
    out += ["per layer"] + text_table(["layer", "pred us"],
                                      [["-" if la is None else str(la), f"{us:.1f}"]
                                       for la, us in layers])
    out.append("")
    ranked = report.ranked()
    shown = ranked if limit is None else ranked[:limit]
    out += ["per node, ranked by predicted time"] + text_table(NODE_HEADER,
                                                               node_rows(shown, total), left=2)
    if len(shown) < len(ranked):
        out.append(f"  ... {len(ranked) - len(shown)} more (--top 0 shows every node)")
    out.append("")
    out += advice_lines(report.advice())
    for note in report.notes:
        out.append(f"note: {printable(note)}")
    wide = (f" ({report.side_by_side} of them side by side, one pass per kernel)"
            if report.side_by_side else "")
    out.append(f"[analysed in {report.seconds:.2f} s on this CPU: {report.recorded} nodes "
               f"recorded on the interpreter{wide}, the rest reused identical traces]")
    return "\n".join(out)


def _occupancy_cells(k: dict) -> list[str]:
    occ = k.get("occupancy")
    if occ is None:
        return ["-", "-", "-", "-"]
    return [f"{k['max_live_r']}/{k['max_live_u']}",
            f"{occ['registers_per_lane']}{' spills' if occ['spills'] else ''}",
            _pct(occ["theoretical_occupancy"]), occ["limiter"]]


def advice_text(a: dict) -> str:
    """One advice line's price: before -> after per token and the saving, or why not."""
    if a["not_computed"] is not None:
        return printable(a["not_computed"])
    saving = a["saving_us_per_token"]
    verb = "saves" if saving >= 0 else "costs"
    return (f"{a['predicted_us']:.2f} -> {a['predicted_us_after']:.2f} us per token "
            f"({a['nodes']} node{'s' if a['nodes'] != 1 else ''}): {verb} "
            f"{abs(saving):.2f} us")


def advice_lines(advice: list[dict]) -> list[str]:
    out = ["advice, ranked by the time it saves per token (predicted by the same model on "
           "the changed geometry; not computed where the model cannot cost the change)"]
    for a in advice:
        out.append(f"  {printable(a['kernel'])}: {printable(a['text'])}")
        out.append(f"      {advice_text(a)}")
    return out


def run_cost(opened_input, *, device: str | None, at: int | None, as_json: bool,
             top: int | None, engine: str = "compiled", baseline: str | None = None) -> int:
    """The ``firscope cost`` command; ``device == 'list'`` lists the profiles."""
    devices = load_devices()
    if device == "list":
        if as_json:
            from .devices import devices_json
            print(json.dumps(devices_json(devices), indent=1, allow_nan=False))
        else:
            print(device_table(devices))
        return 0
    dev = find_device(device, devices)  # before the model loads: a typo fails at once
    opened = opened_input.open()
    from .analyze import analyse_position
    report = analyse_position(opened.model, dev, list(opened.ids), at, engine=engine)
    report.devices = devices
    if baseline is not None:
        from .baseline import baseline_doc, compare
        from .baseline import render as render_baseline
        before = baseline_doc(baseline, opened_input, dev, at, engine, list(opened.ids))
        cmp = compare(before, report.as_dict())
        if as_json:
            json.dump({"device": dev.as_dict(), "position": report.position,
                       "baseline": str(baseline), **cmp}, sys.stdout, indent=1,
                      default=_jsonable, allow_nan=False)
            print()
        else:
            print(render_baseline(cmp, dev.name, report.position, top))
        return 0
    if as_json:
        # strict JSON: a figure that is not finite is a bug to report, not "Infinity"
        json.dump(report.as_dict(), sys.stdout, indent=1, default=_jsonable, allow_nan=False)
        print()
    else:
        print(render(report, limit=top or None))
    return 0


def residency_text(c, r) -> str:
    """``info cost``'s registers and occupancy line (Nsight's occupancy section)."""
    limits = ", ".join(f"{k} {'-' if v is None else v}" for k, v in r.limits.items())
    return (f"  registers: live at most R {c.max_live_r}, U {c.max_live_u} (with loop "
            f"counters {c.register_pressure}) -> {r.registers} per lane"
            f"{' (spills)' if r.spills else ''}; occupancy {r.occupancy:.0%}, limited by "
            f"{r.limiter} (threadgroups per unit: {limits})")


def _jsonable(v):
    if hasattr(v, "item"):
        return v.item()
    raise TypeError(type(v).__name__)


def node_text(n: NodeCost, device, *, where: str = "") -> str:
    """``info cost``: one node's counts, the model's terms, its bound and the advice."""
    c, p = n.counts, n.prediction
    t = p.terms
    out = [f"node {printable(n.node)} ({n.kind} {printable(n.kernel)}) on "
           f"{printable(device.name)}: {p.predicted_us:.2f} us predicted, {p.bound}-bound"
           + (f" {where}" if where else ""),
           f"  terms (us): memory {t['memory']:.3f}  compute {t['compute']:.3f}  latency "
           f"{t['latency']:.3f}  launch {t['launch']:.2f}  (max of the first three + launch)"]
    if n.kind == NodeKind.MICRO:
        out.append(f"  geometry: {c.lanes} lanes, tg {c.tg} -> {c.threadgroups} threadgroups, "
                   f"{c.warps} warps of {c.simd_width}, tgbytes {c.tgbytes}, "
                   f"{p.waves} wave(s), occupancy {p.occupancy:.2%}")
        out.append(f"  work: {c.lane_instructions} lane-instructions, longest lane "
                   f"{c.max_lane_instructions}, SIMD efficiency {_pct(c.simd_efficiency)}, "
                   f"{c.flops} flops ({c.sfu_ops} on SFUs)")
        out.append(residency_text(c, p.residency))
    else:
        out.append(f"  work: {c.flops} flops (from the op's definition)")
    out.append(f"  memory: read {_bytes(c.bytes_read)}, written {_bytes(c.bytes_written)}, "
               f"unique {_bytes(c.unique_bytes)}, DRAM (sectors) {_bytes(c.dram_bytes)}"
               + (f", {c.sectors_per_request:.2f} sectors/request, coalescing "
                  f"{_pct(c.coalescing_efficiency)} (per warp of {min(c.tg, c.simd_width)} "
                  f"lane{'s' if min(c.tg, c.simd_width) > 1 else ''}), "
                  f"{c.bytes_per_sector:.0f} of 32 bytes used per sector"
                  if c.requests else ""))
    worst = sorted((ls for ls in c.lines.values() if ls.sectors),
                   key=lambda ls: ls.coalescing_efficiency or 1)[:3]
    for ls in worst:
        if (ls.coalescing_efficiency or 1) < 1:
            out.append(f"  line {ls.line}: {ls.sectors_per_request:.1f} sectors/request "
                       f"({_pct(ls.coalescing_efficiency)} coalesced): {printable(ls.text)}")
    out.append(f"  advice: {printable(p.advice)}")
    for a in n.priced:
        price = printable(a["not_computed"]) if a["not_computed"] is not None else \
            f"{p.predicted_us:.2f} -> {a['predicted_us_after']:.2f} us"
        out.append(f"    {printable(a['text'])}: {price}")
    out.append("  (a prediction from the recorded execution, not a measurement; "
               "docs/cost-model.md)")
    return "\n".join(out)
