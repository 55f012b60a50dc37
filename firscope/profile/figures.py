"""The report's figures, drawn from the sections of :func:`export.report_dict` only.

Drawing from the same dictionary that becomes ``report.json`` keeps the
JSON the data behind every figure. Figures are SVG written by
:mod:`.svgplot` (no plotting library, no global state: a report can be
written from a worker thread of the TUI, and the same data gives the same
bytes). Each function returns SVG bytes, or None when its data is missing.
"""
from __future__ import annotations

import numpy as np

from .svgplot import TAB10, TAB20, Figure, png_rgb, viridis

PX = 90  # pixels per inch of the sizes below (the figures were 90 dpi PNGs)
KIND_COLORS = {"ext": "#4c72b0", "micro": "#dd8452"}
MAX_TIMELINE_STEPS = 12
MAX_LABELS = 40


def _new(w: float, h: float, title: str = "") -> Figure:
    return Figure(w * PX, h * PX, title)


def _layer_label(layer) -> str:
    return "outside" if layer is None else f"layer {layer}"


def _name_colors(names: list[str]) -> dict[str, str]:
    return {n: TAB20[i % 20] for i, n in enumerate(names)}


def _patches(items) -> list[tuple[str, str, str]]:
    return [(label, color, "patch") for label, color in items]


# -- time ----------------------------------------------------------------------------------
def time_by_name(timing: dict | None) -> bytes | None:
    if not timing or not timing["by_name"]:
        return None
    rows = sorted(timing["by_name"], key=lambda r: r["median_calls_us"])
    fig = _new(9, 0.28 * len(rows) + 1.2)
    (ax,) = fig.subplots()
    vals = [r["median_calls_us"] / 1000 for r in rows]
    ax.barh(vals, [KIND_COLORS.get(r["kind"], "gray") for r in rows])
    ax.set_ticks("y", range(len(rows)), [r["name"] for r in rows])
    ax.set(xlabel="median call × calls, all steps and layers (ms)",
           title="Time per node name (blue: ext, orange: micro)")
    ax.margin["x"] = 0.12
    for i, r in enumerate(rows):
        if r["share"] is not None:
            ax.text(vals[i], i, f" {100 * r['share']:.1f}%", size=8)
    return fig.svg()


def time_by_layer(timing: dict | None) -> bytes | None:
    if not timing or not timing["by_layer"]:
        return None
    rows = timing["by_layer"]
    fig = _new(9, 3)
    (ax,) = fig.subplots()
    ax.bar(range(len(rows)), [r["median_calls_us"] / 1000 for r in rows],
           ["#55a868"] * len(rows))
    many = len(rows) > 16
    ax.set_ticks("x", range(len(rows)), [_layer_label(r["layer"]) for r in rows],
                 size=7 if many else 10, rotate=90 if many else 0)
    ax.set(ylabel="ms (median call x calls per node)", title="Time per layer (all steps)")
    return fig.svg()


def time_per_step(timing: dict | None) -> bytes | None:
    if not timing or not timing["steps"]:
        return None
    steps = timing["steps"]
    fig = _new(9, 2.8)
    (ax,) = fig.subplots()
    x = [s["step"] for s in steps]
    ax.line(x, [s["span_us"] / 1000 for s in steps], TAB10[0], marker=2.5, label="span")
    ax.line(x, [s["compute_us"] / 1000 for s in steps], TAB10[1], marker=1.5,
            label="inside nodes")
    ax.set(xlabel="step (position)", ylabel="ms", title="Time per decode step")
    ax.legend(ax.legend_items)
    return fig.svg()


