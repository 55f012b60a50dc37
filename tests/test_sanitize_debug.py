"""The sanitizer in the debugger, the UI and the profile report (issue 15).

``break race`` / ``break uninit`` stop before the offending instruction with the
focus on the second lane involved; the frozen view carries the findings, and the
graph pane and source gutter mark them (pure functions, no Pilot); ``profile
--sanitize`` puts the report's findings in report.json and report.html.
"""
from __future__ import annotations

import pytest

from conftest import SAMPLE, write_random_gpt2
from firscope.debug.commands import CommandInterpreter
from firscope.debug.session import Session
from firscope.debug.snapshot import StopReason
from firscope.model.tokens import load_tokenizer
from firscope.runtime import load_model
from firscope.tui.attention_view import AttentionRecorder
from firscope.tui.graph_pane import node_rows
from firscope.tui.source_pane import source_rows
from firscope.tui.state import FINDING_MARK, Wants, build_view
from test_sanitize import COPY, RAW, SMALL, fir_with, line_of


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return write_random_gpt2(tmp_path_factory.mktemp("dbg") / "raw", **SMALL, fir_text=fir_with(
        RAW, "node raw micro t.raw x -> scratch res\n", "buf scratch f32 8\nbuf res f32 8\n"))


@pytest.fixture(scope="module")
def uninit(tmp_path_factory):
    return write_random_gpt2(tmp_path_factory.mktemp("dbg") / "uninit", **SMALL,
                             fir_text=fir_with(COPY, "node copy micro t.copy never -> res\n",
                                               "buf never f32 8\nbuf res f32 8\n"))


def session(path, tokens=(1, 2), n=1, engine="compiled"):
    model = load_model(path)
    s = Session(model, list(tokens), n, engine=engine)
    return s, CommandInterpreter(s)


def test_break_race_stops_before_the_read_focused_on_the_second_lane(raw):
    s, ci = session(raw)
    ci.execute("break race")
    ci.execute("stepi 3")  # two ext nodes, then into the embeddings kernel (lanes to focus)
    ci.set_lane(3)
    out = ci.execute("continue")
    stop = ci.last.stop
    load = line_of(raw, "uloadf32 5 2 @out0")
    assert stop.reason is StopReason.BREAKPOINT and stop.breakpoint == 1
    assert "read after write" in stop.message and "scratch[1]" in stop.message
    assert stop.location.node == "raw" and stop.location.line == load
    d = s.dispatch
    assert d.ops[d.pc].loc.line == load and d.steps > 0  # before the load: it has not run
    assert ci.lane == 0  # the reader, whose access met lane 1's write
    assert "Catchpoint 1" in out
    ci.execute("continue")  # the same pair does not stop again in this dispatch ...
    stop = ci.last.stop
    assert stop.reason is StopReason.BREAKPOINT and stop.location.step == 1  # ... but next step
    (f,) = s.breakpoints.get(1).findings()
    assert f.lines == (line_of(raw, "ustoref32 1 0 @out0"), load)
    ci.execute("continue")
    assert ci.last.stop.reason is StopReason.FINISHED


def test_break_race_runs_proven_kernels_whole(raw):
    s, _ = session(raw)
    s.add_breakpoint("race")
    wanted = {n.target for n in s.model.nodes if s.breakpoints.instruction_checks(s, n)}
    assert wanted == {"t.raw", "g2.attn_decode"}  # not g2.add, g2.layernorm, g2.gelu_new


def test_break_uninit_stops_at_the_read(uninit):
    s, ci = session(uninit)
    ci.execute("break uninit")
    ci.execute("continue")
    stop = ci.last.stop
    assert stop.reason is StopReason.BREAKPOINT
    assert stop.location.line == line_of(uninit, "uloadf32 1 0 @in0")
    assert "never[0]" in stop.message and "nothing has written" in stop.message
    assert ci.lane == 0


