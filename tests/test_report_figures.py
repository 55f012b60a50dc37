"""report.html (issue 26, item 16): the node-error chart names nodes and layers, the
timeline's legend groups nodes by kind, token pictures common fonts lack are replaced."""
from __future__ import annotations

import pytest

from firscope.profile import figures as F
from firscope.profile.html import _piece, _token_text, web_piece


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


@pytest.fixture
def drawn(monkeypatch):
    """The matplotlib figure each figure function drew (instead of its PNG)."""
    figs = []
    monkeypatch.setattr(F, "_png", lambda fig: figs.append(fig) or b"png")
    return figs


def quant_of(nodes):
    per_node = [{"node": n["index"], "full_name": n["full_name"], "primary": True,
                 "rel_l2_mean": 0.01 * (1 + n["index"] % 7)} for n in nodes]
    return {"activations": {"per_node": per_node, "per_layer": []}}


def test_node_error_chart_with_many_nodes_names_layers_and_the_worst_nodes(drawn):
    nodes = nodes_of(12)  # 61 bars: too many for a label each
    assert F.activation_error(quant_of(nodes), nodes) == b"png"
    ax = drawn[0].axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["-"] + [f"L{i}" for i in range(12)]  # a label per layer's run of bars
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["outside"] + [f"layer {i}" for i in range(12)]
    named = {a.get_text() for a in ax.texts}  # the worst nodes (error 0.07) are named
    assert len(named) == F.WORST_LABELLED
    assert {n["index"] % 7 for n in nodes if n["full_name"] in named} == {6}


def test_node_error_chart_with_few_nodes_names_every_bar(drawn):
    nodes = nodes_of(2)
    F.activation_error(quant_of(nodes), nodes)
    ax = drawn[0].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [n["full_name"] for n in nodes]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["outside", "layer 0",
                                                                   "layer 1"]


def test_timeline_legend_has_one_colour_per_node_kind(drawn):
    nodes = nodes_of(3)
    steps = [{"step": s, "start_us": 0.0} for s in range(2)]
    timing = {"steps": steps, "node_start_us": [[i * 10.0 for i in range(len(nodes))]] * 2,
              "node_us": [[5.0] * len(nodes)] * 2}
    F.timeline(timing, nodes)
    ax = drawn[0].axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["fir.embedding: token", "g2.layernorm: ln1",
                      "fir.linear: qkv, attention_linear", "g2.attn_decode: attention",
                      "g2.gelu_new: mlp"]
    faces = {tuple(c) for c in ax.collections[0].get_facecolors()}
    assert len(faces) == len(legend)  # bars coloured by kind: five colours, not six names


def test_token_pictures_fall_back_to_characters_every_font_has():
    assert web_piece("def␠x⏎⇥") == "def·x↵→"
    assert web_piece("␁␡") == "\\x01\\x7f"
    report = {"run": {"pieces": {"32": "␠", "10": "⏎", "100": "d"}}}
    text = _token_text(report, [100, 32, 10])
    assert "<code>d·↵</code>" in text and "␠" not in text and "⏎" not in text
    assert _piece(report, 32) == "32 <code>·</code>"