def timeline(timing: dict | None, nodes: list[dict]) -> bytes | None:
    if not timing or not timing["steps"]:
        return None
    steps = timing["steps"][:MAX_TIMELINE_STEPS]
    # one colour per node kind (the kernel or ext op it runs), not per name: 19 names made
    # 19 near-identical colours; the legend lists the names of each kind
    kinds = list(dict.fromkeys(_kind_of(n) for n in nodes))
    colors = _kind_colors(kinds)
    members = {k: list(dict.fromkeys(n["name"] for n in nodes if _kind_of(n) == k))
               for k in kinds}
    fig = _new(9.5, max(0.35 * len(steps) + 1.2, 0.3 * len(kinds) + 0.6))
    (ax,) = fig.subplots()
    rects, faces = [], []
    right = 0.0
    for row, s in enumerate(steps):
        starts = timing["node_start_us"][s["step"]]
        durs = timing["node_us"][s["step"]]
        t0 = s["start_us"]
        for n, st, d in zip(nodes, starts, durs):
            if d is None:
                continue
            x0, x1 = (st - t0) / 1000, (st - t0 + d) / 1000
            rects.append((x0, x1, row - 0.4, row + 0.4))
            faces.append(colors[_kind_of(n)])
            right = max(right, x1)
    ax.rects(rects, faces)
    ax.inverted_y = True
    ax.set(xlim=(0, right * 1.01 or 1), ylim=(-0.6, len(steps) - 0.4),
           xlabel="ms from the start of the step",
           title="Timeline: nodes within each step"
           + (f" (first {len(steps)} steps)" if len(timing["steps"]) > len(steps) else ""))
    ax.set_ticks("y", range(len(steps)), [f"step {s['step']}" for s in steps], size=8)
    ax.legend(_patches((_kind_label(k, members[k]), colors[k]) for k in kinds), where="outside",
              size=7, ncol=1 if len(kinds) <= 24 else 2, title="node kind: nodes")
    return fig.svg()


def _kind_colors(kinds: list[str]) -> dict[str, str]:
    """tab10 while it suffices (tab20 pairs a colour with its own lighter shade)."""
    if len(kinds) > 10:
        return _name_colors(kinds)
    return {k: TAB10[i] for i, k in enumerate(kinds)}


def _kind_of(node: dict) -> str:
    """A node's kind for colouring: the kernel or ext op it runs (``g2.layernorm``)."""
    return str(node.get("target") or node.get("kind") or "?")


def _kind_label(kind: str, names: list[str], room: int = 44) -> str:
    shown = ", ".join(names)
    if len(shown) > room:
        shown = shown[: room - 1].rsplit(",", 1)[0] + ", …"
    return f"{kind}: {shown}"


# -- instructions ---------------------------------------------------------------------------
def instructions(instr: dict | None) -> bytes | None:
    if not instr or not instr["kernels"]:
        return None
    ks = instr["kernels"]
    fig = _new(9, 0.35 * len(ks) + 1.6,
               title=f"Kernels over {len(instr['tokens'])} instrumented step(s)")
    ax1, ax2 = fig.subplots(1, 2)
    ax1.barh([k["steps"] for k in ks], ["#8172b3"] * len(ks))
    ax1.set_ticks("y", range(len(ks)), [k["kernel"] for k in ks])
    ax1.set(xscale="log", xlabel="instructions executed")
    ax2.barh([100 * (k["simd_efficiency"] or 0) for k in ks], ["#64b5cd"] * len(ks))
    ax2.set_ticks("y", range(len(ks)), [""] * len(ks))  # shared with the left
    ax2.set(xlim=(0, 100), xlabel=f"SIMD efficiency (%, warps of {ks[0].get('simd_width', 32)})")
    return fig.svg()


# -- quantization ---------------------------------------------------------------------------
def weight_error(quant: dict) -> bytes | None:
    ws = quant.get("weights") or []
    if not ws:
        return None
    decls = list(dict.fromkeys(w["decl"] for w in ws))
    fig = _new(9, 3.4)
    ax1, ax2 = fig.subplots(1, 2)
    for i, d in enumerate(decls):
        rows = [w for w in ws if w["decl"] == d]
        x = [w["layer"] if w["layer"] is not None else -1 for w in rows]
        ax1.line(x, [w["rmse"] for w in rows], TAB10[i % 10], marker=2.5, label=d)
    xs = sorted({w["layer"] if w["layer"] is not None else -1 for w in ws})
    ax1.set_ticks("x", *_integer_ticks(xs))
    ax1.set(xlabel="layer (-1: not in a layer)" if any(w["layer"] is None for w in ws)
            else "layer", ylabel="rmse", title="Weight rmse per layer")
    ax1.legend(ax1.legend_items, size=7)
    for i, bd in enumerate(quant.get("weights_by_decl") or []):
        hist = np.asarray(bd["hist"], dtype=float)
        edges = np.linspace(0, bd["hist_range"], len(hist) + 1)
        frac = hist / max(hist.sum(), 1)
        ax2.line(edges.tolist(), frac.tolist(), TAB10[i % 10], label=bd["decl"], step=True)
    ax2.set(yscale="log", xlabel="|error| (last bucket: everything above)",
            title="|error| histogram (fraction)")
    ax2.legend(ax2.legend_items, size=7)
    return fig.svg()


