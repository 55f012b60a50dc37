"""``firscope capture``: a node at a step cut out as a test case folder (issue 25)."""
from __future__ import annotations

import numpy as np
import pytest

from firscope.cli import main
from firscope.compare import Dump
from firscope.compare.capture import capture
from firscope.model.checkpoint import SafetensorsFile
from firscope.runtime import Machine, load_model

from test_isolate import BUGS, buggy, dump_of

TOKENS = [3, 1, 4, 1, 5]
STEP = 3


def _reference_outputs(model, node_name, step, tokens=TOKENS):
    """The node's outputs in a plain run of the reference, right after it ran at ``step``."""
    got = {}
    m = Machine(model, engine="compiled")

    def after(machine, node, seconds):
        if node.full_name == node_name and machine.position == step:
            got.update({o.name: model.view(o.region).copy() for o in node.outs})
    m.hooks.after_node.append(after)
    m.reset()
    for t in tokens[: step + 1]:
        m.step(t)
    return got


def _run_case(folder, **kw):
    case = load_model(folder / "gpt2.fir", **kw)
    m = Machine(case, engine="compiled")
    m.reset()
    m.step(0)
    node = case.nodes[-1]
    return {o.name: case.view(o.region).copy() for o in node.outs}


def _one_per_kernel(model):
    seen = {}
    for n in model.nodes:
        seen.setdefault(n.target, n.full_name)
    return seen


def test_every_kernel_and_an_ext_node_round_trip_bit_for_bit(sample_fir, tmp_path):
    model = load_model(sample_fir)
    picks = _one_per_kernel(model)  # g2.add, g2.layernorm, g2.attn_decode, g2.gelu_new, ...
    assert {"g2.attn_decode", "g2.gelu_new", "g2.layernorm", "g2.add", "fir.linear",
            "fir.embedding"} <= set(picks)
    for kernel, name in picks.items():
        want = _reference_outputs(model, name, STEP)
        c = capture(model, name, STEP, TOKENS, tmp_path / kernel)
        got = _run_case(tmp_path / kernel)
        assert set(got) == set(want), kernel
        for buf, values in want.items():
            assert np.array_equal(got[buf].view(np.uint32), values.view(np.uint32)), \
                (kernel, buf)
            assert np.array_equal(c.expected[buf], values)
        exp = Dump(tmp_path / kernel / "expected.safetensors")
        node = name.partition("@")[0]
        for buf, values in want.items():
            assert np.array_equal(exp.read(f"step0/{node}/{buf}"), values)
        exp.close()


def test_a_case_runs_checks_and_diffs_clean_from_the_cli(sample_fir, tmp_path, capsys):
    folder = tmp_path / "case"
    assert main(["capture", str(sample_fir), "--node", "attention@1", "--step", "2",
                 "--tokens", "3,1,4", "-o", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "captured attention@1 (micro g2.attn_decode) at step 2" in out
    assert {p.name for p in folder.iterdir()} >= {"gpt2.fir", "config.json", "README",
                                                  "model.safetensors", "expected.safetensors"}
    readme = (folder / "README").read_text()
    assert "attention@1" in readme and "step 2" in readme and "g2.attn_decode" in readme
    fir = folder / "gpt2.fir"
    assert fir.read_text().count("\nnode ") == 5  # four loads (caches, scores, attn), the node
    assert main(["check", str(fir)]) == 0
    assert main(["run", str(fir), "--tokens", "0", "-n", "0"]) == 0
    capsys.readouterr()
    assert main(["diff", str(fir), "--against", str(folder / "expected.safetensors")]) == 0
    assert "first divergence: none" in capsys.readouterr().out
    # a case is written into a new (or empty) folder only: nothing is overwritten
    before = fir.read_bytes()
    assert main(["capture", str(sample_fir), "--node", "gelu@0", "-o", str(folder)]) == 2
    assert "the folder is not empty" in capsys.readouterr().err
    assert fir.read_bytes() == before


def test_against_a_buggy_dump_the_case_holds_the_buggy_inputs(random_model, tmp_path):
    dump = dump_of(buggy(random_model), tmp_path / "two.safetensors", tokens=TOKENS)
    model = load_model(random_model)
    d = Dump(dump)
    # gelu@0 at step 2 reads fc, which fc_bias@0 wrote: the other run's (buggy-chain) value
    c = capture(model, "gelu@0", 2, TOKENS, tmp_path / "gelu", against=dump)
    theirs_in = d.read("step2/fc_bias@0/fc")
    ours_in = _node_input(model, "gelu@0", 2, "fc")
    assert not np.array_equal(theirs_in, ours_in)  # upstream of gelu@0 the chains differ
    ckpt = SafetensorsFile(tmp_path / "gelu" / "model.safetensors")
    assert np.array_equal(np.asarray(ckpt.read("case.fc")).reshape(-1), theirs_in)
    assert np.array_equal(c.inputs["fc"], theirs_in)
    # the reference's gelu of the buggy input is right, the dump's (the bug) is not
    got = _run_case(tmp_path / "gelu")["activated"]
    assert np.array_equal(got, c.expected["activated"])
    assert not np.allclose(got, d.read("step2/gelu@0/activated"), rtol=1e-4, atol=1e-5)
    # attention@1 at step 2 starts from the dump's caches of step 1
    c = capture(model, "attention@1", 2, TOKENS, tmp_path / "attn", against=dump)
    assert np.array_equal(c.inputs["key_cache"], d.read("step1/attention@1/key_cache"))
    assert np.array_equal(c.inputs["qkv"], d.read("step2/qkv_bias@1/qkv"))
    d.close()


def _node_input(model, name, step, buffer):
    got = {}
    m = Machine(model, engine="compiled")

    def before(machine, node):
        if node.full_name == name and machine.position == step:
            a = next(a for a in node.args if a.name == buffer)
            got["v"] = model.view(a.region).copy()
    m.hooks.before_node.append(before)
    m.reset()
    for t in TOKENS[: step + 1]:
        m.step(t)
    return got["v"]


def test_capture_from_a_dump_lacking_the_inputs_says_so(random_model, tmp_path, capsys):
    part = dump_of(random_model, tmp_path / "part.safetensors", tokens=TOKENS,
                   pattern="gelu@*")
    code = main(["capture", str(random_model), "--node", "gelu@0", "--step", "1",
                 "--against", str(part), "-o", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "cannot capture gelu@0 at step 1 from the dump: the dump has no fc of fc_bias@0" in err
    assert not (tmp_path / "c").exists()


def test_an_embedding_case_keeps_only_the_row_it_reads(sample_fir, tmp_path):
    model = load_model(sample_fir)
    capture(model, "token", 2, TOKENS, tmp_path / "tok")
    ckpt = SafetensorsFile(tmp_path / "tok" / "model.safetensors")
    wte = model.weights["wte"]
    row = np.asarray(ckpt.read("case.w.wte"))
    assert row.shape == (1, wte.shape[1])
    assert np.array_equal(row[0], model.view(wte.region).reshape(wte.shape)[TOKENS[2]])
    assert np.asarray(ckpt.read("case.token_id")).tolist() == [0.0]
    assert f"row {TOKENS[2]} of the original table" in (tmp_path / "tok" / "README").read_text()
