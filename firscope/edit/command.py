"""``firscope replay`` and ``firscope cost --baseline``: text and JSON."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import FirError
from ..text import json_text, printable
from .replay import NodeAB, ReplayReport, load_edit, replay

COST_FIELDS = ("predicted_us", "bound", "simd_efficiency", "sectors_per_request",
               "lane_instructions", "bytes_read")


@dataclass(frozen=True)
class ReplayOptions:
    source: object  # runtime.opening.RunInput (model, prompt or tokens)
    kernel: str
    node: str | None = None
    n: int = 0
    device: str | None = None
    chained: bool = False
    as_json: bool = False
    engine: str = "compiled"
    budget: int | None = None


def run_replay(opts: ReplayOptions) -> int:
    from ..cost import find_device
    from ..runtime.machine import DEFAULT_BUDGET
    dev = find_device(opts.device)  # a typo fails before anything runs
    opened = opts.source.open()
    edit = load_edit(opened.model, opts.kernel)
    budget = opts.budget if opts.budget is not None else DEFAULT_BUDGET
    report = replay(edit, list(opened.ids), opts.n, node=opts.node, engine=opts.engine,
                    budget=budget, chained=opts.chained)
    add_cost(report, dev, list(opened.ids), opts.engine)
    if opts.as_json:
        print(json_text(json.dumps(report_dict(report), indent=1, allow_nan=False,
                                   default=_plain)))
    else:
        print("\n".join(report_lines(report)))
    return 0 if report.identical else 1


def _plain(v):
    if hasattr(v, "item"):
        return v.item()
    raise TypeError(type(v).__name__)


def add_cost(report: ReplayReport, device, prompt: list[int], engine: str) -> None:
    """The predicted GPU cost of each replayed node before and after the edit, at the prompt's
    last position (what ``firscope cost MODEL --tokens PROMPT`` predicts for each file)."""
    from ..cost.analyze import analyse_position
    edit = report.edit
    before = analyse_position(edit.original.with_own_arena(), device, prompt, engine=engine)
    report.device = device.name
    report.cost_position = before.position
    from ..runtime.machine import DEFAULT_BUDGET
    from ..vm.runaway import runaway_stop
    for n in edit.edited.nodes:  # a certain runaway is not run for its cost
        if n.target in edit.kernels and runaway_stop(n.program, DEFAULT_BUDGET) is not None:
            report.cost_note = (f"no cost after: kernel {n.target} runs past the instruction "
                                f"budget at {n.full_name}")
            return
    try:
        after = analyse_position(edit.edited.with_own_arena(), device, prompt, engine="interp")
    except FirError as e:  # the edit faults when the whole step runs with it
        report.cost_note = f"no cost after: the edited model faults: {str(e).splitlines()[0]}"
        return
    a = {n.node: n.as_dict() for n in before.nodes}
    b = {n.node: n.as_dict() for n in after.nodes}
    for node in report.nodes:
        if node.instance in a and node.instance in b:
            node.cost = {"before": {k: a[node.instance][k] for k in COST_FIELDS},
                         "after": {k: b[node.instance][k] for k in COST_FIELDS}}


def report_dict(r: ReplayReport) -> dict:
    return {"kernel_file": str(r.edit.path), "kernels": list(r.edit.kernels),
            "model": str(r.edit.original.path), "tokens": list(r.tokens),
            "identical": r.identical, "device": r.device, "cost_position": r.cost_position,
            "cost_note": r.cost_note,
            "nodes": [{"node": n.instance, "kernel": n.kernel, "identical": n.identical,
                       "cost": n.cost,
                       "steps": [{"step": s.step, "identical": s.identical, "faults": s.faults,
                                  "outputs": [o.as_dict() for o in s.outputs]}
                                 for s in n.steps]} for n in r.nodes],
            "chained": r.chained}


def report_lines(r: ReplayReport) -> list[str]:
    e = r.edit
    out = [f"replay of {printable(e.path)} ({', '.join(map(printable, e.kernels))}) on "
           f"{printable(e.original.path)}: {len(r.nodes)} node(s), {len(r.tokens)} step(s), each "
           "node on the original's inputs"]
    for n in r.nodes:
        out += node_lines(n, e.path)
    if r.cost_note:
        out.append(printable(r.cost_note))
    elif r.device is not None:
        out.append(f"predicted GPU cost on {printable(r.device)} at position {r.cost_position} "
                   "(firscope cost's figures for each file), before -> after:")
        out += cost_lines(r.nodes)
    if r.chained is not None:
        c = r.chained
        if c.get("fault"):
            out.append(f"chained: the whole decode with the edit faulted at step {c['steps']}: "
                       f"{printable(c['fault'])}")
        elif c["identical"]:
            out.append(f"chained: the whole decode with the edit gives the same logits bit for "
                       f"bit over {c['steps']} steps")
        else:
            mx = "n/a" if c["max_abs"] is None else f"{c['max_abs']:.3g}"
            kl = "n/a" if c["kld_mean"] is None else f"{c['kld_mean']:.3g}"
            out.append(f"chained: the whole decode with the edit: logits max |Δ| {mx}, same "
                       f"top-1 {100 * c['same_top']:.1f}%, mean KLD(original ‖ edit) {kl} over "
                       f"{c['steps']} steps")
    out.append("identical: every output bit for bit, no fault" if r.identical else
               "DIFFERENT: see above")
    return out


def node_lines(n: NodeAB, path: Path | str) -> list[str]:
    first = n.first_difference()
    if first is None:
        return [f"  {printable(n.instance)} ({printable(n.kernel)}): identical at all "
                f"{len(n.steps)} step(s)"]
    step, o = first
    bad = sum(1 for s in n.steps if not s.identical)
    out = [f"  {printable(n.instance)} ({printable(n.kernel)}): DIFFERS at {bad} of "
           f"{len(n.steps)} step(s); first at step {step.step}"]
    for f in step.faults:
        out.append(f"    fault: {printable(f)}")
    for o in step.outputs:
        if o.identical:
            out.append(f"    {printable(o.buffer)}: identical")
            continue
        where = ""
        if o.line is not None:
            where = f", stored by lane {o.lane} at {printable(path)}:{o.line}"
        out.append(f"    {printable(o.buffer)}: {o.differing} of {o.elements} element(s) differ; "
                   f"max |Δ| {o.max_abs:.3g}, max {o.max_ulp} ULP, relative L2 {o.rel_l2:.3g}; "
                   f"first {printable(o.buffer)}[{o.first}] = {o.b!r} (original {o.a!r}){where}")
    return out


MAX_COST_ROWS = 8  # node rows in text; the JSON has every node


def cost_lines(nodes: list[NodeAB]) -> list[str]:
    rows = [("node", "us before", "us after", "ratio", "bound", "SIMD eff", "sect/req")]
    costed = [n for n in nodes if n.cost is not None]
    by_kernel: dict[str, list[float]] = {}
    for n in costed:
        acc = by_kernel.setdefault(n.kernel, [0.0, 0.0, 0])
        acc[0] += n.cost["before"]["predicted_us"]
        acc[1] += n.cost["after"]["predicted_us"]
        acc[2] += 1
    for kernel, (a, b, count) in by_kernel.items():
        rows.append((f"{printable(kernel)} ({count} nodes)", f"{a:.2f}", f"{b:.2f}",
                     f"{b / a:.2f}x" if a else "n/a", "", "", ""))
    for n in costed[:MAX_COST_ROWS]:
        a, b = n.cost["before"], n.cost["after"]
        ratio = b["predicted_us"] / a["predicted_us"] if a["predicted_us"] else float("nan")
        rows.append((printable(n.instance), f"{a['predicted_us']:.2f}",
                     f"{b['predicted_us']:.2f}", f"{ratio:.2f}x",
                     f"{a['bound']} -> {b['bound']}",
                     f"{a['simd_efficiency']:.0%} -> {b['simd_efficiency']:.0%}",
                     f"{a['sectors_per_request']:.1f} -> {b['sectors_per_request']:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                            for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    if len(costed) > MAX_COST_ROWS:
        out.append(f"  ... {len(costed) - MAX_COST_ROWS} more node(s) in --json")
    return out
