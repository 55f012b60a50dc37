"""report.html: one self-contained page (inline CSS, figures as data: URIs, no script).

Every piece of text that can come from the model (paths, names in the
model file and config, token text) goes through :func:`esc`; the only
links are in-page anchors.
"""
from __future__ import annotations

import base64
import html
import math

from ..text import printable, web_piece

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0 auto;max-width:1100px;
padding:0 1.2em 3em;color:#222;line-height:1.4}
h1{font-size:1.5em;margin:.8em 0 .2em}h2{border-bottom:2px solid #ddd;margin-top:1.8em}
h3{margin:1.2em 0 .4em}nav a{margin-right:1em}
table{border-collapse:collapse;margin:.4em 0 1em;font-size:.86em}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:right;vertical-align:top}
th{background:#f4f4f4}td.l,th.l{text-align:left}
code,td.code{font-family:ui-monospace,Menlo,Consolas,monospace;white-space:pre}
img{max-width:100%;display:block;margin:.5em 0}
.note{background:#fff6d5;border-left:4px solid #e0b000;padding:.4em .8em}
.muted{color:#777}.bar{background:#8172b3;height:.7em;display:inline-block}
details{margin:.4em 0}summary{cursor:pointer}
.advice{display:inline-block;min-width:22em;max-width:40em;white-space:normal}
"""


def esc(x) -> str:
    """HTML-escaped, with control characters shown as escapes (``cat report.html`` on a
    terminal must not run what a model file smuggled into a name)."""
    return html.escape(printable("" if x is None else x), quote=True)


def num(v, fmt: str = ".4g") -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float) and not math.isfinite(v):
        return "∞" if v > 0 else ("−∞" if v < 0 else "NaN")
    return format(v, fmt)


def pct(v) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def img(picture: bytes | None, alt: str) -> str:
    """A figure (SVG or PNG bytes) as a data: URI image: a picture in an img element runs no
    script and fetches nothing."""
    if not picture:
        return ""
    kind = "svg+xml" if b"<svg" in picture[:512] else "png"
    b64 = base64.b64encode(picture).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/{kind};base64,{b64}">'


def table(header: list[str], rows: list[list[str]], left: set[int] = frozenset()) -> str:
    """``rows`` hold HTML already escaped; ``left`` are column indexes aligned left."""
    th = "".join(f'<th class="{"l" if i in left else ""}">{esc(h)}</th>'
                 for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i in left else ""}">{c}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _token_text(report: dict, ids: list[int]) -> str:
    pieces = report["run"]["pieces"]
    if not ids:
        return '<span class="muted">(none)</span>'
    if pieces:
        text = web_piece("".join(pieces.get(str(i), f"[{i}]") for i in ids))
        return f"<code>{esc(text)}</code> <span class='muted'>{esc(ids)}</span>"
    return f"<code>{esc(ids)}</code>"


def _piece(report: dict, token) -> str:
    p = report["run"]["pieces"].get(str(token))
    return f"{esc(token)} <code>{esc(web_piece(p))}</code>" if p is not None else esc(token)


def render_html(report: dict, figs: dict[str, bytes | None], files: list[str] = ()) -> str:
    meta = report["meta"]
    title = f"firscope profile: {meta.get('family', '')} ({meta.get('model_folder', '')}/" \
            f"{meta.get('model_file', '')})"
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{esc(title)}</h1>",
             "<nav><a href='#summary'>Summary</a><a href='#time'>Time</a>"
             "<a href='#instructions'>Instructions</a>"
             + ("<a href='#gpu'>GPU</a>" if report.get("gpu") else "")
             + "<a href='#quant'>Quantization</a>"
             + ("<a href='#corpus'>Corpus</a>" if report.get("corpus") else "")
             + "<a href='#attention'>Attention</a>"
             + ("<a href='#divergence'>Divergence</a>" if report.get("divergence") else "")
             + ("<a href='#sanitizer'>Sanitizer</a>" if report.get("sanitizer") is not None
                else "") + "<a href='#files'>Files</a></nav>"]
    parts.append(_summary(report))
    parts.append(_divergence(report))
    parts.append(_time(report, figs))
    parts.append(_instructions(report, figs))
    parts.append(gpu_section(report, figs))
    parts.append(_quant(report, figs))
    if report.get("corpus"):
        parts.append(_corpus(report["corpus"], figs))
    parts.append(_attention(report, figs))
    if report.get("sanitizer") is not None:
        parts.append(_sanitizer(report["sanitizer"]))
    parts.append(_files(files))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _summary(report: dict) -> str:
    meta = report["meta"]
    run = report["run"]
    t = report["timing"]
    q = report["quant"]
    rows = [
        ("model file", f"<code>{esc(meta.get('model_path'))}</code>"),
        ("family (model file)", esc(meta.get("family"))),
        ("config 'model'", esc(meta.get("config_model"))) if meta.get("config_model") else None,
        ("weights", "f32 (--fir-f32)" if meta.get("fir_f32")
         else f"q4, group {esc(meta.get('group'))}, {num(meta.get('q4_weights'))} q4 weights, "
              f"{num(meta.get('q4_bytes'))} bytes"),
        ("layers / nodes", f"{num(meta.get('layers'))} / {num(meta.get('nodes'))}"),
        ("engine (timed run)", esc(meta.get("engine")) + (
            f" <span class='muted'>(requested {esc(meta.get('engine_requested'))}: not "
            f"available)</span>" if meta.get("engine_requested") not in (None, meta.get("engine"))
            else "")),
        ("prompt", _token_text(report, run["prompt"])),
        ("generated", _token_text(report, run["generated"])),
        ("created", esc(meta.get("created"))),
    ]
    if t:
        rows.append(("steps timed", f"{num(len(t['steps']))}, {num(t['span_us'] / 1000, '.2f')} ms"
                     f" in all, {num(t['steps_per_s'], '.2f')} steps/s"))
    if q["available"] and q["weight_totals"]:
        wt = q["weight_totals"]
        rows.append(("weight error (all q4)", f"rmse {num(wt['rmse'])}, max {num(wt['max_abs'])}"))
    if q["available"] and q.get("logits") and q["logits"]["summary"]:
        s = q["logits"]["summary"]
        rows.append(("logits vs f32", f"mean KL {num(s['kl_mean'])} nats, same top-1 "
                     f"{pct(s['same_top_ratio'])}, RMS Δp {pct(s['delta_p_rms'])}"))
    body = table(["", ""], [[f"<b>{esc(k)}</b>", v] for k, v in (r for r in rows if r)], {0, 1})
    notes = "".join(f"<p class='note'>{esc(n)}</p>" for n in meta.get("notes") or [])
    return f"<h2 id='summary'>Summary</h2>{body}{notes}"


def _time(report: dict, figs) -> str:
    t = report["timing"]
    out = ["<h2 id='time'>Time</h2>"]
    if not t:
        out.append("<p class='note'>No timed steps in this profile.</p>")
        return "".join(out)
    kinds = ", ".join(f"{esc(k['kind'])} {num(k['median_calls_us'] / 1000, '.3f')} ms "
                      f"({pct(k['share'])})" for k in t["by_kind"])
    out.append(f"<p>{num(len(t['steps']))} steps; time inside nodes, as median call × calls "
               f"per node (the figure of every chart, share and table below: one preempted "
               f"call cannot move it far): {num(t['median_calls_us'] / 1000, '.3f')} ms "
               f"({kinds}); measured total {num(t['total_us'] / 1000, '.3f')} ms; wall span "
               f"{num(t['span_us'] / 1000, '.3f')} ms. Times are per node as the runtime measured "
               f"them (<code>time.perf_counter</code> around each node).</p>")
    for key, alt in (("time_by_name", "time per node name"), ("time_by_layer", "time per layer"),
                     ("timeline", "timeline"), ("time_per_step", "time per step")):
        out.append(img(figs.get(key), alt))
    ranked = t["ranked"]
    header = ["node", "kind", "op / kernel", "calls", "min µs", "median µs", "p90 µs", "max µs",
              "median×calls ms", "share", "outliers"]
    rows = [_ranked_row(r) for r in ranked["node"]]
    out.append("<h3>Nodes ranked by median × calls</h3>" + table(header, rows[:20], {0, 1, 2}))
    if len(rows) > 20:
        out.append(f"<details><summary>all {len(rows)} nodes</summary>"
                   f"{table(header, rows, {0, 1, 2})}</details>")
    out.append(f"<p class='note'>{esc(ranked['node_note'])}</p>")
    out.append("<h3>By node name (all layers)</h3>" + table(
        ["name"] + header[1:], [_ranked_row(r) for r in ranked["name"]], {0, 1, 2}))
    out.append(f"<p class='note'>{esc(ranked['name_note'])}</p>")
    out.append("<h3>By layer</h3>" + table(
        ["layer", "median×calls ms", "share", "measured total ms"],
        [["outside layers" if r["layer"] is None else num(r["layer"]),
          num(r["median_calls_us"] / 1000, ".3f"), pct(r["share"]),
          num(r["total_us"] / 1000, ".3f")] for r in t["by_layer"]], {0}))
    return "".join(out)


def _ranked_row(r: dict) -> list[str]:
    outliers = (f"{r['outliers']} ({num(r['outlier_us'] / 1000, '.3f')} ms)"
                if r["outliers"] else "")
    return [esc(r["key"]), esc(r["kind"]), esc(r["target"]), num(r["calls"]),
            num(r["min_us"], ".1f"), num(r["median_us"], ".1f"), num(r["p90_us"], ".1f"),
            num(r["max_us"], ".1f"), num(r["cost_ms"], ".3f"), pct(r["share"]), outliers]


def _divergence(report: dict) -> str:
    d = report.get("divergence")
    if not d:
        return ""
    out = ["<h2 id='divergence'>Divergence</h2>",
           f"<p>Against <code>{esc(d['other'])}</code>"
           + (f" (written by {esc(d['producer'])})" if d.get("producer") else "")
           + f"; tolerance: {esc(d['tolerance'])}.</p>",
           f"<p class='first'><b>{esc(d['first'])}</b></p>"]
    out += [f"<p class='note'>{esc(n)}</p>" for n in d["notes"]]
    rows = [[esc(r["output"]), num(r["steps"]), num(r["max_abs"]), num(r["rel_l2"]),
             num(r["max_ulp"]), esc(r["status"]),
             "" if r["step"] is None else f"{num(r['step'])} [{num(r['index'])}]",
             "" if r["lane"] is None else num(r["lane"])] for r in d["rows"]]
    out.append(table(["node output", "steps", "max abs", "rel L2", "max ULP", "status",
                      "first differing (step [index])", "lane"], rows, {0, 5}))
    if d["mismatches"]:
        out.append("<h3>Dump keys that match nothing in this model</h3>" + table(
            ["key", "problem"], [[esc(m["key"]), esc(m["problem"])] for m in d["mismatches"]],
            {0, 1}))
    return "".join(out)


def _instructions(report: dict, figs) -> str:
    ins = report["instructions"]
    out = ["<h2 id='instructions'>Instructions</h2>"]
    if not ins:
        out.append("<p class='note'>No instrumented run in this profile (line counts come from "
                   "the step interpreter).</p>")
        return "".join(out)
    out.append(f"<p>Counts from {num(len(ins['tokens']))} step(s) on the {esc(ins['engine'])} "
               "engine, from position 0. One count is one instruction issued for all active "
               "lanes of a dispatch; SIMD efficiency is active lane-instructions over the warp "
               "instructions a GPU would issue (warps of 32 lanes inside each threadgroup) x 32: "
               "a one-lane kernel is 1/32.</p>")
    out.append(img(figs.get("instructions"), "instructions per kernel"))
    out.append(table(["kernel", "line", "nodes", "dispatches", "instructions", "lane-instructions",
                      "SIMD efficiency"],
                     [[esc(k["kernel"]), num(k["line"]), num(k["nodes"]), num(k["dispatches"]),
                       num(k["steps"]), num(k["lane_steps"]), pct(k["simd_efficiency"])]
                      for k in ins["kernels"]], {0}))
    for k in ins["kernels"]:
        top = max((ln["count"] for ln in k["lines"]), default=0) or 1
        rows = [[num(ln["pc"]), num(ln["line"]),
                 f"<code>{'  ' * ln['depth']}{esc(ln['text'])}</code>", num(ln["count"]),
                 num(ln["active_lanes"]), pct(ln["simd_efficiency"]),
                 f"<span class='bar' style='width:{100 * ln['count'] / top:.1f}px'></span>"]
                for ln in k["lines"]]
        out.append(f"<details><summary>{esc(k['kernel'])}: counts per line</summary>"
                   + table(["pc", "line", "instruction", "count", "active lanes", "SIMD eff.",
                            ""], rows, {2, 6}) + "</details>")
    return "".join(out)


def gpu_section(report: dict, figs) -> str:
    gpu = report.get("gpu")
    if not gpu:
        return ""
    dev = gpu["device"]
    out = ["<h2 id='gpu'>GPU speed of light (predicted)</h2>",
           f"<p class='note'>Predicted, not measured: the step at position {num(gpu['position'])} "
           f"costed on <b>{esc(dev['name'])}</b> from the interpreter's recorded execution "
           "(warps of "
           f"{num(dev['simd_width'])} lanes per threadgroup, 32-byte sectors per warp request). "
           "Per node: max(memory, compute, latency) + launch overhead; see "
           "docs/cost-model.md for what the model ignores.</p>",
           f"<p>Predicted per token: <b>{num(gpu['predicted_us_per_token'], '.1f')} µs</b> "
           f"({num(gpu['tokens_per_s'], '.0f')} tokens/s).</p>",
           img(figs.get("gpu_split"), "predicted time per token by kernel"),
           img(figs.get("roofline"), "roofline")]
    advice = _kernel_advice(gpu["nodes"])
    out.append(table(
        ["kernel", "nodes", "predicted µs", "share", "bound", "SIMD eff.", "sectors/request",
         "coalescing", "B/sector", "flop/byte", "live R/U", "regs/lane", "occupancy",
         "limiter", "advice"],
        [[esc(k["kernel"]), num(k["nodes"]), num(k["predicted_us"], ".2f"), pct(k["share"]),
          esc(k["bound"]), pct(k["simd_efficiency"]), num(k["sectors_per_request"], ".2f"),
          pct(k["coalescing_efficiency"]), num(k.get("bytes_per_sector"), ".0f"),
          num(k["arithmetic_intensity"], ".3g"), *_occupancy_cells(k),
          f"<span class='advice'>{esc(advice.get(k['kernel'], ''))}</span>"]
         for k in gpu["kernels"]], {0, 4, 13, 14}))
    out.append(_priced_advice(gpu.get("advice") or []))
    # every node: the top rows shown, the rest one click away; no advice per row (it is the
    # kernel's, above): 61 rows of advice squeezed to 8 characters were 16 lines each
    ranked = sorted(gpu["nodes"], key=lambda n: -n["predicted_us"])
    rows = [[esc(n["node"]), esc(n["kernel"]), num(n["predicted_us"], ".2f"), esc(n["bound"]),
             num(n["terms"]["memory"], ".3f"), num(n["terms"]["compute"], ".3f"),
             num(n["terms"]["latency"], ".3f"), num(n["terms"]["launch"], ".2f"),
             num(n["lanes"]), num(n["warps"]), pct(n["simd_efficiency"]),
             num(n["sectors_per_request"], ".2f"), pct(n["coalescing_efficiency"]),
             num(n["dram_bytes"])] for n in ranked]
    header = ["node", "kernel", "µs", "bound", "memory µs", "compute µs", "latency µs",
              "launch µs", "lanes", "warps", "SIMD eff.", "sect/req", "coalescing",
              "DRAM bytes"]
    top = min(TOP_NODES, len(rows))
    out.append(f"<h3>The {top} slowest of {len(rows)} nodes</h3>"
               + table(header, rows[:top], {0, 1, 3}))
    if len(rows) > top:
        out.append(f"<details><summary>every node ({len(rows)}), ranked by predicted time"
                   "</summary>" + table(header, rows, {0, 1, 3}) + "</details>")
    for k in gpu["kernels"]:
        if not k.get("lines"):
            continue
        lines = [[num(ln["line"]), f"<code>{esc(ln['text'])}</code>", num(ln["executions"]),
                  pct(ln.get("active_lane_share")), num(ln["sectors_per_request"], ".2f"),
                  pct(ln["coalescing_efficiency"]), pct(ln["simd_efficiency"]),
                  pct(ln.get("time_share")),
                  f"{ln.get('live_r', '-')}/{ln.get('live_u', '-')}"] for ln in k["lines"]]
        out.append(f"<details><summary>{esc(k['kernel'])}: per source line</summary>"
                   + table(["line", "source", "executions", "active lanes", "sectors/request",
                            "coalescing", "SIMD eff.", "share of time", "live R/U"],
                           lines, {1}) + "</details>")
    return "".join(out)


def _occupancy_cells(k: dict) -> list[str]:
    occ = k.get("occupancy")
    if not occ:
        return ["-", "-", "-", "-"]
    return [f"{k['max_live_r']}/{k['max_live_u']}", num(occ["registers_per_lane"]),
            pct(occ["theoretical_occupancy"]), esc(occ["limiter"])]


def _priced_advice(advice: list[dict]) -> str:
    """The advice ranked by the time it would save per token, each with its price."""
    if not advice:
        return ""
    rows = [[esc(a["kernel"]), f"<span class='advice'>{esc(a['text'])}</span>",
             num(a["predicted_us"], ".2f"),
             "-" if a["predicted_us_after"] is None else num(a["predicted_us_after"], ".2f"),
             "-" if a["saving_us_per_token"] is None else num(a["saving_us_per_token"], ".2f"),
             esc(a["not_computed"] or "")] for a in advice]
    return ("<h3>Advice, ranked by the time it would save per token</h3>"
            + table(["kernel", "advice", "µs now", "µs after", "saves µs", "not computed"],
                    rows, {0, 1, 5}))


TOP_NODES = 8  # GPU rows shown before the collapsed table of every node


def _kernel_advice(nodes: list[dict]) -> dict[str, str]:
    """The advice most of a kernel's predicted time carries, per kernel."""
    weight: dict[str, dict[str, float]] = {}
    for n in nodes:
        acc = weight.setdefault(n["kernel"], {})
        acc[n["advice"]] = acc.get(n["advice"], 0.0) + n["predicted_us"]
    return {k: max(acc, key=acc.get) for k, acc in weight.items()}


def _quant(report: dict, figs) -> str:
    q = report["quant"]
    out = ["<h2 id='quant'>Quantization</h2>"]
    if q.get("note"):
        out.append(f"<p class='note'>{esc(q['note'])}</p>")
    if not q["available"]:
        return "".join(out)
    if q["weights"]:
        wt = q["weight_totals"]
        out.append("<h3>Weights</h3><p>error = original f32 weight (checkpoint, [out, in]) − "
                   "dequantized q4. Quantiles are exact (NumPy); the columns marked &lt; are "
                   "llama.cpp quantize-stats' histogram bounds (150 buckets over [0, "
                   f"{num(wt['hist_range'])})).</p>")
        out.append(table(["", "weights", "elements", "rmse", "max |err|", "mean |err|", "95% <",
                          "median <"],
                         [[esc("all q4"), num(wt["weights"]), num(wt["count"]), num(wt["rmse"]),
                           num(wt["max_abs"]), num(wt["mean_abs"]), num(wt["p95_bucket"]),
                           num(wt["median_bucket"])]] +
                         [[esc(d["decl"]), num(d["weights"]), num(d["count"]), num(d["rmse"]),
                           num(d["max_abs"]), num(d["mean_abs"]), num(d["p95_bucket"]),
                           num(d["median_bucket"])] for d in q["weights_by_decl"]], {0}))
        out.append(img(figs.get("weight_error"), "weight error"))
        rows = [[esc(w["name"]), esc("×".join(str(s) for s in w["shape"])), num(w["rmse"]),
                 num(w["max_abs"]), num(w["p95_abs"]), num(w["median_abs"]),
                 num(w["p95_bucket"]), num(w["median_bucket"]), num(w["weight_rms"]),
                 f"{num(w['scale_min'])} … {num(w['scale_max'])}",
                 f"{num(w['min_min'])} … {num(w['min_max'])}", num(w["flat_groups"])]
                for w in q["weights"]]
        out.append("<details open><summary>per weight</summary>" + table(
            ["weight", "[out×in]", "rmse", "max |err|", "p95 |err|", "median |err|", "95% <",
             "median <", "rms(w)", "scale range", "min range", "flat groups"], rows, {0, 1, 9, 10})
            + "</details>")
    acts = q.get("activations")
    if acts:
        out.append("<h3>Activations</h3><p>The same tokens through an f32 shadow model in "
                   "lockstep; every node output of the q4 run compared with the f32 one right "
                   "after both ran the node (errors accumulate along the graph).</p>")
        out.append(img(figs.get("activation_error"), "activation error per node"))
        rows = [[esc(r["full_name"]), esc(r["output"]), num(r["rel_l2_mean"]),
                 num(r["rel_l2_max"]), num(r["max_abs"]), num(r["cosine_min"], ".6f"),
                 num(r["sqnr_db"], ".1f")] for r in acts["per_node"]]
        out.append("<details><summary>per node output</summary>" + table(
            ["node", "output", "rel L2 mean", "rel L2 max", "max |err|", "min cosine",
             "SQNR dB"], rows, {0, 1}) + "</details>")
        if acts["per_layer"]:
            out.append("<p>Per layer (output of the layer's last node):</p>" + table(
                ["layer", "node", "rel L2 mean", "min cosine", "SQNR dB"],
                [[num(r["layer"]), esc(r["node"]), num(r["rel_l2_mean"]),
                  num(r["cosine_min"], ".6f"), num(r["sqnr_db"], ".1f")]
                 for r in acts["per_layer"]], {1}))
    lg = q.get("logits")
    if lg and lg["summary"]:
        s = lg["summary"]
        out.append("<h3>Logits</h3><p>KL(P_f32 ‖ P_q4) in nats per step; Δp = P_q4 − P_f32 of "
                   "the f32 top token (as llama-perplexity --kl-divergence reports).</p>")
        out.append(table(["steps", "mean KL", "median KL", "99% KL", "max KL", "same top-1",
                          "mean Δp", "RMS Δp"],
                         [[num(s["steps"]), num(s["kl_mean"]), num(s["kl_median"]),
                           num(s["kl_p99"]), num(s["kl_max"]), pct(s["same_top_ratio"]),
                           pct(s["delta_p_mean"]), pct(s["delta_p_rms"])]]))
        out.append(img(figs.get("logits"), "logit divergence"))
        rows = [[num(r["step"]), num(r["position"]), _piece(report, r["token"]), num(r["kl"]),
                 _piece(report, r["top_f32"]), _piece(report, r["top_q4"]),
                 num(r["same_top"]), num(r["p_top_f32"]), num(r["p_top_q4"]),
                 num(r["delta_p"])] for r in lg["per_step"]]
        out.append("<details><summary>per step</summary>" + table(
            ["step", "pos", "fed token", "KL", "f32 top", "q4 top", "same", "P_f32(top)",
             "P_q4(top)", "Δp"], rows, {2, 4, 5}) + "</details>")
    return "".join(out)


def _corpus(c: dict, figs) -> str:
    """``profile --corpus``: the eval figures of the all-q4 model and the sensitivity table."""
    s = c["all_q4"]
    out = ["<h2 id='corpus'>Quantization over a corpus</h2>",
           f"<p>{esc(c['corpus'])}: {num(c['chunks'])} chunk(s) of {num(c['ctx'])} tokens, "
           f"{num(s['tokens'])} scored, every q4 weight q4 against every weight f32 "
           "(figures as <code>firscope eval</code> and llama-perplexity define them, "
           "docs/quant.md).</p>"]
    for note in c.get("notes", []):
        out.append(f"<p class='note'>{esc(note)}</p>")
    out.append(table(["PPL(q4)", "PPL(f32)", "ln(PPL ratio)", "mean KLD", "median KLD",
                      "99% KLD", "max KLD", "RMS Δp", "same top 1"],
                     [[f"{num(s['ppl_q'])} ± {num(s['ppl_q_err'], '.2g')}",
                       f"{num(s['ppl_base'])} ± {num(s['ppl_base_err'], '.2g')}",
                       f"{num(s['ln_ppl_ratio'])} ± {num(s['ln_ppl_ratio_err'], '.2g')}",
                       f"{num(s['kld_mean'])} ± {num(s['kld_mean_err'], '.2g')}",
                       num(s["kld_median"]), num(s["kld_p99"]), num(s["kld_max"]),
                       pct(s["dp_rms"]), pct(s["same_top"])]]))
    out.append("<h3>Sensitivity per weight</h3><p>alone: mean KLD with only this weight q4; "
               "recovered: with only this weight f32 (gain = all-q4 KLD − recovered); w err: "
               "relative L2 error of its q4 form; imp err: the same weighted by the mean x² "
               "of each input channel over the corpus (llama-imatrix's importance).</p>")
    out.append(img(figs.get("sensitivity"), "sensitivity per layer"))
    rows = [[num(i + 1), esc(w["name"]), esc(w["q4_form"]), num(w["alone"]),
             num(w["recovered"]), num(w["gain"]), num(w["q4_bytes"]), num(w["f32_bytes"]),
             num(w["weight_err"]), num(w["weighted_err"])]
            for i, w in enumerate(c["weights"])]
    out.append(table(["rank", "weight", "q4 form", "alone KLD", "recovered", "gain", "q4 B",
                      "f32 B", "w err", "imp err"], rows, {1, 2}))
    return "".join(out)


def _attention(report: dict, figs) -> str:
    out = ["<h2 id='attention'>Attention</h2>"]
    sites = report["attention"]
    if not sites:
        out.append("<p class='note'>No attention probabilities were captured (no node stores "
                   "into an n_head × n_positions buffer holding softmax rows).</p>")
        return "".join(out)
    s0 = sites[0]
    out.append(f"<p>Read after each attention node from its operand "
               f"<code>{esc(s0['buffer'])}</code>: head h's probabilities at "
               f"[h·{num(s0['stride'])} + 0..position]. Rows are query positions "
               f"{num(min(s0['positions']))}..{num(max(s0['positions']))}.</p>")
    out.append(img(figs.get("attention"), "attention per layer and head"))
    out.append("<p>Nodes: " + ", ".join(f"<code>{esc(s['full_name'])}</code>" for s in sites)
               + "</p>")
    return "".join(out)


def _sanitizer(san: dict) -> str:
    """``profile --sanitize``: every finding, and which kernels the lane analysis proved."""
    n = san["errors"]
    out = [f"<h2 id='sanitizer'>Sanitizer</h2><p>Tools {esc(', '.join(san['tools']))}: "
           f"<b>ERROR SUMMARY: {num(n)} error{'s' if n != 1 else ''}</b> "
           f"({num(san['dispatches'])} dispatches, {num(san['instrumented'])} instrumented).</p>"]
    if san["findings"]:
        rows = [[esc(f["tool"]), esc(f["kind"]), esc(f["kernel"] or "(ext node)"), esc(f["node"]),
                 num(f["step"]), esc(", ".join(str(x) for x in f["lines"])),
                 esc(", ".join(str(x) for x in f["lanes"])),
                 esc(f"{f['region']}[{f['index']}]"), num(f["count"]), esc(f["confirmed"])]
                for f in san["findings"]]
        out.append(table(["tool", "kind", "kernel", "node", "step", "lines", "lanes", "element",
                          "accesses", "lane orders"], rows, {0, 1, 2, 3, 5, 6, 7, 9}))
    rows = [[esc(k["kernel"]), esc(k["race"]), esc(k["memory"]), num(k["nodes"]),
             esc(k["reason"])] for k in san["kernels"]]
    out.append("<h3>Kernels</h3><p>race <i>proven</i>: the lane analysis shows no two lanes "
               "share a written element, so racecheck does not instrument it.</p>"
               + table(["kernel", "race", "bounds", "nodes", "why checked at run time"], rows,
                       {0, 1, 2, 4}))
    return "".join(out)


def _files(files: list[str]) -> str:
    items = "".join(f"<li><code>{esc(f)}</code></li>" for f in files)
    return (f"<h2 id='files'>Files</h2><p>Beside this page: </p><ul>{items}</ul>"
            "<p class='muted'>trace.json opens in Perfetto (ui.perfetto.dev) and "
            "chrome://tracing.</p>")
