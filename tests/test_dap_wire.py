"""The DAP server at the byte level: framing, a clean stdout, errors as responses.

(The behaviour an editor sees is tested with VS Code's own client in
test_dap.py; these are the cases a well-behaved client never produces.)
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest

from conftest import REPO
from firscope.dap.protocol import ProtocolError, encode_message, read_message

FIRSCOPE = Path(sys.executable).parent / "firscope"


def frames(data: bytes) -> list[dict]:
    """Split a byte stream into DAP messages, refusing any byte outside a frame."""
    stream = io.BytesIO(data)
    out = []
    while stream.tell() < len(data):
        msg = read_message(stream)
        assert msg is not None
        out.append(msg)
    return out


def request(seq: int, command: str, **args) -> bytes:
    return encode_message({"seq": seq, "type": "request", "command": command,
                           "arguments": args})


def run_adapter(payload: bytes, *, argv=None, timeout=120) -> tuple[list[dict], str]:
    r = subprocess.run(argv or [str(FIRSCOPE), "dap"], input=payload, capture_output=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr.decode()
    return frames(r.stdout), r.stderr.decode("utf-8", "replace")


def responses(msgs: list[dict]) -> dict[int, dict]:
    return {m["request_seq"]: m for m in msgs if m["type"] == "response"}


def test_stray_prints_go_to_stderr_never_into_the_protocol():
    # A handler that prints (Python's print and a raw write to fd 1) must not corrupt stdout.
    code = ("import os, sys\n"
            "import firscope.dap.adapter as a\n"
            "orig = a.Adapter.r_disconnect\n"
            "def noisy(self, req):\n"
            "    print('stray print')\n"
            "    os.write(1, b'raw write to fd 1\\n')\n"
            "    orig(self, req)\n"
            "a.Adapter.r_disconnect = noisy\n"
            "from firscope.dap.server import serve_stdio\n"
            "sys.exit(serve_stdio())\n")
    payload = request(1, "initialize", adapterID="firscope") + request(2, "disconnect")
    msgs, err = run_adapter(payload, argv=[sys.executable, "-c", code])
    assert [(m["type"], m.get("command") or m.get("event")) for m in msgs] == [
        ("response", "initialize"), ("event", "initialized"), ("response", "disconnect")]
    assert msgs[0]["body"]["supportsStepBack"] is True
    assert "stray print" in err and "raw write to fd 1" in err


def test_launch_errors_are_answered_and_the_adapter_stays(tmp_path):
    broken = tmp_path / "broken.fir"
    broken.write_text("fir 1\nmodel gpt2\nbogus directive\n")
    payload = b"".join([
        request(1, "initialize", adapterID="firscope"),
        request(2, "launch", model=str(broken)),
        request(3, "launch", model=str(tmp_path / "missing.fir")),
        request(4, "launch", steps=-1),
        request(5, "launch", engine="cuda"),
        request(11, "launch", engine="gpu"),  # a real engine, but one that cannot step
        request(6, "launch", prompt="a", tokens=[1]),
        request(7, "launch", tokens=[1, 999999]),
        request(8, "threads"),
        request(9, "stackTrace", threadId=1),
        request(10, "disconnect"),
    ])
    msgs, err = run_adapter(payload)
    r = responses(msgs)
    assert all(not r[i]["success"] for i in range(2, 8)), [r[i] for i in range(2, 8)]
    assert r[2]["message"].startswith(f"{broken}:3:1: ")  # FILE:LINE:COL, from the loader
    assert "bogus" in r[2]["message"]
    assert "missing.fir" in r[3]["message"]
    assert r[4]["message"] == "launch: 'steps' must be a whole number in 0..1048576, found -1"
    assert "'engine' must be one of compiled, interp" in r[5]["message"]
    assert not r[11]["success"] and "cannot stop at an instruction" in r[11]["message"]
    assert r[6]["message"] == "launch: give 'prompt' or 'tokens', not both"
    assert "999999" in r[7]["message"]
    assert r[8]["success"] and r[8]["body"]["threads"] == [{"id": 1, "name": "graph"}]
    assert r[9]["message"] == "'stackTrace': no model is launched yet"
    assert r[10]["success"]
    assert "Traceback" not in err


def test_framing_errors_are_reported_and_reading_goes_on():
    payload = (b"Content-Length: 2\r\n\r\n[]"  # JSON, but not an object
               + b"Content-Length: 3\r\n\r\n{x}"  # not JSON
               + b"X-Other: 1\r\n\r\n"  # a header without Content-Length
               + encode_message({"seq": 1, "type": "event", "event": "nonsense"})
               + request(2, "initialize") + request(3, "disconnect"))
    msgs, _ = run_adapter(payload)
    complaints = [m["body"]["output"] for m in msgs if m.get("event") == "output"]
    assert len(complaints) == 4, complaints
    assert all(c.startswith("firscope dap: ignored") for c in complaints)
    assert [m["command"] for m in msgs if m["type"] == "response"] == ["initialize",
                                                                        "disconnect"]


@pytest.mark.parametrize("data, message", [
    (b"Content-Length: x\r\n\r\n", "bad Content-Length"),
    (b"Content-Length: 99999999999\r\n\r\n", "over the"),
    (b"Content-Length: 10\r\n\r\n{}", "ended inside a message body"),
    (b"Content-Length: 2\r\n", "ended inside a message header"),
    (b"no colon here\r\n\r\n", "bad header line"),
    (b"A: " + b"x" * 9000 + b"\r\n\r\n", "header is too long"),
])
def test_read_message_names_what_is_wrong(data, message):
    with pytest.raises(ProtocolError, match=message):
        read_message(io.BytesIO(data))


def test_nan_is_never_sent_as_bare_json():
    with pytest.raises(ValueError):
        encode_message({"value": float("nan")})


def test_every_package_is_shipped():
    """A package folder missing from pyproject's list is left out of `pip install .`."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts)
             for p in (REPO / "firscope").rglob("__init__.py")}
    assert found - listed == set()


