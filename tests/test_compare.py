"""Differential debugging (issue 13): tolerances, the lockstep diff, ``firscope diff``.

The model tests use a random 2-layer GPT-2 (n_embd 64, 4 heads: headdim 16,
so lane h of g2.attn_decode writes attn[16h:16h+16]) and variants of its
attention kernel with a deliberate bug.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from firscope.cli import main
from firscope.compare import (DEFAULT_RTOL, Dump, DumpSource, ModelSource, Tolerance,
                              compare_arrays, make_tolerance, run_lockstep)
from firscope.compare.views import Severity, buffer_view, node_errors, severity
from firscope.dump import DumpWriter
from firscope.runtime import load_model

from npgpt2_dump import write_numpy_dump

HEADDIM = 16
BUGS = {
    # the softmax scale 1/headdim instead of 1/sqrt(headdim): at step 0 there is one
    # position and its weight is 1 whatever the scale, so the first divergence is step 1
    "wrong scale": ("mulconst 3 3 1/sqrt(headdim)", "mulconst 3 3 1/headdim", 1),
    # the loops over positions 0..pos stop one short: at step 0 nothing is attended
    "off by one": ("addconst 14 14 1", "addconst 14 14 0", 0),
}


def _bugged(fir, name):
    old, new, _ = BUGS[name]
    text = fir.read_text()
    assert text.count(old) == 1
    out = fir.parent / f"bug-{name.replace(' ', '-')}.fir"
    out.write_text(text.replace(old, new))
    return out


def _fs(capsys, *args):
    """firscope in this process: (exit status, stdout, stderr)."""
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


# -- the tolerance ---------------------------------------------------------------------------
def test_identical_and_equivalent_bit_patterns_are_exact():
    a = np.array([1.0, 0.0, np.nan, -np.inf, 2.0], np.float32)
    b = a.copy()
    b[1] = -0.0  # +0 and -0 mean the same
    b.view(np.uint32)[2] = 0x7FC00001  # another NaN payload
    d = compare_arrays(a, b, Tolerance())
    assert d.exact and not d.diverged and d.first_index is None and d.max_abs == 0


def _reordered_dot(seed=0, n=512, m=4096):
    """The same f32 matrix-vector product in two summation orders (as a GPU would)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n).astype(np.float32)
    W = rng.normal(size=(m, n)).astype(np.float32)
    fwd = np.zeros(m, np.float32)
    for k in range(n):
        fwd += W[:, k] * x[k]
    back = np.zeros(m, np.float32)
    for k in reversed(range(n)):
        back += W[:, k] * x[k]
    return fwd, back


def test_reordering_noise_passes_the_default_but_not_a_ulp_bound():
    """The issue's warning: near-zero outputs are many ULPs apart from reordering alone."""
    ref, other = _reordered_dot()
    d = compare_arrays(ref, other, Tolerance())
    assert not d.diverged and d.differing > 1000
    assert d.rel_l2 < 1e-6 and d.max_ulp > 1000
    strict = compare_arrays(ref, other, make_tolerance(ulp=16))
    assert strict.diverged and "16 ULP" in strict.reason


def test_one_wrong_element_in_a_large_buffer_is_caught_by_the_floor():
    rng = np.random.default_rng(1)
    ref = rng.normal(size=1 << 20).astype(np.float32)
    other = ref.copy()
    other[777_777] += 0.05  # 5% of an element's typical size
    d = compare_arrays(ref, other, Tolerance())
    assert d.rel_l2 < DEFAULT_RTOL  # the L2 norm alone would miss it
    assert d.diverged and d.bad_index == 777_777 and d.index == 777_777
    assert "beyond the floor" in d.reason
    assert d.ref_value == float(ref[777_777]) and d.other_value == float(other[777_777])


