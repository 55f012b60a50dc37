"""The textual-serve server ``firscope serve`` runs, made safe to leave running.

textual-serve alone answers any web page: a page on another origin could open
``ws://127.0.0.1:8000/ws``, read the screen and type into the debugger, and
every connection started another UI process. Here, as in Jupyter:

* a random token is part of the URL printed at start; the page (``/?token=T``)
  and its websocket (``/ws/T``) are refused (403) without it;
* the websocket is refused unless its ``Origin`` is this server's own (or no
  Origin at all: not a browser, and it still needs the token);
* at most ``max_sessions`` UI processes run at once; one more connection is
  answered 503 ("busy") before any process starts.

Each UI child runs in a session (process group) of its own and dies with the
server (``PR_SET_PDEATHSIG`` on Linux). When its browser connection ends the
child is asked to quit; one that does not end within a few seconds (a UI still
starting does not read its input yet) is sent SIGTERM, then SIGKILL, with its
whole group. Nothing outlives the connection or the server.
"""
from __future__ import annotations

import asyncio
import hmac
import os
import secrets
import signal
import sys
from urllib.parse import urlsplit

import aiohttp_jinja2
import jinja2
from aiohttp import WSCloseCode, web
from textual_serve.app_service import AppService
from textual_serve.server import Server, to_int

