"""The profiler and its report: numbers checked against direct computations.

One CLI run (a subprocess, as a user meets it) on a tiny random model in a
folder whose name needs HTML escaping is shared by most tests; the rest run
in-process. Everything here uses independent arithmetic: the Q4 formula
and GPT-2 (tests/npgpt2.py) are recomputed from the checkpoint with
safetensors and NumPy, not with firscope's own code.
"""
from __future__ import annotations

import csv
import json
import re
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

import npgpt2
from conftest import SEED_FIR, write_random_gpt2
from model_util import firscope
from firscope.runtime import load_model
from firscope.runtime import Machine

NASTY = "m<b>&\"'x"  # a legal folder name that means something to HTML
NASTY_CONFIG = "<script>alert('x')</script>"
PROMPT = [60, 98, 62, 1, 2]  # bytes "<b>" then control bytes: token text must be escaped too
N = 3
STEPS = len(PROMPT) + N - 1


# -- independent references ------------------------------------------------------------------
def q4_reference(w: np.ndarray, group: int = 32):
    """The .fir Q4 formula on an [out, in] f32 matrix: (dequantized, scale, min) per group."""
    from firscope.model.numerics import fma_f32_numpy
    rows, cols = w.shape
    assert cols % group == 0
    g = w.reshape(rows, cols // group, group)
    lo = g.min(axis=2, keepdims=True)
    hi = g.max(axis=2, keepdims=True)
    scale = ((hi - lo) / np.float32(15)).astype(np.float32)
    scale[scale == 0] = 1
    q = np.clip(np.rint((g - lo).astype(np.float64) / scale), 0, 15).astype(np.float32)
    deq = fma_f32_numpy(q, scale, lo).reshape(rows, cols)  # q * scale + lo, rounded once
    return deq, scale[..., 0], lo[..., 0]


def log_softmax64(z):
    z = np.asarray(z, dtype=np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def oracle_logits(folder, tokens, dequantize: bool):
    """NumPy GPT-2 on the checkpoint (q4 linears replaced by the reference Q4 when asked)."""
    tensors = load_file(str(folder / "model.safetensors"))
    if dequantize:
        for name, t in list(tensors.items()):
            if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
                tensors[name] = np.ascontiguousarray(q4_reference(t.T)[0].T)
    config = json.loads((folder / "config.json").read_text())
    g = npgpt2.NumpyGPT2(tensors, config)
    return np.stack([g.step(t) for t in tokens])


# -- the shared CLI run --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli_report(tmp_path_factory):
    base = tmp_path_factory.mktemp("prof")
    folder = base / NASTY
    fir = write_random_gpt2(folder, config_extra={"model": NASTY_CONFIG})
    out = base / "out"
    t = time.perf_counter()
    p = firscope("profile", str(fir), "--tokens", ",".join(map(str, PROMPT)), "-n", str(N), "-o",
                 str(out), "--engine", "compiled", "--device", "h200", cwd=None)
    wall = time.perf_counter() - t
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    report = json.loads((out / "report.json").read_text())
    return {"folder": folder, "fir": fir, "out": out, "report": report, "wall": wall,
            "stdout": p.stdout, "stderr": p.stderr}


def test_cli_writes_every_file_and_shows_progress(cli_report):
    out = cli_report["out"]
    for name in ("report.html", "report.json", "trace.json", "node_timing.csv",
                 "token_node_timing.csv", "weight_quant.csv", "activation_error.csv",
                 "logits.csv", "line_counts.csv", "logits.npz"):
        assert (out / name).is_file(), name
        assert str(out / name) in cli_report["stdout"]
    err = cli_report["stderr"]
    for phase in ("timed run", "instrumented run", "weight quantization error",
                  "q4 vs f32 lockstep", "writing the report"):
        assert f"profile: {phase}" in err, phase
    r = cli_report["report"]
    assert r["format"] == "firscope-profile" and r["version"] == 1
    assert r["meta"]["engine_requested"] == "compiled"
    assert r["meta"]["engine"] in ("compiled", "interp")
    assert r["run"]["prompt"] == PROMPT and len(r["run"]["generated"]) == N
    assert r["run"]["fed"] == PROMPT + r["run"]["generated"][:N - 1]
    assert r["meta"]["config_model"] == NASTY_CONFIG


def test_report_json_is_stable_and_has_one_timestamp(cli_report):
    text = (cli_report["out"] / "report.json").read_text()
    r = cli_report["report"]
    assert text == json.dumps(r, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    stamps = re.findall(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", text)
    assert stamps == [r["meta"]["created"][:19]]


def test_weight_stats_match_the_checkpoint(cli_report):
    r = cli_report["report"]
    tensors = load_file(str(cli_report["folder"] / "model.safetensors"))
    rows = {w["name"]: w for w in r["quant"]["weights"]}
    assert sorted(rows) == sorted(f"{d}@{i}" for d in ("qkvw", "attnw", "fcw", "projw")
                                  for i in (0, 1))
    for name, tensor in (("qkvw@1", "transformer.h.1.attn.c_attn.weight"),
                         ("projw@0", "transformer.h.0.mlp.c_proj.weight")):
        w = tensors[tensor].T  # Conv1D [in, out] -> [out, in]
        deq, scale, lo = q4_reference(w)
        err = w.astype(np.float64) - deq.astype(np.float64)
        a = np.abs(err)
        got = rows[name]
        assert got["tensor"] == tensor and got["shape"] == list(w.shape)
        assert got["rmse"] == pytest.approx(np.sqrt(np.mean(err ** 2)), rel=1e-9)
        assert got["max_abs"] == pytest.approx(a.max(), rel=1e-9)
        assert got["median_abs"] == pytest.approx(np.median(a), rel=1e-9)
        assert got["p95_abs"] == pytest.approx(np.percentile(a, 95), rel=1e-9)
        assert got["scale_min"] == pytest.approx(scale.min()) and \
            got["scale_max"] == pytest.approx(scale.max())
        assert got["min_min"] == pytest.approx(lo.min())
        assert got["min_max"] == pytest.approx(lo.max())
        # llama.cpp's histogram: 150 buckets of |error| over [0, 0.03), and its quantile bounds
        hist = np.bincount(np.minimum((a / 0.03 * 150).astype(int), 149).ravel(), minlength=150)
        assert got["hist"] == hist.tolist()
        cum = np.cumsum(hist)
        assert got["median_bucket"] == pytest.approx((np.argmax(cum >= a.size * 0.5) + 1) * 0.0002)
        assert got["p95_bucket"] == pytest.approx((np.argmax(cum >= a.size * 0.95) + 1) * 0.0002)
        # the error of a round-to-nearest code is at most half a step
        assert got["max_abs"] <= scale.max() / 2 * (1 + 1e-5)
    # the CSV carries the same numbers
    with (cli_report["out"] / "weight_quant.csv").open() as f:
        csv_rows = {row["name"]: row for row in csv.DictReader(f)}
    assert float(csv_rows["qkvw@1"]["rmse"]) == rows["qkvw@1"]["rmse"]


def test_logits_and_kl_agree_with_an_independent_gpt2(cli_report):
    r = cli_report["report"]
    folder = cli_report["folder"]
    saved = np.load(cli_report["out"] / "logits.npz")
    fed = r["run"]["fed"]
    assert saved["tokens"].tolist() == fed
    ref_f32 = oracle_logits(folder, fed, dequantize=False)
    ref_q4 = oracle_logits(folder, fed, dequantize=True)
    np.testing.assert_allclose(saved["f32"], ref_f32, atol=2e-4)
    np.testing.assert_allclose(saved["q4"], ref_q4, atol=2e-4)
    steps = r["quant"]["logits"]["per_step"]
    assert len(steps) == STEPS
    kls = []
    for i, s in enumerate(steps):
        lf, lq = log_softmax64(saved["f32"][i]), log_softmax64(saved["q4"][i])
        kl = float(np.sum(np.exp(lf) * (lf - lq)))
        kls.append(kl)
        assert s["kl"] == pytest.approx(kl, rel=1e-9, abs=1e-15)
        assert s["kl"] == pytest.approx(float(np.sum(np.exp(log_softmax64(ref_f32[i])) * (
            log_softmax64(ref_f32[i]) - log_softmax64(ref_q4[i])))), rel=0.05)
        top = int(np.argmax(saved["f32"][i]))
        assert s["top_f32"] == top and s["top_q4"] == int(np.argmax(saved["q4"][i]))
        assert s["same_top"] == (s["top_f32"] == s["top_q4"])
        assert s["delta_p"] == pytest.approx(np.exp(lq[top]) - np.exp(lf[top]), abs=1e-12)
        assert s["kl"] > 0  # int4 changes the distribution; a zero would mean no comparison
    summary = r["quant"]["logits"]["summary"]
    assert summary["kl_mean"] == pytest.approx(np.mean(kls))
    assert summary["same_top"] == sum(s["same_top"] for s in steps)
    # the generated tokens are the q4 model's greedy choices
    gen = r["run"]["generated"]
    assert gen[0] == int(np.argmax(saved["q4"][len(PROMPT) - 1]))


def test_activation_errors_follow_the_lockstep_runs(cli_report):
    r = cli_report["report"]
    saved = np.load(cli_report["out"] / "logits.npz")
    acts = r["quant"]["activations"]
    per_step = acts["per_step"]
    head = [a for a in per_step if a["full_name"] == "head"]
    assert len(head) == STEPS
    for a in head:  # the last node's output is the logits: recompute its error from them
        q = saved["q4"][a["step"]].astype(np.float64)
        f = saved["f32"][a["step"]].astype(np.float64)
        assert a["rel_l2"] == pytest.approx(np.linalg.norm(q - f) / np.linalg.norm(f), rel=1e-9)
        assert a["max_abs"] == pytest.approx(np.abs(q - f).max(), rel=1e-9)
        assert a["cosine"] == pytest.approx(q @ f / np.linalg.norm(q) / np.linalg.norm(f))
        assert a["sqnr_db"] == pytest.approx(10 * np.log10((f @ f) / ((q - f) @ (q - f))))
    by_node = {(a["full_name"], a["output"]): a for a in acts["per_node"]}
    # nothing is quantized before the first q4 linear: exactly equal, SQNR infinite (null)
    for name in ("token", "positional", "embeddings", "ln1@0"):
        row = by_node[(name, r["nodes"][[n["full_name"] for n in r["nodes"]].index(name)]
                       ["outputs"][0])]
        assert row["rel_l2_max"] == 0 and row["cosine_min"] == 1 and row["sqnr_db"] is None
    assert by_node[("qkv_linear@0", "qkv")]["rel_l2_mean"] > 1e-3
    # every output of the attention node is compared, the first one is the primary
    att = [k for k in by_node if k[0] == "attention@1"]
    assert {o for _, o in att} == {"attn", "key_cache@1", "value_cache@1", "scores"}
    assert [x["layer"] for x in acts["per_layer"]] == [0, 1]
    assert acts["per_layer"][1]["node"] == "mlp_residual@1"


def test_timing_tables_add_up(cli_report):
    t = cli_report["report"]["timing"]
    nodes = cli_report["report"]["nodes"]
    assert len(t["steps"]) == STEPS and len(t["node_us"]) == STEPS
    assert all(len(row) == len(nodes) and all(v is not None and v > 0 for v in row)
               for row in t["node_us"])
    total = sum(map(sum, t["node_us"]))
    assert t["total_us"] == pytest.approx(total, abs=0.01 * len(nodes) * STEPS)
    assert sum(x["total_us"] for x in t["by_name"]) == pytest.approx(total, rel=1e-6)
    assert sum(x["total_us"] for x in t["by_layer"]) == pytest.approx(total, rel=1e-6)
    assert [x["layer"] for x in t["by_layer"]] == [None, 0, 1]
    assert {x["name"] for x in t["by_name"]} == {n["name"] for n in nodes}
    for s, row in zip(t["steps"], t["node_us"]):
        assert s["compute_us"] == pytest.approx(sum(row), abs=0.01 * len(row))
        assert s["span_us"] >= s["compute_us"] - 0.01
    attn = next(x for x in t["by_name"] if x["name"] == "attention")
    assert attn["calls"] == 2 * STEPS and attn["nodes"] == 2
    # microseconds: the runs took milliseconds of real time, and less than the whole CLI run
    assert 1000 < t["span_us"] < cli_report["wall"] * 1e6


def test_trace_is_chrome_trace_format_with_nested_spans(cli_report):
    trace = json.loads((cli_report["out"] / "trace.json").read_text())
    events = trace["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= set(e)
    for e in xs:
        assert {"name", "cat", "ts", "dur", "pid", "tid", "args"} <= set(e)
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
        assert e["ts"] >= 0 and e["dur"] >= 0
    tokens = [e for e in xs if e["cat"] == "token"]
    nodes = [e for e in xs if e["cat"] != "token"]
    n_nodes = len(cli_report["report"]["nodes"])
    assert len(tokens) == STEPS and len(nodes) == STEPS * n_nodes
    by_step = {e["args"]["step"]: e for e in tokens}
    eps = 1e-6
    for e in nodes:
        parent = by_step[e["args"]["step"]]
        assert parent["ts"] - eps <= e["ts"]
        assert e["ts"] + e["dur"] <= parent["ts"] + parent["dur"] + eps
    # siblings do not overlap, steps do not overlap
    for a, b in zip(tokens, tokens[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + eps
    same = sorted((e for e in nodes if e["args"]["step"] == 1), key=lambda e: e["ts"])
    for a, b in zip(same, same[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + eps
    # the same durations as report.json (microseconds)
    t = cli_report["report"]["timing"]
    first = [e for e in nodes if e["args"]["step"] == 0]
    assert sorted(e["dur"] for e in first) == sorted(t["node_us"][0])


def test_line_counts_and_simd_efficiency(cli_report):
    r = cli_report["report"]
    ins = r["instructions"]
    k = {x["kernel"]: x for x in ins["kernels"]}
    steps = len(ins["tokens"])
    assert steps == 3 and ins["tokens"] == r["run"]["fed"][:3]
    layers = 2
    # g2.add: straight-line code, every lane active, each line once per dispatch
    add = k["g2.add"]
    n_add = sum(1 for n in r["nodes"] if n["target"] == "g2.add")
    assert add["dispatches"] == n_add * steps
    assert [ln["count"] for ln in add["lines"]] == [n_add * steps] * len(add["lines"])
    # tg=1: each lane is a threadgroup, and so a warp of its own: 1 of 32 SIMD lanes busy
    assert add["simd_efficiency"] == pytest.approx(1 / 32)
    # g2.layernorm: the first loop body runs in0.size (= 64) times per dispatch
    ln = k["g2.layernorm"]
    assert ln["dispatches"] == (2 * layers + 1) * steps
    first_body = next(x for x in ln["lines"] if x["text"] == "add 1 1 2")
    assert first_body["count"] == 64 * ln["dispatches"]
    # attention: the score loop runs position + 1 times; the running-max `ifbegin` diverges
    at = k["g2.attn_decode"]
    score = next(x for x in at["lines"] if x["text"] == "mulconst 3 3 1/sqrt(headdim)")
    assert score["count"] == layers * sum(p + 1 for p in range(steps))
    assert score["active_lanes"] == 4 * score["count"]
    assert score["simd_efficiency"] == pytest.approx(1 / 32)
    inside_if = next(x for x in at["lines"] if x["text"] == "mulconst 10 3 1")
    assert inside_if["count"] <= score["count"]
    assert 0 < inside_if["active_lanes"] <= 4 * inside_if["count"]
    assert at["lane_steps"] == sum(x["active_lanes"] for x in at["lines"])
    assert at["steps"] == sum(x["count"] for x in at["lines"])
    assert at["warp_instructions"] == at["lane_steps"]  # one-lane warps (tg=1)
    assert at["simd_efficiency"] == pytest.approx(1 / 32)
    assert "utilisation" not in json.dumps(r)
    with (cli_report["out"] / "line_counts.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sum(int(x["count"]) for x in rows) == sum(x["steps"] for x in ins["kernels"])


def test_gpu_section(cli_report):
    r = cli_report["report"]
    gpu = r["gpu"]
    assert gpu["device"]["key"] == "h200" and gpu["device"]["dram_bandwidth_gbs"] == 4800
    assert gpu["position"] == len(r["run"]["fed"]) - 1
    assert len(gpu["nodes"]) == len(r["nodes"])
    need = {"node", "kernel", "kind", "lanes", "threadgroups", "tg", "tgbytes", "warps",
            "lane_instructions", "max_lane_instructions", "simd_efficiency", "flops", "sfu_ops",
            "bytes_read", "bytes_written", "unique_bytes", "sectors_per_request",
            "coalescing_efficiency", "predicted_us", "bound", "terms"}
    for n in gpu["nodes"]:
        assert need <= set(n), need - set(n)
        assert n["predicted_us"] == pytest.approx(
            max(n["terms"]["memory"], n["terms"]["compute"], n["terms"]["latency"])
            + n["terms"]["launch"])
    gelu = next(k for k in gpu["kernels"] if k["kernel"] == "g2.gelu_new")
    assert gelu["sfu_ops"] == 4 * 64 * 2  # one sigmoid per lane (mlp = 4 x 64), 2 layers
    assert all({"sectors_per_request", "coalescing_efficiency", "simd_efficiency"}
               <= set(ln) for ln in gelu["lines"])
    with (cli_report["out"] / "gpu_nodes.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [x["node"] for x in rows] == [n["full_name"] for n in r["nodes"]]
    html = (cli_report["out"] / "report.html").read_text()
    assert "GPU speed of light (predicted)" in html and 'alt="roofline"' in html


def test_attention_maps_are_the_softmax_of_each_head(cli_report, monkeypatch):
    r = cli_report["report"]
    sites = r["attention"]
    assert [s["full_name"] for s in sites] == ["attention@0", "attention@1"]
    assert all(s["buffer"] == "scores" and s["n_head"] == 4 and s["stride"] == 32 for s in sites)
    fed = r["run"]["fed"]
    # the q4 model's attention, recomputed by the NumPy GPT-2 with reference Q4 weights
    captured = []
    real = npgpt2.softmax
    monkeypatch.setattr(npgpt2, "softmax", lambda x: captured.append(real(x)) or captured[-1])
    oracle_logits(cli_report["folder"], fed, dequantize=True)
    for s in sites:
        assert s["positions"] == list(range(STEPS))
        for h in range(4):
            for pos, row in enumerate(s["probs"][h]):
                ref = captured[pos * 2 + s["layer"]][h]
                assert len(row) == pos + 1
                np.testing.assert_allclose(row, ref, atol=2e-5)


def test_html_is_self_contained_and_escaped(cli_report):
    html = (cli_report["out"] / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>")
    srcs = re.findall(r"""\bsrc\s*=\s*["']?([^"' >]*)""", html, re.I)
    hrefs = re.findall(r"""\bhref\s*=\s*["']?([^"' >]*)""", html, re.I)
    # 9 figures, and with --device the roofline and the predicted split by kernel
    assert len(srcs) == 11 and all(s.startswith("data:image/svg+xml;base64,") for s in srcs)
    assert all(h.startswith("#") for h in hrefs)
    assert "<script" not in html.lower() and "<link" not in html.lower() and "url(" not in html
    assert "@import" not in html
    # the folder name, the config's "model" and the token text "<b>" arrive escaped only
    assert NASTY not in html and "<b>&" not in html
    assert "m&lt;b&gt;&amp;&quot;&#x27;x" in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "<code>&lt;b&gt;" in html
    for section in ("Time", "Instructions", "Quantization", "Attention", "qkvw@1",
                    "attention@1", "ln2@1", "g2.attn_decode"):
        assert section in html


def test_fir_f32_run_says_there_is_no_quantization(make_model, tmp_path):
    from firscope.profile.report import profile_model, write_report
    model = load_model(make_model("f"), fir_f32=True)
    data = profile_model(model, [1, 2], 1, engine="interp", instrument_steps=1)
    files = write_report(data, tmp_path / "o")
    r = json.loads(files["report.json"].read_text())
    assert r["meta"]["fir_f32"] is True
    assert r["quant"]["available"] is False and "--fir-f32" in r["quant"]["note"]
    assert r["quant"]["weights"] == [] and r["quant"]["logits"] is None
    assert "weight_quant.csv" not in files and "logits.csv" not in files
    assert "there is no quantization to measure" in files["report.html"].read_text()
    assert r["timing"] and len(r["timing"]["steps"]) == 2


def test_profiler_on_a_session_machine_and_state_is_kept(random_model, tmp_path):
    """The TUI path: a session drives its machine node by node; export completes the profile."""
    from firscope.profile import Profiler
    from firscope.profile.report import complete_profile, write_report
    model = load_model(random_model)
    machine = Machine(model, engine="interp")
    prof = Profiler(model).attach(machine)
    for tok in (5, 6):
        machine.begin_token(tok)
        for node in model.nodes:
            machine.run_node(node)
        machine.finish_token()
    machine.begin_token(7)  # stopped in the middle of a step, as a debugger can be
    for node in model.nodes[:10]:
        machine.run_node(node)
    arena = model.arena.copy()
    data = prof.data()
    assert [t.token for t in data.tokens] == [5, 6] and all(t.ran.all() for t in data.tokens)
    complete_profile(data, model, engine="interp", instrument_steps=2)
    assert np.array_equal(model.arena, arena)  # the session's buffers are untouched
    assert data.instructions is not None and data.instructions.tokens == [5, 6]
    assert data.comparison is not None and data.comparison.tokens == [5, 6]
    for node in model.nodes[10:]:
        machine.run_node(node)
    logits = machine.finish_token().logits
    reference = Machine(load_model(random_model), engine="interp")
    reference.step(5)
    reference.step(6)
    assert np.array_equal(reference.step(7).logits, logits)
    assert len(prof.tokens) == 3 and prof.tokens[2].ran.all()  # finished after the export
    # A debugger single-steps kernels through machine.dispatch (no node hooks): such nodes
    # have no time, and a step whose last node went that way is kept when the next begins.
    from firscope.runtime.extops import EXT_IMPLS
    machine.begin_token(8)
    for node in model.nodes[:-1]:
        if node.index == 3:
            machine.dispatch(node).run()
        else:
            machine.run_node(node)
    EXT_IMPLS[model.nodes[-1].target](machine.arena, model.nodes[-1])
    machine.finish_token()
    assert len(prof.tokens) == 3
    machine.begin_token(9)
    machine.run_node(model.nodes[0])
    assert [t.token for t in prof.tokens] == [5, 6, 7, 8]
    partial = prof.tokens[3].node_ns
    assert model.nodes[3].kind == "micro" and partial[3] == -1 and partial[-1] == -1
    assert (np.delete(partial, [3, len(partial) - 1]) > 0).all()
    prof.detach(machine)
    assert not machine.hooks.per_node
    files = write_report(data, tmp_path / "tui")
    r = json.loads(files["report.json"].read_text())
    assert len(r["timing"]["steps"]) == 2
    assert r["run"]["prompt"] == [] and r["quant"]["logits"]["summary"]["steps"] == 2


def test_attention_is_found_from_kernel_operands_not_the_buffer_name(make_model):
    from firscope.profile import find_attention_sites
    text = SEED_FIR.read_text().replace(" scores", " probs")
    assert " scores" not in text
    model = load_model(make_model("r", fir_text=text))
    sites = find_attention_sites(model)
    assert [(s.full_name, s.buffer, s.n_head, s.n_positions) for s in sites] == \
        [("attention@0", "probs", 4, 32), ("attention@1", "probs", 4, 32)]


@pytest.mark.parametrize("args,msg,code", [
    (["--tokens", "1", "-n", "40"], "past n_positions 32", 1),
    (["--tokens", "1", "-n", "-1"], "argument -n: must be 0 or more", 2),  # a usage error
    (["--tokens", "1", "-o", "{file}/sub"], "cannot create the report folder", 1),
])
def test_cli_errors_are_one_line_and_early(random_model, tmp_path, args, msg, code):
    (tmp_path / "file").write_text("")
    args = [a.replace("{file}", str(tmp_path / "file")) for a in args]
    if "-o" not in args:
        args += ["-o", str(tmp_path / "out")]
    p = firscope("profile", str(random_model), "--engine", "interp", *args, cwd=None)
    assert p.returncode == code and msg in p.stderr and "Traceback" not in p.stderr
    assert "timed run" not in p.stderr  # nothing was profiled before the error


# -- robust per-node timing statistics (issue 16: the table was decided by outliers) -------------
def synthetic_profile(per_node_ns: list[list[int]], meta=None):
    """ProfileData with given node durations: per_node_ns[step][node] (ns; -1 = not run)."""
    from firscope.profile.data import NodeInfo, ProfileData, TokenTiming
    n = len(per_node_ns[0])
    nodes = [NodeInfo(i, f"n{i % 2}@{i // 2}", f"n{i % 2}", i // 2, "micro", f"k{i % 2}",
                      ("out",)) for i in range(n)]
    data = ProfileData(dict(meta or {}), nodes, {})
    for s, row in enumerate(per_node_ns):
        dur = np.array(row, dtype=np.int64)
        start = np.where(dur >= 0, np.cumsum(np.maximum(dur, 0)) - np.maximum(dur, 0), -1)
        data.tokens.append(TokenTiming(s, 7, s, start.astype(np.int64), dur))
    return data


def test_timing_stats_rank_by_median_times_calls_not_by_one_slow_call():
    # node 0: steady 100 us; node 1: usually 3 us with one 4 ms call (attention_residual@3 of
    # the issue: it topped the old total-time ranking); nodes 2, 3: steady 50 / 60 us.
    rng = np.random.default_rng(0)
    steps = []
    for s in range(12):
        steps.append([100_000 + int(rng.integers(0, 2000)), 3_000 + int(rng.integers(0, 300)),
                      50_000 + int(rng.integers(0, 1000)), 60_000 + int(rng.integers(0, 1000))])
    steps[6][1] = 4_054_000
    data = synthetic_profile(steps, meta={"warmup_steps": 1})
    st = data.timing_stats()
    assert [r.key for r in st.rows] == ["n0@0", "n1@1", "n0@1", "n1@0"]  # median x calls order
    slow = next(r for r in st.rows if r.key == "n1@0")
    col = np.array([s[1] for s in steps])
    assert slow.samples == 12 and st.steps == 12 and st.warmup_discarded == 0
    assert (slow.min_ns, slow.max_ns) == (col.min(), col.max())
    assert slow.median_ns == np.median(col) and slow.p90_ns == np.percentile(col, 90)
    assert slow.total_ns == col.sum()
    assert slow.outliers == 1 and slow.outlier_ns == 4_054_000
    assert all(r.outliers == 0 for r in st.rows if r is not slow)
    # by total time the slow node would rank first; by median x calls it is last, share small
    assert slow.total_ns > max(r.total_ns for r in st.rows if r is not slow)
    assert st.share(slow) == pytest.approx(slow.median_ns * 12 / st.cost_ns)
    assert st.share(slow) < 0.02
    assert "12 timed step(s)" in st.note() and "12 call(s)" in st.note()


def test_timing_stats_discard_one_warmup_step_unless_the_run_already_did():
    steps = [[9_000_000, 9_000_000, 9_000_000, 9_000_000]] + [[10, 20, 30, 40]] * 5
    fresh = synthetic_profile(steps).timing_stats()  # e.g. a session profile: step 0 compiles
    assert fresh.warmup_discarded == 1 and fresh.steps == 5
    assert [r.max_ns for r in fresh.rows] == [40, 30, 20, 10]
    assert "first 1 timed step(s) left out" in fresh.note()
    warmed = synthetic_profile(steps, meta={"warmup_steps": 1}).timing_stats()
    assert warmed.warmup_discarded == 0 and warmed.steps == 6  # the CLI ran its warm-up before
    assert all(r.max_ns == 9_000_000 for r in warmed.rows)
    assert "1 warm-up step(s) run and discarded" in warmed.note()
    one = synthetic_profile(steps[:1]).timing_stats()  # never discard the only step
    assert one.steps == 1 and one.rows[0].samples == 1 and one.rows[0].fence_ns is None
    assert synthetic_profile(steps).timing_stats(warmup=0).steps == 6


def test_timing_stats_by_name_pool_layers_and_skip_nodes_that_did_not_run():
    steps = [[100, 10, 300, -1], [100, 10, 300, 20], [100, 10, 300, 20]]
    st = synthetic_profile(steps).timing_stats(by="name", warmup=0)
    rows = {r.key: r for r in st.rows}
    assert rows["n0"].nodes == (0, 2) and rows["n0"].samples == 6
    assert rows["n0"].median_ns == 200 and rows["n0"].min_ns == 100 and rows["n0"].max_ns == 300
    assert rows["n1"].samples == 5 and rows["n1"].min_ns == 10  # the -1 is not a sample
    with pytest.raises(ValueError):
        synthetic_profile(steps).timing_stats(by="layer")


def test_profile_run_has_timing_stats(random_model):
    from firscope.profile.report import profile_model
    m = load_model(random_model)
    data = profile_model(m, [1, 2, 3], 2, engine="compiled", instrument_steps=0, quant=False)
    st = data.timing_stats()
    assert st.steps == len(data.tokens) == 4 and st.warmup_before == 1
    assert len(st.rows) == len(m.nodes) and all(r.samples == 4 for r in st.rows)
    assert all(r.min_ns <= r.median_ns <= r.p90_ns <= r.max_ns for r in st.rows)
    costs = [r.cost_ns for r in st.rows]
    assert costs == sorted(costs, reverse=True)