def test_a_small_scale_error_is_caught_by_relative_l2():
    rng = np.random.default_rng(2)
    ref = rng.normal(size=4096).astype(np.float32)
    other = (ref * np.float32(1.0005)).astype(np.float32)  # each element within the floor
    d = compare_arrays(ref, other, Tolerance())
    assert d.diverged and "relative L2 error 0.0005" in d.reason
    assert d.bad_index == int(np.argmax(np.abs(ref)))  # no element beyond the floor: the worst


def test_nan_where_the_reference_is_finite():
    ref = np.arange(8, dtype=np.float32)
    other = ref.copy()
    other[5] = np.nan
    d = compare_arrays(ref, other, Tolerance())
    assert d.diverged and d.nonfinite == 1 and d.bad_index == 5
    assert d.reason == "element 5 is NaN where the reference has 5"


def test_f16_storage_widens_the_tolerance():
    rng = np.random.default_rng(3)
    ref = rng.normal(size=4096).astype(np.float32)
    stored = ref.astype(np.float16).astype(np.float32)
    assert compare_arrays(ref, stored, Tolerance()).diverged  # f16 rounding > 1e-4
    assert not compare_arrays(ref, stored, Tolerance().for_dtype("F16")).diverged
    assert compare_arrays(ref, stored * np.float32(1.01),
                          Tolerance().for_dtype("F16")).diverged  # a real 1% error still is