QUIT_GRACE = 3.0  # seconds a child has to quit by itself once its connection ended
TERM_GRACE = 2.0  # then seconds between SIGTERM and SIGKILL
CLOSE_GRACE = 2.0  # seconds a browser has to answer the server's close of its websocket


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the server process dies."""
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


class UiProcess(AppService):
    """One browser tab's ``firscope ui`` child, which always ends when :meth:`stop` does."""

    def __init__(self, argv: list[str], **kwargs):
        super().__init__(" ".join(argv), **kwargs)
        self.argv = argv

    async def _open_app_process(self, width: int = 80, height: int = 24):
        self._process = process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=self._build_environment(width, height),
            start_new_session=True, preexec_fn=_die_with_parent)
        self._stdin = process.stdin
        return process

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await self._download_manager.cancel_app_downloads(
                app_service_id=self.app_service_id)
            try:
                await asyncio.wait_for(self.send_meta({"type": "quit"}), QUIT_GRACE)
            except (asyncio.TimeoutError, OSError, AttributeError):
                pass
        proc = self._process
        if proc is not None:
            for sig, grace in ((None, QUIT_GRACE), (signal.SIGTERM, TERM_GRACE),
                               (signal.SIGKILL, 30.0)):
                if sig is not None:
                    self._signal_group(sig)
                try:
                    await asyncio.wait_for(asyncio.shield(proc.wait()), grace)
                    break
                except asyncio.TimeoutError:
                    continue
        if task is not None:  # its output ends with the process
            done, _ = await asyncio.wait({task}, timeout=5)
            if not done:
                task.cancel()

    def _signal_group(self, sig) -> None:
        if self._process is None or self._process.returncode is not None:
            return
        try:
            os.killpg(self._process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill_now(self) -> None:
        """SIGKILL the child's whole group (the server is going away)."""
        self._signal_group(signal.SIGKILL)


class GuardedServer(Server):
    """textual-serve's Server with a token, an Origin check and a cap on sessions."""

    def __init__(self, argv: list[str], *, host: str, port: int, max_sessions: int = 1,
                 token: str | None = None, title: str = "firscope"):
        super().__init__(" ".join(argv), host=host, port=port, title=title)
        self.argv = argv
        self.token = token or secrets.token_urlsafe(24)
        self.max_sessions = max_sessions
        self.sessions: set[UiProcess] = set()
        self.sockets: set[web.WebSocketResponse] = set()
        self.refusals = 0  # counted for the log line at exit

    @property
    def url(self) -> str:
        return f"{self.public_url}/?token={self.token}"

    def origins(self) -> set[str]:
        own = {self.public_url}
        if self.host in ("127.0.0.1", "localhost", "::1"):
            own |= {f"http://{h}:{self.port}" for h in ("127.0.0.1", "localhost", "[::1]")}
        return own

    def _token_ok(self, given: str | None) -> bool:
        return isinstance(given, str) and hmac.compare_digest(given.encode(),
                                                              self.token.encode())

    async def _make_app(self) -> web.Application:
        app = web.Application()
        aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(self.templates_path))
        app.add_routes([  # textual-serve's routes, the websocket's with the token in its path
            web.get("/", self.handle_index, name="index"),
            web.get("/ws/{token}", self.handle_websocket, name="websocket"),
            web.get("/download/{key}", self.handle_download, name="download"),
            web.static("/static", self.statics_path, show_index=False, name="static"),
        ])
        app.on_shutdown.append(self.on_shutdown)
        return app

    async def handle_index(self, request: web.Request) -> web.Response:
        if not self._token_ok(request.query.get("token")):
            raise web.HTTPForbidden(text="firscope serve: open the URL printed at start "
                                         "(it carries the session token)\n")
        scheme = "wss" if self.public_url.startswith("https") else "ws"
        context = {
            "font_size": to_int(request.query.get("fontsize", "16"), 16),
            "app_websocket_url": f"{scheme}:{self.public_url.split(':', 1)[1]}/ws/"
                                 f"{self.token}",
            "config": {"static": {"url": f"{self.public_url}/static/"}},
            "application": {"name": self.title},
        }
        response = aiohttp_jinja2.render_template("app_index.html", request, context)
        response.headers["Referrer-Policy"] = "no-referrer"  # the token stays here
        return response

    async def on_shutdown(self, app: web.Application) -> None:
        """The server stops (ctrl+c, SIGTERM): every UI is killed and every tab's websocket
        closed, a tab that does not answer the close within CLOSE_GRACE cut off (aiohttp
        otherwise waits on its handler until the heartbeat gives up on it, ~20 s)."""
        for ui in list(self.sessions):
            ui.kill_now()
        await asyncio.gather(*(ws.close(code=WSCloseCode.GOING_AWAY)
                               for ws in list(self.sockets)), return_exceptions=True)

    def _refusal(self, request: web.Request) -> web.Response | None:
        if not self._token_ok(request.match_info.get("token")):
            return web.Response(status=403, text="firscope serve: no valid token\n")
        origin = request.headers.get("Origin")
        if origin is not None and _origin(origin) not in self.origins():
            return web.Response(status=403, text=f"firscope serve: origin {origin[:80]!r} "
                                                 "is not this server's\n")
        if len(self.sessions) >= self.max_sessions:
            return web.Response(status=503, text=f"firscope serve: busy: {len(self.sessions)}"
                                                 f" session(s) open (--max-sessions "
                                                 f"{self.max_sessions})\n")
        return None

    async def handle_websocket(self, request: web.Request):
        refusal = self._refusal(request)
        if refusal is not None:
            self.refusals += 1
            return refusal
        websocket = web.WebSocketResponse(heartbeat=15, timeout=CLOSE_GRACE)
        width = to_int(request.query.get("width", "80"), 80)
        height = to_int(request.query.get("height", "24"), 24)
        ui = UiProcess(self.argv, write_bytes=websocket.send_bytes,
                       write_str=websocket.send_str, close=websocket.close,
                       download_manager=self.download_manager, debug=self.debug)
        self.sessions.add(ui)  # counted before the first await: no race past the cap
        self.sockets.add(websocket)
        try:
            await websocket.prepare(request)
            await ui.start(width, height)
            await self._process_messages(websocket, ui)
        except asyncio.CancelledError:
            await websocket.close()
        except Exception as e:  # a broken browser message: end this session, keep serving
            print(f"firscope serve: a session ended: {type(e).__name__}: {str(e)[:200]}",
                  file=sys.stderr, flush=True)
        finally:
            try:
                await asyncio.shield(ui.stop())
            finally:
                ui.kill_now()
                self.sessions.discard(ui)
                self.sockets.discard(websocket)
        return websocket


def _origin(value: str) -> str:
    parts = urlsplit(value.strip())
    return f"{parts.scheme}://{parts.netloc}".lower()
