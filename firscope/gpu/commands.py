"""The GPU engine's commands behind cli.py: ``firscope gpu``, ``firscope wgsl`` and
``firscope profile --engine gpu``."""
from __future__ import annotations

import json
import sys
import time
from collections import defaultdict

import numpy as np

from ..errors import FirError
from ..runtime import Model
from ..runtime.opening import RunInput, check_output_folder, check_steps, write_into_folder
from ..text import printable
from ..vm import wgsl
from .device import open_device
from ..engines import make_machine
from .engine import GPU_ENGINE
from .shaders import SHADERS, default_text
from .sol import REPEATS, beside, choose_device, predict_step, render_beside, retime_last_step
from ..runtime import NodeKind

SHOWN_NODES = 12  # node instances printed on the terminal (the files have all)

def gpu_info(out=None) -> int:
    """``firscope gpu``: the adapter wgpu finds, its backend, driver and limits."""
    out = out or sys.stdout
    gpu = open_device()
    print(gpu.describe(), file=out)
    return 0


def _kernel_programs(model: Model) -> dict:
    """The first node of each kernel, by kernel name (what a shader is made from)."""
    first: dict = {}
    for n in model.nodes:
        if n.kind == NodeKind.MICRO:
            first.setdefault(n.target, n)
    return first


def wgsl_text(model: Model, which: str | None = None) -> str:
    """The generated shader(s): every kernel's (from its first node), or one kernel's, one
    node's (``attention@2``: that node's numbers are its params), or an ext op's."""
    label = model.path.name
    kernels = _kernel_programs(model)
    by_node = {n.full_name: n for n in model.nodes}
    if which is None:
        parts = [wgsl.generate(n.program, symbols=model.symbols, path=label).source
                 for n in kernels.values()]
        return "\n".join(parts)
    node = kernels.get(which) or by_node.get(which)
    if node is not None and node.kind == NodeKind.MICRO:
        prog = wgsl.generate(node.program, symbols=model.symbols, path=label)
        return (f"// node {node.full_name}: params = {prog.params.tolist()}\n"
                + prog.source)
    if which in SHADERS:
        return default_text(which)
    names = ", ".join(list(kernels) + list(SHADERS))
    raise FirError(f"'{printable(which)}' is neither a kernel, a node of {label} nor an ext "
                   f"shader; kernels and ext shaders: {names}")


def print_wgsl(source: RunInput, kernel: str | None = None, out=None) -> int:
    """``firscope wgsl [MODEL] [KERNEL]``: ``source`` says the model and how it loads."""
    import os
    from dataclasses import replace

    out = out or sys.stdout
    path = source.model
    if kernel is None and path is not None and not os.path.exists(path):
        source, kernel = replace(source, model=None), path  # `firscope wgsl g2.add`: the sample's
    model = source.load()
    print(wgsl_text(model, kernel), file=out, end="")
    return 0


def profile_steps(model: Model, ids: list[int], n: int, *, budget=None,
                  repeats: int = 0) -> dict:
    """Decode ``ids`` then ``n`` greedy tokens on the GPU, every node timed. Returns the
    numbers of the report (seconds per node instance and kernel, per token); with
    ``repeats``, also ``last_step_s``: each node's median over that many more runs of the
    last step (the measurement the speed-of-light prediction is set beside)."""
    machine = make_machine(model, GPU_ENGINE, budget=budget or None)
    machine.reset()
    runner = machine.runner
    steps = len(ids) + max(n - 1, 0)
    machine.check_room(steps)
    per_node = defaultdict(float)
    per_token, fed = [], []
    pending = list(ids)
    all_nodes = range(len(model.nodes))
    generated: list[int] = []
    while pending:
        tok = pending.pop(0)
        machine.begin_token(tok)
        t = time.perf_counter()
        times = runner.timed(all_nodes)
        wall = time.perf_counter() - t
        logits_region = model.outputs["logits"]
        logits = runner.download(logits_region)
        model.view(logits_region)[:] = logits
        machine.finish_token()
        fed.append(tok)
        per_token.append({"gpu_s": float(sum(times)), "wall_s": wall})
        for node, s in zip(model.nodes, times):
            per_node[node.full_name] += s
        if not pending and len(generated) < n:
            generated.append(int(np.argmax(logits)))
            if len(generated) < n:
                pending.append(generated[-1])
    last = retime_last_step(machine, repeats) if repeats and fed else None
    return {"per_node": dict(per_node), "per_token": per_token, "fed": fed,
            "generated": generated, "last_step_s": last}