def _integer_ticks(values: list[int], most: int = 13) -> tuple[list[int], list[str]]:
    """Integer ticks over ``values`` (every one while they fit, else every k-th)."""
    lo, hi = min(values), max(values)
    step = max(1, -(-(hi - lo) // (most - 1)))
    pos = list(range(lo, hi + 1, step))
    return pos, [str(p) for p in pos]


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
    y = [r["rel_l2_mean"] if r["rel_l2_mean"] is not None else np.nan for r in prim]
    layers = [layer_of.get(r["node"]) for r in prim]
    cols = ["gray" if lay is None else TAB10[lay % 10] for lay in layers]
    positive = any(v and v > 0 for v in y)
    ax1.bar(range(len(prim)), [v if v and v > 0 else np.nan for v in y], cols)
    if positive:
        ax1.set(yscale="log")
    ax1.set(ylabel="relative L2",
            title="Node output error, q4 vs f32 (mean over steps; colour = layer)")
    _label_nodes(ax1, prim, y, layers)
    shown = list(dict.fromkeys(layers))
    ax1.legend(_patches((_layer_label(lay), "gray" if lay is None else TAB10[lay % 10])
                        for lay in shown[:MAX_LABELS]),
               size=6, ncol=1 if len(shown) <= 14 else 2, where="outside")
    _residual_panel(ax2, acts.get("per_layer") or [])
    return fig.svg()


def _residual_panel(ax, per_layer: list[dict]) -> None:
    if not per_layer:
        ax.frame = False
        ax.show_ticks = {"x": False, "y": False}
        return
    ax.line([r["layer"] for r in per_layer],
            [r["sqnr_db"] if r["sqnr_db"] is not None else np.nan for r in per_layer],
            TAB10[0], marker=3)
    ax.set_ticks("x", *_integer_ticks([r["layer"] for r in per_layer]))
    ax.set(xlabel="layer", ylabel="SQNR (dB)", title="Residual stream after each layer")


WORST_LABELLED = 6  # with too many bars for a label each: the worst ones are named


def _label_nodes(ax, prim: list[dict], y: list, layers: list) -> None:
    """A name under every bar when they fit; else the layer under its run of bars and the
    worst nodes named above theirs."""
    if len(prim) <= MAX_LABELS:
        ax.set_ticks("x", range(len(prim)), [r["full_name"] for r in prim], size=6, rotate=90)
        return
    starts = [i for i in range(len(layers)) if i == 0 or layers[i] != layers[i - 1]]
    ends = starts[1:] + [len(layers)]
    ax.set_ticks("x", [(a + b - 1) / 2 for a, b in zip(starts, ends)],
                 ["-" if layers[a] is None else f"L{layers[a]}" for a in starts], size=6)
    for a in starts[1:]:
        ax.vline(a - 0.5)
    ax.set(xlabel="node (plan order), by layer")
    finite = [(v, i) for i, v in enumerate(y) if v is not None and np.isfinite(v) and v > 0]
    for v, i in sorted(finite, reverse=True)[:WORST_LABELLED]:
        ax.text(i, v, prim[i]["full_name"], size=6, dy=3, rotate=45)
    if finite:  # room above the tallest bar for its name (log scale: a factor)
        low, high = ax.limits("y")
        ax.set(ylim=(low, max(high, max(finite)[0] * 6)))


def logits(quant: dict) -> bytes | None:
    lg = quant.get("logits")
    if not lg or not lg["per_step"]:
        return None
    rows = lg["per_step"]
    fig = _new(9, 3)
    ax1, ax2 = fig.subplots(1, 2)
    x = [r["step"] for r in rows]
    ax1.bar(x, [r["kl"] or 0 for r in rows],
            ["#55a868" if r["same_top"] else "#c44e52" for r in rows])
    ax1.set(xlabel="step", ylabel="KL(P_f32 || P_q4), nats",
            title="KL per step (red: top-1 differs)")
    ax2.bar(x, [r["delta_p"] or 0 for r in rows], ["#4c72b0"] * len(rows))
    ax2.hline(0)
    ax2.set(xlabel="step", ylabel="Δp of the f32 top token", title="P_q4 − P_f32 (f32 top token)")
    return fig.svg()


# -- attention -------------------------------------------------------------------------------
def attention(sites: list[dict]) -> bytes | None:
    """Every layer and head in one mosaic: a row of cells per attention node, a column per head.

    Each cell has queries down and keys across; blank cells are masked (a key
    after its query). The mosaic is one PNG inside the SVG, a pixel per probability.
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
    labels = [s["full_name"] for s in sites]
    left = max(len(t) for t in labels) * 7 * 0.6 / PX + 0.3  # the row names
    fig = _new(min(12.0, 1.8 + cell * n_head) + left,
               0.9 + cell * len(sites) * rows_q / keys)
    (ax,) = fig.subplots()
    ax.image(png_rgb(viridis(mosaic)), mosaic.shape)
    ax.frame = False
    ax.set_ticks("x", [h * cw + (keys - 1) / 2 for h in range(n_head)],
                 [f"head {h}" for h in range(n_head)], size=7)
    ax.set_ticks("y", [r * ch + (rows_q - 1) / 2 for r in range(len(sites))], labels, size=7)
    ax.add_colorbar("probability")
    ax.set(title=f"softmax of '{sites[0]['buffer']}' per layer and head (in a cell: rows = "
           "query position, columns = key position)", title_size=8)
    return fig.svg()


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
    (ax,) = fig.subplots()
    lo = min([p[1] for p in pts] + [peak / bw]) / 10
    hi = max([p[1] for p in pts] + [peak / bw]) * 10
    x = np.geomspace(lo, hi, 200)
    ax.line(x.tolist(), np.minimum(x * bw, peak).tolist(), "#333333")
    ax.text(lo * 1.3, lo * 1.3 * bw * 1.25, f"DRAM {dev['dram_bandwidth_gbs']:g} GB/s", size=8)
    ax.text(hi / 1.3, peak * 1.12, f"f32 peak {dev['f32_tflops']:g} TFLOP/s", size=8,
            anchor="end")
    for i, (name, ai, rate) in enumerate(pts):
        ax.line([ai], [rate], TAB10[i % 10], marker=3.5, width=0)
        ax.text(ai, rate, name, size=8, dx=4, dy=4)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi),
           xlabel="arithmetic intensity (flop / DRAM byte)",
           ylabel="FLOP/s (predicted, launch included)",
           title=f"Roofline: {dev['name']} (predicted, not measured)", title_size=10)
    return fig.svg()


def gpu_split(gpu: dict | None) -> bytes | None:
    """Predicted time per token split by kernel, coloured by the bound of most of its time."""
    if not gpu or not gpu.get("kernels"):
        return None
    colors = {"memory": "#4c72b0", "compute": "#c44e52", "latency": "#dd8452",
              "launch": "#8c8c8c"}
    ks = gpu["kernels"][::-1]
    fig = _new(7.5, 0.32 * len(ks) + 1.4)
    (ax,) = fig.subplots()
    ax.barh([k["predicted_us"] for k in ks], [colors.get(k["bound"], "#999999") for k in ks])
    ax.set_ticks("y", range(len(ks)), [k["kernel"] for k in ks])
    ax.set(xlabel=f"predicted us per token ({gpu['predicted_us_per_token']:.1f} us in all)",
           title=f"Predicted time per token on {gpu['device']['name']}", title_size=10)
    ax.legend(_patches(colors.items()), size=7, where="lower right")
    return fig.svg()
