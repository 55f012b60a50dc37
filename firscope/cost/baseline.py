"""``firscope cost A.fir --baseline B.fir`` (or a saved ``cost --json``): the price of an
edit without the UI, per kernel and per node: before (the baseline), after (A), the ratio."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import FirError
from ..fir.source import read_limited
from ..text import printable

MAX_JSON_BYTES = 256 * 1024 * 1024
CHANGED = 1e-3  # a node whose prediction moved by more than this share is listed as changed


def baseline_doc(path: str, opened_input, device, at: int | None, engine: str,
                 ids: list[int]) -> dict:
    """The baseline's ``cost --json`` document: read from a saved one, or analysed now from a
    model file on the same tokens, position and device."""
    p = Path(path)
    if p.suffix == ".json":
        raw = read_limited(p, "a saved cost --json", MAX_JSON_BYTES)
        try:
            doc = json.loads(raw)
            ok = isinstance(doc, dict) and all(isinstance(n, dict) and "node" in n and
                                                "predicted_us" in n and "kernel" in n
                                                for n in doc["nodes"])
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise FirError(f"{printable(p)}: not the output of firscope cost --json (it needs "
                           "'nodes', each with 'node', 'kernel' and 'predicted_us')")
        return doc
    from dataclasses import replace
    from .analyze import analyse_position
    other = replace(opened_input, model=str(p)).open()
    return analyse_position(other.model, device, list(ids), at, engine=engine).as_dict()


def compare(before: dict, after: dict) -> dict:
    """Per node instance and per kernel: before, after, after/before."""
    a = {n["node"]: n for n in before["nodes"]}
    nodes = []
    for n in after["nodes"]:
        b = a.get(n["node"])
        nodes.append({"node": n["node"], "kernel": n["kernel"],
                      "before": None if b is None else b["predicted_us"],
                      "after": n["predicted_us"],
                      "ratio": _ratio(b and b["predicted_us"], n["predicted_us"]),
                      "bound_before": None if b is None else b.get("bound"),
                      "bound_after": n.get("bound")})
    only_before = [n["node"] for n in before["nodes"] if n["node"] not in
                   {x["node"] for x in after["nodes"]}]
    kernels: dict[str, dict] = {}
    for side, doc in (("before", before), ("after", after)):
        for n in doc["nodes"]:
            k = kernels.setdefault(n["kernel"], {"kernel": n["kernel"], "before": 0.0,
                                                 "after": 0.0, "nodes": 0})
            k[side] += n["predicted_us"]
            if side == "after":
                k["nodes"] += 1
    for k in kernels.values():
        k["ratio"] = _ratio(k["before"], k["after"])
    tb = sum(n["predicted_us"] for n in before["nodes"])
    ta = sum(n["predicted_us"] for n in after["nodes"])
    return {"total": {"before": tb, "after": ta, "ratio": _ratio(tb, ta)},
            "kernels": sorted(kernels.values(), key=lambda k: -abs(k["after"] - k["before"])),
            "nodes": nodes, "only_in_baseline": only_before}


def _ratio(before, after):
    return after / before if before else None


def render(cmp: dict, device_name: str, position: int, top: int | None) -> str:
    t = cmp["total"]
    out = [f"predicted on {printable(device_name)}, step at position {position}: per token "
           f"{t['before']:.1f} us (baseline) -> {t['after']:.1f} us ({_r(t['ratio'])})", "",
           "per kernel"]
    rows = [("kernel", "nodes", "before us", "after us", "ratio")]
    for k in cmp["kernels"]:
        rows.append((printable(k["kernel"]), str(k["nodes"]), f"{k['before']:.2f}",
                     f"{k['after']:.2f}", _r(k["ratio"])))
    out += _table(rows)
    changed = sorted((n for n in cmp["nodes"] if n["before"] is None or
                      abs(n["after"] - n["before"]) > CHANGED * max(n["before"], 1e-9)),
                     key=lambda n: -abs(n["after"] - (n["before"] or 0.0)))
    out += ["", f"per node ({len(changed)} changed of {len(cmp['nodes'])}; the largest "
                "changes first)"]
    rows = [("node", "kernel", "before us", "after us", "ratio", "bound")]
    for n in changed[: top or None]:
        rows.append((printable(n["node"]), printable(n["kernel"]),
                     "-" if n["before"] is None else f"{n['before']:.2f}", f"{n['after']:.2f}",
                     _r(n["ratio"]), f"{n['bound_before'] or '-'} -> {n['bound_after']}"))
    out += _table(rows)
    if cmp["only_in_baseline"]:
        out.append(f"only in the baseline: {', '.join(map(printable, cmp['only_in_baseline']))}")
    return "\n".join(out)


def _r(ratio) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def _table(rows) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(r, widths))).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
