"""The typed debugger API (issue 41, item 1): the text commands are a parse of its calls, so
the same movements through either give the same stops, and a bad argument changes nothing."""
from __future__ import annotations

import numpy as np
import pytest

from firscope.debug.commands import CommandInterpreter
from firscope.debug.debugger import Debugger
from firscope.debug.opening import open_session
from firscope.errors import FirError
from firscope.runtime.opening import RunInput
from conftest import SEED_FIR


def both():
    """A text interpreter and a plain typed Debugger on two sessions of the same run."""
    source = RunInput(model=str(SEED_FIR), tokens=(3, 7, 9))
    text = open_session(source, n=1, engine="interp").ci
    typed = Debugger(open_session(source, n=1, engine="interp").session)
    assert isinstance(text, Debugger) and not isinstance(typed, CommandInterpreter)
    return text, typed


def test_text_commands_and_typed_calls_make_the_same_stops():
    text, typed = both()
    script = [
        ("break g2.attn_decode:124 if R0 == 0", lambda d: d.break_at(
            "g2.attn_decode:124", condition="R0 == 0")),
        ("continue", lambda d: d.cont()),
        ("stepi 3", lambda d: d.step(3)),
        ("lane 3", lambda d: d.set_lane(3)),
        ("delete", lambda d: d.delete()),
        ("reverse-stepi", lambda d: d.reverse_step()),
        ("next", lambda d: d.next()),
        ("goto attention@1 token 0", lambda d: d.goto("attention@1", 0)),
        ("until g2.attn_decode:130", lambda d: d.until("g2.attn_decode:130")),
        ("finish", lambda d: d.finish()),
        ("reverse-next 2", lambda d: d.reverse_next(2)),
        ("token", lambda d: d.next_token()),
        ("reverse-continue", lambda d: d.reverse_continue()),
    ]
    seen = []
    for line, call in script:
        text.run(line)
        call(typed)
        assert text.last.description == typed.last.description, line
        assert text.last.location == typed.last.location, line
        assert text.lane == typed.lane, line
        seen.append((typed.last.reason, typed.last.location))
    assert text.status_line() == typed.status_line()
    # the script went somewhere: a breakpoint hit, inside a kernel, across nodes and tokens
    assert seen[1][0] == "breakpoint" and seen[2][1].in_kernel
    assert len({loc for _, loc in seen}) >= 7


def test_breakpoints_are_objects():
    _, d = both()
    bp = d.break_at("attention@1")
    added, gone = d.toggle_break("attention@1")
    assert added is None and gone == [bp.number] and d.breakpoints == []
    added, gone = d.toggle_break("attention@1")
    assert added.spec == "attention@1" and gone == []
    w = d.watch("x[0:4]", temporary=True)
    assert w.temporary and w.spec == "x[0:4]"
    lp = d.dprintf("ln2@0", "x0={x[0]}")
    assert lp.log == "x0={x[0]}"
    d.disable([added.number])
    assert not [b for b in d.breakpoints if b.number == added.number][0].enabled
    d.ignore(added.number, 2)
    d.condition(added.number, "R0 > 1")
    d.delete()
    assert d.breakpoints == []


def test_set_evaluate_display_history():
    _, d = both()
    d.goto("ln1@0")
    patch = d.set("x[0:2]", 0.1)
    assert float(d.evaluate("x[0]")) == float(np.float32(0.1))  # the same f32 as typed
    assert patch.text.startswith("x[0:2] = ")
    shown = d.display("x[1]")
    assert shown.number == 1 and shown.text == repr(float(np.float32(0.1)))[:len(shown.text)]
    d.next()
    assert [v.number for v in d.display_values()] == [1]
    d.undisplay()
    h = d.history("x[0]")
    assert h.element == "x[0]" and len(h.writes) >= 1
    rows = d.lens(3)
    assert len(rows) == 1 and len(rows[0].top) == 3


@pytest.mark.parametrize("call, message", [
    (lambda d: d.step(0), "at least 1"),
    (lambda d: d.next(True), "expected a count"),
    (lambda d: d.goto("attenton@1"), "did you mean attention@1"),
    (lambda d: d.goto("attention@1", -1), "integer >= 0"),
    (lambda d: d.until(" "), "needs a location"),
    (lambda d: d.break_at("ln1@0 if R0 > 1", condition="R0 > 2"), "condition once"),
    (lambda d: d.break_at("nosuchnode"), "nosuchnode"),
    (lambda d: d.set("x[0]", True), "number or an expression"),
    (lambda d: d.set("x[0]", object()), "number or an expression"),
    (lambda d: d.set_lane(99), "lane 99 does not exist"),
    (lambda d: d.restart(4), "checkpoint"),
    (lambda d: d.undisplay([3]), "no display number 3"),
])
def test_a_bad_argument_is_a_fir_error_and_changes_nothing(call, message):
    _, d = both()
    d.goto("ln1@0")
    before = (d.last.description, d.location(), len(d.breakpoints), np.array(d.evaluate("x")))
    with pytest.raises(FirError, match=message):
        call(d)
    after = (d.last.description, d.location(), len(d.breakpoints), np.array(d.evaluate("x")))
    assert before[:3] == after[:3] and np.array_equal(before[3], after[3])


def test_checkpoints_through_the_typed_api():
    _, d = both()
    d.goto("ln2@0")
    ck, dropped = d.checkpoint()
    assert ck.number == 1 and dropped == []
    d.next(5)
    back = d.restart(1)
    assert back.location.node == "ln2@0" and "restarted at checkpoint 1" in back.description
    assert d.delete_checkpoints() == [1]
