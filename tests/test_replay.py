"""``firscope replay`` (an edited kernel judged on the original's inputs) and ``firscope cost
--baseline``. The kernels under tests/data/edits were written by hand for these tests, apart
from the code under test: an equivalent rewrite with other registers, a subtly wrong one, a
syntax error, a wider threadgroup."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import REPO, SAMPLE
from model_util import firscope

EDITS = REPO / "tests" / "data" / "edits"
TOKENS = "3,1,4"


def replay(*args):
    return firscope("replay", *args, timeout=600)


def test_an_equivalent_rewrite_with_other_registers_is_identical():
    r = replay("--kernel", EDITS / "add_regs.fir", "--tokens", TOKENS, "-n", 2)
    assert r.returncode == 0, r.stderr
    assert "25 node(s), 4 step(s)" in r.stdout
    assert "identical: every output bit for bit, no fault" in r.stdout
    assert "DIFFERS" not in r.stdout


def test_a_subtly_wrong_kernel_names_node_buffer_element_lane_and_line():
    r = replay("--kernel", EDITS / "add_wrong.fir", "--tokens", TOKENS, "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["identical"] is False
    first = doc["nodes"][0]
    assert first["node"] == "embeddings" and not first["identical"]
    out = first["steps"][0]["outputs"][0]
    assert out["buffer"] == "x" and out["first"] is not None
    assert out["lane"] == out["first"]  # g2.add: lane i stores element i
    store = (EDITS / "add_wrong.fir").read_text().split("\n")[out["line"] - 1]
    assert store.startswith("ustoref32")  # the line named is the edit's store
    assert 0 < out["max_abs"] < 1e-5 and out["b"] != out["a"]
    text = replay("--kernel", EDITS / "add_wrong.fir", "--tokens", TOKENS).stdout
    assert (f"first x[{out['first']}]" in text and
            f"stored by lane {out['lane']} at {EDITS / 'add_wrong.fir'}:{out['line']}" in text)


def test_a_syntax_error_is_positioned_in_the_file_and_exits_2():
    r = replay("--kernel", EDITS / "add_syntax.fir", "--tokens", TOKENS)
    assert r.returncode == 2
    assert f"{EDITS / 'add_syntax.fir'}:5:9: register R99 is outside 0..31" in r.stderr
    r = replay("--kernel", EDITS / "unknown_name.fir", "--tokens", TOKENS)
    assert r.returncode == 2 and "no kernel 'g2.addd' to replace; did you mean g2.add?" in r.stderr
    r = replay("--kernel", EDITS / "add_regs.fir", "--tokens", TOKENS, "--node", "nothing@*")
    assert r.returncode == 2 and "no node matching 'nothing@*'" in r.stderr


def test_a_signature_the_nodes_cannot_take_is_refused(tmp_path):
    bad = tmp_path / "sig.fir"
    bad.write_text((EDITS / "add_regs.fir").read_text().replace("in=2 out=1 size=in0,in1,out0",
                                                               "in=3 out=1 size=in0,in1,out0"))
    r = replay("--kernel", bad, "--tokens", TOKENS)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.strip()


def test_tg32_cost_before_and_after_are_what_cost_predicts_for_each_file(tmp_path):
    r = replay("--kernel", EDITS / "add_tg32.fir", "--tokens", TOKENS, "--json", "--node",
               "qkv_bias@1")
    assert r.returncode == 0, r.stderr  # a wider threadgroup computes the same bits
    node = json.loads(r.stdout)["nodes"][0]
    folder = tmp_path / "tg32"
    shutil.copytree(SAMPLE, folder)
    fir = folder / "gpt2.fir"
    text = fir.read_text()
    old = "kernel g2.add in=2 out=1 size=in0,in1,out0 threads=out0.size tg=1 tgbytes=16"
    assert old in text
    fir.write_text(text.replace(old, old.replace("tg=1", "tg=32")))
    for side, model in (("before", SAMPLE / "gpt2.fir"), ("after", fir)):
        doc = json.loads(firscope("cost", model, "--tokens", TOKENS, "--json").stdout)
        mine = next(n for n in doc["nodes"] if n["node"] == "qkv_bias@1")
        for k in ("predicted_us", "bound", "simd_efficiency", "sectors_per_request"):
            assert node["cost"][side][k] == mine[k], (side, k)
    assert node["cost"]["before"]["simd_efficiency"] < node["cost"]["after"]["simd_efficiency"]
    # cost --baseline gives the same before/after per node
    doc = json.loads(firscope("cost", fir, "--tokens", TOKENS, "--baseline", SAMPLE / "gpt2.fir",
                              "--json").stdout)
    row = next(n for n in doc["nodes"] if n["node"] == "qkv_bias@1")
    assert (row["before"], row["after"]) == (node["cost"]["before"]["predicted_us"],
                                             node["cost"]["after"]["predicted_us"])
    add = next(k for k in doc["kernels"] if k["kernel"] == "g2.add")
    assert add["nodes"] == 25 and add["ratio"] == pytest.approx(add["after"] / add["before"])
    saved = tmp_path / "base.json"
    saved.write_text(firscope("cost", SAMPLE / "gpt2.fir", "--tokens", TOKENS, "--json").stdout)
    again = json.loads(firscope("cost", fir, "--tokens", TOKENS, "--baseline", saved,
                                "--json").stdout)
    assert again["kernels"] == doc["kernels"] and again["total"] == doc["total"]
    text = firscope("cost", fir, "--tokens", TOKENS, "--baseline", SAMPLE / "gpt2.fir").stdout
    assert "per kernel" in text and "g2.add" in text and "per node" in text
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = firscope("cost", fir, "--tokens", TOKENS, "--baseline", bad)
    assert r.returncode == 1 and "not the output of firscope cost --json" in r.stderr


def test_chained_reports_the_logits_change_of_a_wrong_edit():
    r = replay("--kernel", EDITS / "ln_wrong.fir", "--tokens", "10,20,30,40,50,60", "-n", 6,
               "--chained", "--json")
    assert r.returncode == 1, r.stderr
    c = json.loads(r.stdout)["chained"]
    assert c["identical"] is False and c["same_top"] < 1.0 and c["kld_mean"] > 0
    r = replay("--kernel", EDITS / "add_regs.fir", "--tokens", TOKENS, "--chained")
    assert r.returncode == 0 and "same logits bit for bit" in r.stdout


def test_a_store_out_of_bounds_is_a_fault_with_lane_and_line():
    r = replay("--kernel", EDITS / "add_oob.fir", "--tokens", TOKENS, "--node", "qkv_bias@0")
    assert r.returncode == 1
    assert "fault: Out-of-bounds access in kernel 'g2.add' at node qkv_bias@0" in r.stdout
    assert "lane 383 stores to qkv[384] at line 8, outside qkv[0:384]" in r.stdout
    # qkv_bias reads qkv and writes it: a store one element on meets the next lane's read
    assert "Race hazard" in r.stdout
    # the whole step with the edit faults at its first g2.add: no cost after, said so
    assert "no cost after: the edited model faults" in r.stdout


def test_a_runaway_edit_and_a_store_outside_the_outputs_are_faults():
    r = replay("--kernel", EDITS / "add_runaway.fir", "--tokens", "3", "--node", "qkv_bias@0")
    assert r.returncode == 1
    assert "fault:" in r.stdout and "executed more than" in r.stdout
    assert "line 9: addconst 3 3 1" in r.stdout
    assert "no cost after: kernel g2.add runs past the instruction budget" in r.stdout
    r = replay("--kernel", EDITS / "add_stray.fir", "--tokens", "3", "--node", "qkv_bias@0")
    assert r.returncode == 1
    assert ("writes outside its outputs: scores[0] changed (384 element(s)), and scores is "
            "not an output of qkv_bias@0") in r.stdout
    assert "qkv: identical" in r.stdout  # its own output is right: the stray store is the fault
