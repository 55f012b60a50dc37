"""`firscope serve`: the UI served to a browser by textual-serve, on 127.0.0.1 by default."""
from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import SEED_FIR
from netutil import free_port, listening_addresses, stop_server

FIRSCOPE = Path(sys.executable).parent / "firscope"
pytest.importorskip("textual_serve", reason="firscope serve needs the serve extra")


def _get(url: str, deadline: float) -> str:
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                assert r.status == 200
                return r.read().decode("utf-8", "replace")
        except OSError as e:  # not listening yet
            last = e
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer: {last}")


def _plain(screen: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)


async def _screen_text(url: str, wanted: tuple[str, ...], seconds: float) -> str:
    """What the served UI writes to a browser's websocket (escapes removed), until every
    string in ``wanted`` shows."""
    import aiohttp
    seen = ""
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url) as ws:
            end = time.monotonic() + seconds
            while not all(w in _plain(seen) for w in wanted) and time.monotonic() < end:
                try:
                    msg = await ws.receive(timeout=max(end - time.monotonic(), 0.1))
                except asyncio.TimeoutError:
                    break
                if msg.type == aiohttp.WSMsgType.BINARY:
                    seen += msg.data.decode("utf-8", "replace")
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    seen += msg.data
                else:
                    break
    return _plain(seen)


