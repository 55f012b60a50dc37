"""ProfileData -> the machine-readable report: report.json, CSV tables, trace.json.

:func:`report_dict` builds the one dictionary every figure and table of the
HTML report is drawn from, so ``report.json`` is exactly the data behind
them. It holds no timestamp except ``meta.created``; keys are written
sorted, floats as shortest round-trip decimals, non-finite numbers as
``null`` (JSON has no inf/NaN; the CSV tables write ``inf``/``nan``).
Times are microseconds, relative to the first node the profiler saw.
"""
from __future__ import annotations

import csv
import io
import json
import math

import numpy as np

from ..text import json_text, printable
from .data import SIMD_WIDTH, ProfileData
from .divergence import divergence_section
from .quant import activation_summary, logit_summary, total_stats

FORMAT = "firscope-profile"
VERSION = 1


def _us(ns) -> float:
    return round(int(ns) / 1000.0, 3)


def _f(x):
    """A JSON-safe float: None for inf/NaN."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _share(part: float, total: float) -> float | None:
    return part / total if total else None


# -- sections --------------------------------------------------------------------------
def timing_section(data: ProfileData) -> dict | None:
    if not data.tokens:
        return None
    nodes = data.nodes
    ns = data.node_ns()  # [steps, nodes], -1 = not run
    ran = ns >= 0
    safe = np.where(ran, ns, 0)
    total = int(safe.sum())
    steps = []
    for t in data.tokens:
        steps.append({"step": t.step, "token": t.token, "position": t.position,
                      "start_us": _us(t.start_ns), "span_us": _us(t.span_ns),
                      "compute_us": _us(t.compute_ns)})
    # The robust figure every chart, share and summary uses: per node, its median call times
    # its calls (one call preempted for 9 ms cannot make a node look like 40% of the run,
    # as the raw total let it on a busy machine); the raw totals are kept beside it.
    # The ranked table's own rows (timing_stats: its warm-up step left out, as there).
    cost = {r.key: r.cost_ns for r in data.timing_stats(by="node").rows}
    robust = {n.index: float(cost.get(n.full_name, 0.0)) for n in nodes}
    robust_total = sum(robust.values())
    by_node = []
    for n in nodes:
        col = ns[:, n.index][ran[:, n.index]]
        calls = int(col.size)
        tot = int(col.sum()) if calls else 0
        by_node.append({"index": n.index, "full_name": n.full_name, "name": n.name,
                        "layer": n.layer, "kind": n.kind, "target": n.target, "calls": calls,
                        "total_us": _us(tot), "mean_us": round(tot / calls / 1000, 3) if calls
                        else None, "min_us": _us(col.min()) if calls else None,
                        "max_us": _us(col.max()) if calls else None,
                        "median_calls_us": _us(robust[n.index]),
                        "share": _share(robust[n.index], robust_total)})
    by_name: dict[str, dict] = {}
    by_layer: dict[object, list] = {}
    by_kind: dict[str, list] = {}
    for n, row in zip(nodes, by_node):
        tot_ns = int(safe[:, n.index].sum())
        e = by_name.setdefault(n.name, {"name": n.name, "kind": n.kind, "target": n.target,
                                        "nodes": 0, "calls": 0, "_ns": 0, "_robust": 0.0})
        e["nodes"] += 1
        e["calls"] += row["calls"]
        e["_ns"] += tot_ns
        e["_robust"] += robust[n.index]
        for table, key in ((by_layer, n.layer), (by_kind, n.kind)):
            acc = table.setdefault(key, [0, 0.0])
            acc[0] += tot_ns
            acc[1] += robust[n.index]
    names = []
    for e in by_name.values():  # plan order of first appearance: stable across runs
        tot_ns, rob = e.pop("_ns"), e.pop("_robust")
        e["total_us"] = _us(tot_ns)
        e["median_calls_us"] = _us(rob)
        e["mean_us"] = round(tot_ns / e["calls"] / 1000, 3) if e["calls"] else None
        e["share"] = _share(rob, robust_total)
        names.append(e)
    layer_keys = sorted(by_layer, key=lambda k: (k is not None, -1 if k is None else k))
    span = sum(t.span_ns for t in data.tokens)
    return {
        "unit": "us",
        "steps": steps,
        "node_us": [[_us(v) if v >= 0 else None for v in row] for row in ns],
        "node_start_us": [[_us(s) if v >= 0 else None for s, v in zip(t.node_start_ns, t.node_ns)]
                          for t in data.tokens],
        "by_node": by_node,
        "by_name": names,
        "by_layer": [{"layer": k, "total_us": _us(by_layer[k][0]),
                      "median_calls_us": _us(by_layer[k][1]),
                      "share": _share(by_layer[k][1], robust_total)} for k in layer_keys],
        "by_kind": [{"kind": k, "total_us": _us(by_kind[k][0]),
                     "median_calls_us": _us(by_kind[k][1]),
                     "share": _share(by_kind[k][1], robust_total)} for k in sorted(by_kind)],
        "total_us": _us(total),
        "median_calls_us": _us(robust_total),
        # what every share and chart of time is: the same figure as the ranked tables
        "robust": "median x calls",
        "span_us": _us(span),
        "steps_per_s": len(data.tokens) / (span / 1e9) if span else None,
        "ranked": ranked_section(data),
    }


def ranked_section(data: ProfileData) -> dict:
    """Per node and per node name: min, median, p90 and max of the calls, ranked by median
    x calls (one slow call cannot reorder the table), outliers marked, and what it rests on."""
    out = {}
    for by in ("node", "name"):
        stats = data.timing_stats(by=by)
        out[by] = [{"key": r.key, "kind": r.kind, "target": r.target, "calls": r.samples,
                    "min_us": _us(r.min_ns), "median_us": round(r.median_ns / 1000, 3),
                    "p90_us": round(r.p90_ns / 1000, 3), "max_us": _us(r.max_ns),
                    "cost_ms": round(r.cost_ns / 1e6, 4), "share": stats.share(r),
                    "outliers": r.outliers, "outlier_us": _us(r.outlier_ns)}
                   for r in stats.rows]
        out[f"{by}_note"] = stats.note()
    return out


def instruction_section(data: ProfileData) -> dict | None:
    ip = data.instructions
    if ip is None or not ip.nodes:
        return None
    kernels = []
    for name, k in ip.by_kernel().items():
        info = data.kernels.get(name)
        lines = []
        for pc, (c, lanes, warps) in enumerate(zip(k["line_counts"], k["lane_counts"],
                                                   k["warp_counts"])):
            op = info.ops[pc] if info and pc < len(info.ops) else None
            lines.append({"pc": pc, "line": op.line if op else None,
                          "text": op.text if op else "", "depth": op.depth if op else 0,
                          "category": op.category if op else "",
                          "count": int(c), "active_lanes": int(lanes),
                          "warp_instructions": int(warps),
                          "simd_efficiency": _f(lanes / (warps * SIMD_WIDTH)) if warps else None})
        warps = int(k["warp_counts"].sum())
        kernels.append({"kernel": name, "line": info.line if info else None,
                        "nodes": k["nodes"], "dispatches": k["dispatches"], "steps": k["steps"],
                        "lane_steps": k["lane_steps"], "lane_slots": k["lane_slots"],
                        "warp_instructions": warps, "simd_width": SIMD_WIDTH,
                        "simd_efficiency": _f(k["lane_steps"] / (warps * SIMD_WIDTH)) if warps
                        else None, "lines": lines})
    nodes = []
    for ni in sorted(ip.nodes.values(), key=lambda n: n.node):
        nodes.append({"index": ni.node, "full_name": data.nodes[ni.node].full_name,
                      "kernel": ni.kernel, "threads": ni.threads, "dispatches": ni.dispatches,
                      "steps": ni.steps, "lane_steps": ni.lane_steps,
                      "simd_efficiency": _f(ni.simd_efficiency)})
    return {"engine": ip.engine, "tokens": list(ip.tokens), "kernels": kernels, "nodes": nodes}


def _weight_row(w) -> dict:
    return {"name": w.name, "decl": w.decl, "layer": w.layer, "tensor": w.tensor,
            "shape": list(w.shape), "group": w.group, "count": w.count, "rmse": _f(w.rmse),
            "max_abs": _f(w.max_abs), "mean_abs": _f(w.mean_abs), "p95_abs": _f(w.p95_abs),
            "median_abs": _f(w.median_abs), "p95_bucket": _f(w.p95_bucket),
            "median_bucket": _f(w.median_bucket), "weight_rms": _f(w.weight_rms),
            "hist": [int(c) for c in w.hist], "hist_range": w.hist_range,
            "scale_min": _f(w.scale_min), "scale_max": _f(w.scale_max),
            "scale_mean": _f(w.scale_mean), "min_min": _f(w.min_min), "min_max": _f(w.min_max),
            "groups": w.groups, "flat_groups": w.flat_groups}


def _clean(d: dict | None) -> dict | None:
    if d is None:
        return None
    out = {}
    for k, v in d.items():
        if isinstance(v, np.ndarray):
            out[k] = [int(x) for x in v]
        elif isinstance(v, float):
            out[k] = _f(v)
        else:
            out[k] = v
    return out


def quant_section(data: ProfileData) -> dict:
    weights = data.weights
    comp = data.comparison
    available = bool(weights) or comp is not None
    sec: dict = {"available": available, "note": data.quant_note}
    if not available and sec["note"] is None:
        sec["note"] = "Quantization error was not computed for this report."
    sec["weights"] = [_weight_row(w) for w in weights] if weights else []
    sec["weight_totals"] = _clean(total_stats(weights)) if weights else None
    by_decl = []
    if weights:
        decls: dict[str, list] = {}
        for w in weights:
            decls.setdefault(w.decl, []).append(w)
        for decl, ws in decls.items():
            t = _clean(total_stats(ws))
            t["decl"] = decl
            by_decl.append(t)
    sec["weights_by_decl"] = by_decl
    if comp is None:
        sec["activations"] = None
        sec["logits"] = None
        return sec
    per_step = [{"step": a.step, "position": a.position, "node": a.node,
                 "full_name": a.full_name, "output": a.output, "primary": a.primary,
                 "rel_l2": _f(a.rel_l2), "max_abs": _f(a.max_abs), "cosine": _f(a.cosine),
                 "sqnr_db": _f(a.sqnr_db)} for a in comp.activations]
    per_node = [{k: (_f(v) if isinstance(v, float) else v) for k, v in row.items()}
                for row in activation_summary(comp.activations)]
    # Per layer: the primary output of the layer's last node (the residual stream after it).
    last: dict[int, int] = {}
    for n in data.nodes:
        if n.layer is not None:
            last[n.layer] = n.index
    per_layer = []
    for layer in sorted(last):
        row = next((r for r in per_node if r["node"] == last[layer] and r["primary"]), None)
        if row is not None:
            per_layer.append({"layer": layer, "node": row["full_name"], "output": row["output"],
                              "rel_l2_mean": row["rel_l2_mean"], "rel_l2_max": row["rel_l2_max"],
                              "cosine_min": row["cosine_min"], "sqnr_db": row["sqnr_db"]})
    sec["activations"] = {"tokens": list(comp.tokens), "per_step": per_step,
                          "per_node": per_node, "per_layer": per_layer}
    sec["logits"] = {"per_step": [{"step": s.step, "position": s.position, "token": s.token,
                                   "kl": _f(s.kl), "top_f32": s.top_f32, "top_q4": s.top_q4,
                                   "same_top": s.same_top, "p_top_f32": _f(s.p_top_f32),
                                   "p_top_q4": _f(s.p_top_q4), "delta_p": _f(s.delta_p)}
                                  for s in comp.logits],
                     "summary": _clean(logit_summary(comp.logits))}
    return sec


def attention_section(data: ProfileData) -> list[dict]:
    out = []
    for m in data.attention:
        s = m.site
        out.append({"node": s.node, "full_name": s.full_name, "layer": s.layer,
                    "buffer": s.buffer, "n_head": s.n_head, "stride": s.n_positions,
                    "positions": list(m.positions),
                    # probs[h][row] = softmax over keys 0..positions[row]
                    "probs": [[[round(float(v), 6) for v in r[h]] for r in m.rows]
                              for h in range(s.n_head)]})
    return out


def report_dict(data: ProfileData) -> dict:
    meta = dict(data.meta)
    return {
        "format": FORMAT,
        "version": VERSION,
        "meta": meta,
        "run": {"prompt": list(data.prompt), "generated": list(data.generated),
                "fed": data.fed, "pieces": {str(k): v for k, v in sorted(data.pieces.items())}},
        "nodes": [{"index": n.index, "full_name": n.full_name, "name": n.name, "layer": n.layer,
                   "kind": n.kind, "target": n.target, "outputs": list(n.outputs)}
                  for n in data.nodes],
        "timing": timing_section(data),
        "instructions": instruction_section(data),
        "quant": quant_section(data),
        "attention": attention_section(data),
        "divergence": divergence_section(data),
        "sanitizer": data.sanitizer,  # None: the profile ran without --sanitize
        "gpu": data.gpu,  # None: the profile ran without --device
        "corpus": data.corpus,  # None: the profile ran without --corpus
    }


def dumps(report: dict) -> str:
    return json_text(json.dumps(_jsonable(report), sort_keys=True, indent=1, allow_nan=False,
                                ensure_ascii=False)) + "\n"


def trace_json(data: ProfileData) -> str:
    return json_text(json.dumps(trace_dict(data), ensure_ascii=False))


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return _f(x)
    return x


# -- trace.json ----------------------------------------------------------------------------
PID, TID = 1, 1


def trace_dict(data: ProfileData) -> dict:
    """Chrome Trace Event format: one "X" event per step, its nodes nested inside it."""
    family = data.meta.get("family", "model")
    engine = data.meta.get("engine", "")
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": PID, "tid": TID, "ts": 0,
         "args": {"name": f"firscope {family} ({data.meta.get('model_folder', '')})"}},
        {"name": "thread_name", "ph": "M", "pid": PID, "tid": TID, "ts": 0,
         "args": {"name": f"decode ({engine})"}},
    ]
    xs = []
    for t in data.tokens:
        piece = data.pieces.get(t.token)
        args = {"step": t.step, "token": t.token, "position": t.position}
        if piece is not None:
            args["text"] = piece
        xs.append({"name": f"step {t.step} (pos {t.position})", "cat": "token", "ph": "X",
                   "ts": _us(t.start_ns), "dur": _us(t.span_ns), "pid": PID, "tid": TID,
                   "args": args})
        for n in data.nodes:
            d = int(t.node_ns[n.index])
            if d < 0:
                continue
            xs.append({"name": n.full_name, "cat": n.kind, "ph": "X",
                       "ts": _us(t.node_start_ns[n.index]), "dur": _us(d), "pid": PID,
                       "tid": TID, "args": {"target": n.target, "layer": n.layer,
                                            "node": n.index, "step": t.step}})
    xs.sort(key=lambda e: (e["ts"], -e["dur"], e["cat"] != "token"))
    return {"traceEvents": events + xs, "displayTimeUnit": "ms",
            "otherData": {"generator": "firscope profile", "model": data.meta.get("model_path"),
                          "engine": engine}}


# -- CSV ---------------------------------------------------------------------------------------
def _cell(v):
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else
                                                  ("inf" if v > 0 else "-inf"))
    if isinstance(v, (list, tuple)):
        return "x".join(str(x) for x in v)
    if isinstance(v, str):  # names and source text from the model's files: no raw controls
        return printable(v)
    return v


def _csv(header: list[str], rows) -> str:
    f = io.StringIO(newline="")
    w = csv.writer(f)
    w.writerow(header)
    for r in rows:
        w.writerow([_cell(r.get(h)) for h in header])
    return f.getvalue()


def csv_tables(data: ProfileData, report: dict) -> dict[str, str]:
    """The tables, {file name: CSV text}; a table whose data is missing is left out."""
    files: dict[str, str] = {}
    timing = report["timing"]
    instr = report["instructions"]
    if timing is not None:
        per_node_instr = {n["index"]: n for n in instr["nodes"]} if instr else {}
        rows = []
        for r in timing["by_node"]:
            i = per_node_instr.get(r["index"], {})
            rows.append(dict(r, instr_steps=i.get("steps"), lane_steps=i.get("lane_steps"),
                             threads=i.get("threads"), simd_efficiency=i.get("simd_efficiency")))
        files["node_timing.csv"] = _csv(
            ["index", "full_name", "name", "layer", "kind", "target", "calls", "total_us",
             "mean_us", "min_us", "max_us", "share", "threads", "instr_steps", "lane_steps",
             "simd_efficiency"], rows)
        long_rows = []
        for t, durs, starts in zip(timing["steps"], timing["node_us"], timing["node_start_us"]):
            for n, d, s in zip(report["nodes"], durs, starts):
                if d is not None:
                    long_rows.append({"step": t["step"], "token": t["token"],
                                      "position": t["position"], "node": n["index"],
                                      "full_name": n["full_name"], "start_us": s, "dur_us": d})
        files["token_node_timing.csv"] = _csv(
            ["step", "token", "position", "node", "full_name", "start_us", "dur_us"], long_rows)
    q = report["quant"]
    if q["weights"]:
        files["weight_quant.csv"] = _csv(
            ["name", "decl", "layer", "tensor", "shape", "group", "count", "rmse", "max_abs",
             "mean_abs", "p95_abs", "median_abs", "p95_bucket", "median_bucket", "weight_rms",
             "scale_min", "scale_max", "scale_mean", "min_min", "min_max", "groups",
             "flat_groups"],
            [_raw_weight(w) for w in data.weights])
    if data.comparison is not None:
        files["activation_error.csv"] = _csv(
            ["step", "position", "node", "full_name", "output", "primary", "rel_l2", "max_abs",
             "cosine", "sqnr_db"],
            [a.__dict__ for a in data.comparison.activations])
        files["logits.csv"] = _csv(
            ["step", "position", "token", "kl", "top_f32", "top_q4", "same_top", "p_top_f32",
             "p_top_q4", "delta_p"],
            [dict(s.__dict__, same_top=s.same_top, delta_p=s.delta_p)
             for s in data.comparison.logits])
    if instr is not None:
        rows = []
        for k in instr["kernels"]:
            for ln in k["lines"]:
                rows.append(dict(ln, kernel=k["kernel"], instruction=ln["text"]))
        files["line_counts.csv"] = _csv(
            ["kernel", "pc", "line", "instruction", "count", "active_lanes", "warp_instructions",
             "simd_efficiency"], rows)
    if report.get("gpu"):
        files["gpu_nodes.csv"] = _csv(GPU_NODE_COLUMNS,
                                      [_gpu_row(n) for n in report["gpu"]["nodes"]])
    return files


GPU_NODE_COLUMNS = ["index", "node", "kernel", "kind", "layer", "predicted_us", "bound",
                    "memory_us", "compute_us", "latency_us", "launch_us", "lanes", "threadgroups",
                    "tg", "tgbytes", "warps", "lane_instructions", "max_lane_instructions",
                    "simd_efficiency", "flops", "sfu_ops", "bytes_read", "bytes_written",
                    "unique_bytes", "dram_bytes", "sectors_per_request", "coalescing_efficiency",
                    "advice"]


def _gpu_row(n: dict) -> dict:
    return dict(n, **{f"{t}_us": v for t, v in n["terms"].items()})


def _raw_weight(w) -> dict:
    d = dict(w.__dict__)
    d.pop("hist")
    return d
