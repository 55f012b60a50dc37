"""`firscope dap --port`: who the TCP server talks to, over real loopback sockets.

One session at a time (a second client is told "busy"), a silent client is timed
out, the connection closes after disconnect, the first malformed header ends the
connection, a stream that does not start with a DAP header (a browser's HTTP POST)
is closed unread, and SIGTERM stops the server in every state. Every wait here is
bounded by a socket timeout, so a regression fails instead of hanging.
"""
from __future__ import annotations

import base64
import io
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import SEED_FIR
from firscope.dap.protocol import encode_message, read_message
from netutil import stop_server

FIRSCOPE = Path(sys.executable).parent / "firscope"


def start_server(idle: float = 2.0) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([str(FIRSCOPE), "dap", "--port", "0", "--idle-timeout", str(idle)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    m = re.search(r"listening on 127\.0\.0\.1:([0-9]+)", line)
    assert m, f"unexpected first line: {line!r}"
    return proc, int(m.group(1))


def connect(port: int, timeout: float = 60) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.settimeout(timeout)
    return s


def request(seq: int, command: str, **args) -> bytes:
    return encode_message({"seq": seq, "type": "request", "command": command,
                           "arguments": args})


def read_all(s: socket.socket, limit: float = 60) -> bytes:
    """Everything the server sends until it closes the connection (fails after ``limit``)."""
    data = b""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"the server kept the connection open for {limit} s: {data[:300]!r}")


def messages(data: bytes) -> list[dict]:
    stream, out = io.BytesIO(data), []
    while (m := read_message(stream)) is not None:
        out.append(m)
    return out


def read_one(s: socket.socket) -> dict:
    return read_message(s.makefile("rb"))


def test_an_idle_client_gets_timed_out_and_a_second_client_is_told_busy():
    proc, port = start_server(idle=2.0)
    try:
        idle = connect(port)  # connects, never sends
        time.sleep(0.3)
        second = connect(port)
        second.sendall(request(1, "initialize", adapterID="firscope"))
        busy = messages(read_all(second, 30))
        assert len(busy) == 1 and busy[0]["success"] is False, busy
        assert busy[0]["request_seq"] == 1 and "busy" in busy[0]["message"]
        t0 = time.monotonic()
        assert read_all(idle, 30) == b""  # closed without a word, by the idle timeout
        assert time.monotonic() - t0 < 15
        third = connect(port)  # the slot is free again
        third.sendall(request(1, "initialize", adapterID="firscope") + request(2, "disconnect"))
        got = messages(read_all(third, 60))  # and closed after disconnect
        assert [(m.get("command"), m["success"]) for m in got if m["type"] == "response"] == [
            ("initialize", True), ("disconnect", True)]
        for s in (idle, second, third):
            s.close()
        assert proc.poll() is None
    finally:
        out, err = stop_server(proc, signal.SIGTERM, wait=20)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_a_busy_client_that_sends_nothing_hears_busy_too():
    proc, port = start_server(idle=30.0)
    try:
        first = connect(port)
        first.sendall(request(1, "initialize", adapterID="firscope"))
        assert read_one(first)["command"] == "initialize"
        second = connect(port)
        told = messages(read_all(second, 30))
        assert told and told[0]["event"] == "output" and "busy" in told[0]["body"]["output"]
        first.close()
        second.close()
    finally:
        stop_server(proc, signal.SIGTERM, wait=20)


@pytest.mark.parametrize("state", ["no client", "silent client", "session open",
                                   "half a header", "busy client too"])
def test_sigterm_stops_the_server_promptly_in_every_state(state):
    proc, port = start_server(idle=60.0)
    socks = []
    try:
        if state != "no client":
            socks.append(connect(port))
        if state in ("session open", "busy client too"):
            socks[0].sendall(request(1, "initialize", adapterID="firscope"))
            assert read_one(socks[0])["command"] == "initialize"
        if state == "half a header":
            socks[0].sendall(b"Content-Length: 40\r\n")
        if state == "busy client too":
            socks.append(connect(port))
        time.sleep(0.3)
        t0 = time.monotonic()
        _, err = stop_server(proc, signal.SIGTERM, wait=10)
        assert time.monotonic() - t0 < 10
        assert proc.returncode == 0, err
        assert "firscope dap: stopped" in err and "Traceback" not in err
    finally:
        for s in socks:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_http_post_is_closed_unread_and_launches_nothing():
    body = json.dumps({"seq": 1, "type": "request", "command": "launch",
                       "arguments": {"model": str(SEED_FIR), "stopOnEntry": True}}).encode()
    post = (b"POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    proc, port = start_server()
    try:
        s = connect(port)
        s.sendall(post)
        assert read_all(s, 30) == b"", "nothing is answered to a stream that is not DAP"
        s.close()
        # the server is still there for a real client
        ok = connect(port)
        ok.sendall(request(1, "initialize", adapterID="firscope") + request(2, "disconnect"))
        got = messages(read_all(ok, 60))
        assert [(m.get("command"), m["success"]) for m in got if m["type"] == "response"] == [
            ("initialize", True), ("disconnect", True)]
        ok.close()
    finally:
        stop_server(proc, signal.SIGTERM, wait=20)


def test_the_first_malformed_header_ends_the_connection():
    proc, port = start_server()
    try:
        s = connect(port)
        s.sendall(request(1, "initialize", adapterID="firscope"))
        assert read_one(s)["command"] == "initialize"
        s.sendall(b"GET / HTTP/1.1\r\n" + request(2, "threads"))
        got = messages(read_all(s, 30))
        said = [m["body"]["output"] for m in got if m.get("event") == "output"]
        assert len(said) == 1 and "closing the connection" in said[0], got
        assert not any(m["type"] == "response" for m in got), "nothing after it is executed"
        s.close()
    finally:
        stop_server(proc, signal.SIGTERM, wait=20)


def test_read_memory_before_address_zero_is_clamped_not_shifted():
    from test_dap_wire import Client
    c = Client()
    try:
        c.response(c.send("initialize", {"adapterID": "firscope"}))
        launched = c.response(c.send("launch", {"model": str(SEED_FIR), "tokens": [104],
                                                "steps": 1, "engine": "interp",
                                                "stopOnEntry": True}))
        assert launched["success"], launched
        c.response(c.send("configurationDone", {}))
        c.wait(lambda m: m.get("event") == "stopped")
        whole = c.response(c.send("readMemory", {"memoryReference": "0x0", "count": 8}))
        early = c.response(c.send("readMemory", {"memoryReference": "0x0", "offset": -8,
                                                 "count": 16}))
        before = c.response(c.send("readMemory", {"memoryReference": "0x0", "offset": -32,
                                                  "count": 16}))
    finally:
        c.close()
    assert early["success"] and early["body"]["address"] == "0x0"
    assert base64.b64decode(early["body"]["data"]) == base64.b64decode(whole["body"]["data"])
    assert early["body"]["unreadableBytes"] == 8
    assert before["body"]["address"] == "0x0" and before["body"]["data"] == ""
    assert before["body"]["unreadableBytes"] == 16

