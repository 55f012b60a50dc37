"""The debugger against a dump (issue 13): break diverge, s into the kernel, info diff.

The dump comes from the random model with the wrong attention scale
(1/headdim): it first diverges at step 1 in attention@0, and lane h of
g2.attn_decode writes attn[16h:16h+16].
"""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from firscope.debug.batch import run_batch
from firscope.debug.commands import CommandInterpreter
from firscope.debug.diverge import attach_reference
from firscope.debug.session import Session
from firscope.debug.snapshot import StopReason
from firscope.errors import FirError
from firscope.runtime import load_model
from model_util import scale_bug_dump

TOKENS = [3, 1, 4, 1]


@pytest.fixture
def bug_dump(random_model, tmp_path):
    """The same model with a wrong attention scale, dumped: attention@0 diverges at step 1."""
    return scale_bug_dump(random_model, tmp_path, TOKENS)


def _debugger(random_model, dump, engine="compiled"):
    s = Session(load_model(random_model), TOKENS, 0, engine=engine)
    attach_reference(s, dump)
    return s, CommandInterpreter(s)


@pytest.mark.parametrize("engine", ["compiled", "interp"])
def test_break_diverge_stops_after_the_first_diverging_node_focused_on_its_lane(
        random_model, bug_dump, engine):
    s, ci = _debugger(random_model, bug_dump, engine)
    assert ci.execute("break diverge").startswith("Catchpoint 1 at diverge (relative L2 <= ")
    text = ci.execute("continue")
    stop = ci.last.stop
    assert stop.reason is StopReason.BREAKPOINT and stop.breakpoint == 1
    assert text.startswith("Catchpoint 1, attention@0 diverges from the dump at step 1: attn[")
    assert s.step == 1 and s.node.full_name == "attention_linear@0"  # just after the node
    first = s.reference.first_divergence()
    assert (first.step, first.instance, first.buffer) == (1, "attention@0", "attn")
    lane = first.diff.index // 16
    assert first.writer is not None and first.writer.lane == lane
    assert stop.lane == lane and ci.lane == lane  # the stop focused the writing lane
    assert f"lane {lane} wrote it (line {first.writer.line}); 's' steps into attention@0" in text


def test_s_from_a_divergence_stop_steps_into_the_kernel_on_that_lane(random_model, bug_dump):
    s, ci = _debugger(random_model, bug_dump)
    ci.execute("break diverge")
    ci.execute("continue")
    lane = s.reference.first_divergence().writer.lane
    text = ci.execute("s")
    assert text.startswith(f"stepped into attention@0 at step 1, focused on lane {lane}, "
                           "which writes attn[")
    assert s.dispatch is not None and s.step == 1 and s.node.full_name == "attention@0"
    assert s.dispatch.steps == 1 and ci.lane == lane
    assert ci.last.lane.lane == lane  # the registers shown are that lane's
    assert float(s.dispatch.R[0, lane]) == lane  # R0 holds the lane id
    # a second s is an ordinary step, inside the same kernel
    ci.execute("s")
    assert s.dispatch.steps == 2 and s.node.full_name == "attention@0" and ci.lane == lane
    # the kernel the user now steps through recomputes exactly what the reference had
    ci.execute("finish")
    np.testing.assert_array_equal(s.buffer_value("attn"),
                                  s.model.view(s.model.nodes[s.model.node_index(
                                      "attention@0")].outs[0].region))


def test_s_elsewhere_is_plain_stepi(random_model, bug_dump):
    s, ci = _debugger(random_model, bug_dump)
    ci.execute("break diverge")
    ci.execute("continue")
    # everything downstream diverges too: the next stop is after attention_linear@0, an ext
    # node (no lanes), from where s is the ordinary step into the next kernel
    assert ci.execute("continue").startswith("Catchpoint 1, attention_linear@0 diverges")
    assert ci.last.stop.lane is None
    ci.execute("s")
    assert s.node.full_name == "attention_bias@0" and s.dispatch.steps == 1
    ci.execute("delete")
    ci.execute("finish")
    before = s.cursor  # not at a divergence stop
    ci.execute("s")
    assert s.cursor == before and s.dispatch is not None and s.dispatch.steps == 1


def test_break_diverge_tolerance_and_errors(random_model, bug_dump):
    s, ci = _debugger(random_model, bug_dump)
    ci.execute("break diverge 1 1")  # a 100% tolerance: nothing here is that far off
    assert ci.execute("continue").startswith("end of generation")
    s2 = Session(load_model(random_model), TOKENS, 0)
    with pytest.raises(FirError, match="needs a dump: start the debugger with --against"):
        s2.add_breakpoint("diverge")
    for bad in ("diverge x", "diverge 1 2 3", "diverge ulp", "diverge -1"):
        with pytest.raises(FirError,
                           match=r"break diverge \[--isolate\] \[RTOL \[ATOL\] \| ulp N\]"):
            s.add_breakpoint(bad)
    bp = s.add_breakpoint("diverge ulp 0")
    assert bp.spec == "diverge (max 0 ULP per element)"


