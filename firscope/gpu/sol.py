"""The GPU's measured time beside the speed-of-light prediction (firscope/cost), per node
instance and per kernel, with measured / predicted: what ``profile --engine gpu`` and
benchmarks/gpu.py print.

The two sides are the same work: the prediction costs the step at one position
(the last one fed), and the measurement re-runs that very step on the GPU a few
times (:func:`retime_last_step`; each run rewrites this position's KV-cache row
with the same values) and takes each dispatch's median.

Which device the prediction is for (:func:`choose_device`): ``--device NAME``;
else the profile whose name the adapter's own name matches (an H200 measured
against the H200 profile); else the configured default (devices.toml's
``default``, else h200). The report always names both the adapter measured and
the device predicted for, and says when they are different chips (the ratio
then compares two chips, not a kernel with its own limit) or when the adapter
is a software one (lavapipe: the CPU; its times say little about any GPU).
"""
from __future__ import annotations

import re
import statistics

from ..cost import CostReport, Device, analyse_position, find_device, load_devices
from ..cost.render import text_table
from ..text import printable

REPEATS = 5  # re-runs of the predicted step; each dispatch's median is the measurement
PREDICTED_NOTE = "firscope/cost's model (docs/cost-model.md): a prediction, not a measurement"


def _squeezed(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def matching_device(adapter_name: str, devices: dict[str, Device]) -> Device | None:
    """The profile an adapter's name names: its key (``h200`` in "NVIDIA H200") or its name
    before any parenthesis, ignoring case, spaces and punctuation; the longest match wins.
    Names shorter than 4 characters never match (too easily part of another name)."""
    have = _squeezed(adapter_name)
    best, best_len = None, 0
    for d in devices.values():
        for cand in (_squeezed(d.key), _squeezed(d.name.split("(")[0])):
            if len(cand) >= 4 and cand in have and len(cand) > best_len:
                best, best_len = d, len(cand)
    return best


def choose_device(name: str | None, adapter_name: str) -> tuple[Device, str]:
    """(device profile, why it was chosen): see the module docstring for the order."""
    devices = load_devices()
    if name is not None:
        return find_device(name, devices), "--device"
    match = matching_device(adapter_name, devices)
    if match is not None:
        return match, "the adapter's own profile, by name"
    return find_device(None, devices), "the default (devices.toml's default, else h200)"


def retime_last_step(machine, repeats: int = REPEATS) -> list[float]:
    """Run the step ``machine`` (a GpuMachine) finished last ``repeats`` more times at the
    same position, every dispatch timed; each node's median seconds, in plan order."""
    if not machine.history:
        raise ValueError("no step has run: nothing to time again")
    token, position = int(machine.history[-1]), machine.position - 1
    nodes = range(len(machine.model.nodes))
    runs = []
    for _ in range(max(repeats, 1)):
        machine.begin_token(token, position=position)
        runs.append(machine.runner.timed(nodes))
        machine.finish_token()
    return [statistics.median(column) for column in zip(*runs)]


def predict_step(model, device: Device, fed: list[int], *,
                 engine: str = "compiled") -> CostReport:
    """The speed-of-light analysis of the step at the last position of ``fed`` (the model's
    buffers are put back afterwards: the GPU engine's host mirror is left as it was)."""
    saved = [(r.base, model.arena[r.base: r.base + r.size].copy())
             for r in model.buffer_regions()]
    try:
        return analyse_position(model, device, list(fed), len(fed) - 1, engine=engine)
    finally:
        for base, data in saved:
            model.arena[base: base + data.size] = data


def _ratio(measured: float, predicted: float) -> float | None:
    return measured / predicted if predicted > 0 else None


def beside(measured_s: list[float], report: CostReport, gpu, device: Device, chosen_by: str,
           *, repeats: int = REPEATS) -> dict:
    """The comparison as data (gpu-profile.json's ``speed_of_light``): per node instance and
    per kernel the measured and predicted microseconds, the bound and measured/predicted."""
    nodes = []
    for cost, s in zip(report.nodes, measured_s):
        us = 1e6 * s
        p = cost.prediction
        nodes.append({"index": cost.index, "node": cost.node, "kernel": cost.kernel,
                      "kind": cost.kind, "measured_us": us, "predicted_us": p.predicted_us,
                      "bound": p.bound, "ratio": _ratio(us, p.predicted_us),
                      "terms": dict(p.terms)})
    measured_total = sum(n["measured_us"] for n in nodes)
    within = [n for n in nodes if within_2x(n["ratio"])]
    kernels = []
    for name, k in report.by_kernel().items():
        mine = [n for n in nodes if n["kernel"] == name]
        us = sum(n["measured_us"] for n in mine)
        kernels.append({"kernel": name, "kind": k["kind"], "nodes": len(mine),
                        "measured_us": us, "predicted_us": k["predicted_us"],
                        "bound": k["bound"], "ratio": _ratio(us, k["predicted_us"]),
                        "measured_share": us / measured_total if measured_total else 0.0,
                        "predicted_share": k["share"]})
    kernels.sort(key=lambda k: -k["measured_us"])
    same = matching_device(gpu.name, {device.key: device}) is device
    return {"measured_on": gpu.name, "backend": gpu.backend, "software_adapter": gpu.is_software,
            "timing": "timestamp queries" if gpu.timestamps else "queue completion per dispatch",
            "predicted_for": device.key, "device": device.as_dict(), "chosen_by": chosen_by,
            "same_chip": same, "position": report.position, "token": report.token,
            "repeats": repeats, "measured_us_per_token": measured_total,
            "predicted_us_per_token": report.total_us,
            "ratio": _ratio(measured_total, report.total_us),
            "within_2x_share": (sum(n["measured_us"] for n in within) / measured_total
                                if measured_total else None),
            "within_2x_nodes": len(within), "device_key": device.key,
            "device_origin": device.origin,
            "nodes": nodes, "kernels": kernels, "prediction": PREDICTED_NOTE}


def within_2x(ratio: float | None) -> bool:
    """measured/predicted within a factor of two either way."""
    return ratio is not None and 0.5 <= ratio <= 2.0


def caveats(sol: dict) -> list[str]:
    """What the ratios mean here, in words: the same chip, another chip, a software adapter,
    times that include each submission's overhead."""
    dev = sol["device"]
    out = [f"  measured on:   {printable(sol['measured_on'])} ({sol['backend']})",
           f"  predicted for: {printable(dev['name'])} [{dev['key']}, {sol['chosen_by']}]"]
    if sol["software_adapter"] and sol["same_chip"]:
        out += ["  a software adapter (the CPU runs the shaders) with its own profile",
                "  (`firscope gpu --calibrate`): measured/predicted tests the cost model on",
                "  this adapter; its times say little about any GPU"]
    elif sol["software_adapter"]:
        out += ["  a software adapter (the CPU runs the shaders): its times say little about",
                "  any GPU, so measured/predicted means little here (`firscope gpu",
                "  --calibrate` measures it into a profile of its own)"]
    elif sol["same_chip"]:
        out += ["  the adapter is the device predicted for (by name; check the variant):",
                "  measured/predicted is how far each dispatch is from the model's limit"]
    else:
        out += ["  a different chip from the one measured: measured/predicted compares two",
                "  chips, not a kernel with its own limit"]
    if not sol["timing"].startswith("timestamp"):
        out.append("  no timestamp queries: each measured time includes its submission's "
                   "host overhead")
    out += [f"  measured:  each dispatch's median of {sol['repeats']} runs of the step at "
            f"position {sol['position']} (token {sol['token']})",
            f"  predicted: the same step, by {PREDICTED_NOTE}"]
    return out


def _row(name: str, d: dict, *extra: str) -> list[str]:
    ratio = "-" if d["ratio"] is None else f"{d['ratio']:.2f}"
    return [printable(name), *extra, f"{d['measured_us']:.2f}", f"{d['predicted_us']:.2f}",
            d["bound"], ratio]


def render_beside(sol: dict, *, top: int | None = None) -> list[str]:
    """The comparison as text: caveats, totals, per kernel, and the nodes ranked by
    measured time (``top`` of them, or all)."""
    ratio = "-" if sol["ratio"] is None else f"{sol['ratio']:.2f}"
    out = ["speed of light beside the measurement"] + caveats(sol)
    out.append(f"  per token at that position: {sol['measured_us_per_token']:.1f} us measured, "
               f"{sol['predicted_us_per_token']:.1f} us predicted, measured/predicted {ratio}")
    if sol.get("within_2x_share") is not None:
        out.append(f"  the prediction is within 2x for {sol['within_2x_share']:.0%} of the "
                   f"step's measured time ({sol['within_2x_nodes']} of {len(sol['nodes'])} "
                   "node instances)")
    out += ["", "per kernel"] + text_table(
        ["kernel / op", "nodes", "measured us", "predicted us", "bound", "measured/predicted"],
        [_row(k["kernel"], k, str(k["nodes"])) for k in sol["kernels"]])
    ranked = sorted(sol["nodes"], key=lambda n: -n["measured_us"])
    shown = ranked if top is None else ranked[:top]
    out += ["", "per node instance, ranked by measured time"] + text_table(
        ["node", "kernel", "measured us", "predicted us", "bound", "measured/predicted"],
        [_row(n["node"], n, printable(n["kernel"])) for n in shown], left=2)
    if len(shown) < len(ranked):
        out.append(f"  ... {len(ranked) - len(shown)} more in gpu-profile.txt and .json")
    return out
