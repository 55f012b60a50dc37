"""Regenerate screenshots/browser-serve.png: the UI served by `firscope serve`, in Chromium.

    python screenshots/make_browser_shot.py

Needs Debian's `chromium` (apt-get install chromium) and the serve extra
(pip install -e '.[serve]'). It starts `firscope serve` on a free port of
127.0.0.1, opens the page in headless Chromium through the DevTools protocol
(no browser download, no driver), steps the session to a breakpoint inside
the attention kernel through the served UI, and saves what the browser shows.
"""
from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "browser-serve.png"
WIDTH, HEIGHT = 1400, 860
# Chromium's flags for a closed network and no sandbox as root (the machine notes).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--remote-debugging-port=0", f"--window-size={WIDTH},{HEIGHT}"]
# What the served UI is asked to do before the shot, with the keys a person types: six
# nodes on (F10: before attention@0), then 36 instructions into the attention kernel (F11).
KEYS = ["n"] * 6 + ["s"] * 36


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer")


def devtools_port(profile: Path, seconds: float) -> int:
    marker = profile / "DevToolsActivePort"
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if marker.exists() and marker.read_text().strip():
            return int(marker.read_text().split()[0])
        time.sleep(0.1)
    raise SystemExit("chromium did not open its DevTools port")


class Page:
    """The few DevTools protocol calls the shot needs."""

    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, **params):
        self.next_id += 1
        await self.ws.send_str(json.dumps({"id": self.next_id, "method": method,
                                           "params": params}))
        while True:
            msg = json.loads((await self.ws.receive()).data)
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def key(self, key: str) -> None:
        special = {"Enter": ("\r", 13)}
        text, code = special.get(key, (key, ord(key.upper()) if len(key) == 1 else 0))
        await self.call("Input.dispatchKeyEvent", type="keyDown", key=key, text=text,
                        windowsVirtualKeyCode=code)
        await self.call("Input.dispatchKeyEvent", type="keyUp", key=key,
                        windowsVirtualKeyCode=code)
        await asyncio.sleep(0.2)  # the UI runs each movement in a worker


async def shoot(cdp_port: int, url: str) -> bytes:
    import aiohttp
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{cdp_port}/json/list") as r:
            targets = [t for t in await r.json() if t["type"] == "page"]
        async with http.ws_connect(targets[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            page = Page(ws)
            await page.call("Page.enable")
            await page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                            deviceScaleFactor=1, mobile=False)
            await page.call("Page.navigate", url=url)
            await asyncio.sleep(8)  # the page connects, `firscope ui` starts and loads
            # keys go to the terminal's hidden textarea: focus it as a click would
            await page.call("Runtime.evaluate",
                            expression="document.querySelector('#terminal textarea').focus()")
            for key in KEYS:
                await page.key(key)
            await asyncio.sleep(4)  # the last movement and the redraw
            shot = await page.call("Page.captureScreenshot", format="png")
            return base64.b64decode(shot["data"])


def main() -> int:
    chromium = shutil.which("chromium")
    if chromium is None:
        print("needs Debian's chromium: apt-get install chromium", file=sys.stderr)
        return 1
    port = free_port()
    firscope = Path(sys.executable).parent / "firscope"
    server = subprocess.Popen([str(firscope), "serve", "--port", str(port), "--prompt",
                               "def main(", "-n", "12"], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    # the first line names the URL with its token (serve refuses a page without it)
    m = re.search(r"(http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]+)", server.stderr.readline())
    if m is None:
        server.kill()
        raise SystemExit("firscope serve did not print its URL")
    url = m.group(1)
    with tempfile.TemporaryDirectory(prefix="firscope-chromium-") as profile:
        browser = None
        try:
            wait_http(url, 60)
            browser = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                        "about:blank"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
            png = asyncio.run(shoot(devtools_port(Path(profile), 30), url))
        finally:
            for proc in (browser, server):
                if proc is not None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
    OUT.write_bytes(png)
    print(f"wrote {OUT} ({len(png)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