def _report(model: Model, gpu, data: dict, *, top: int | None = None) -> tuple[str, dict]:
    per_kernel = defaultdict(lambda: [0.0, 0])
    for node in model.nodes:
        k = per_kernel[node.target]
        k[0] += data["per_node"].get(node.full_name, 0.0)
        k[1] += 1
    steps = max(len(data["per_token"]), 1)
    gpu_total = sum(t["gpu_s"] for t in data["per_token"])
    wall = sum(t["wall_s"] for t in data["per_token"])
    timing = ("timestamp queries" if gpu.timestamps
              else "queue completion of one submission per dispatch (no timestamp queries)")
    lines = [f"GPU profile of {model.path.name} on {gpu.name} ({gpu.backend})",
             f"timing: {timing}",
             f"{steps} steps: {1e3 * gpu_total / steps:.3f} ms GPU time per token, "
             f"{1e3 * wall / steps:.3f} ms wall per token"]
    if gpu.is_software:
        lines.append("note: a software adapter (CPU): these times say little about a GPU")
    lines += ["", f"{'kernel / op':28} {'nodes':>5} {'ms/token':>10} {'share':>7}"]
    for name, (s, count) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0]):
        share = s / gpu_total if gpu_total else 0.0
        lines.append(f"{printable(name)[:28]:28} {count:5d} {1e3 * s / steps:10.4f} "
                     f"{share:7.1%}")
    as_json = {"model": str(model.path), "adapter": dict(gpu.info), "timing": timing,
               "steps": steps, "gpu_ms_per_token": 1e3 * gpu_total / steps,
               "wall_ms_per_token": 1e3 * wall / steps, "speed_of_light": data.get("sol"),
               "speed_of_light_error": data.get("sol_error"),
               "per_kernel_ms_per_token": {k: 1e3 * v[0] / steps for k, v in per_kernel.items()},
               "per_node_ms_per_token": {k: 1e3 * v / steps
                                         for k, v in data["per_node"].items()},
               "fed": data["fed"], "generated": data["generated"]}
    lines.append("")
    if data.get("sol") is not None:
        lines += render_beside(data["sol"], top=top)
    else:
        lines.append(f"no speed-of-light prediction: {printable(data.get('sol_error', '?'))}")
    return "\n".join(lines), as_json


def add_speed_of_light(model: Model, gpu, data: dict, device, chosen_by: str) -> None:
    """``data['sol']``: the last step's prediction beside its re-timed dispatches; a failed
    analysis is said in ``data['sol_error']`` and the measurement is kept."""
    if not data.get("last_step_s"):
        data["sol_error"] = "no step was run"
        return
    try:
        report = predict_step(model, device, data["fed"])
    except FirError as e:
        data["sol_error"] = f"the cost analysis failed: {e.message}"
        return
    data["sol"] = beside(data["last_step_s"], report, gpu, device, chosen_by, repeats=REPEATS)


def run_gpu_profile(source, *, n: int, out, device: str | None = None) -> int:
    """``firscope profile --engine gpu -o DIR [--device NAME]``: gpu-profile.txt and
    gpu-profile.json, each dispatch's GPU time beside its speed-of-light prediction."""
    check_steps(n)
    folder = check_output_folder(out)
    gpu = open_device()
    dev, chosen_by = choose_device(device, gpu.name)  # a typo fails before the model loads
    opened = source.open()
    data = profile_steps(opened.model, list(opened.ids), n, repeats=REPEATS)
    add_speed_of_light(opened.model, gpu, data, dev, chosen_by)
    text, as_json = _report(opened.model, gpu, data)
    try:
        paths = [write_into_folder(folder, "gpu-profile.txt", text + "\n"),
                 write_into_folder(folder, "gpu-profile.json", json.dumps(as_json, indent=1))]
    except OSError as e:
        raise FirError(f"{printable(folder)}: cannot write the report: {e.strerror}") from None
    print(_report(opened.model, gpu, data, top=SHOWN_NODES)[0])
    for p in paths:
        print(f"wrote {printable(p)}")
    return 0
