"""The report's figures, drawn from the sections of :func:`export.report_dict` only.

Drawing from the same dictionary that becomes ``report.json`` keeps the
JSON the data behind every figure. Figures use matplotlib's object API on
the Agg canvas (no pyplot state), so a report can be written from a worker
thread of the TUI. Each function returns PNG bytes, or None when its data
is missing.
"""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

import numpy as np  # noqa: E402

DPI = 90
KIND_COLORS = {"ext": "#4c72b0", "micro": "#dd8452"}
MAX_TIMELINE_STEPS = 12
MAX_LABELS = 40


def _new(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _layer_label(layer) -> str:
    return "outside" if layer is None else f"layer {layer}"


def _name_colors(names: list[str]) -> dict[str, tuple]:
    cmap = matplotlib.colormaps["tab20"]
    return {n: cmap(i % 20) for i, n in enumerate(names)}


# -- time ----------------------------------------------------------------------------------
def time_by_name(timing: dict | None) -> bytes | None:
    if not timing or not timing["by_name"]:
        return None
    rows = sorted(timing["by_name"], key=lambda r: r["total_us"])
    fig = _new(9, 0.28 * len(rows) + 1.2)
    ax = fig.add_subplot()
    ax.barh([r["name"] for r in rows], [r["total_us"] / 1000 for r in rows],
            color=[KIND_COLORS.get(r["kind"], "gray") for r in rows])
    ax.set_xlabel("total time over all steps and layers (ms)")
    ax.set_title("Time per node name (blue: ext, orange: micro)")
    for i, r in enumerate(rows):
        if r["share"] is not None:
            ax.text(r["total_us"] / 1000, i, f" {100 * r['share']:.1f}%", va="center", fontsize=8)
    ax.margins(x=0.12)
    return _png(fig)


def time_by_layer(timing: dict | None) -> bytes | None:
    if not timing or not timing["by_layer"]:
        return None
    rows = timing["by_layer"]
    fig = _new(9, 3)
    ax = fig.add_subplot()
    ax.bar([_layer_label(r["layer"]) for r in rows], [r["total_us"] / 1000 for r in rows],
           color="#55a868")
    ax.set_ylabel("ms")
    ax.set_title("Time per layer (all steps)")
    if len(rows) > 16:
        ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    return _png(fig)


def time_per_step(timing: dict | None) -> bytes | None:
    if not timing or not timing["steps"]:
        return None
    steps = timing["steps"]
    fig = _new(9, 2.8)
    ax = fig.add_subplot()
    x = [s["step"] for s in steps]
    ax.plot(x, [s["span_us"] / 1000 for s in steps], marker="o", ms=3, label="span")
    ax.plot(x, [s["compute_us"] / 1000 for s in steps], marker=".", ms=3,
            label="inside nodes")
    ax.set_xlabel("step (position)")
    ax.set_ylabel("ms")
    ax.set_title("Time per decode step")
    ax.legend(fontsize=8)
    return _png(fig)


def timeline(timing: dict | None, nodes: list[dict]) -> bytes | None:
    if not timing or not timing["steps"]:
        return None
    steps = timing["steps"][:MAX_TIMELINE_STEPS]
    names = list(dict.fromkeys(n["name"] for n in nodes))
    colors = _name_colors(names)
    fig = _new(9.5, max(0.35 * len(steps) + 1.2, 0.17 * len(names) + 0.6))
    ax = fig.add_subplot()
    verts, faces = [], []
    right = 0.0
    for row, s in enumerate(steps):
        starts = timing["node_start_us"][s["step"]]
        durs = timing["node_us"][s["step"]]
        t0 = s["start_us"]
        for n, st, d in zip(nodes, starts, durs):
            if d is None:
                continue
            x0, x1 = (st - t0) / 1000, (st - t0 + d) / 1000
            verts.append([(x0, row - 0.4), (x1, row - 0.4), (x1, row + 0.4), (x0, row + 0.4)])
            faces.append(colors[n["name"]])
            right = max(right, x1)
    ax.add_collection(PolyCollection(verts, facecolors=faces, linewidths=0))
    ax.set_xlim(0, right * 1.01 or 1)
    ax.set_ylim(-0.6, len(steps) - 0.4)
    ax.set_yticks(range(len(steps)), [f"step {s['step']}" for s in steps], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the start of the step")
    ax.set_title("Timeline: nodes within each step"
                 + (f" (first {len(steps)} steps)" if len(timing["steps"]) > len(steps) else ""))
    handles = [Patch(color=colors[n], label=n) for n in names]
    ax.legend(handles=handles, fontsize=7, ncol=1 if len(handles) <= 24 else 2,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _png(fig)


# -- instructions ---------------------------------------------------------------------------
def instructions(instr: dict | None) -> bytes | None:
    if not instr or not instr["kernels"]:
        return None
    ks = instr["kernels"]
    fig = _new(9, 0.35 * len(ks) + 1.6)
    ax1, ax2 = fig.subplots(1, 2, sharey=True)
    labels = [k["kernel"] for k in ks]
    ax1.barh(labels, [k["steps"] for k in ks], color="#8172b3")
    ax1.set_xscale("log")
    ax1.set_xlabel("instructions executed")
    ax2.barh(labels, [100 * (k["simd_efficiency"] or 0) for k in ks], color="#64b5cd")
    ax2.set_xlim(0, 100)
    ax2.set_xlabel(f"SIMD efficiency (%, warps of {ks[0].get('simd_width', 32)})")
    fig.suptitle(f"Kernels over {len(instr['tokens'])} instrumented step(s)")
    return _png(fig)


# -- quantization ---------------------------------------------------------------------------
def weight_error(quant: dict) -> bytes | None:
    ws = quant.get("weights") or []
    if not ws:
        return None
    decls = list(dict.fromkeys(w["decl"] for w in ws))
    fig = _new(9, 3.4)
    ax1, ax2 = fig.subplots(1, 2)
    for d in decls:
        rows = [w for w in ws if w["decl"] == d]
        x = [w["layer"] if w["layer"] is not None else -1 for w in rows]
        ax1.plot(x, [w["rmse"] for w in rows], marker="o", ms=3, label=d)
    ax1.set_xlabel("layer (-1: not in a layer)" if any(w["layer"] is None for w in ws)
                   else "layer")
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_ylabel("rmse")
    ax1.set_title("Weight rmse per layer")
    ax1.legend(fontsize=7)
    for bd in quant.get("weights_by_decl") or []:
        hist = np.asarray(bd["hist"], dtype=float)
        edges = np.linspace(0, bd["hist_range"], len(hist) + 1)
        ax2.stairs(hist / max(hist.sum(), 1), edges, label=bd["decl"])
    ax2.set_yscale("log")
    ax2.set_xlabel("|error| (last bucket: everything above)")
    ax2.set_title("|error| histogram (fraction)")
    ax2.legend(fontsize=7)
    return _png(fig)


def activation_error(quant: dict, nodes: list[dict]) -> bytes | None:
    acts = quant.get("activations")
    if not acts:
        return None
    prim = [r for r in acts["per_node"] if r["primary"]]
    if not prim:
        return None
    layer_of = {n["index"]: n["layer"] for n in nodes}
    fig = _new(9, 4.2)
    ax1, ax2 = fig.subplots(2, 1, height_ratios=[3, 2])
    x = np.arange(len(prim))
    y = [r["rel_l2_mean"] if r["rel_l2_mean"] is not None else np.nan for r in prim]
    layers = [layer_of.get(r["node"]) for r in prim]
    cmap = matplotlib.colormaps["tab10"]
    cols = ["gray" if lay is None else cmap(lay % 10) for lay in layers]
    ax1.bar(x, [v if v and v > 0 else np.nan for v in y], color=cols)
    if any(v and v > 0 for v in y):
        ax1.set_yscale("log")
    ax1.set_ylabel("relative L2")
    ax1.set_title("Node output error, q4 vs f32 (mean over steps; colour = layer)")
    if len(prim) <= MAX_LABELS:
        ax1.set_xticks(x, [r["full_name"] for r in prim], rotation=90, fontsize=6)
    else:
        ax1.set_xticks([])
        ax1.set_xlabel("node (plan order)")
    per_layer = acts.get("per_layer") or []
    if per_layer:
        ax2.plot([r["layer"] for r in per_layer],
                 [r["sqnr_db"] if r["sqnr_db"] is not None else np.nan for r in per_layer],
                 marker="o")
        ax2.set_xlabel("layer")
        ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax2.set_ylabel("SQNR (dB)")
        ax2.set_title("Residual stream after each layer")
    else:
        ax2.set_axis_off()
    return _png(fig)


def logits(quant: dict) -> bytes | None:
    lg = quant.get("logits")
    if not lg or not lg["per_step"]:
        return None
    rows = lg["per_step"]
    fig = _new(9, 3)
    ax1, ax2 = fig.subplots(1, 2)
    x = [r["step"] for r in rows]
    ax1.bar(x, [r["kl"] or 0 for r in rows],
            color=["#55a868" if r["same_top"] else "#c44e52" for r in rows])
    ax1.set_xlabel("step")
    ax1.set_ylabel("KL(P_f32 || P_q4), nats")
    ax1.set_title("KL per step (red: top-1 differs)")
    ax2.bar(x, [r["delta_p"] or 0 for r in rows], color="#4c72b0")
    ax2.axhline(0, color="black", lw=0.5)
    ax2.set_xlabel("step")
    ax2.set_ylabel("Δp of the f32 top token")
    ax2.set_title("P_q4 − P_f32 (f32 top token)")
    return _png(fig)


# -- attention -------------------------------------------------------------------------------
def attention(sites: list[dict]) -> bytes | None:
    """Every layer and head in one mosaic: a row of cells per attention node, a column per head.

    Each cell has queries down and keys across; blank cells are masked (a key
    after its query). One image in one axes keeps this fast for 12x12 heads.
    """
    sites = [s for s in sites if s["positions"]]
    if not sites:
        return None
    n_head = max(s["n_head"] for s in sites)
    rows_q = max(len(s["positions"]) for s in sites)
    keys = max(max(s["positions"]) for s in sites) + 1
    gap = max(1, keys // 12)
    ch, cw = rows_q + gap, keys + gap
    mosaic = np.full((len(sites) * ch - gap, n_head * cw - gap), np.nan)
    for r, s in enumerate(sites):
        for h in range(s["n_head"]):
            for i, row in enumerate(s["probs"][h]):
                mosaic[r * ch + i, h * cw: h * cw + len(row)] = row
    cell = min(1.3, 10.0 / n_head)
    fig = _new(min(12.0, 1.8 + cell * n_head), 0.9 + cell * len(sites) * rows_q / keys)
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    im = ax.imshow(mosaic, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([h * cw + (keys - 1) / 2 for h in range(n_head)],
                  [f"head {h}" for h in range(n_head)], fontsize=7)
    ax.set_yticks([r * ch + (rows_q - 1) / 2 for r in range(len(sites))],
                  [s["full_name"] for s in sites], fontsize=7)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    fig.colorbar(im, ax=ax, shrink=0.8, label="probability")
    ax.set_title(f"softmax of '{sites[0]['buffer']}' per layer and head (in a cell: rows = query "
                 "position, columns = key position)", fontsize=8)
    return _png(fig)


# -- GPU speed of light (profile --device) ---------------------------------------------------
def roofline(gpu: dict | None) -> bytes | None:
    """Arithmetic intensity (flop per DRAM byte) vs attainable FLOP/s, one point per kernel
    at its predicted rate, under the device's memory and compute roofs."""
    if not gpu or not gpu.get("kernels"):
        return None
    dev = gpu["device"]
    peak = dev["f32_tflops"] * 1e12
    bw = dev["dram_bandwidth_gbs"] * 1e9
    pts = [(k["kernel"], k["flops"] / k["dram_bytes"], k["flops"] / (k["predicted_us"] * 1e-6))
           for k in gpu["kernels"]
           if k.get("dram_bytes") and k.get("flops") and k.get("predicted_us")]
    fig = _new(7.5, 4.6)
    ax = fig.subplots()
    lo = min([p[1] for p in pts] + [peak / bw]) / 10
    hi = max([p[1] for p in pts] + [peak / bw]) * 10
    x = np.geomspace(lo, hi, 200)
    ax.plot(x, np.minimum(x * bw, peak), color="#333", lw=1.5)
    ax.text(lo * 1.3, lo * 1.3 * bw * 1.25, f"DRAM {dev['dram_bandwidth_gbs']:g} GB/s",
            fontsize=8, rotation=0)
    ax.text(hi / 1.3, peak * 1.12, f"f32 peak {dev['f32_tflops']:g} TFLOP/s", fontsize=8,
            ha="right")
    for name, ai, rate in pts:
        ax.scatter([ai], [rate], s=30, zorder=3)
        ax.annotate(name, (ai, rate), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (flop / DRAM byte)")
    ax.set_ylabel("FLOP/s (predicted, launch included)")
    ax.set_title(f"Roofline: {dev['name']} (predicted, not measured)", fontsize=10)
    return _png(fig)


def gpu_split(gpu: dict | None) -> bytes | None:
    """Predicted time per token split by kernel, coloured by the bound of most of its time."""
    if not gpu or not gpu.get("kernels"):
        return None
    colors = {"memory": "#4c72b0", "compute": "#c44e52", "latency": "#dd8452",
              "launch": "#8c8c8c"}
    ks = gpu["kernels"]
    fig = _new(7.5, 0.32 * len(ks) + 1.4)
    ax = fig.subplots()
    labels = [k["kernel"] for k in ks][::-1]
    vals = [k["predicted_us"] for k in ks][::-1]
    ax.barh(labels, vals, color=[colors.get(k["bound"], "#999") for k in ks][::-1])
    ax.set_xlabel(f"predicted us per token ({gpu['predicted_us_per_token']:.1f} us in all)")
    ax.legend(handles=[Patch(color=c, label=b) for b, c in colors.items()], fontsize=7,
              loc="lower right")
    ax.set_title(f"Predicted time per token on {gpu['device']['name']}", fontsize=10)
    return _png(fig)