def _adversarial(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300) if seed % 2 else rng.integers(2000, 9000))  # across blocks
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1e-45, 3e38, -3e38, 1.0],
                        np.float32)
    a = rng.normal(size=n).astype(np.float32) * np.float32(10.0 ** rng.integers(-30, 30))
    b = a.copy()
    for arr in (a, b):
        k = rng.integers(0, max(n // 4, 1) + 1)
        arr[rng.integers(0, max(n, 1), k) % max(n, 1)] = rng.choice(specials, k) if n else arr[:0]
    noisy = rng.random(n) < 0.5
    b[noisy] = (b[noisy] * (1 + rng.integers(-3, 4, noisy.sum()) * np.float32(2 ** -23))
                ).astype(np.float32)
    return a, b


@pytest.mark.parametrize("seed", range(60))
def test_the_fused_scan_matches_the_numpy_reference(seed):
    """scan (one numba loop) against scan_numpy (plain NumPy), as the compiled engine is
    checked against the interpreter: NaN payloads, infinities, +-0, subnormals, huge values."""
    from firscope.compare.scan import (bits_equal, first_beyond, first_beyond_numpy, scan,
                                       scan_numpy)
    a, b = _adversarial(seed)
    fast, ref = scan(a, b), scan_numpy(a, b)
    for field in ("differing", "first", "nonfinite", "first_nonfinite", "max_d", "arg_d",
                  "max_ulp", "max_ref"):
        assert getattr(fast, field) == getattr(ref, field), field
    assert fast.sum_d2 == pytest.approx(ref.sum_d2, rel=1e-12)
    assert fast.sum_r2 == pytest.approx(ref.sum_r2, rel=1e-12)
    assert bits_equal(a, b) == np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert bits_equal(a, a.copy())
    for floor, ulp in ((0.0, None), (ref.max_d / 2, None), (None, 2), (None, 0)):
        assert first_beyond(a, b, floor, ulp) == first_beyond_numpy(a, b, floor, ulp)
    for tol in (Tolerance(), make_tolerance(ulp=1)):
        _same(compare_arrays(a, b, tol), compare_arrays(a, b, tol, scanner=scan_numpy))


def _same(x, y):
    """Field by field; NaN equals NaN; the two scans sum squares in different orders, so
    rel_l2 may differ in the last bits."""
    import dataclasses
    import math
    for f in dataclasses.fields(x):
        u, v = getattr(x, f.name), getattr(y, f.name)
        if isinstance(u, float) and math.isnan(u):
            assert isinstance(v, float) and math.isnan(v), f.name
        elif f.name == "rel_l2":
            assert u == pytest.approx(v, rel=1e-12)
        else:
            assert u == v, f.name


@pytest.mark.parametrize("kw,message", [
    (dict(rtol=-1.0), "--rtol -1"), (dict(atol=float("nan")), "--atol nan"),
    (dict(ulp=-2), "--ulp -2"), (dict(ulp=3, rtol=1e-3), "either --ulp or"),
])
def test_bad_tolerances(kw, message):
    with pytest.raises(ValueError, match=message):
        make_tolerance(**kw)


# -- whole runs ------------------------------------------------------------------------------
def test_a_run_dumped_by_run_dump_diffs_clean_against_itself(random_model, tmp_path):
    """Written by the compiled engine in a separate process, diffed on the interpreter: the
    two engines agree bit for bit, so every output is exact."""
    dump = tmp_path / "self.safetensors"
    p = subprocess.run([sys.executable, "-m", "firscope", "run", random_model, "--tokens",
                        "1,2,3", "-n", "3", "--ids", "--dump", dump], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    fed = [int(t) for t in p.stdout.strip().split(",")][:-1]  # the last token is not fed
    d = Dump(dump)
    assert d.tokens == fed and d.producer.startswith("firscope")
    assert len(d.entries) == 5 * 39  # every output of every node (33 nodes, 39 outputs)
    p = subprocess.run([sys.executable, "-m", "firscope", "diff", random_model, "--against",
                        dump, "--engine", "interp", "--json"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["first_divergence"] is None and rep["mismatches"] == []
    assert rep["compared"] == {"outputs": 195, "possible": 195, "steps": 5, "of_steps": 5,
                               "nodes": 33, "of_nodes": 33}
    assert rep["tokens"] == fed and rep["tokens_from"] == "the dump's metadata"
    assert all(o["differing"] == 0 and o["max_ulp"] == 0 for o in rep["outputs"])


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_bugged_attention_kernel_is_named_with_its_step_and_lane(random_model, tmp_path,
                                                                   capsys, bug):
    buggy = _bugged(random_model, bug)
    dump = tmp_path / "bug.safetensors"
    code, _, err = _fs(capsys, "run", buggy, "--tokens", "3,1,4,1", "-n", "2", "--ids",
                       "--engine", "interp", "--dump", dump)
    assert code == 0, err
    code, out, err = _fs(capsys, "diff", random_model, "--against", dump, "--engine", "interp")
    assert code == 1, err
    step = BUGS[bug][2]
    line = next(ln for ln in out.splitlines() if ln.startswith("first divergence:"))
    assert line.startswith(f"first divergence: step {step} (token "), line
    assert ", attention@0, output attn, element " in line and "written by lane" in line
    assert "warning: the dump was made from another model file" in out
    code, out, _ = _fs(capsys, "diff", random_model, "--against", dump, "--engine", "interp",
                       "--json")
    first = json.loads(out)["first_divergence"]
    assert (first["step"], first["instance"], first["buffer"]) == (step, "attention@0", "attn")
    assert first["lane"] == first["index"] // HEADDIM  # lane h writes head h's slice
    ref = load_model(random_model)
    assert first["line"] in {op.loc.line for op in ref.kernels["g2.attn_decode"].ops
                             if op.spec.mnemonic == "ustoref32"}


def test_the_same_bug_in_a_second_model_file(random_model, capsys):
    """diff A.fir B.fir: an edited kernel against the original, same weights and inputs."""
    buggy = _bugged(random_model, "wrong scale")
    code, out, err = _fs(capsys, "diff", random_model, buggy, "--tokens", "3,1,4",
                         "--engine", "interp", "--json")
    assert code == 1, err
    rep = json.loads(out)
    first = rep["first_divergence"]
    assert (first["step"], first["instance"], first["buffer"]) == (1, "attention@0", "attn")
    assert rep["other"]["kind"] == "model" and rep["unmatched"] == []
    same = random_model.parent / "copy.fir"
    shutil.copy(random_model, same)
    code, out, _ = _fs(capsys, "diff", random_model, same, "--tokens", "3,1,4")
    assert code == 0 and "first divergence: none" in out
    assert "compared 117 of 117 node outputs (3 of 3 steps, 33 of 33 nodes)" in out


def test_graphs_that_differ_are_matched_by_instance(random_model, capsys):
    """B has an extra node (a copy of x) and lacks final_norm's counterpart name."""
    text = random_model.read_text()
    text = text.replace("node final_norm micro", "node extra micro g2.add x pos_embed -> mix\n"
                                                 "node final_ln micro")
    b = random_model.parent / "b.fir"
    b.write_text(text)
    code, out, err = _fs(capsys, "diff", random_model, b, "--tokens", "1,2")
    assert code == 0, err + out  # the graphs differ; nothing that was compared diverges
    assert "extra: instance only in b.fir" in out
    assert "final_ln: instance only in b.fir" in out
    assert "final_norm: instance only in gpt2.fir" in out
    assert "compared 76 of 78 node outputs (2 of 2 steps, 32 of 33 nodes)" in out


def test_an_independent_numpy_gpt2_diffs_clean_against_fir_f32(sample_fir, tmp_path):
    """tests/npgpt2_dump.py (BLAS matmuls, NumPy reductions, tanh GELU), f32 weights, on the
    trained sample model: every node has a counterpart and none diverges; the q4 load
    against the same dump does (the check can fail)."""
    tokens = [int(t) for t in np.random.default_rng(5).integers(0, 256, 24)]
    dump = write_numpy_dump(sample_fir.parent, tokens, tmp_path / "np.safetensors")
    f32 = load_model(sample_fir, fir_f32=True)
    rep = run_lockstep(f32, DumpSource(f32, Dump(dump), len(tokens)), tokens, Tolerance(),
                       engine="interp")
    assert rep.mismatches == [] and rep.exit_code == 0, rep.first_divergence
    assert len(f32.nodes) == 61
    assert len(rep.results) == rep.possible == 24 * 73  # every output of every node
    worst = max(r.diff.rel_l2 for r in rep.results)
    assert 0 < worst < DEFAULT_RTOL / 10  # different arithmetic, well inside the bound
    q4 = load_model(sample_fir)
    rep = run_lockstep(q4, DumpSource(q4, Dump(dump), len(tokens)), tokens, Tolerance(),
                       engine="interp")
    assert rep.first_divergence is not None and rep.first_divergence.instance == "qkv_linear@0"


# -- dumps that do not fit ---------------------------------------------------------------------
def _good_dump(model_path, path, tokens=(1, 2, 3), keep=None, extra=None, meta=True):
    """A dump of the reference itself; ``keep(step, instance, buffer)`` filters keys."""
    from firscope.runtime import Machine
    m = load_model(model_path)
    mach = Machine(m, engine="interp")
    with DumpWriter(path, tokens=tokens if meta else None) as w:
        for step, tok in enumerate(tokens):
            mach.begin_token(tok)
            for node in m.nodes:
                mach.run_node(node)
                for o in node.outs:
                    if keep is None or keep(step, node.full_name, o.name):
                        w.add(step, node.full_name, o.name, m.view(o.region))
            mach.finish_token()
        for key, value in (extra or {}).items():
            w.add(*key, value)
    return path


def test_missing_steps_and_nodes_are_counted_not_errors(random_model, tmp_path, capsys):
    dump = _good_dump(random_model, tmp_path / "part.safetensors",
                      keep=lambda s, inst, buf: s != 1 and inst.startswith("attention@"))
    code, out, err = _fs(capsys, "diff", random_model, "--against", dump)
    assert code == 0, err
    assert "compared 16 of 117 node outputs (2 of 3 steps, 2 of 33 nodes)" in out
    assert "note: no values for 1 of 3 steps: 1" in out
    assert "note: no values for 31 of 33 nodes: token, positional, embeddings" in out


def test_keys_that_match_nothing_are_listed_and_fail(random_model, tmp_path, capsys):
    f = np.float32
    extra = {
        (0, "attn@0", "attn"): np.zeros(64, f),  # a naming slip
        (0, "attention@7", "attn"): np.zeros(64, f),  # no such layer
        (0, "attention", "attn"): np.zeros(64, f),  # the layer left out
        (0, "head", "foo"): np.zeros(256, f),  # no such output
        (0, "qkv_bias@0", "qkvb"): np.zeros(192, f),  # an input, not an output
        (5, "token", "x"): np.zeros(64, f),  # past the tokens: not compared, not an error
    }
    dump = _good_dump(random_model, tmp_path / "bad.safetensors", tokens=(1, 2), extra=extra,
                      keep=lambda s, inst, buf: (s, inst, buf) != (1, "ln2@1", "norm"))
    with DumpWriter(tmp_path / "more.npz", tokens=(1, 2)) as w:
        w.add(0, "ln1@0", "norm", np.zeros(65, f))  # wrong element count
        w.add(0, "ln2@0", "norm", np.zeros(64, np.int32).view(np.float32))
        w.add(1, "ln1@0", "norm", np.zeros((8, 8), f))  # shaped: fine
    z = dict(np.load(tmp_path / "more.npz"))
    z["step0/ln2@0/norm"] = np.zeros(64, np.int32)  # not floating point
    z["garbage"] = np.zeros(1, f)
    np.savez(tmp_path / "more.npz", **z)
    code, out, err = _fs(capsys, "diff", random_model, "--against", dump)
    assert code == 1, err
    for needle in ("5 keys that do not match the model (not compared):",
                   "step0/attn@0/attn: no node instance 'attn@0' in gpt2.fir (did you mean "
                   "attention@0",
                   "step0/attention@7/attn: no node instance 'attention@7' in gpt2.fir (its "
                   "layers are 0..1)",
                   "step0/attention/attn: no node instance 'attention' in gpt2.fir (a node "
                   "inside the repeat is named with its layer: attention@0)",
                   "step0/head/foo: head has no output 'foo' (outputs: logits)",
                   "step0/qkv_bias@0/qkvb: 'qkvb' is an input of qkv_bias@0, not an output",
                   "note: 1 keys are at steps past the 2 compared (e.g. step5/token/x)"):
        assert needle in out, needle
    assert "first divergence: none" in out  # what was compared agrees
    code, out, err = _fs(capsys, "diff", random_model, "--against", tmp_path / "more.npz",
                         "--json")
    rep = json.loads(out)
    problems = {m["key"]: m["problem"] for m in rep["mismatches"]}
    assert code == 1 and set(problems) == {"step0/ln1@0/norm", "step0/ln2@0/norm", "garbage"}
    assert problems["step0/ln1@0/norm"] == "65 elements (shape [65]), but 'norm' has 64"
    assert problems["step0/ln2@0/norm"].startswith("dtype <i4: dumps hold f32")
    assert problems["garbage"] == "not a step{S}/{instance}/{buffer} key"
    assert rep["compared"]["outputs"] == 1  # the shaped [8, 8] key (zeros: it diverges)
    assert (rep["first_divergence"]["step"], rep["first_divergence"]["instance"]) == (1, "ln1@0")


def test_text_from_the_dump_is_escaped(random_model, tmp_path, capsys):
    """Keys and metadata are the file's text: a terminal escape in them is shown escaped."""
    evil = "\x1b]0;pwned\x07"
    with DumpWriter(tmp_path / "e.safetensors", tokens=[1], producer=f"x{evil}") as w:
        w.add(0, f"head{evil}", "logits", np.zeros(256, np.float32))
    code, out, err = _fs(capsys, "diff", random_model, "--against", tmp_path / "e.safetensors")
    assert code == 1 and "\x1b" not in out + err
    assert "producer: x\\x1b]0;pwned\\x07" in out
    assert "step0/head\\x1b]0;pwned\\x07/logits: no node instance" in out


def test_nan_in_a_dump_is_the_divergence(random_model, tmp_path, capsys):
    dump = _good_dump(random_model, tmp_path / "d.safetensors")
    d = Dump(dump)
    with DumpWriter(tmp_path / "nan.safetensors", tokens=[1, 2, 3]) as w:
        for key in d.entries:
            v = d.read(key).copy()
            if key == "step2/gelu@1/activated":
                v[7] = np.nan
            e = d.entries[key]
            w.add(e.step, e.instance, e.buffer, v)
    code, out, _ = _fs(capsys, "diff", random_model, "--against", tmp_path / "nan.safetensors")
    assert code == 1
    assert ("first divergence: step 2 (token 3), gelu@1, output activated, element 7, written "
            "by lane 7 at line") in out
    assert "element 7 is NaN where the reference has" in out


@pytest.mark.parametrize("args,message", [
    (["--tokens", "1,2"], None),  # fine: the given tokens
    ([], "the dump does not say which tokens it was fed"),
])
def test_tokens_come_from_the_metadata_or_the_command_line(random_model, tmp_path, capsys,
                                                          args, message):
    dump = _good_dump(random_model, tmp_path / "d.safetensors", tokens=(1, 2), meta=False)
    code, out, err = _fs(capsys, "diff", random_model, "--against", dump, *args)
    if message is None:
        assert code == 0 and "tokens:    2 steps (--tokens)" in out
    else:
        assert code == 2 and message in err and out == ""


@pytest.mark.parametrize("args,message", [
    (["--against", "{tmp}/nothing.safetensors"], "nothing.safetensors: no such file"),
    (["--against", "{tmp}/junk.safetensors"], "corrupt"),
    ([], "give the run to compare with"),
    (["{model}", "--against", "{tmp}/d.safetensors"], "give the run to compare with"),
    (["--against", "{tmp}/d.safetensors", "--rtol", "-1"], "--rtol -1"),
    (["--against", "{tmp}/d.safetensors", "--ulp", "2", "--atol", "0.1"], "either --ulp"),
])
def test_usage_errors_and_unreadable_files_exit_2(random_model, tmp_path, capsys, args,
                                                  message):
    _good_dump(random_model, tmp_path / "d.safetensors", tokens=(1,))
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\0\0\0\0\0\0\0{not json}......")
    args = [a.format(tmp=tmp_path, model=random_model) for a in args]
    code, out, err = _fs(capsys, "diff", random_model, *args)
    assert code == 2 and message in err, err


def test_dump_nodes_selects_outputs(random_model, tmp_path, capsys):
    dump = tmp_path / "sel.npz"
    code, _, err = _fs(capsys, "run", random_model, "--tokens", "1,2", "-n", "1", "--engine",
                       "interp", "--dump", dump, "--dump-nodes", "attention@*/attn, head")
    assert code == 0, err
    assert sorted(Dump(dump).entries) == sorted(
        f"step{s}/{k}" for s in (0, 1) for k in ("attention@0/attn", "attention@1/attn",
                                                 "head/logits"))
    code, _, err = _fs(capsys, "run", random_model, "--tokens", "1", "--dump",
                       tmp_path / "x.safetensors", "--dump-nodes", "atention@*")
    assert code == 1 and "'atention@*' matches no node output" in err
    assert not (tmp_path / "x.safetensors").exists()


def test_dump_replaces_only_a_dump(random_model, tmp_path, capsys):
    """A --dump path that names the model's checkpoint, its .fir or any other file is
    refused before the run and the file is left as it was (an earlier dump is replaced)."""
    ckpt = random_model.parent / "model.safetensors"
    note = tmp_path / "notes.txt"
    note.write_text("keep me\n")
    for target, why in ((ckpt, "it holds '"), (random_model, "it cannot be read as one"),
                        (note, "it cannot be read as one")):
        before = target.read_bytes()
        code, _, err = _fs(capsys, "run", random_model, "--tokens", "1", "--dump", target)
        assert code == 1 and "exists and is not a dump" in err and why in err, err
        assert target.read_bytes() == before
    dump = tmp_path / "d.safetensors"
    for n in ("1", "2"):  # the second run replaces the first one's dump
        assert _fs(capsys, "run", random_model, "--tokens", n, "--dump", dump)[0] == 0
    assert Dump(dump).tokens[0] == 2
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")  # nothing to lose: replaced
    assert _fs(capsys, "run", random_model, "--tokens", "1", "--dump", empty)[0] == 0


def test_dump_never_renames_over_a_folder_or_a_fifo(random_model, tmp_path, capsys):
    import os
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for target, what in ((tmp_path, "is a folder"), (fifo, "is not a regular file")):
        code, _, err = _fs(capsys, "run", random_model, "--tokens", "1", "--dump", target)
        assert code == 1 and what in err, err
    assert fifo.is_fifo() and tmp_path.is_dir()
    with pytest.raises(OSError, match="not a regular file"):
        DumpWriter(fifo)


# -- what the UI shows ---------------------------------------------------------------------------
def test_view_models_for_the_graph_pane_and_the_buffer_view(random_model, tmp_path):
    m = load_model(random_model)
    b = load_model(_bugged(random_model, "wrong scale"))
    rep = run_lockstep(m, ModelSource(m, b, 2), [3, 1], Tolerance())
    step1 = {}
    for r in rep.results:
        if r.step == 1:
            step1.setdefault(r.node, []).append(r)
    rows = node_errors(m.nodes, step1, Tolerance().rtol)
    by_name = {e.instance: e for e in rows}
    assert by_name["ln1@0"].severity is Severity.EXACT and by_name["ln1@0"].label == "="
    att = by_name["attention@0"]
    assert att.severity is Severity.DIVERGED and att.worst in ("attn", "scores")
    assert att.label.startswith("DIVERGED ")
    assert by_name["head"].severity is Severity.DIVERGED
    first = rep.first_divergence
    ref = np.linspace(-1, 1, 64).astype(np.float32)
    other = ref.copy()
    other[first.diff.index] += 1
    view = buffer_view(first, ref, other, rows=8)
    assert view.marked == first.diff.index and len(view.rows) == 8
    marked = [r for r in view.rows if r.marked]
    assert len(marked) == 1 and marked[0].index == first.diff.index
    assert marked[0].differs and marked[0].difference == pytest.approx(1.0)
    assert sum(r.differs for r in view.rows) == 1
    assert view.summary.startswith("attention@0/attn: ") and "DIVERGED" in view.summary
    assert severity(None) is Severity.NOT_COMPARED
    assert Severity.NONFINITE > Severity.DIVERGED > Severity.NEAR > Severity.WITHIN


def test_profile_divergence_section(random_model, tmp_path, capsys):
    from firscope.profile.data import ProfileData
    from firscope.profile.divergence import compare_with_dump, divergence_section
    buggy = _bugged(random_model, "wrong scale")
    dump = tmp_path / "bug.safetensors"
    assert _fs(capsys, "run", buggy, "--tokens", "3,1", "-n", "1", "--dump", dump)[0] == 0
    m = load_model(random_model)
    before = m.arena.copy()
    div = compare_with_dump(m, dump, [3, 1], engine="interp")
    assert np.array_equal(m.arena, before)  # a session's state is left as it was
    assert div.first_step == 1 and m.nodes[div.first_node].full_name == "attention@0"
    assert div.first.startswith("first divergence: step 1 (token 1), attention@0")
    row = next(r for r in div.rows if r.output == "attention@0/attn")
    assert row.status == "DIVERGED at step 1" and row.lane == row.index // HEADDIM
    data = ProfileData.for_model(m)
    assert divergence_section(data) is None
    data.divergence = div
    sec = json.loads(json.dumps(divergence_section(data)))
    assert sec["first_step"] == 1 and sec["rows"][0]["status"] == "exact"
