"""Log points (dprintf), register watchpoints (watch R3, watch lane 2 U4), and
`save breakpoints FILE` / `source FILE`, through the command interpreter as batch mode
and the UI use it."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import SEED_FIR
from firscope.debug.commands import CommandInterpreter
from firscope.debug.logpoints import interpolate, parse_format
from firscope.debug.session import Session
from firscope.debug.snapshot import StopReason
from firscope.errors import FirError
from firscope.runtime import load_model
from model_util import line_of

SEED = SEED_FIR.read_text()
ADD_LINE = line_of(SEED, "add 1 1 2", SEED[:SEED.index("kernel g2.add")].count("\n"))


@pytest.fixture
def ci(random_model):
    s = Session(load_model(random_model), [104, 101, 108], 2, engine="interp")
    return CommandInterpreter(s)


def test_format_pieces_and_braces():
    pieces = parse_format("R3={R3} {{lit}} max={max(abs(x))}")
    assert [p if isinstance(p, str) else p.text for p in pieces] == [
        "R3=", "R3", " {lit} max=", "max(abs(x))"]
    assert interpolate("a{R1}b", lambda e: f"<{e.text}>") == "a<R1>b"
    for bad in ("{", "x}", "{}"):
        with pytest.raises(FirError):
            parse_format(bad)


def test_dprintf_prints_each_hit_and_does_not_stop(ci):
    out = ci.execute(f'dprintf g2.add:{ADD_LINE} "lane R0={{R0}} sum? {{R1}} pos={{position}}"')
    assert out.startswith(f'Dprintf 1 at g2.add:{ADD_LINE}: "lane R0=')
    ci.execute("break ln1")  # ln1 follows embeddings (the first g2.add dispatch)
    text = ci.execute("continue")
    logs = [line for line in text.splitlines() if line.startswith("lane R0=")]
    # one line per hit (the focused lane 0), printed before the stop at ln1
    assert logs and all(line.startswith("lane R0=0 sum? ") for line in logs)
    assert ci.last.stop.reason is StopReason.BREAKPOINT and ci.s.node.name == "ln1"
    assert "dprintf" in ci.execute("info breakpoints")
    # the value printed is R1 after uloadf32 (x[0]) at that point: before `add` runs
    x0 = float(logs[0].split("sum? ")[1].split()[0])
    assert np.isfinite(x0)


def test_dprintf_errors(ci):
    with pytest.raises(FirError, match="usage: dprintf"):
        ci.execute("dprintf ln1")
    with pytest.raises(FirError, match="unmatched"):
        ci.execute('dprintf ln1 "x={R3"')
    with pytest.raises(FirError):
        ci.execute('dprintf ln1 "{nosuchbuffer}"')
    assert len(ci.s.breakpoints) == 0


def test_dprintf_value_that_fails_prints_an_error_in_place(ci):
    ci.execute('dprintf ln1 "x5={x[99999]}"')
    text = ci.execute("next 6")
    assert "x5=<error:" in text


def test_watch_register_any_lane_and_one_lane(ci):
    out = ci.execute("watch R1")
    assert out == "Watchpoint 1: R1"
    text = ci.execute("continue")
    stop = ci.last.stop
    assert stop.reason is StopReason.WATCHPOINT and stop.breakpoint == 1
    assert "R1 in lane 0" in text and f"line {ADD_LINE - 2}" in text  # the first uloadf32
    d = ci.s.dispatch
    assert float(stop.new) == float(d.R[1][0]) and float(stop.old) == 0.0
    assert f"New value = {float(stop.new)!r}"[:14] in text
    ci.execute("delete 1")
    ci.execute("watch lane 2 U4 if U4 > 0")
    with pytest.raises(FirError):
        ci.execute("watch R99")
    assert "Watchpoint 3: lane 2 R1" in ci.execute("watch lane 2 R1")
    ci.execute("continue")
    stop = ci.last.stop
    assert stop.reason is StopReason.WATCHPOINT and stop.breakpoint == 3 and ci.lane == 2
    assert float(stop.new) == float(ci.s.dispatch.R[1][2])


def test_save_and_source_round_trip(ci, tmp_path):
    ci.execute("break attention@1 if R0 >= 0")
    ci.execute("tbreak token 1")
    ci.execute(f'dprintf g2.add:{ADD_LINE} "R1={{R1}} \\"q\\""')
    ci.execute("watch x[0:4]")
    ci.execute("watch lane 1 U3")
    ci.execute("break nan")
    ci.execute("ignore 1 2")
    ci.execute("disable 4")
    ci.execute("display max(abs(x))")
    saved = tmp_path / "bps.txt"
    out = ci.execute(f"save breakpoints {saved}")
    assert out == f"Saved 6 breakpoints and 1 display to {saved}."
    before = [bp.describe() for bp in ci.s.breakpoints]

    fresh = CommandInterpreter(Session(ci.s.model, [104, 101, 108], 2, engine="interp"))
    fresh.execute(f"source {saved}")
    after = [bp.describe() for bp in fresh.s.breakpoints]
    assert after == before
    assert [e.text for e in fresh.displays.values()] == ["max(abs(x))"]
    assert fresh.s.breakpoints.get(3).log == 'R1={R1} "q"'


def test_source_names_the_failing_line(ci, tmp_path):
    script = tmp_path / "s.txt"
    script.write_text("# comment\nbreak ln1\nbreak nosuchnode\nbreak attention\n")
    with pytest.raises(FirError) as e:
        ci.execute(f"source {script}")
    assert e.value.message.startswith(f"{script}:3: no node named 'nosuchnode'")
    assert [bp.spec for bp in ci.s.breakpoints] == ["ln1"]  # line 4 was not run
    script.write_text("break ln1\ncontinue\n")
    with pytest.raises(FirError, match=f"{script}:2: 'continue' moves execution"):
        ci.execute(f"source {script}")
    assert ci.s.cursor == (0, 0)
    with pytest.raises(FirError, match="cannot read"):
        ci.execute(f"source {tmp_path / 'missing'}")
    with pytest.raises(FirError, match="usage: save breakpoints FILE"):
        ci.execute("save")
