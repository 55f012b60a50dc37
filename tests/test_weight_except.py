"""The format's per-layer dtypes: ``weight ... except LAYERS:DTYPE`` and ``q4:gN`` groups."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import SEED_FIR, write_random_gpt2
from model_util import firscope, line_of, load_err
from firscope.runtime import Machine, load_model

FCW = "weight fcw q4 h.{i}.mlp.c_fc.weight tensor [n_embd,mlp]"
LINEARS = ("qkvw", "attnw", "fcw", "projw")


def with_line(tmp_path, old: str, new: str, name="m", **kw):
    text = SEED_FIR.read_text()
    assert old in text
    return write_random_gpt2(tmp_path / name, fir_text=text.replace(old, new), **kw)


def logits(model, tokens=(3, 1, 4, 1, 5)) -> np.ndarray:
    m = Machine(model, engine="compiled")
    return np.stack([m.step(t).logits for t in tokens])


def test_except_gives_each_layer_its_own_dtype_and_group(tmp_path):
    fir = with_line(tmp_path, FCW, FCW + " except 0:f32 1:q4:g16", n_layer=3)
    m = load_model(fir)
    w0, w1, w2 = (m.weights[f"fcw@{i}"] for i in range(3))
    assert (w0.declared, w0.q4, w0.matrix.shape) == ("f32", None, (256, 64))
    assert (w1.declared, w1.q4.group) == ("q4:g16", 16)
    assert (w2.declared, w2.q4.group) == ("q4", 32)
    # bytes as loaded: f32 4 a weight; q4 codes two to a byte + an f32 scale and min per group
    n = 64 * 256
    assert (w0.nbytes, w1.nbytes, w2.nbytes) == (4 * n, n // 2 + 8 * n // 16, n // 2 + 8 * n // 32)


def test_every_layer_f32_by_except_is_bit_identical_to_fir_f32(tmp_path):
    text = SEED_FIR.read_text()
    for name in LINEARS:
        line = next(x for x in text.split("\n") if x.startswith(f"weight {name} "))
        text = text.replace(line, line + " except 0-1:f32")
    fir = write_random_gpt2(tmp_path / "m", fir_text=text)
    a = logits(load_model(fir))
    b = logits(load_model(fir, fir_f32=True))
    q = logits(load_model(write_random_gpt2(tmp_path / "q")))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, q)  # the q4 model computes other numbers: the test can fail


def test_q4_with_the_default_group_spelled_out_is_the_same_model(tmp_path):
    a = logits(load_model(with_line(tmp_path, FCW, FCW + " except 0,1:q4:g32", name="a")))
    b = logits(load_model(write_random_gpt2(tmp_path / "b")))
    c = logits(load_model(with_line(tmp_path, FCW, FCW.replace(" q4 ", " q4:g16 "), name="c")))
    assert np.array_equal(a, b)
    assert not np.array_equal(b, c)


@pytest.mark.parametrize("clause, needle, message", [
    ("except 0,2:f32", "2:f32", "layer 2 is out of range: the file repeats 2 layers (0..1)"),
    ("except 0-5:f32", "0-5", "layer 5 is out of range"),
    ("except 0:f32 0:q4:g16", "0:q4", "layer 0 is given a dtype twice (first at column"),
    ("except 1-0:f32", "1-0", "layer range 1-0 runs backwards"),
    ("except 1:q8", "q8", "unknown weight dtype 'q8'"),
    ("except 1:q4:g1", "q4:g1", "unknown weight dtype 'q4:g1'"),
    ("except 1:q4:g016", "q4:g016", "unknown weight dtype"),
    ("except 1", "1", "expected LAYERS:DTYPE"),
    ("except a:f32", "a:f32", "expected a layer number or a range"),
    ("except", "except", "'except' needs at least one LAYERS:DTYPE group"),
])
def test_bad_except_clauses_are_positioned(tmp_path, clause, needle, message):
    fir = with_line(tmp_path, FCW, FCW + " " + clause)
    e = load_err(fir)
    assert message in e.message
    line = fir.read_text().split("\n")[line_of(fir.read_text(), FCW) - 1]
    assert e.loc.line == line_of(fir.read_text(), FCW)
    # the piece that is wrong (for a missing group: just after the keyword)
    col = line.rindex(needle) + 1 if needle != "except" else line.index("except") + 8
    assert e.loc.col == col


def test_except_only_on_a_per_layer_q4_weight(tmp_path):
    e = load_err(with_line(tmp_path, "weight ln1w f32 h.{i}.ln_1.weight tensor [n_embd]",
                           "weight ln1w f32 h.{i}.ln_1.weight tensor [n_embd] except 0:q4",
                           name="a"))
    assert "only q4 weights take another dtype per layer" in e.message
    e = load_err(with_line(tmp_path, "weight wte f32 wte.weight tensor [vocab_size,n_embd]",
                           "weight wte q4 wte.weight tensor [vocab_size,n_embd] except 0:f32",
                           name="b"))
    assert "'except' needs a per-layer weight" in e.message


def test_check_lists_the_excepted_layers(tmp_path):
    from firscope.runtime.describe import describe_model
    fir = with_line(tmp_path, FCW, FCW + " except 1:f32")
    text = describe_model(load_model(fir))
    assert "mixed" in text and "layer 1: f32" in text and "layer 0:" not in text


def test_capture_of_an_excepted_layer_runs_the_same(tmp_path):
    from firscope.compare.command import CaptureOptions, run_capture
    from firscope.runtime.opening import RunInput
    fir = with_line(tmp_path, FCW, FCW + " except 1:f32 0:q4:g16")
    for layer in (0, 1):
        out = tmp_path / f"case{layer}"
        assert run_capture(CaptureOptions(RunInput(model=str(fir), tokens="3,1,4"),
                                          node=f"fc_linear@{layer}", step=2, output=str(out),
                                          against=None, engine="compiled")) == 0
        case = (out / "gpt2.fir").read_text()
        assert ("weight fcw f32 " in case) if layer else ("weight fcw q4:g16 " in case)
        r = firscope("diff", out / "gpt2.fir", "--against", out / "expected.safetensors")
        assert r.returncode == 0, r.stdout + r.stderr


def test_diff_names_the_weight_a_layer_stores_differently(tmp_path):
    a = write_random_gpt2(tmp_path / "a")
    b = with_line(tmp_path, FCW, FCW + " except 1:f32", name="b")
    r = firscope("diff", a, b, "--tokens", "3,1,4")
    assert r.returncode == 1, r.stderr
    assert "fc_linear@1 reads weight fcw@1 as q4 in A and f32 in B" in r.stdout
