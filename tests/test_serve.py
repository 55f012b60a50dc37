"""`firscope serve`: the UI served to a browser by textual-serve, on 127.0.0.1 by default."""
from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
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


def test_serve_answers_on_loopback_runs_the_ui_and_stops_cleanly():
    port = free_port()
    proc = subprocess.Popen([str(FIRSCOPE), "serve", str(SEED_FIR), "--port", str(port),
                             "--tokens", "104,101", "-n", "2", "--engine", "interp"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        page = _get(f"http://127.0.0.1:{port}/", time.monotonic() + 60)
        assert "<div>firscope</div>" in page  # the title the page shows
        assert f"ws://127.0.0.1:{port}/ws" in page  # the page's websocket: same host
        assert listening_addresses(port) == {"127.0.0.1"}, "bound to loopback only"
        # a browser tab: the websocket starts `firscope ui` and relays its screen
        wanted = ("tiny-gpt2 · q4 · token 0 of 0..2 'h'", "attention_linear")
        text = asyncio.run(_screen_text(f"ws://127.0.0.1:{port}/ws?width=120&height=36",
                                        wanted, 120))
        assert all(w in text for w in wanted), text[-3000:]
    finally:
        out, err = stop_server(proc, signal.SIGINT)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert re.search(rf"open http://127\.0\.0\.1:{port}", err)


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
