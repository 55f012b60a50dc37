"""The Python API (issue 41): firscope.open, Model.run with record= and patch=, Run.value and
Run.save, firscope.patching, Model.debug, and what a script gets for bad input."""
from __future__ import annotations

import shutil
import warnings
import subprocess

import numpy as np
import pytest

import firscope
from firscope import FirError
import model_util
from conftest import SAMPLE

TOKENS = [105, 109, 112, 111, 114, 116, 32, 111]  # "import o"


@pytest.fixture(scope="module")
def q4():
    return firscope.open()


@pytest.fixture(scope="module")
def f32():
    return firscope.open(fir_f32=True)


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """The command line, in this process (tests/model_util.firscope)."""
    return model_util.firscope(*args, cwd=cwd, timeout=600)


def read_dump(path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    return load_file(str(path))


# -- runs agree with the command line --------------------------------------------------------
@pytest.mark.parametrize("fir_f32", [False, True], ids=["q4", "f32"])
def test_logits_and_values_are_the_dumps_bits(tmp_path, fir_f32, q4, f32):
    model = f32 if fir_f32 else q4
    dump = tmp_path / "cli.safetensors"
    ids = ",".join(map(str, TOKENS[:5]))
    done = cli("run", "--tokens", ids, "-n", "3", "--dump", str(dump),
               *(["--fir-f32"] if fir_f32 else []))
    assert done.returncode == 0, done.stderr
    run = model.run(tokens=TOKENS[:5], n=3, record="attention@*/attn,ln1@0")
    tensors = read_dump(dump)
    assert run.steps == 5 + 3 - 1 and run.logits.shape == (7, model.vocab)
    assert run.logits.dtype == np.float32
    assert len(run.tokens) == 8 and run.tokens[:5] == TOKENS[:5]
    for s in range(run.steps):
        assert np.array_equal(bits(run.logits[s]), bits(tensors[f"step{s}/head/logits"]))
        for layer in range(model.n_layers):
            node = f"attention@{layer}"
            got = run.value("attn", node, s)
            assert np.array_equal(bits(got), bits(tensors[f"step{s}/{node}/attn"])), (s, node)
        assert np.array_equal(bits(run.value("norm", "ln1@0", s)),
                              bits(tensors[f"step{s}/ln1@0/norm"]))
    # the tokens the command line printed are the run's tokens
    ids_out = cli("run", "--tokens", ids, "-n", "3", "--ids", *(["--fir-f32"] if fir_f32 else []))
    assert ids_out.stdout.strip() == ",".join(map(str, run.tokens))


def test_compiled_and_interp_give_the_same_bits(q4):
    interp = firscope.open(engine="interp")
    a = q4.run(tokens=TOKENS[:4], n=2, record="*/x")
    b = interp.run(tokens=TOKENS[:4], n=2, record="*/x")
    assert np.array_equal(bits(a.logits), bits(b.logits))
    assert a.values().keys() == b.values().keys() and len(a.values()) > 10
    for key, v in a.values().items():
        assert np.array_equal(bits(v), bits(b.values()[key])), key


def test_a_prompt_is_encoded_and_runs_are_independent(q4):
    first = q4.run("def ", n=4)
    again = q4.run("def ", n=4)
    assert first.prompt == q4.encode("def ") == [100, 101, 102, 32]
    assert np.array_equal(bits(first.logits), bits(again.logits))
    assert first.text == q4.decode(first.tokens) and first.text.startswith("def ")
    with pytest.raises(ValueError):
        first.logits[0, 0] = 1.0  # a run's logits are read-only: nothing later changes them


def test_run_save_is_a_dump_diff_accepts(tmp_path, q4):
    run = q4.run(tokens=TOKENS[:4], n=1, record="attention@*/attn")
    path = tmp_path / "api.safetensors"
    assert run.save(path) == str(path)
    tensors = read_dump(path)
    assert "step3/head/logits" in tensors and "step0/attention@3/attn" in tensors
    done = cli("diff", "--against", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "first divergence: none" in done.stdout and "compared 20 of" in done.stdout, \
        done.stdout  # 4 steps x (4 attention outputs and the logits)
    # the output rule of --dump: a file that is not a dump is never replaced
    victim = tmp_path / "notes.txt"
    victim.write_text("keep me")
    with pytest.raises(FirError, match="not a dump"):
        run.save(victim)
    assert victim.read_text() == "keep me"


# -- patching ------------------------------------------------------------------------------
def zero(value, step):
    return np.zeros_like(value) if step == 1 else None


def test_zero_ablation_keeps_the_steps_before_and_changes_the_rest(q4):
    clean = q4.run(tokens=TOKENS[:5], record="attention@0/attn,attention_linear@0/mix")
    ablated = q4.run(tokens=TOKENS[:5], patch={("attention@0", "attn"): zero},
                     record="attention@0/attn,attention_linear@0/mix")
    assert np.array_equal(bits(clean.logits[0]), bits(ablated.logits[0]))
    assert not np.array_equal(clean.logits[1], ablated.logits[1])
    assert np.all(ablated.value("attn", "attention@0", 1) == 0)  # recorded after the patch
    assert np.any(clean.value("attn", "attention@0", 1) != 0)
    # the linear after it read the patched zeros: its output is its bias-free product, 0
    assert np.all(ablated.value("mix", "attention_linear@0", 1) == 0)
    assert ablated.patched == ("attention@0/attn",)


def test_zero_ablation_agrees_with_transformers_patched_the_same_way(f32):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(SAMPLE), torch_dtype=torch.float32)
    hf.eval()

    def pre_hook(module, args):
        x = args[0].clone()
        x[:, 1, :] = 0  # the input of c_proj (the heads' merged output) at position 1
        return (x,)

    handle = hf.transformer.h[0].attn.c_proj.register_forward_pre_hook(pre_hook)
    try:
        with torch.no_grad():
            ref = hf(torch.tensor([TOKENS]), use_cache=False).logits[0].numpy()
    finally:
        handle.remove()
    with torch.no_grad():
        plain = hf(torch.tensor([TOKENS]), use_cache=False).logits[0].numpy()
    got = f32.run(tokens=TOKENS, patch={("attention@0", "attn"): zero}).logits
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= 1e-3, np.abs(got - ref).max()
    assert np.abs(plain[1:] - ref[1:]).max() > 1e-2  # the ablation moves what it checks


def test_patch_globs_steering_and_copying_from_another_run(q4):
    donor = q4.run(tokens=[10, 20, 30], record="mlp_residual@*/x")
    every = q4.run(tokens=TOKENS[:3], patch={
        ("mlp_residual@*", "x"): lambda v, step: donor.value("x", "mlp_residual@3", step)})
    # the last layer's residual was replaced by the donor's at every step: the same logits
    assert np.array_equal(bits(every.logits), bits(donor.logits))
    seen = []
    steer = np.full(128, 0.25, dtype=np.float32)
    q4.run(tokens=TOKENS[:3], patch={("embeddings", "x"): lambda v, s: seen.append(
        (s, v.flags.writeable)) or v + steer})
    assert seen == [(0, False), (1, False), (2, False)]  # a read-only copy, every step


def test_sweep_diagonal_recovers_the_clean_metric(q4):
    clean = [105, 109, 112, 111, 114, 116]  # "import"
    corrupt = [105, 109, 112, 97, 114, 116]  # "impart": one token differs, at position 3
    metric = firscope.patching.logit_diff(32, 101)
    result = firscope.patching.sweep(q4, clean, corrupt, metric)
    rows = result.rows
    assert rows[0] == "token/x" and rows[-1] == "mlp_residual@3/x"
    assert result.values.shape == (len(rows), len(clean))
    assert result.clean == metric(q4.run(tokens=clean))
    assert result.corrupted == metric(q4.run(tokens=corrupt))
    assert result.clean != result.corrupted
    # the residual right after the embeddings at the corrupted position carries all of it,
    # and so does the last layer's residual at the last position: the clean metric exactly
    assert result.values[rows.index("embeddings/x"), 3] == result.clean
    assert result.values[-1, -1] == result.clean
    # before the corrupted position nothing differs: patching there changes nothing
    assert np.all(result.values[:, :3] == result.corrupted)
    norm = result.normalized()
    assert norm[rows.index("embeddings/x"), 3] == 1.0 and norm[-1, -1] == 1.0


# -- rich display and figures -----------------------------------------------------------------
def test_notebook_views(q4):
    run = q4.run("def ", n=3, record="attention@*/scores,embeddings/x,mlp_residual@*/x")
    page = run._repr_html_()
    assert "firscope.Run" in page and "<table>" in page and "&#x27;" in page
    att = run.attention(1)
    assert att.probs.shape == (4, run.steps, run.steps)
    assert np.allclose(att.probs.sum(axis=2), 1.0, atol=1e-5)
    assert np.all(att.probs[:, 0, 1:] == 0)  # causal: the first query sees only itself
    assert "<svg" in att._repr_html_()
    lens = run.lens()
    assert [label for label, _ in lens.rows] == ["embed"] + [f"layer {i}" for i in range(4)]
    # the last layer's lens is the model's own prediction
    top = int(np.argmax(run.logits[-1]))
    assert lens.rows[-1][1][0][0] == top
    assert "logit lens" in lens._repr_html_()
    w = q4.weight("qkvw", 0)
    stats = w.error()
    assert w.dtype == "q4" and 0 < stats.rmse < stats.max_abs
    assert "rmse" in w._repr_html_()
    assert q4.weight("qkvw@0").name == "qkvw@0"
    assert q4.weight("wte").values().shape == (256, 128)  # as declared
    dense = w.values()  # [out, in], what the q4 matmul multiplies by
    assert dense.shape == (384, 128)
    from firscope.model.checkpoint import Checkpoint
    original = Checkpoint(SAMPLE).read(w.tensor).T
    assert np.sqrt(np.mean((original - dense) ** 2)) == pytest.approx(stats.rmse, rel=1e-6)
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    result = firscope.patching.sweep(q4, [1, 2, 3], [1, 5, 3], firscope.patching.logit_diff(1, 2),
                                     targets=[("attention@*", "attn")])
    assert result.rows == [f"attention@{i}/attn" for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a glyph the font lacks is a warning: none here
        fig = att.figure()
        assert len(fig.axes) == 5  # four heads and the colour bar
        fig.canvas.draw()
        fig = result.figure()  # tokens 1, 2, 5: control bytes, shown as their pictures
        assert len(fig.axes) == 2 and "<table>" in result._repr_html_()
        fig.canvas.draw()
    from firscope.api.display import figure_label
    assert figure_label("\u2402\u2420a\u2421", 16) == "\\x02\u2423a\\x7f"
    assert figure_label("abcdefghij") == "abcdefg\u2026"


# -- the debugger from a script ------------------------------------------------------------------
def test_model_debug_is_the_typed_session(q4):
    d = q4.debug(tokens=TOKENS[:3], n=1)
    bp = d.break_at("attention@1")
    snap = d.cont()
    assert snap.reason == "breakpoint" and snap.location.node == "attention@1"
    assert bp.number == snap.stop.breakpoint
    x_before = np.array(d.evaluate("x"))
    d.step()  # into the kernel
    assert d.location().in_kernel
    assert d.location().pc == 1
    d.reverse_step()
    assert d.location().pc == 0 and d.location().node == "attention@1"
    d.set("x[0]", 2.5)
    assert float(d.evaluate("x[0]")) == 2.5
    assert np.array_equal(np.array(d.evaluate("x"))[1:], x_before[1:])
    # the session has its own arena: a run meanwhile neither sees nor disturbs it
    run = q4.run(tokens=TOKENS[:3])
    assert np.array_equal(bits(run.logits), bits(q4.run(tokens=TOKENS[:3]).logits))
    assert float(d.evaluate("x[0]")) == 2.5
    d.delete()
    end = d.cont()
    assert end.reason == "finished" and d.finished


# -- bad input ------------------------------------------------------------------------------------
def test_a_bad_model_raises_the_message_the_command_line_prints(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(SAMPLE, folder)
    fir = folder / "gpt2.fir"
    fir.write_text(fir.read_text().replace("node ln2 micro", "node ln2 mikro", 1))
    with pytest.raises(FirError) as caught:
        firscope.open(fir)
    printed = cli("check", str(fir))
    assert printed.returncode == 1
    assert printed.stderr.strip() == str(caught.value).strip()
    assert f"{fir}:" in str(caught.value) and "^" in str(caught.value)
    by_folder = firscope.open(SAMPLE, engine="interp")  # a folder holding one .fir
    assert by_folder.path == SAMPLE / "gpt2.fir" and by_folder.n_layers == 4
    for bad in (tmp_path / "missing.fir", tmp_path):
        with pytest.raises(FirError):
            firscope.open(bad)
    with pytest.raises(FirError, match="engine"):
        firscope.open(engine="cuda")


@pytest.mark.parametrize("call, message", [
    (lambda m: m.run(tokens=[1, 2], record="attenton@*"), "matches no node"),
    (lambda m: m.run(tokens=[1, 2], patch={("attenton@0", "attn"): zero}),
     "did you mean attention@0"),
    (lambda m: m.run(tokens=[1, 2], patch={("attention", "attn"): zero}),
     "once per layer"),
    (lambda m: m.run(tokens=[1, 2], patch={("attention@0", "atn"): zero}), "did you mean attn"),
    (lambda m: m.run(tokens=[1, 2], patch={("attention@0", "qkvw"): zero}), "is a weight"),
    (lambda m: m.run(tokens=[1, 2], patch={("embeddings", "key_cache"): zero}),
     "one instance per layer"),
    (lambda m: m.run(tokens=[1, 2], patch={("embeddings", "x"): 3}), "must be a function"),
    (lambda m: m.run(tokens=[1, 999]), "outside the vocabulary 0..255"),
    (lambda m: m.run(tokens=[1, -1]), "outside the vocabulary"),
    (lambda m: m.run(tokens=[1, 2.5]), "integers"),
    (lambda m: m.run(), "give a prompt"),
    (lambda m: m.run("a", tokens=[1]), "not both"),
    (lambda m: m.run(tokens=[1], n=-1), "0 or more"),
    (lambda m: m.run(tokens=[1], n=300), "n_positions 256"),
    (lambda m: m.run(tokens=[1, 2]).value("attn", "attention@0", 0),
     "record='attention@0/attn' \\(or record='attention@\\*/attn'"),
    (lambda m: m.run(tokens=[1, 2]).value("logits", "head", 2), "outside this run"),
    (lambda m: m.run(tokens=[1, 2]).value("x", "attention@0", 0), "does not write 'x'"),
    (lambda m: m.run(tokens=[1, 2]).attention(0), "record='attention@\\*/scores'"),
    (lambda m: m.run(tokens=[1, 2]).lens(), "record='embeddings/x,mlp_residual@\\*/x'"),
    (lambda m: m.weight("qkvw"), "one instance per layer"),
    (lambda m: m.weight("qkvw", 9), "layers 0..3"),
    (lambda m: m.weight("wte").error(), "f32 here"),
])
def test_bad_input_is_a_clear_error_before_anything_runs(q4, call, message):
    before = q4.run(tokens=[1, 2])
    with pytest.raises(FirError, match=message):
        call(q4)
    after = q4.run(tokens=[1, 2])
    assert np.array_equal(bits(before.logits), bits(after.logits))


@pytest.mark.parametrize("answer, message", [
    (np.zeros(64, dtype=np.float32), r"returned shape \(64,\); the buffer has shape \(128,\)"),
    (np.zeros((1, 128), dtype=np.float32), r"shape \(1, 128\)"),
    (np.zeros(128, dtype=np.int64), "int64 values"),
    ("nonsense", "<U8 values"),
])
def test_a_wrong_patch_answer_names_node_buffer_and_shapes(q4, answer, message):
    clean = q4.run(tokens=[1, 2, 3])
    with pytest.raises(FirError, match=message) as caught:
        q4.run(tokens=[1, 2, 3], patch={("attention@0", "attn"): lambda v, s: answer})
    assert "attention@0/attn at step 0" in str(caught.value)
    # the model is not left half patched: the next run is the clean one
    assert np.array_equal(bits(q4.run(tokens=[1, 2, 3]).logits), bits(clean.logits))


def test_an_exception_in_a_patch_leaves_the_model_as_it_was(q4):
    clean = q4.run(tokens=[4, 5])

    def broken(value, step):
        if step == 1:
            raise KeyError("mine")
        return value * 0

    with pytest.raises(KeyError, match="mine"):
        q4.run(tokens=[4, 5], patch={("embeddings", "x"): broken})
    assert np.array_equal(bits(q4.run(tokens=[4, 5]).logits), bits(clean.logits))
