"""`firscope dap` against a minimal client written from the DAP specification (the bare
Client of test_dap_wire): the life cycle's order, errors shown to the user, 0-based
lines and file:// URIs, log points, breakpoint events, progress, and a quiet SIGINT once
the session is over."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from conftest import SEED_FIR
from firscope.runtime import load_model
from model_util import line_of
from test_dap_wire import FIRSCOPE, Client, frames, request, run_adapter

SEED = SEED_FIR.read_text()
KERNEL_ADD = SEED[:SEED.index("kernel g2.add")].count("\n")  # 0-based line of its header
ADD_LINE = line_of(SEED, "add 1 1 2", KERNEL_ADD)  # 1-based, inside g2.add
LN1_LINE = line_of(SEED, "node ln1 ")
ATTENTION_LINE = line_of(SEED, "node attention ")


def adds_before_ln1_1() -> int:
    """g2.add dispatches before ln1@1 (loading the model here, in the one test that needs
    it, not at import: every pytest worker imports every test file)."""
    nodes = load_model(SEED_FIR).nodes
    return sum(n.kind == "micro" and n.target == "g2.add" for n in
               nodes[:next(i for i, n in enumerate(nodes) if n.full_name == "ln1@1")])


LAUNCH = {"model": str(SEED_FIR), "tokens": [104, 101], "steps": 1, "engine": "interp"}


def events(c: Client, name: str) -> list[dict]:
    with c.cond:
        return [m for m in c.messages if m.get("event") == name]


def position(c: Client, pred) -> int:
    with c.cond:
        return next(i for i, m in enumerate(c.messages) if pred(m))


def test_initialized_follows_the_initialize_response_at_once():
    msgs, _ = run_adapter(request(1, "initialize", adapterID="x") + request(2, "disconnect"))
    assert [(m["type"], m.get("command") or m.get("event")) for m in msgs] == [
        ("response", "initialize"), ("event", "initialized"), ("response", "disconnect")]
    assert msgs[0]["body"]["supportsLogPoints"] is True


def test_launch_errors_are_shown_to_the_user_and_printed(tmp_path):
    missing = tmp_path / "missing.fir"
    payload = b"".join([request(1, "initialize"), request(2, "launch", model=str(missing)),
                        request(3, "stackTrace", threadId=1), request(4, "launch", steps=-1),
                        request(5, "disconnect")])
    msgs, _ = run_adapter(payload)
    r = {m["request_seq"]: m for m in msgs if m["type"] == "response"}
    stderr = [m["body"]["output"] for m in msgs
              if m.get("event") == "output" and m["body"]["category"] == "stderr"]
    for seq in (2, 4):
        assert not r[seq]["success"] and r[seq]["body"]["error"]["showUser"] is True
        assert f"firscope: {r[seq]['message']}\n" in stderr
    assert "missing.fir" in r[2]["message"]
    # a request the editor made on its own (not the user's launch) stays out of dialogs
    assert r[3]["body"]["error"]["showUser"] is False
    assert len(stderr) == 2


def test_zero_based_lines_uri_paths_and_configuration_before_launch():
    c = Client()
    try:
        c.response(c.send("initialize", {"linesStartAt1": False, "columnsStartAt1": False,
                                         "pathFormat": "uri",
                                         "supportsProgressReporting": True}))
        c.wait(lambda m: m.get("event") == "initialized")
        uri = SEED_FIR.resolve().as_uri()
        # sent before launch, as a client does on `initialized`: held until the model loads
        bps = c.send("setBreakpoints", {"source": {"path": uri},
                                        "breakpoints": [{"line": ADD_LINE - 1}]})
        done = c.send("configurationDone", {})
        launch = c.send("launch", {**LAUNCH, "stopOnEntry": False})
        assert c.response(launch)["success"]
        answer = c.response(bps)
        assert position(c, lambda m: m.get("request_seq") == launch) < \
            position(c, lambda m: m.get("request_seq") == bps)
        (bp,) = answer["body"]["breakpoints"]
        assert bp["verified"] and bp["line"] == ADD_LINE - 1 and bp["source"]["path"] == uri
        assert c.response(done)["success"]
        stopped = c.wait(lambda m: m.get("event") == "stopped")
        assert stopped["body"]["reason"] == "breakpoint"
        st = c.response(c.send("stackTrace", {"threadId": stopped["body"]["threadId"]}))
        top = st["body"]["stackFrames"][0]
        assert (top["line"], top["column"]) == (ADD_LINE - 1, 0)
        assert top["source"]["path"] == uri
        goto = c.response(c.send("gotoTargets", {"source": {"path": uri},
                                                 "line": LN1_LINE - 1}))
        assert goto["body"]["targets"] and goto["body"]["targets"][0]["line"] == LN1_LINE - 1
        start = events(c, "progressStart")
        assert len(start) == 1 and "loading" in start[0]["body"]["title"]
        assert [e["body"]["progressId"] for e in events(c, "progressEnd")] == \
            [start[0]["body"]["progressId"]]
    finally:
        c.close()


def test_stop_on_entry_is_the_default():
    c = Client()
    try:
        c.response(c.send("initialize", {}))
        assert c.response(c.send("launch", LAUNCH))["success"]
        c.response(c.send("configurationDone", {}))
        assert c.wait(lambda m: m.get("event") == "stopped")["body"]["reason"] == "entry"
    finally:
        c.close()


def test_log_points_print_and_do_not_stop():
    c = Client()
    try:
        c.response(c.send("initialize", {}))
        assert c.response(c.send("launch", {**LAUNCH, "stopOnEntry": False}))["success"]
        r = c.response(c.send("setBreakpoints", {
            "source": {"path": str(SEED_FIR)},
            "breakpoints": [{"line": ADD_LINE, "logMessage": "R1={R1} lane0 {{ok}}"}]}))
        assert r["body"]["breakpoints"][0]["verified"]
        c.response(c.send("setFunctionBreakpoints", {"breakpoints": [{"name": "ln1@1"}]}))
        c.response(c.send("configurationDone", {}))
        stopped = c.wait(lambda m: m.get("event") == "stopped")
        assert stopped["body"]["reason"] == "function breakpoint"  # not the log point
        logs = [e["body"] for e in events(c, "output")
                if e["body"]["output"].startswith("R1=")]
        # one line per g2.add dispatch before ln1@1 (embeddings, biases, residuals)
        assert len(logs) == adds_before_ln1_1(), logs
        for body in logs:
            assert body["output"].endswith(" lane0 {ok}\n")
            float(body["output"][3:].split()[0])  # a number, in the print language
            assert body["line"] == ADD_LINE and body["source"]["path"] == str(SEED_FIR.resolve())
    finally:
        c.close()


def test_breakpoint_events_when_the_engine_changes_one():
    c = Client()
    try:
        c.response(c.send("initialize", {}))
        assert c.response(c.send("launch", {**LAUNCH, "stopOnEntry": False}))["success"]
        r = c.response(c.send("setBreakpoints", {"source": {"path": str(SEED_FIR)},
                                                 "breakpoints": [{"line": LN1_LINE,
                                                                  "hitCondition": "==2"}]}))
        (bp,) = r["body"]["breakpoints"]
        c.response(c.send("configurationDone", {}))
        stopped = c.wait(lambda m: m.get("event") == "stopped")
        assert stopped["body"]["hitBreakpointIds"] == [bp["id"]]
        (spent,) = events(c, "breakpoint")
        assert spent["body"]["reason"] == "changed"
        assert spent["body"]["breakpoint"]["id"] == bp["id"]
        assert spent["body"]["breakpoint"]["verified"] is False
        assert "spent" in spent["body"]["breakpoint"]["message"]
        # the event came before the stop it explains
        assert position(c, lambda m: m.get("event") == "breakpoint") < \
            position(c, lambda m: m.get("event") == "stopped")

        def console(text):
            assert c.response(c.send("evaluate", {"expression": text,
                                                  "context": "repl"}))["success"]
            return events(c, "breakpoint")[-1]["body"]
        new = console("break attention")
        assert new["reason"] == "new" and new["breakpoint"]["line"] == ATTENTION_LINE
        n = new["breakpoint"]["id"]
        off = console(f"disable {n}")
        assert (off["reason"], off["breakpoint"]["id"], off["breakpoint"]["verified"]) == \
            ("changed", n, False)
        gone = console(f"delete {n}")
        assert gone == {"reason": "removed", "breakpoint": {"id": n, "verified": False}}
        assert len(events(c, "breakpoint")) == 4
    finally:
        c.close()


def _adapter_after(requests: list[tuple[str, dict]]) -> Client:
    c = Client()
    c.response(c.send("initialize", {}))
    for command, args in requests:
        c.response(c.send(command, args))
    return c


def test_sigint_once_the_session_is_over_exits_0_silently():
    c = _adapter_after([("launch", LAUNCH), ("terminate", {})])  # still up: no disconnect
    c.proc.send_signal(signal.SIGINT)
    code, err = c.exit()
    assert code == 0 and err == ""


def test_sigint_after_stdin_closes_exits_0_silently():
    c = _adapter_after([("launch", LAUNCH)])
    c.proc.stdin.close()
    try:
        c.proc.send_signal(signal.SIGINT)
    except ProcessLookupError:  # it had already gone, with its own exit code
        pass
    code, err = c.exit()
    assert code == 0 and err == ""


def test_sigint_during_a_session_still_interrupts():
    c = _adapter_after([("launch", LAUNCH)])
    c.proc.send_signal(signal.SIGINT)  # stdin stays open: the client is still there
    code, err = c.exit()
    assert code == 130 and "interrupted" in err, err


def test_initialize_is_answered_before_the_engine_is_imported():
    """The first answer comes from modules that import neither NumPy nor the engine."""
    code = ("import sys\n"
            "from firscope.dap.server import serve_stdio\n"
            "import firscope.dap.capabilities as c\n"
            "orig = c.answer_initialize\n"
            "def spy(writer, req):\n"
            "    sys.stderr.write('numpy loaded: %s\\n' % ('numpy' in sys.modules))\n"
            "    return orig(writer, req)\n"
            "c.answer_initialize = spy\n"
            "sys.exit(serve_stdio())\n")
    import sys
    r = subprocess.run([sys.executable, "-c", code], input=request(1, "initialize")
                       + request(2, "disconnect"), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "numpy loaded: False" in r.stderr.decode()
    assert [m.get("command") or m.get("event") for m in frames(r.stdout)] == [
        "initialize", "initialized", "disconnect"]
    assert Path(FIRSCOPE).exists()


def test_a_register_from_the_variables_view_is_a_data_breakpoint():
    c = Client()
    try:
        c.response(c.send("initialize", {}))
        assert c.response(c.send("launch", {**LAUNCH, "stopOnEntry": False}))["success"]
        load = ADD_LINE - 2  # uloadf32 1 0 @in0: writes R1
        c.response(c.send("setBreakpoints", {"source": {"path": str(SEED_FIR)},
                                             "breakpoints": [{"line": load}]}))
        c.response(c.send("configurationDone", {}))
        stopped = c.wait(lambda m: m.get("event") == "stopped")
        thread = stopped["body"]["threadId"]
        frame = c.response(c.send("stackTrace", {"threadId": thread}))["body"]["stackFrames"][0]
        assert frame["line"] == load
        scopes = c.response(c.send("scopes", {"frameId": frame["id"]}))["body"]["scopes"]
        regs = next(s for s in scopes if s["name"] == "Registers (lane 0)")
        info = c.response(c.send("dataBreakpointInfo", {
            "variablesReference": regs["variablesReference"], "name": "R1"}))["body"]
        assert info["dataId"] == "lane 0 R1"
        c.response(c.send("setBreakpoints", {"source": {"path": str(SEED_FIR)},
                                             "breakpoints": []}))
        r = c.response(c.send("setDataBreakpoints", {"breakpoints": [
            {"dataId": info["dataId"]}]}))
        assert r["body"]["breakpoints"][0]["verified"]
        c.response(c.send("continue", {"threadId": thread}))
        again = c.wait(lambda m: m.get("event") == "stopped" and m is not stopped)
        assert again["body"]["reason"] == "data breakpoint"
        assert "R1 in lane 0" in again["body"]["text"]
        top = c.response(c.send("stackTrace", {"threadId": again["body"]["threadId"]}))
        assert top["body"]["stackFrames"][0]["line"] == load + 1  # after the write
    finally:
        c.close()


def test_input_closed_tells_a_closed_peer_from_a_quiet_or_busy_one():
    """The SIGINT handler's second question (the reader thread may not have seen EOF yet)."""
    from firscope.dap.server import input_closed
    r, w = os.pipe()
    try:
        assert not input_closed(r)  # open, nothing sent: the client is still there
        os.write(w, b"Content-Length: 2\r\n\r\n{}")
        assert not input_closed(r)  # bytes waiting: still talking
        os.read(r, 100)
        os.close(w)
        w = -1
        assert input_closed(r)  # the other end is gone and nothing is left
        assert os.read(r, 1) == b""  # asking read nothing
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