def test_info_diff_lists_the_compared_outputs(random_model, bug_dump):
    s, ci = _debugger(random_model, bug_dump)
    with pytest.raises(FirError, match="usage: info diff"):
        ci.execute("info diff x")
    ci.execute("break diverge")
    ci.execute("continue")
    text = ci.execute("info diff")
    lines = text.splitlines()
    assert lines[0].startswith("dump ") and "156 outputs over 4 steps" in lines[0]
    assert "step 1: 10 outputs compared so far, 2 diverged" in text
    row = next(ln for ln in lines if ln.strip().startswith("attention@0/attn"))
    lane = s.reference.first_divergence().writer.lane
    assert row.rstrip().endswith("DIVERGED") and f"lane {lane}" in row
    assert next(ln for ln in lines if "ln1@0/norm" in ln).rstrip().endswith("exact")
    assert lines[-1].startswith("first divergence so far: step 1, attention@0/attn [")
    step0 = ci.execute("info diff 0")
    assert "step 0: 39 outputs compared so far, 0 diverged" in step0
    s3 = Session(load_model(random_model), TOKENS, 0)
    with pytest.raises(FirError, match="no dump is attached"):
        CommandInterpreter(s3).execute("info diff")


def test_a_session_fed_other_tokens_does_not_compare_those_steps(random_model, bug_dump):
    s = Session(load_model(random_model), [3, 2], 0)
    ref = attach_reference(s, bug_dump)
    ci = CommandInterpreter(s)
    ci.execute("break diverge")
    assert ci.execute("continue").startswith("end of generation")
    assert ref.skipped == {1: "this session fed token 2 at step 1, the dump token 1"}
    assert "step 1 not compared: this session fed token 2" in ci.execute("info diff 1")


def test_batch_debug_against_a_dump(random_model, bug_dump):
    from firscope.runtime.opening import RunInput
    source = RunInput(model=str(random_model))
    out = io.StringIO()
    code = run_batch(source, n=0, engine="interp", against=str(bug_dump), out=out,
                     stdin=io.StringIO("break diverge\ncontinue\ns\nwhere\n"))
    text = out.getvalue()
    assert code == 0
    assert "4 prompt tokens, 0 to generate" in text  # the dump's tokens
    assert "Catchpoint 1, attention@0 diverges from the dump at step 1" in text
    assert "stepped into attention@0 at step 1, focused on lane" in text
    assert "#0  g2.attn_decode pc 1" in text
    with pytest.raises(FirError, match="give the prompt"):
        run_batch(source, n=0, engine="interp", out=io.StringIO(), stdin=io.StringIO(""))


def test_profile_against_a_dump_reports_the_divergence_and_ranks_nodes_robustly(
        random_model, bug_dump, tmp_path):
    from firscope.cli import main
    out = tmp_path / "rep"
    tokens = ",".join(str(t) for t in TOKENS)
    code = main(["profile", str(random_model), "--tokens", tokens, "-n", "1", "-o", str(out),
                 "--engine", "interp", "--against", str(bug_dump)])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    d = report["divergence"]
    assert d["first"].startswith("first divergence: step 1") and "attention@0" in d["first"]
    assert report["nodes"][d["first_node"]]["full_name"] == "attention@0" and d["first_step"] == 1
    html = (out / "report.html").read_text()
    assert "id='divergence'" in html and "attention@0" in html
    ranked = report["timing"]["ranked"]
    costs = [r["cost_ms"] for r in ranked["node"]]
    assert costs == sorted(costs, reverse=True) and len(costs) == len(report["nodes"])
    for r in ranked["node"] + ranked["name"]:
        assert r["min_us"] <= r["median_us"] <= r["p90_us"] <= r["max_us"]
    assert "Nodes ranked by median × calls" in html and ranked["node_note"] in html
    plain = tmp_path / "plain"
    assert main(["profile", str(random_model), "--tokens", tokens, "-n", "1", "-o", str(plain),
                 "--engine", "interp"]) == 0
    assert json.loads((plain / "report.json").read_text())["divergence"] is None


def test_break_diverge_isolate_stops_at_each_node_wrong_on_its_own(random_model, tmp_path):
    """Two bugs (gelu from step 0, attention from step 1): the plain catchpoint stops at the
    first only; --isolate stops at every instance of both kernels and nowhere else."""
    from test_isolate import buggy, dump_of
    dump = dump_of(buggy(random_model), tmp_path / "two.safetensors", tokens=TOKENS)
    s = Session(load_model(random_model), TOKENS, 0, engine="compiled")
    attach_reference(s, dump)
    ci = CommandInterpreter(s)
    assert ci.execute("break diverge --isolate").startswith(
        "Catchpoint 1 at diverge --isolate (relative L2 <= ")
    stops = []
    while True:
        text = ci.execute("continue")
        if ci.last.stop.reason is not StopReason.BREAKPOINT:
            break
        stops.append(text.split(" is wrong on its own at step ")[0].split(", ")[1] + "@step"
                     + text.split(" is wrong on its own at step ")[1].split(" ")[0])
        assert "firscope capture --node" in text and f"--against {dump}" in text
    expected = ["gelu@0@step0", "gelu@1@step0"] + [
        f"{n}@step{k}" for k in (1, 2, 3) for n in ("attention@0", "gelu@0", "attention@1",
                                                   "gelu@1")]
    assert stops == expected
    ref = s.reference
    assert not ref.not_judged and len({k[1] for k in ref.own}) == len(s.model.nodes)
    assert "first node wrong on its own so far: step 0, gelu@0/activated" in \
        ci.execute("info diff 1")
    # the session's own chain diverged everywhere after gelu@0, as the plain diff says
    assert ref.first_divergence().instance == "gelu@0"
    assert ref.results[(3, s.model.node_index("head"))][0].diff.diverged