HOSTILE_ARGS = [None, [], "x", {}, {"threadId": "x", "frameId": -1, "variablesReference": 0},
                {"threadId": 1, "frameId": 10 ** 30, "variablesReference": True, "start": -5,
                 "count": 10 ** 12, "expression": 5, "name": None, "value": [],
                 "breakpoints": [1, None, {"line": "7"}], "source": {"path": 3},
                 "filters": ["bogus"], "lines": ["a"], "targetId": 0, "line": 10 ** 40,
                 "memoryReference": "zz", "offset": "0", "granularity": 1}]


def _tricky_but_well_formed(c, sent: dict) -> None:
    """Real handles with out-of-range pages, impossible writes and odd expressions."""
    def ask(command, **args):
        seq = c.send(command, args)
        sent[seq] = command
        return c.response(seq)
    frame = ask("stackTrace", threadId=1)["body"]["stackFrames"][0]["id"]
    scopes = ask("scopes", frameId=frame)["body"]["scopes"]
    for sc in scopes:
        ref = sc["variablesReference"]
        kids = ask("variables", variablesReference=ref)["body"]["variables"]
        for kid in kids[:3]:
            sub = kid.get("variablesReference", 0)
            for page in ({"start": 10 ** 9, "count": 5}, {"start": 0, "count": 0},
                         {"filter": "named"}, {"filter": "indexed", "start": 3}):
                if sub:
                    ask("variables", variablesReference=sub, **page)
            ask("setVariable", variablesReference=sub or ref, name=kid["name"], value="x[")
            ask("setVariable", variablesReference=sub or ref, name="[999999999]", value="1")
            ask("dataBreakpointInfo", variablesReference=ref, name=kid["name"])
    for text in ("", "   ", "R99", "x[" * 200, "1/0", "x[10**20]", "@in9", "lane", "help"):
        for context in ("watch", "hover", "repl"):
            ask("evaluate", expression=text, context=context, frameId=frame)
    ask("readMemory", memoryReference="0x0", offset=-10 ** 12, count=16)
    ask("readMemory", memoryReference="0x0", offset=10 ** 12, count=10 ** 9)
    ask("gotoTargets", source={"path": "/nonexistent"}, line=0)
    ask("setBreakpoints", source={"path": "/nonexistent.fir"}, breakpoints=[{"line": 1}])
    ask("setFunctionBreakpoints", breakpoints=[{"name": "token 99999999999"},
                                               {"name": "x", "hitCondition": "%2"}])
    ask("setDataBreakpoints", breakpoints=[{"dataId": "x[5:1]"}, {"dataId": "R3"}])


