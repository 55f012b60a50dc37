"""report.html's speed-of-light section (``profile --device``): tables and the roofline."""
from __future__ import annotations

from .html import esc, img, num, pct, table


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
    out.append(table(
        ["kernel", "nodes", "predicted µs", "share", "bound", "SIMD eff.", "sectors/request",
         "coalescing", "flop/byte"],
        [[esc(k["kernel"]), num(k["nodes"]), num(k["predicted_us"], ".2f"), pct(k["share"]),
          esc(k["bound"]), pct(k["simd_efficiency"]), num(k["sectors_per_request"], ".2f"),
          pct(k["coalescing_efficiency"]), num(k["arithmetic_intensity"], ".3g")]
         for k in gpu["kernels"]], {0, 4}))
    ranked = sorted(gpu["nodes"], key=lambda n: -n["predicted_us"])
    rows = [[esc(n["node"]), esc(n["kernel"]), num(n["predicted_us"], ".2f"), esc(n["bound"]),
             num(n["terms"]["memory"], ".3f"), num(n["terms"]["compute"], ".3f"),
             num(n["terms"]["latency"], ".3f"), num(n["terms"]["launch"], ".2f"),
             num(n["lanes"]), num(n["warps"]), pct(n["simd_efficiency"]),
             num(n["sectors_per_request"], ".2f"), pct(n["coalescing_efficiency"]),
             num(n["dram_bytes"]), esc(n["advice"])] for n in ranked]
    out.append("<details open><summary>every node, ranked by predicted time</summary>" + table(
        ["node", "kernel", "µs", "bound", "memory", "compute", "latency", "launch", "lanes",
         "warps", "SIMD eff.", "sect/req", "coalescing", "DRAM bytes", "advice"], rows,
        {0, 1, 3, 14}) + "</details>")
    for k in gpu["kernels"]:
        if not k.get("lines"):
            continue
        lines = [[num(ln["line"]), f"<code>{esc(ln['text'])}</code>", num(ln["executions"]),
                  num(ln["sectors_per_request"], ".2f"), pct(ln["coalescing_efficiency"]),
                  pct(ln["simd_efficiency"])] for ln in k["lines"]]
        out.append(f"<details><summary>{esc(k['kernel'])}: per source line</summary>"
                   + table(["line", "source", "executions", "sectors/request", "coalescing",
                            "SIMD eff."], lines, {1}) + "</details>")
    return "".join(out)