def start_serve(*extra: str) -> tuple[subprocess.Popen, int, str]:
    """A `firscope serve` on a free port: the process, the port and the token of the URL
    it prints."""
    port = free_port()
    proc = subprocess.Popen([str(FIRSCOPE), "serve", str(SEED_FIR), "--port", str(port),
                             "--tokens", "104,101", "-n", "2", "--engine", "interp", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    m = re.search(rf"open http://127\.0\.0\.1:{port}/\?token=([A-Za-z0-9_-]{{20,}}) ", line)
    assert m, f"unexpected first line: {line!r}"
    return proc, port, m.group(1)


def test_serve_answers_on_loopback_runs_the_ui_and_stops_cleanly():
    proc, port, token = start_serve()
    try:
        page = _get(f"http://127.0.0.1:{port}/?token={token}", time.monotonic() + 60)
        assert "<div>firscope</div>" in page  # the title the page shows
        assert f"ws://127.0.0.1:{port}/ws/{token}" in page  # its websocket: same host, token
        assert listening_addresses(port) == {"127.0.0.1"}, "bound to loopback only"
        # a browser tab: the websocket starts `firscope ui` and relays its screen
        wanted = ("tiny-gpt2 · q4 · token 0 of 0..2 'h'", "attention_linear")
        text = asyncio.run(_screen_text(f"ws://127.0.0.1:{port}/ws/{token}?width=120&height=36",
                                        wanted, 120))
        assert all(w in text for w in wanted), text[-3000:]
    finally:
        out, err = stop_server(proc, signal.SIGINT)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_serve_refuses_a_missing_model_and_a_bad_port(tmp_path):
    r = subprocess.run([str(FIRSCOPE), "serve", str(tmp_path / "none.fir")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "none.fir: no such file" in r.stderr
    r = subprocess.run([str(FIRSCOPE), "serve", "--port", "70000"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--port 70000: must be 1..65535" in r.stderr


def test_serve_on_a_port_in_use_is_a_clear_error():
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = subprocess.run([str(FIRSCOPE), "serve", "--port", str(port)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"firscope: cannot listen on 127.0.0.1:{port}: " in r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr


def test_ui_command_passes_the_ui_arguments():
    import argparse
    from firscope.dap.serve import ui_command
    args = argparse.Namespace(model="m.fir", prompt=None, tokens="1,2", n=3, fir_f32=True,
                              group=16, engine="interp", q4_path="dequant")
    cmd = ui_command(args)
    assert cmd[:4] == [sys.executable, "-m", "firscope", "ui"]
    assert cmd[4] == str(Path("m.fir").resolve())
    assert cmd[5:] == ["--tokens", "1,2", "-n", "3", "--fir-f32", "--group", "16",
                       "--engine", "interp", "--q4-path", "dequant"]


def _children(pid: int) -> set[int]:
    """The live (not zombie) child processes of ``pid``."""
    kids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.add(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_until(pred, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


async def _handshake(url: str, origin: str | None = None) -> int:
    """The HTTP status a websocket handshake gets (101 when it is accepted; then closed)."""
    import aiohttp
    async with aiohttp.ClientSession() as http:
        try:
            ws = await http.ws_connect(url, origin=origin, timeout=aiohttp.ClientWSTimeout(
                ws_receive=30))
        except aiohttp.WSServerHandshakeError as e:
            return e.status
        await ws.close()
        return 101


def test_serve_wants_the_token_its_own_origin_and_one_session_at_a_time():
    import aiohttp
    proc, port, token = start_serve()
    base = f"http://127.0.0.1:{port}"
    try:
        _get(f"{base}/?token={token}", time.monotonic() + 60)
        for url in (f"{base}/", f"{base}/?token=wrong{token}"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(url, timeout=10)
            assert e.value.code == 403
        ws = f"ws://127.0.0.1:{port}/ws"
        assert asyncio.run(_handshake(f"{ws}?width=80&height=24")) in (403, 404)
        assert asyncio.run(_handshake(f"{ws}/x{token}")) == 403
        assert asyncio.run(_handshake(f"{ws}/{token}", origin="http://evil.example")) == 403
        assert asyncio.run(_handshake(f"{ws}/{token}", origin="null")) == 403
        assert _children(proc.pid) == set(), "a refused connection starts no UI"

        async def two_tabs():
            async with aiohttp.ClientSession() as http:
                first = await http.ws_connect(f"{ws}/{token}", origin=base)
                second = await _handshake(f"{ws}/{token}", origin=base)
                kids = _children(proc.pid)
                await first.close()
                return second, kids
        second, kids = asyncio.run(two_tabs())
        assert second == 503, "a second tab is refused while the first is open (default 1)"
        assert len(kids) == 1, kids
        assert _wait_until(lambda: not _children(proc.pid), 20), "the closed tab's UI ended"
        statuses = []  # the slot is free again once the server has seen the child end
        assert _wait_until(lambda: statuses.append(
            asyncio.run(_handshake(f"{ws}/{token}", origin=base))) or statuses[-1] != 503, 20)
        assert statuses[-1] == 101, statuses
    finally:
        _, err = stop_server(proc, signal.SIGTERM)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    refused = re.search(r"firscope serve: stopped \(([0-9]+) connection\(s\) refused\)", err)
    assert refused and int(refused.group(1)) >= 4, err[-2000:]  # 3 x 403, 1 x 503 at least


def test_serve_children_end_with_their_connection_and_with_the_server():
    """A tab that disconnects while its UI is still starting leaves nothing running; a tab
    still open when the server stops leaves nothing running either, and does not hold the
    server up."""
    import aiohttp
    proc, port, token = start_serve("--max-sessions", "2")
    url = f"ws://127.0.0.1:{port}/ws/{token}"
    try:
        _get(f"http://127.0.0.1:{port}/?token={token}", time.monotonic() + 60)

        async def connect_and_drop():
            async with aiohttp.ClientSession() as http:
                ws = await http.ws_connect(url)
                assert _wait_until(lambda: _children(proc.pid), 10)
                kids = _children(proc.pid)
                await ws.close()  # at once: the UI is still importing
                return kids
        started = asyncio.run(connect_and_drop())
        assert started
        assert _wait_until(lambda: not any(_alive(p) for p in started), 20), \
            "a UI child outlived its dropped connection"

        async def stay_open_and_stop_the_server():
            async with aiohttp.ClientSession() as http:
                ws = await http.ws_connect(url)
                assert _wait_until(lambda: _children(proc.pid), 10)
                kids = _children(proc.pid)
                # this client does not answer the server's close (its loop is blocked in
                # here): the server still stops within its close grace, not when its
                # heartbeat gives up on the tab (~20 s)
                t = time.monotonic()
                stop_server(proc, signal.SIGTERM)
                assert time.monotonic() - t < 8, "the server waited on a silent tab"
                await ws.close()
                return kids
        open_kids = asyncio.run(stay_open_and_stop_the_server())
        assert _wait_until(lambda: not any(_alive(p) for p in open_kids), 20), \
            "a UI child outlived the server"
    finally:
        if proc.poll() is None:
            stop_server(proc, signal.SIGTERM)
