"""Every node judged on its own inputs (``firscope diff --isolate``, issue 25).

The random 2-layer model gets two independent bugs: a wrong softmax scale in
g2.attn_decode (attention@L, from step 1) and a wrong cubic coefficient in
g2.gelu_new (gelu@L, from step 0). The plain diff names only the first; with
--isolate every instance of those two kernels is wrong on its own and nothing
else is.
"""
from __future__ import annotations

import json

import pytest

from firscope.cli import main
from firscope.compare.record import DumpRecorder
from firscope.runtime import Machine, load_model

TOKENS = [3, 1, 4, 1]
BUGS = (("mulconst 3 3 1/sqrt(headdim)", "mulconst 3 3 1/headdim"),
        ("mulconst 2 2 0.044715", "mulconst 2 2 0.06"))


def dump_of(fir, out, tokens=TOKENS, pattern=None):
    mach = Machine(load_model(fir), engine="interp")
    rec = DumpRecorder(mach, out, steps=len(tokens), pattern=pattern)
    mach.reset()
    for t in tokens:
        mach.step(t)
    rec.close()
    return out


def buggy(fir, bugs=BUGS, name="two-bugs.fir"):
    text = fir.read_text()
    for old, new in bugs:
        assert text.count(old) == 1
        text = text.replace(old, new)
    out = fir.parent / name
    out.write_text(text)
    return out


@pytest.fixture
def two_bugs(random_model, tmp_path):
    return dump_of(buggy(random_model), tmp_path / "two.safetensors")