def test_break_uninit_set_mid_run_knows_what_was_written_before():
    """Set at step 2, it must know the KV cache rows steps 0 and 1 wrote (a replay), or the
    attention kernel's reads of them would stop it falsely."""
    s, ci = session(SAMPLE / "gpt2.fir", tokens=(1, 2, 3, 4), n=1)
    ci.execute("token")
    ci.execute("token")
    assert s.step == 2
    ci.execute("break uninit")
    ci.execute("continue")
    assert ci.last.stop.reason is StopReason.FINISHED, ci.last.stop.message
    # and after going back in time the shadow is rebuilt, not left ahead of the session
    ci.execute("reverse-continue")
    ci.execute("continue")
    assert ci.last.stop.reason is StopReason.FINISHED


def test_break_uninit_set_mid_run_still_finds_a_real_one(uninit):
    s, ci = session(uninit, tokens=(1, 2, 3), n=0)
    ci.execute("token")
    ci.execute("break uninit")
    ci.execute("continue")
    assert ci.last.stop.reason is StopReason.BREAKPOINT and ci.last.stop.location.step == 1


def test_findings_are_marked_in_the_graph_and_the_gutter(raw):
    s, ci = session(raw)
    model = s.model
    tok = load_tokenizer(model.folder, model.vocab)
    rec = AttentionRecorder(s)
    ci.execute("break race")
    clean = build_view(s, ci, tok, rec, Wants())
    assert not clean.findings.nodes
    ci.execute("continue")
    view = build_view(s, ci, tok, rec, Wants())
    raw_node = next(n for n in model.nodes if n.name == "raw")
    assert view.findings.nodes == {raw_node.index}
    rows = {i: t.plain for i, t, d in node_rows(model, view, 40) if not d}
    assert rows[str(raw_node.index)].rstrip().endswith(FINDING_MARK)
    assert not any(t.rstrip().endswith(FINDING_MARK) for i, t in rows.items()
                   if i != str(raw_node.index))
    sv = source_rows(model, view, raw_node.index, 60)
    marked = {ln for ln, t in sv.rows if t.plain[0] == FINDING_MARK}
    assert marked == {line_of(raw, "ustoref32 1 0 @out0"), line_of(raw, "uloadf32 5 2 @out0")}
    before = source_rows(model, clean, raw_node.index, 60)
    assert not any(t.plain[0] == FINDING_MARK for _, t in before.rows)


def test_profile_sanitize_lists_the_findings(raw, tmp_path):
    from firscope.profile.export import report_dict
    from firscope.profile.html import render_html
    from firscope.profile.report import add_sanitizer, profile_model
    model = load_model(raw)
    data = profile_model(model, [1, 2], 1, quant=False, instrument_steps=0)
    assert report_dict(data)["sanitizer"] is None
    add_sanitizer(data, model)
    rep = report_dict(data)
    san = rep["sanitizer"]
    assert san["errors"] == 1 and san["findings"][0]["kernel"] == "t.raw"
    assert san["findings"][0]["lines"] == [line_of(raw, "ustoref32 1 0 @out0"),
                                           line_of(raw, "uloadf32 5 2 @out0")]
    page = render_html(rep, {}, [])
    assert "id='sanitizer'" in page and "ERROR SUMMARY: 1 error" in page and "t.raw" in page


def test_f2_carries_break_race_and_uninit(raw):
    from firscope.tui.reload import carry, restore
    s, ci = session(raw)
    ci.execute("break race")
    ci.execute("break uninit")
    ci.execute("disable 2")
    carried = carry(s, ci)
    assert [(c.command, c.enabled) for c in carried.breaks] == [("break race", True),
                                                                 ("break uninit", False)]
    s2, ci2 = session(raw)
    notes = restore(ci2, carried)
    assert not any(n.startswith("not restored") for n in notes), notes
    assert [(bp.kind, bp.enabled) for bp in s2.breakpoints] == [("race", True), ("uninit", False)]
