"""report.html (issue 26, item 16): the node-error chart names nodes and layers, the
timeline's legend groups nodes by kind, token pictures common fonts lack are replaced."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from firscope.profile import figures as F
from firscope.text import printable
from firscope.profile.html import _piece, _token_text, web_piece


NS = "{http://www.w3.org/2000/svg}"


def nodes_of(n_layer: int, names=("ln1", "qkv", "attention", "attention_linear", "mlp")):
    nodes = [{"index": 0, "name": "token", "full_name": "token", "layer": None, "kind": "ext",
              "target": "fir.embedding"}]
    targets = {"ln1": "g2.layernorm", "qkv": "fir.linear", "attention": "g2.attn_decode",
               "attention_linear": "fir.linear", "mlp": "g2.gelu_new"}
    for layer in range(n_layer):
        for name in names:
            nodes.append({"index": len(nodes), "name": name, "full_name": f"{name}@{layer}",
                          "layer": layer, "kind": "micro", "target": targets[name]})
    return nodes


def parsed(svg: bytes):
    """The figure's SVG as an element tree (it must be well-formed XML)."""
    return ET.fromstring(svg)


def texts(root, cls: str) -> list[str]:
    return [t.text for t in root.iter(f"{NS}text") if t.get("class") == cls]


def quant_of(nodes):
    per_node = [{"node": n["index"], "full_name": n["full_name"], "primary": True,
                 "rel_l2_mean": 0.01 * (1 + n["index"] % 7)} for n in nodes]
    return {"activations": {"per_node": per_node, "per_layer": []}}


def test_node_error_chart_with_many_nodes_names_layers_and_the_worst_nodes():
    nodes = nodes_of(12)  # 61 bars: too many for a label each
    root = parsed(F.activation_error(quant_of(nodes), nodes))
    assert texts(root, "xtick") == ["-"] + [f"L{i}" for i in range(12)]  # per layer's run
    assert texts(root, "legend-label") == ["outside"] + [f"layer {i}" for i in range(12)]
    named = set(texts(root, "note"))  # the worst nodes (error 0.07) are named
    assert len(named) == F.WORST_LABELLED
    assert {n["index"] % 7 for n in nodes if n["full_name"] in named} == {6}


def test_node_error_chart_with_few_nodes_names_every_bar():
    nodes = nodes_of(2)
    root = parsed(F.activation_error(quant_of(nodes), nodes))
    assert texts(root, "xtick") == [n["full_name"] for n in nodes]
    assert texts(root, "legend-label") == ["outside", "layer 0", "layer 1"]
    bars = sum(p.get("d").count("z") for p in root.iter(f"{NS}path")
               if p.get("class") == "mark")
    assert bars == len(nodes)  # every bar drawn, from the foot of the log axis


def timing_of(nodes):
    steps = [{"step": s, "start_us": 0.0} for s in range(2)]
    return {"steps": steps, "node_start_us": [[i * 10.0 for i in range(len(nodes))]] * 2,
            "node_us": [[5.0] * len(nodes)] * 2}


def test_timeline_legend_has_one_colour_per_node_kind():
    nodes = nodes_of(3)
    root = parsed(F.timeline(timing_of(nodes), nodes))
    legend = texts(root, "legend-label")
    assert legend == ["fir.embedding: token", "g2.layernorm: ln1",
                      "fir.linear: qkv, attention_linear", "g2.attn_decode: attention",
                      "g2.gelu_new: mlp"]
    faces = [p.get("fill") for p in root.iter(f"{NS}path") if p.get("class") == "mark"]
    assert len(faces) == len(set(faces)) == len(legend)  # one path per kind: five colours
    bars = sum(p.get("d").count("z") for p in root.iter(f"{NS}path")
               if p.get("class") == "mark")
    assert bars == 2 * len(nodes)  # every node of both steps drawn


def test_figures_are_deterministic_escaped_svg():
    nodes = nodes_of(2)
    nodes[1]["full_name"] = "<b>&'x\x1b"
    nodes[1]["name"] = "<b>&'x"
    one = F.activation_error(quant_of(nodes), nodes)
    assert one == F.activation_error(quant_of(nodes), nodes)
    assert one.startswith(b"<svg") and b"<b>" not in one
    assert one.count(b"\x1b") == 0  # a control character is shown as an escape, not sent
    assert printable("<b>&'x\x1b") in texts(parsed(one), "xtick")  # intact as text
    assert b"<b>" not in F.timeline(timing_of(nodes), nodes)


def test_attention_mosaic_is_a_png_of_the_probabilities():
    import base64
    import zlib

    import numpy as np
    probs = [[[1.0], [0.25, 0.75]], [[1.0], [0.5, 0.5]]]
    sites = [{"positions": [0, 1], "n_head": 2, "probs": probs, "full_name": f"attention@{i}",
              "buffer": "scores"} for i in range(2)]
    root = parsed(F.attention(sites))
    assert texts(root, "ytick") == ["attention@0", "attention@1"]
    assert texts(root, "xtick") == ["head 0", "head 1"]
    (image,) = [e for e in root.iter(f"{NS}image")]
    png = base64.b64decode(image.get("href").split(",", 1)[1])
    assert png.startswith(b"\x89PNG")
    w, h = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (w, h) == (2 * 2 + 1, 2 * 2 + 1)  # two cells of 2x2 each way, a 1-pixel gap
    idat = png[png.index(b"IDAT") + 4:png.index(b"IEND") - 8]
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + 3 * w)[:, 1:]
    px = rows.reshape(h, w, 3)
    assert tuple(px[0, 1]) == (255, 255, 255)  # masked (key after query): white
    assert tuple(px[0, 0]) == (0xfd, 0xe7, 0x25)  # probability 1: viridis' top
    assert tuple(px[2, 0]) == (255, 255, 255)  # the gap between layers


def test_missing_data_draws_no_figure():
    assert F.time_by_name(None) is None and F.timeline({"steps": []}, []) is None
    assert F.attention([]) is None and F.roofline(None) is None and F.logits({}) is None


def test_token_pictures_fall_back_to_characters_every_font_has():
    assert web_piece("def␠x⏎⇥") == "def·x↵→"
    assert web_piece("␁␡") == "\\x01\\x7f"
    report = {"run": {"pieces": {"32": "␠", "10": "⏎", "100": "d"}}}
    text = _token_text(report, [100, 32, 10])
    assert "<code>d·↵</code>" in text and "␠" not in text and "⏎" not in text
    assert _piece(report, 32) == "32 <code>·</code>"


def test_tick_labels_stay_inside_the_figure():
    # the y labels of a bar chart by name once had room for 18 px only: "attention" read
    # "ation" (the margin rule treated unrotated y labels as rotated ones)
    from firscope.profile.svgplot import text_width
    rows = [{"name": n, "kind": "micro", "total_us": 10.0 * (i + 1),
             "median_calls_us": 10.0 * (i + 1), "share": 0.1}
            for i, n in enumerate(("attention_residual", "ln1", "a_rather_long_node_name"))]
    root = parsed(F.time_by_name({"by_name": rows, "by_layer": []}))
    width = float(root.get("width"))
    ticks = [t for t in root.iter(f"{NS}text") if t.get("class") == "ytick"]
    assert [t.text for t in ticks] == ["attention_residual", "ln1", "a_rather_long_node_name"]
    for t in ticks:  # anchored at their end: the start is x minus the (estimated) width
        size = float(t.get("font-size"))
        assert float(t.get("x")) - text_width(t.text, size) >= 0, t.text
        assert float(t.get("x")) <= width
