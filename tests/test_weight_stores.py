"""Weights are read-only: a kernel cannot store into one (issue 10.3).

The loader accepted `ustoref32 ... @lnfb`, reset only zeroes buffers, and
`profile`'s discarded warm-up step then changed the model. A store that can
reach a weight, through `@NAME` or an `inN` operand a node binds to a
weight, is refused at load, at the store, naming the node and the weight.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzzing as F
from conftest import SEED_FIR, write_random_gpt2
from model_util import firscope, line_of, load_err

SEED = SEED_FIR.read_text()


# -- 10.3: kernels cannot store into weights -------------------------------------------
LAYERNORM_STORE = "ustoref32 2 0 @out0\nuaddk 0 0 1\nforend\nendkernel\n# One lane per head"


@pytest.mark.parametrize("target,node,weight", [
    ("@lnfb", "ln1@0 (layer 0)", "lnfb"),  # a weight named in the kernel
    ("@in1", "ln1@0 (layer 0)", "ln1w@0"),  # an operand the node binds to a weight
    ("@in2+1", "ln1@0 (layer 0)", "ln1b@0"),
])
def test_a_store_into_a_weight_is_refused_at_the_instruction(make_model, target, node, weight):
    assert LAYERNORM_STORE in SEED
    text = SEED.replace(LAYERNORM_STORE, LAYERNORM_STORE.replace(
        "ustoref32 2 0 @out0", f"ustoref32 2 0 @out0\nustoref32 2 0 {target}"), 1)
    e = load_err(make_model("w", fir_text=text))
    assert f"node {node}: kernel 'g2.layernorm' stores into weight '{weight}'" in str(e), str(e)
    assert "weights are read-only" in e.message
    assert e.loc.line == line_of(text, f"ustoref32 2 0 {target}")


def test_profile_and_run_agree_because_weights_cannot_change(make_model):
    """The issue's case: a store into lnfb made profile's warm-up step change the model.
    Refused at load now, by every command alike."""
    text = SEED.replace(LAYERNORM_STORE, LAYERNORM_STORE.replace(
        "ustoref32 2 0 @out0", "ustoref32 2 0 @out0\nustoref32 2 0 @lnfb"), 1)
    path = make_model("p", fir_text=text)
    for cmd in ("check", "run", "profile"):
        extra = {"check": [], "run": ["--tokens", "1,2"],
                 "profile": ["--tokens", "1,2", "-o", path.parent / "report"]}[cmd]
        p = firscope(cmd, path, *extra)
        assert p.returncode == 1 and "stores into weight 'lnfb'" in p.stderr, (cmd, p.stderr)


@pytest.fixture(scope="module")
def store_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("store") / "model"
    write_random_gpt2(folder, n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab=64)
    return folder


@settings(max_examples=40, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_mutated_kernels_never_change_a_weight(store_folder, data):
    """A store aimed at a weight (by name, or through an operand a node binds to one) is
    refused with a located error; whatever loads decodes without changing any weight."""
    text = F.weight_store_model(SEED, lambda n: data.draw(st.integers(0, n - 1)))
    path = store_folder / "gpt2.fir"
    path.write_text(text)
    outcome, detail = F.run_case(path, fir_text=text)
    assert outcome in (F.FIRERROR, F.DECODED), F.describe(detail)
    if outcome == F.FIRERROR and "stores into weight" in str(detail):
        assert detail.loc.text.startswith("ustoref32"), str(detail)


def test_the_fuzz_check_sees_a_weight_change(make_model, monkeypatch):
    """The invariant run_case checks can fail: with the refusal switched off, it reports."""
    import firscope.runtime.plan as plan
    monkeypatch.setattr(plan, "_refuse_weight_stores", lambda program, where: None)
    text = SEED.replace(LAYERNORM_STORE, LAYERNORM_STORE.replace(
        "ustoref32 2 0 @out0", "ustoref32 2 0 @out0\nustoref32 2 0 @lnfb"), 1)
    path = make_model("c", fir_text=text)
    outcome, detail = F.run_case(path, fir_text=text)
    assert outcome == F.ESCAPE and "weights changed" in str(detail) and "lnfb" in str(detail)