class Client:
    """A bare DAP client over a live adapter process, for requests no editor sends."""

    def __init__(self):
        self.proc = subprocess.Popen([str(FIRSCOPE), "dap"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.seq = 0
        self.messages: list[dict] = []
        self.cond = threading.Condition()
        self._err = bytearray()
        threading.Thread(target=self._read, daemon=True).start()
        # stderr is drained as it comes: an adapter that writes more than a pipe holds
        # must not block on it while a test waits for it to exit
        self._err_reader = threading.Thread(target=self._drain, daemon=True)
        self._err_reader.start()

    def _read(self):
        while (msg := read_message(self.proc.stdout)) is not None:
            with self.cond:
                self.messages.append(msg)
                self.cond.notify_all()

    def _drain(self):
        while chunk := self.proc.stderr.read1(65536):
            self._err += chunk

    def exit(self, timeout: float = 60) -> tuple[int, str]:
        """Wait for the adapter to end: its exit status and all it wrote to stderr (said in
        the failure when it does not end)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self._err_reader.join(10)
            raise AssertionError("the adapter did not exit; its stderr:\n"
                                 + self._err.decode("utf-8", "replace")) from None
        self._err_reader.join(30)
        return self.proc.returncode, self._err.decode("utf-8", "replace")

    def send(self, command: str, args) -> int:
        self.seq += 1
        self.proc.stdin.write(encode_message({"seq": self.seq, "type": "request",
                                              "command": command, "arguments": args}))
        self.proc.stdin.flush()
        return self.seq

    def wait(self, pred, timeout: float = 120) -> dict:
        with self.cond:
            assert self.cond.wait_for(lambda: any(pred(m) for m in self.messages), timeout)
            return next(m for m in self.messages if pred(m))

    def response(self, seq: int) -> dict:
        return self.wait(lambda m: m.get("request_seq") == seq)

    def close(self) -> str:
        self.response(self.send("disconnect", {}))
        self.proc.stdin.close()
        code, err = self.exit()
        assert code == 0, err
        return err


def test_hostile_arguments_to_every_request_get_answers_not_crashes(sample_fir):
    """Every request the adapter knows, with arguments of the wrong shape, before and after
    a launch: each gets exactly one response, none is an internal error, and the session
    still answers afterwards."""
    from firscope.dap.adapter import PRELAUNCH, Adapter
    moves = ("configurationDone", "continue", "next", "stepIn", "stepOut", "stepBack",
             "reverseContinue", "goto", "pause")
    # the looking requests first, while the session is stopped; the movements last
    commands = sorted((n[2:] for n in dir(Adapter) if n.startswith("r_")
                       and n not in ("r_disconnect", "r_terminate", "r_launch")),
                      key=lambda c: (c in moves, c))
    c = Client()
    sent: dict[int, str] = {}

    held = set(PRELAUNCH)

    def send_all(launched: bool):
        for command in commands:
            for args in HOSTILE_ARGS:
                sent[c.send(command, args)] = command
        for seq, command in sent.items():
            if launched or command not in held:  # configuration waits for the launch
                c.response(seq)
    try:
        c.response(c.send("initialize", {"adapterID": "firscope"}))
        send_all(False)  # before any launch
        launch = c.send("launch", {"model": str(sample_fir), "tokens": [104, 101], "steps": 1,
                                   "engine": "interp", "stopOnEntry": True})
        assert c.response(launch)["success"]
        c.response(c.send("configurationDone", {}))
        c.wait(lambda m: m.get("event") == "stopped")
        _tricky_but_well_formed(c, sent)
        send_all(True)  # stopped at entry (a hostile continue may start a run: fine)
        c.response(c.send("pause", {"threadId": 1}))  # a hostile continue may still run
        for _ in range(600):  # until the run has stopped: then the session answers again
            value = c.response(c.send("evaluate", {"expression": "max(abs(x))",
                                                   "context": "watch"}))
            if value["success"] or "is running" not in value["message"]:
                break
            time.sleep(0.1)
        threads = c.response(c.send("threads", {}))
    finally:
        err = c.close()
    got = {m["request_seq"]: m for m in c.messages if m["type"] == "response"}
    assert set(sent) <= set(got), "one response per request"
    assert len([m for m in c.messages if m["type"] == "response"]) == c.seq
    internal = [(sent.get(s), r["message"]) for s, r in got.items()
                if not r["success"] and "internal error" in r["message"]]
    assert internal == []
    assert "Traceback" not in err
    assert threads["success"] and threads["body"]["threads"][0] == {"id": 1, "name": "graph"}
    assert value["success"] and float(value["body"]["result"]) > 0


def test_tcp_server_on_a_port_in_use_is_a_clear_error():
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = subprocess.run([str(FIRSCOPE), "dap", "--port", str(port)], capture_output=True,
                           text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.startswith(f"firscope: cannot listen on 127.0.0.1:{port}: ")
    assert r.stdout == ""
