"""The debugger engine: stepping, breakpoints, reverse, watchpoints, NaN, lanes, batch mode."""

import numpy as np
import pytest

from firscope.debug.commands import CommandInterpreter
from firscope.debug.session import Session
from firscope.errors import FirError
from firscope.runtime import load_model
from conftest import SEED_FIR
from model_util import firscope

SEED = SEED_FIR.read_text()


@pytest.fixture
def model(random_model):
    return load_model(random_model)


def session(model, prompt=(104, 101, 108), n=3, **kw):
    kw.setdefault("engine", "interp")
    return Session(model, list(prompt), n, **kw)


def state(s: Session):
    """Everything that defines where a session is and what it holds."""
    d = s.dispatch
    regs = None if d is None else (d.pc, d.R.copy(), d.U.copy(), d.mask.copy(),
                                  [(f.kind, f.pc, f.trips) for f in d.stack])
    return (s.step, s.node_index, s.finished, list(s.sequence), s.arena.copy(), regs,
            [l.copy() for l in s.logits])


def same(a, b):
    assert a[:4] == b[:4]
    assert np.array_equal(a[4].view(np.uint32), b[4].view(np.uint32))
    if a[5] is None or b[5] is None:
        assert a[5] is None and b[5] is None
    else:
        assert a[5][0] == b[5][0] and a[5][4] == b[5][4]
        for x, y in zip(a[5][1:4], b[5][1:4]):
            assert np.array_equal(x, y)
    assert len(a[6]) == len(b[6]) and all(np.array_equal(x, y) for x, y in zip(a[6], b[6]))


def test_session_starts_before_first_node_with_token_written(model):
    s = session(model)
    loc = s.location()
    assert (loc.step, loc.node, loc.token, loc.in_kernel) == (0, "token", 104, False)
    assert s.arena[model.inputs["token"].base] == 104


def test_stepi_executes_one_instruction_in_lockstep(model):
    s = session(model)
    ci = CommandInterpreter(s)
    ci.execute("until embeddings")
    assert s.node.full_name == "embeddings" and s.dispatch is None
    ci.execute("stepi")  # rtou 0 0
    ci.set_lane(5)
    d = s.dispatch
    assert d.pc == 1 and d.steps == 1
    assert np.array_equal(d.U[0], np.arange(64))
    assert ci.last.lane.lane == 5 and ci.last.lane.changed == {("U", 0)}
    ci.execute("stepi 2")  # the two loads
    assert ci.last.lane.changed == {("R", 1), ("R", 2)}
    x = model.view(model.regions["x"])
    assert np.array_equal(d.R[1], x)
    assert s.evaluate("R1", lane=5) == x[5] and ci.execute("print R1") == f"$ = {x[5]:.9g}"
    ci.execute("stepi 2")  # add, store: kernel done, stop before the next node
    assert s.dispatch is None and s.node.full_name == "ln1@0"


def test_next_finish_and_token_move_by_node_kernel_and_token(model):
    s = session(model)
    s.next()
    assert s.node.full_name == "positional"
    s.until("g2.layernorm:90")
    assert s.dispatch is not None and s.location().line == 90
    s.finish()
    assert s.dispatch is None and s.node.full_name == "qkv_linear@0"
    s.finish()  # outside a kernel: to the end of the token
    assert (s.step, s.node_index) == (1, 0)
    s.next_token()
    assert (s.step, s.node_index) == (2, 0)
    assert s.sequence[:3] == [104, 101, 108]


def test_breakpoint_versus_stepping_identity(model):
    a = session(model)
    a.add_breakpoint("g2.attn_decode:156")
    stop = a.cont()
    assert stop.reason == "breakpoint" and stop.location.line == 156
    assert stop.location.node == "attention@0"
    b = session(model)
    while not (b.dispatch is not None and b.location().line == 156):
        b.stepi()
    same(state(a), state(b))


def test_breakpoint_in_later_token_and_layer_with_compiled_style_runs(model):
    a = session(model, n=4)
    a.add_breakpoint("attention@1 if position == 3")
    stop = a.cont()
    assert stop.reason == "breakpoint" and stop.location.node == "attention@1"
    assert a.step == 3
    b = session(model, n=4)
    while (b.step, b.node.full_name) != (3, "attention@1"):
        b.next()
    same(state(a), state(b))


