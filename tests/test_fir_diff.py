"""``firscope diff A.fir B.fir`` says what changed and ties the divergence to it (issue 25)."""
from __future__ import annotations

import json

from firscope.cli import main
from firscope.compare.textdiff import diff_fir

from model_util import line_of


def _edit(fir, old, new, name):
    text = fir.read_text()
    assert text.count(old) == 1
    out = fir.parent / name
    out.write_text(text.replace(old, new))
    return out


def test_changed_lines_with_both_line_numbers_and_the_link(random_model, capsys):
    bug = _edit(random_model, "mulconst 3 3 1/sqrt(headdim)", "mulconst 3 3 1/headdim",
                "scale.fir")
    line = line_of(random_model.read_text(), "mulconst 3 3 1/sqrt(headdim)")
    code = main(["diff", str(random_model), str(bug), "--tokens", "3,1,4"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert out[0] == f"--- {random_model}" and out[1] == f"+++ {bug}"
    assert out[2].startswith("kernel g2.attn_decode (A lines ")
    minus = f"- {line:>5} {'':>5}  mulconst 3 3 1/sqrt(headdim)"
    plus = f"+ {'':>5} {line:>5}  mulconst 3 3 1/headdim"
    assert minus in out and plus in out
    assert out.index(plus) == out.index(minus) + 1
    assert out.index(plus) < out.index(next(l for l in out if l.startswith("reference:")))
    i = next(i for i, l in enumerate(out) if l.startswith("first divergence:"))
    assert "attention@0" in out[i]
    assert out[i + 1] == (f"  attention@0 runs g2.attn_decode, changed at A line {line} (-) "
                          f"mulconst 3 3 1/sqrt(headdim); B line {line} (+) "
                          "mulconst 3 3 1/headdim")
    assert "the instruction that stored the diverging element is unchanged" in out[i + 2]


def test_the_store_itself_changed(random_model, capsys):
    bug = _edit(random_model, "ustoref32 12 5 @out0", "ustoref32 11 5 @out0", "store.fir")
    line = line_of(random_model.read_text(), "ustoref32 12 5 @out0")
    # on the reference itself: a changed store is new code, which the compiled engine
    # would compile (~10 s of the suite's CPU for a kernel run once)
    code = main(["diff", str(random_model), str(bug), "--tokens", "3,1", "--json",
                 "--engine", "interp"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 1
    assert rep["changes"] == [
        {"section": "kernel g2.attn_decode", "kind": "-", "a_line": line, "b_line": None,
         "text": "ustoref32 12 5 @out0"},
        {"section": "kernel g2.attn_decode", "kind": "+", "a_line": None, "b_line": line,
         "text": "ustoref32 11 5 @out0"}]
    assert rep["first_divergence"]["line"] == line
    assert rep["divergence_links"][-1] == (f"the instruction that stored the diverging element "
                                           f"(A line {line}) is a changed line: "
                                           "ustoref32 12 5 @out0")


def test_graph_changes_and_identical_files(random_model, tmp_path, capsys):
    text = random_model.read_text()
    moved = _edit(random_model, "node gelu micro g2.gelu_new fc -> activated",
                  "node gelu micro g2.add fc fc -> activated", "graph.fir")
    fd = diff_fir(random_model, moved)
    assert [(c.section, c.kind) for c in fd.changes] == [("graph", "-"), ("graph", "+")]
    line = line_of(text, "node gelu micro")
    assert fd.changes[0].a_line == line and fd.changes[1].b_line == line
    code = main(["diff", str(random_model), str(moved), "--tokens", "3"])
    out = capsys.readouterr().out
    assert code == 1
    assert "the diverging node gelu@0 is declared on a changed line: A line" in out
    same = tmp_path / "same.fir"
    same.write_text(text.replace("\n# ", "\n#  "))  # comments do not count
    assert diff_fir(random_model, same).same