def _diff(capsys, *args):
    code = main(["diff", *map(str, args)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out


def _kernels(model):
    return {n.full_name: n.target for n in model.nodes}


def test_isolate_lists_exactly_the_two_wrong_kernels(random_model, two_bugs, capsys):
    model = load_model(random_model)
    kernels = _kernels(model)
    code, out = _diff(capsys, random_model, "--against", two_bugs, "--isolate", "--json")
    assert code == 1
    rep = json.loads(out)
    wrong = {w["instance"] for w in rep["isolate"]["wrong_on_their_own"]}
    expected = {n for n, k in kernels.items() if k in ("g2.attn_decode", "g2.gelu_new")}
    assert wrong == expected and len(expected) == 4  # two layers of each
    assert not rep["isolate"]["not_judged"]
    by = {w["instance"]: w for w in rep["isolate"]["wrong_on_their_own"]}
    assert by["gelu@0"]["steps"] == [0, 1, 2, 3]
    assert by["attention@0"]["steps"] == [1, 2, 3]  # one position: any scale gives weight 1
    # every run of every other node agrees on its own (bit for bit or within tolerance)
    runs: dict = {}
    for o in rep["outputs"]:
        runs[(o["step"], o["instance"])] = runs.get((o["step"], o["instance"]), False) \
            or o["diverged"]
    assert len(runs) == len(TOKENS) * len(kernels)
    for (step, instance), diverged in runs.items():
        assert diverged == (instance in expected and (step > 0 or "gelu" in instance))
    inherited = {(i["step"], i["instance"]): i["from"] for i in rep["isolate"]["inherited"]}
    assert not [k for k in inherited if runs[k]]  # wrong on its own is never "inherited"
    assert inherited[(0, "attention@1")] == "gelu@0 at step 0"  # attention is right at step 0
    assert inherited[(0, "head")] == "gelu@0 at step 0"
    # step 1 starts from a fresh embedding: ln2@0 is downstream of that step's attention@0
    assert (0, "ln2@0") not in inherited and inherited[(1, "ln2@0")] == "attention@0 at step 1"
    # the plain diff: the first divergence only, and everything after it differs
    code, out = _diff(capsys, random_model, "--against", two_bugs, "--json")
    plain = json.loads(out)
    assert code == 1 and plain["isolate"] is None
    assert plain["first_divergence"]["instance"] == "gelu@0"
    assert plain["first_divergence"]["step"] == 0
    assert {o["instance"] for o in plain["outputs"] if o["diverged"]} - expected


def test_isolate_text_report_names_kernels_and_lanes(random_model, two_bugs, capsys):
    code, out = _diff(capsys, random_model, "--against", two_bugs, "--isolate")
    assert code == 1
    lines = out.splitlines()
    assert "wrong on their own: 4 node instances of 2 kernels" in lines
    assert any(l.startswith("  g2.attn_decode: attention@0, attention@1 (steps 1..3;")
               for l in lines)
    assert any(l.startswith("  g2.gelu_new: gelu@0, gelu@1 (steps 0..3;") for l in lines)
    first = next(l for l in lines if l.startswith("first node wrong on its own:"))
    assert "step 0 (token 3), gelu@0, output activated" in first
    assert "written by lane" in first  # looked up from the other run's inputs
    assert "WRONG ON ITS OWN at step 1" in next(l for l in lines
                                                 if l.startswith("attention@1/attn "))


def test_a_single_bug_is_wrong_on_its_own_only_in_its_kernel(random_model, tmp_path, capsys):
    dump = dump_of(buggy(random_model, BUGS[:1], "scale.fir"), tmp_path / "scale.safetensors")
    code, out = _diff(capsys, random_model, "--against", dump, "--isolate", "--json")
    rep = json.loads(out)
    assert {w["instance"] for w in rep["isolate"]["wrong_on_their_own"]} == \
        {"attention@0", "attention@1"}
    first = rep["first_divergence"]
    assert (first["step"], first["instance"], first["buffer"]) == (1, "attention@0", "attn")
    assert first["lane"] == first["index"] // 16  # lane h writes attn[16h:16h+16]


def test_a_clean_dump_is_clean_on_its_own(random_model, tmp_path, capsys):
    dump = dump_of(random_model, tmp_path / "ok.safetensors")
    code, out = _diff(capsys, random_model, "--against", dump, "--isolate")
    assert code == 0, out
    assert "wrong on their own: none" in out and "not judged" not in out


def test_nodes_whose_inputs_the_dump_lacks_are_not_judged(random_model, two_bugs, tmp_path,
                                                          capsys):
    # outputs of attention and gelu only: their inputs (qkv, fc) are not in the dump
    part = dump_of(buggy(random_model), tmp_path / "part.safetensors",
                   pattern="attention@*,gelu@*,qkv_bias@0")
    code, out = _diff(capsys, random_model, "--against", part, "--isolate", "--json")
    rep = json.loads(out)
    nj = rep["isolate"]["not_judged"]
    judged = {w["instance"] for w in rep["isolate"]["wrong_on_their_own"]}
    # attention@0 has all it reads: qkv (qkv_bias@0), scores (attention@1 at the step before,
    # nothing at step 0) and its own caches; qkv_bias@0 lacks qkv, attention@1 and gelu fc
    missing = {"qkv_bias@0", "attention@1", "gelu@0", "gelu@1"}
    assert {n["instance"] for n in nj} == missing
    assert all("the dump has no" in n["reason"] and "(an input)" in n["reason"] for n in nj)
    assert len(nj) == len(missing) * len(TOKENS)
    assert judged == {"attention@0"}
    assert not {o["instance"] for o in rep["outputs"]} & missing
    code, out = _diff(capsys, random_model, "--against", part, "--isolate")
    assert code == 1  # attention@0 is wrong on its own
    assert "not judged: 16 node runs of 4 instances (the other side lacks their inputs), " \
           "e.g. qkv_bias@0 at step 0: the dump has no qkv of qkv_linear@0 at step 0 " \
           "(an input)" in out


def test_isolate_between_two_model_files(random_model, capsys):
    bug = buggy(random_model)
    code, out = _diff(capsys, random_model, bug, "--isolate", "--tokens", "3,1,4", "--json")
    rep = json.loads(out)
    assert code == 1
    assert {w["instance"] for w in rep["isolate"]["wrong_on_their_own"]} == \
        {"attention@0", "attention@1", "gelu@0", "gelu@1"}
    assert not rep["isolate"]["not_judged"]


# -- KV caches compared by the rows written this step (compare/rows) --------------------------
def _with_stray_write(src, dst, step, key_suffix="attention@0/key_cache", index=5):
    """A copy of dump ``src`` where the cache element ``index`` (row 0) is changed from
    ``step`` on: a write outside the row the step should write, kept by later steps."""
    from firscope.compare import Dump
    from firscope.dump import DumpWriter
    d = Dump(src)
    with DumpWriter(dst, tokens=d.tokens, producer="stray") as w:
        for key, e in d.entries.items():
            v = d.read(key).copy()
            if key.endswith(key_suffix) and e.step >= step:
                v[index] += 1.0
            w.add(e.step, e.instance, e.buffer, v)
    d.close()
    return dst


def test_rows_compare_only_the_written_row_but_find_a_stray_write_by_the_end(random_model,
                                                                              tmp_path):
    from firscope.compare import DumpSource, Tolerance, run_lockstep
    from firscope.compare.dumpfile import Dump
    import firscope.compare.rows as rows
    ok = dump_of(random_model, tmp_path / "ok.safetensors")
    stray = _with_stray_write(ok, tmp_path / "stray.safetensors", 2)
    model = load_model(random_model)
    old = rows.MIN_ELEMENTS
    rows.MIN_ELEMENTS = 1  # the random model's caches are small: compare them by rows too
    try:
        found = {}
        for by_rows in (True, False):
            d = Dump(stray)
            rep = run_lockstep(model, DumpSource(model, d, len(TOKENS)), TOKENS, Tolerance(),
                               rows=by_rows)
            d.close()
            bad = [r for r in rep.diverged if r.buffer == "key_cache"]
            found[by_rows] = (bad[0].step, bad[0].instance, bad[0].diff.index, rep.notes)
        assert found[False][:3] == (2, "attention@0", 5)  # whole: the step that wrote it
        assert found[True][:3] == (3, "attention@0", 5)  # by rows: found at the last step
        assert any("attention@0/key_cache differs at the last step outside the row" in n
                   for n in found[True][3])
        d = Dump(ok)  # a clean dump: everything exact, caches compared by rows after step 0
        comparer = rows.RowComparer(model, len(TOKENS))
        rep = run_lockstep(model, DumpSource(model, d, len(TOKENS)), TOKENS, Tolerance())
        d.close()
        assert rep.exit_code == 0 and not rep.notes
    finally:
        rows.MIN_ELEMENTS = old
    assert comparer._width  # the caches are persistent outputs of n_positions rows
