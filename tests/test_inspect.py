"""set, display, element history, the logit lens and checkpoints (issue 14)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from firscope.debug.commands import CommandInterpreter
from firscope.debug.session import Session
from firscope.errors import FirError
from firscope.runtime import load_model
from npgpt2 import NumpyGPT2


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from conftest import write_random_gpt2
    return write_random_gpt2(tmp_path_factory.mktemp("inspect") / "m").parent


@pytest.fixture(scope="module")
def model(folder):
    return load_model(folder / "gpt2.fir")


@pytest.fixture(scope="module")
def model_f32(folder):
    return load_model(folder / "gpt2.fir", fir_f32=True)


def fresh(model, prompt=(104, 101, 108), n=3):
    s = Session(model, list(prompt), n, engine="interp")
    return s, CommandInterpreter(s)


def bits(a):
    return np.asarray(a).view(np.uint32).copy()


def everything(s):
    d = s.dispatch
    regs = None if d is None else (d.pc, d.steps, bits(d.R), bits(d.U), d.mask.copy())
    return (s.step, s.node_index, s.finished, list(s.sequence), bits(s.arena), regs,
            [bits(l) for l in s.logits])


def same(a, b):
    assert a[:4] == b[:4]
    assert np.array_equal(a[4], b[4])
    assert (a[5] is None) == (b[5] is None)
    if a[5] is not None:
        assert a[5][:2] == b[5][:2] and all(np.array_equal(x, y) for x, y in zip(a[5][2:],
                                                                                 b[5][2:]))
    assert len(a[6]) == len(b[6]) and all(np.array_equal(x, y) for x, y in zip(a[6], b[6]))


# --- set ------------------------------------------------------------------------------------
def test_set_then_print_shows_the_new_value(model):
    s, ci = fresh(model)
    ci.execute("until attention@1")
    ci.execute("set x[0:4] = 0")
    assert ci.execute("print x[0:4]") == "$ = [0., 0., 0., 0.]  (shape [4])"
    ci.execute("set x = x * 0.5")
    half = s.evaluate("x[4]")
    ci.execute("set key_cache@1[3] = -1.25")
    assert s.evaluate("key_cache@1[3]") == np.float32(-1.25)
    ci.execute("stepi 3")
    ci.execute("set R1 = 1.5")
    ci.execute("set U4 = 7")
    ci.execute("set lane 2 R5 = 3")
    ci.execute("set R6[3] = 4")
    d = s.dispatch
    assert d.R[1, 0] == np.float32(1.5) and d.U[4, 0] == 7
    assert d.R[5, 2] == 3 and d.R[6, 3] == 4 and d.R[5, 0] != 3
    assert ci.execute("print R1") == "$ = 1.5"
    assert half == s.evaluate("x[4]")
    assert "4 " in ci.execute("info patches").splitlines()[4]


@pytest.mark.parametrize("cmd,msg", [
    ("set wte[0, 0] = 1", "weights are read-only"),
    ("set scores@1[3] = 0", "all layers share"),
    ("set R1 = 2", "no kernel is running"),
    ("set x[0:4] = wte[0:2]", "the value has shape"),
    ("set x", "usage: set"),
    ("set x[999] = 1", "index out of range"),
    ("set nosuch = 1", "no buffer, weight or register"),
])
def test_set_refuses_what_it_cannot_do(model, cmd, msg):
    s, ci = fresh(model)
    ci.execute("until ln2@0")
    arena = bits(model.arena)
    with pytest.raises(FirError, match=msg):
        ci.execute(cmd)
    assert np.array_equal(bits(model.arena), arena) and len(s.patches) == 0


def test_a_weight_can_be_patched_when_asked_and_reverse_undoes_it(model):
    s, ci = fresh(model)
    ci.execute("until ln1@0")
    before = float(s.evaluate("ln1w@0[3]"))
    ci.execute("set --weight ln1w@0[3] = 9")
    assert s.evaluate("ln1w@0[3]") == 9
    ci.execute("next")
    ci.execute("reverse-next 2")
    assert float(s.evaluate("ln1w@0[3]")) == before


def test_reverse_past_a_set_and_forward_again_is_identical(model):
    s, ci = fresh(model, n=3)
    ci.execute("until attention@1")
    ci.execute("set x[0:4] = 0")
    ci.execute("stepi 5")
    ci.execute("set R2 = 0.25")
    ci.execute("set attn[1] = 3")
    ci.execute("next 4")
    ahead = everything(s)
    cursor = s.cursor
    ci.execute("reverse-next 10")  # before both patches
    assert s.evaluate("x[0]") != 0
    ci.execute("next 10")
    same(everything(s), ahead)
    ci.execute("reverse-stepi 200")  # back into the kernel, before the register patch
    ci.execute("reverse-stepi 20")
    assert s.dispatch is not None and s.nodes[s.node_index].name == "attention"
    ci.execute(f"goto {s.nodes[cursor[1]].full_name}")
    same(everything(s), ahead)
    ci.execute("continue")
    patched = [bits(l) for l in s.logits]
    s2, ci2 = fresh(model, n=3)
    ci2.execute("continue")
    assert not all(np.array_equal(a, bits(b)) for a, b in zip(patched, s2.logits))


def test_zeroing_the_residual_changes_the_logits_as_an_independent_gpt2_does(folder,
                                                                              model_f32):
    prompt = [104, 101]
    s, ci = fresh(model_f32, prompt=prompt, n=1)
    ci.execute("token")  # step 0 plainly
    ci.execute("until attention@1")  # step 1, layer 1: after q, k, v
    ci.execute("set x[0:4] = 0")
    ci.execute("continue")
    got = s.logits[1].astype(np.float64)
    s0, ci0 = fresh(model_f32, prompt=prompt, n=1)
    ci0.execute("continue")
    base = s0.logits[1].astype(np.float64)

    config = json.loads((folder / "config.json").read_text())
    ref = NumpyGPT2(load_file(str(folder / "model.safetensors")), config)
    ref.step(prompt[0])
    ref_base = ref.step(prompt[1]).astype(np.float64)
    ref.reset()

    def zero(layer, x):
        if layer == 1:
            x = x.copy()
            x[0:4] = 0
        return x
    ref.step(prompt[0])
    ref_patched = ref.step(prompt[1], patch=zero).astype(np.float64)
    want = ref_patched - ref_base
    delta = got - base
    assert np.abs(want).max() > 1e-3  # the patch matters
    assert np.abs(delta - want).max() <= 1e-4 * np.abs(want).max() + 1e-5


def test_unset_forgets_a_patch_for_later_replays(model):
    s, ci = fresh(model)
    ci.execute("until attention@1")
    ci.execute("set x[0:4] = 0")
    ci.execute("reverse-next")
    ci.execute("unset 1")
    ci.execute("next")
    assert s.evaluate("x[0]") != 0 and len(s.patches) == 0


# --- display ----------------------------------------------------------------------------------
def test_display_prints_after_every_stop_and_marks_changes(model):
    s, ci = fresh(model)
    assert ci.execute("display max(abs(x))").startswith("1: max(abs(x)) = ")
    ci.execute("display R1")
    out = ci.execute("next")
    assert "\n1: max(abs(x)) = " in out and "\n2: R1 = <error:" in out
    first = ci.last.displays[0]
    ci.execute("next 2")
    second = ci.last.displays[0]
    assert second.changed == (first.text != second.text)
    assert ci.execute("info display").startswith("Auto-display expressions now in effect:")
    ci.execute("undisplay 1")
    assert "\n1: " not in ci.execute("next")
    with pytest.raises(FirError):
        ci.execute("display nosuch + 1")


# --- element history ---------------------------------------------------------------------------
def test_history_lists_the_writes_print_showed(model):
    s, ci = fresh(model, n=2)
    seen = [np.float32(s.evaluate("x[5]"))]
    while s.step < 1:  # every node of token 0, looking at x[5] after each
        ci.execute("next")
        v = np.float32(s.evaluate("x[5]"))
        if v.view(np.uint32) != seen[-1].view(np.uint32):
            seen.append(v)
    result = ci.run("history x[5]")
    out, writes = result.text, result.data
    news = [np.float32(w.new).view(np.uint32) for w in writes if w.step == 0]
    assert news == [v.view(np.uint32) for v in seen[1:]] and len(news) >= 5
    micro = [w for w in writes if w.line is not None]
    assert micro and all(w.lane == 5 and "ustoref32" in w.text for w in micro)
    assert out.splitlines()[0].startswith("x[5]: ")
    kc = ci.execute("history key_cache[3]@1")  # the same as key_cache@1[3]
    assert kc.startswith("key_cache@1[3]: ") and "attention@1 (line" in kc
    with pytest.raises(FirError, match="one element"):
        ci.execute("history x[0:2]")


def test_history_says_when_it_is_truncated(model):
    s = Session(model, [1, 2, 3], 2, engine="interp", history_budget=30_000)
    ci = CommandInterpreter(s)
    ci.execute("continue")
    assert "older history was dropped" in ci.execute("history x[0]")


# --- logit lens -----------------------------------------------------------------------------------
def test_lens_at_the_last_layer_is_the_models_own_top_k(model):
    s, ci = fresh(model, n=2)
    ci.execute("until final_norm")
    from firscope.debug.lens import lens, top_k
    now = lens(s, k=5)[0].top
    every = lens(s, k=5, every_layer=True)
    assert [r.layer for r in every] == [None, 0, 1] and every[-1].top == now  # embed first
    arena = bits(model.arena)
    ci.execute("lens --all 3")
    assert np.array_equal(bits(model.arena), arena)  # the lens puts everything back
    ci.execute("token")
    assert now == top_k(s.logits[-1], 5)
    with pytest.raises(FirError, match="between nodes"):
        ci.execute("until attention@0")
        ci.execute("stepi")
        ci.execute("lens")


def test_lens_explains_a_model_without_a_head(make_model):
    from conftest import SEED_FIR
    text = SEED_FIR.read_text().replace("node head ext fir.linear_t norm wte -> logits",
                                        "node head micro g2.add norm norm -> norm")
    text = text.replace("buf logits f32 vocab output:logits", "buf logits f32 vocab output:logits")
    m = load_model(make_model("nohead", fir_text=text))
    s, ci = fresh(m)
    with pytest.raises(FirError, match="no node writes the output:logits"):
        ci.execute("lens")


# --- checkpoints --------------------------------------------------------------------------------
def test_checkpoints_restore_bit_identical_state(model):
    s, ci = fresh(model, n=3)
    ci.execute("until attention@1")
    ci.execute("stepi 17")
    assert ci.execute("checkpoint") == "checkpoint 1: token 0, attention@1 pc " + \
        str(s.dispatch.pc)
    here = everything(s)
    ci.execute("next 30")
    ci.execute("checkpoint")
    later = everything(s)
    ci.execute("continue")
    ci.execute("restart 1")
    same(everything(s), here)
    ci.execute("reverse-stepi 5")  # stepping back works from a restored place
    ci.execute("stepi 5")
    same(everything(s), here)
    ci.execute("restart 2")
    same(everything(s), later)
    ci.execute("reverse-next 30")
    ci.execute("next 30")
    same(everything(s), later)
    assert "2   token" in ci.execute("info checkpoints")
    with pytest.raises(FirError, match="no checkpoint number 9"):
        ci.execute("restart 9")


def test_an_exported_report_says_the_session_was_patched(model, tmp_path):
    import threading

    from firscope.tui.jobs import JobProgress, Probe, export_session
    s, ci = fresh(model, n=1)
    ci.execute("until attention@1")
    ci.execute("set x[0:4] = 0")
    done = export_session(s, None, tmp_path / "rep", JobProgress(Probe(), threading.Event()))
    meta = json.loads((done.folder / "report.json").read_text())["meta"]
    notes = " ".join(meta.get("notes", []))
    assert "patched with 1 set command(s): x[0:4] = 0 (at token 0, before attention@1)" in notes
    assert "without the buffer and register patches" in notes
    assert "patched with" in (done.folder / "report.html").read_text()