def test_conditions_ignore_counts_hit_counts_and_temporary(model):
    s = session(model, n=4)
    bp = s.add_breakpoint("ln1")
    s.set_ignore(bp.number, 2)
    stop = s.cont()
    assert stop.location.node == "ln1@0" and s.step == 1  # step 0: ln1@0, ln1@1 ignored
    assert s.breakpoints.get(bp.number).hit_count == 3
    s.delete_breakpoints([bp.number])
    t = s.add_breakpoint("qkv_linear@1", temporary=True)
    assert s.cont().breakpoint == t.number
    assert t.number not in s.breakpoints
    c = s.add_breakpoint("mlp_residual if max(abs(x)) > 1e9")
    assert s.cont().reason == "finished" and s.breakpoints.get(c.number).hit_count == 0


def test_reverse_next_and_forward_again_give_identical_state(model):
    s = session(model, n=3)
    s.until("ln2@1")
    s.next_token()
    s.next(5)
    ahead = state(s)
    s.reverse_next(5 + 33)  # back across the token boundary into token 0
    assert s.step == 0
    behind = state(s)
    s.next(5 + 33)
    same(state(s), ahead)
    s.reverse_next(5 + 33)
    same(state(s), behind)


def test_reverse_to_the_start_and_history_end(model):
    s = session(model, n=2)
    start = state(s)
    s.next_token()
    s.next_token()
    stop = s.reverse_next(10_000)
    assert stop.reason == "history"
    same(state(s), start)


def test_reverse_stepi_inside_kernel_matches_stepping(model):
    a = session(model)
    a.until("attention@0")
    a.stepi(40)
    a.reverse_stepi(15)
    b = session(model)
    b.until("attention@0")
    b.stepi(25)
    same(state(a), state(b))
    # from a node boundary, reverse-stepi goes to the last instruction of the previous kernel
    c = session(model)
    c.until("qkv_linear@0")
    c.reverse_stepi()
    assert c.node.full_name == "ln1@0" and c.dispatch is not None
    d = c.dispatch
    assert d.pc == len(d.ops) - 1
    c.stepi()
    assert c.node.full_name == "qkv_linear@0"


def test_watchpoint_reports_old_and_new_and_the_instruction(model):
    s = session(model)
    w = s.add_watch("attn[0:16]")
    stop = s.cont()
    assert stop.reason == "watchpoint" and stop.breakpoint == w.number
    assert stop.location.node == "attention@0" and stop.location.in_kernel
    assert "by line" in stop.message and "ustoref32 12 5 @out0" in stop.message
    assert stop.old[0] == 0 and stop.new[0] != 0
    assert np.array_equal(s.buffer_value("attn")[:16], stop.new)


def test_break_nan_names_node_and_instruction(make_model):
    text = SEED.replace("mulconst 2 2 2*sqrt(2/pi)\nsigmoid 2 2",
                        "mulconst 2 2 2*sqrt(2/pi)\nloadconstf32 9 0\ndiv 2 2 9\nsigmoid 2 2")
    m = load_model(make_model("nan", fir_text=text))
    s = session(m)
    s.add_breakpoint("nan")
    stop = s.cont()
    assert stop.reason == "nan" and stop.location.node == "gelu@0"
    line = next(i + 1 for i, l in enumerate(text.splitlines()) if l == "div 2 2 9")
    assert f"line {line} (div 2 2 9)" in stop.message
    # stopped right after the instruction that wrote it, like a gdb watchpoint
    assert stop.location.pc == 9 and s.dispatch.ops[8].text == "div 2 2 9"


def test_fault_stops_on_the_faulting_instruction(make_model):
    text = SEED.replace("uloadf32 2 0 @in1\nadd 1 1 2", "uaddk 5 0 1\nuloadf32 2 5 @in1\nadd 1 1 2")
    m = load_model(make_model("oob", fir_text=text))
    s = session(m)
    stop = s.cont()
    assert stop.reason == "fault" and "lane 63" in stop.message
    assert stop.location.node == "embeddings" and stop.location.in_kernel
    assert s.dispatch.ops[s.dispatch.pc].text == "uloadf32 2 5 @in1"


