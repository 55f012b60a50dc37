"""Who owns the cancel flag (issue 22, item 4): the front end clears it when it submits a
run, the engine only reads it; and a DAP ``disconnect`` never hands the breakpoint changes
it held to a session whose run has not stopped."""
from __future__ import annotations

import io
import threading

from conftest import SEED_FIR
from firscope.dap import lifecycle
from firscope.dap.adapter import Adapter, Run
from firscope.dap.protocol import Writer, read_message
from firscope.debug.opening import open_session
from firscope.debug.snapshot import StopReason
from firscope.runtime.opening import RunInput


def _session():
    return open_session(RunInput(model=str(SEED_FIR), tokens=(1, 2)), n=1, engine="interp")


def test_the_engine_reads_the_flag_and_leaves_it_to_the_front_end():
    s, _ = _session()
    s.cancel.set()  # an interrupt nobody has cleared
    assert s.next().reason is StopReason.INTERRUPTED
    assert s.reverse_next().reason is StopReason.INTERRUPTED
    assert s.cancel.is_set()  # neither loop cleared it
    s.cancel.clear()  # what a front end does as it submits the next run
    stop = s.next()
    assert stop.reason is StopReason.STEP and s.node_index == 1


def _messages(stream: io.BytesIO) -> list[dict]:
    stream.seek(0)
    out = []
    while (msg := read_message(stream)) is not None:
        out.append(msg)
    return out


def _launched() -> tuple[Adapter, io.BytesIO]:
    stream = io.BytesIO()
    a = Adapter(Writer(stream))
    a.r_launch({"seq": 1, "type": "request", "command": "launch",
                "arguments": {"model": str(SEED_FIR), "tokens": [1, 2], "steps": 1,
                              "engine": "interp"}})
    return a, stream


def test_a_dap_run_starts_with_the_flag_cleared():
    a, _ = _launched()
    a.ci.s.cancel.set()  # left over from a pause
    a._start("next", a.ci.next, goalless=False)
    kind, item = a.inbox.get(timeout=120)
    assert kind == "ran" and item[1] is None
    a._ran(*item)
    assert a.ci.last.stop.reason is StopReason.STEP


def _disconnect_with_a_held_request(a: Adapter, worker: threading.Thread) -> dict:
    run = Run("continue", a.ci.cont, goalless=True, reason="step", thread=worker)
    a.running = run
    held = {"seq": 7, "type": "request", "command": "setFunctionBreakpoints",
            "arguments": {"breakpoints": [{"name": "ln1@0"}]}}
    a.dispatch(held)  # while running: held for the stop
    assert run.deferred == [held]
    a.r_disconnect({"seq": 8, "type": "request", "command": "disconnect"})
    return held


def test_disconnect_does_not_hand_held_requests_to_a_run_still_going(monkeypatch):
    monkeypatch.setattr(lifecycle, "STOP_WAIT_S", 0.2)
    a, stream = _launched()
    release = threading.Event()
    worker = threading.Thread(target=release.wait, daemon=True)  # deaf to the cancel flag
    worker.start()
    try:
        _disconnect_with_a_held_request(a, worker)
        answer = next(m for m in _messages(stream) if m.get("request_seq") == 7)
        assert answer["success"] is False
        assert "did not stop within 0.2 s of the disconnect" in answer["message"]
        assert list(a.ci.s.breakpoints) == []  # the running session was not touched
        assert a.done
    finally:
        release.set()


def test_disconnect_still_answers_held_requests_once_the_run_stopped():
    a, stream = _launched()
    worker = threading.Thread(target=lambda: None)
    worker.start()
    _disconnect_with_a_held_request(a, worker)
    answer = next(m for m in _messages(stream) if m.get("request_seq") == 7)
    assert answer["success"] is True and len(list(a.ci.s.breakpoints)) == 1