def test_lanes_and_register_across_lanes(model):
    s = session(model)
    s.until("attention@0")
    s.stepi(3)
    ci = CommandInterpreter(s)
    out = ci.execute("info lanes U1")
    assert "4 lanes, 4 active" in out and "U1 = 48" in out  # lane 3: head 3 * headdim 16
    with pytest.raises(FirError, match="lane 9 does not exist"):
        ci.set_lane(9)


def test_history_budget_bounds_memory(model):
    s = session(model, n=3, history_budget=20_000)
    s.next_token()
    s.next_token()
    assert s.history.nbytes <= 20_000 and s.history.truncated
    stop = s.reverse_next(10_000)
    assert stop.reason == "history" and "dropped" in stop.message


def test_expressions_in_print(model):
    s = session(model)
    s.until("ln1@0")
    ci = CommandInterpreter(s)
    x = model.view(model.regions["x"])
    assert ci.execute("print x[0:2]").startswith("$ = [")
    assert float(ci.execute("print max(abs(x))").split("= ")[1]) == pytest.approx(
        float(np.abs(x).max()), rel=1e-6)
    assert "std" in ci.execute("stats key_cache@1")
    for bad in ("__import__('os')", "x.__class__", "[i for i in x]", "open('f')"):
        with pytest.raises(FirError):
            ci.execute(f"print {bad}")


def test_batch_mode_script_and_stdin(random_model, tmp_path):
    script = tmp_path / "cmds.gdb"
    script.write_text("break attention@1\ncontinue\nbogus\nstepi 2\nlane 1\nprint U1\nwhere\n"
                      "info breakpoints\nreverse-stepi\nquit\ncontinue\n")
    p = firscope("debug", str(random_model), "--tokens", "1,2", "-n", "2", "--engine", "interp",
                 "-x", str(script), "--keep-going", cwd=None)
    assert p.returncode == 1, p.stderr  # a command failed (bogus); --keep-going ran the rest
    out = p.stdout
    assert "Breakpoint 1, attention@1" in out
    assert f"{script}:3: error: unknown command 'bogus'" in out
    assert "$ = 16" in out  # lane 1 after `umulk 1 0 headdim`: 1 * 16
    assert out.count("(firscope)") == 10  # stopped reading at quit
    p2 = firscope("debug", str(random_model), "--tokens", "1", "-n", "1", "--engine", "interp",
                  input="next\nprint x[0:2]\n", cwd=None)
    assert p2.returncode == 0 and "before positional" in p2.stdout


def test_layer_specific_value_of_a_shared_buffer(model):
    s = session(model)
    s.next_token()
    s.next_token()  # position 2: three keys, so the rows differ between layers
    s.until("attention@1")
    ci = CommandInterpreter(s)
    with pytest.raises(FirError, match="layer 1 has not written 'scores' yet"):
        ci.execute("print scores@1[0:4]")
    s.next()  # attention@1 runs
    s.next(3)  # later nodes of layer 1 do not touch scores
    after1 = s.buffer_value("scores")[:3].copy()
    assert ci.execute("print scores@1[0:2]").startswith("$ = [")
    assert np.array_equal(s.evaluate("scores@1[0:3]"), after1)
    s.reverse_next(4)  # back before attention@1: its value is from the future now
    with pytest.raises(FirError, match="has not written"):
        s.evaluate("scores@1")
    # layer 0's value stays readable and differs from layer 1's
    assert not np.array_equal(s.evaluate("scores@0[0:3]"), after1)


@pytest.mark.parametrize("cmd", ["break token ²", "break g2.add:²", "break ²", "info lanes R²",
                                 "print R²", "lane ²", "stepi ²"])
def test_unicode_digits_are_errors_not_crashes(model, cmd):
    s = session(model)
    s.until("attention@0")
    s.stepi()
    with pytest.raises(FirError):
        CommandInterpreter(s).execute(cmd)


def test_reverse_with_almost_no_history_stays_at_a_valid_place(model):
    s = session(model, history_budget=1)  # keeps only the newest record
    s.next_token()  # the newest record is now the token's "begin"
    here = (s.step, s.node_index)
    stop = s.reverse_next()
    assert stop.reason == "history" and (s.step, s.node_index) == here
    assert s.node.full_name == "token"
    s.next()
    assert s.node.full_name == "positional"
