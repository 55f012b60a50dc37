"""``firscope serve``: the terminal UI in a browser tab, through textual-serve.

textual-serve runs ``firscope ui ...`` as a child process for each browser
connection and relays its screen over a websocket. It binds 127.0.0.1 unless
told otherwise: whoever reaches the port runs the debugger as this user, so the
server (webserve.py) wants the random token of the URL it prints, refuses other
origins and runs at most ``--max-sessions`` UIs at once.
It lives beside the DAP server as the other way an editor-less user reaches
the debugger; it imports no part of the UI, only starts it.
"""
from __future__ import annotations

import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path

from ..defaults import DEFAULT_ENGINE, DEFAULT_GROUP, UI_STEPS
from ..errors import FirError

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ServeOptions:
    """``firscope serve``'s arguments: the UI's own, handed on to each ``firscope ui``, and
    where to listen."""

    model: str | None = None
    prompt: str | None = None
    tokens: str | None = None
    n: int | None = UI_STEPS
    fir_f32: bool = False
    group: int = DEFAULT_GROUP
    engine: str = DEFAULT_ENGINE
    q4_path: str = "packed"
    host: str = LOOPBACK
    port: int = 8000
    max_sessions: int = 1


def ui_command(args: ServeOptions) -> list[str]:
    """The ``firscope ui`` command line the server runs for each browser tab."""
    cmd = [sys.executable, "-m", "firscope", "ui"]
    if args.model is not None:
        cmd.append(str(Path(args.model).resolve()))
    if args.prompt is not None:
        cmd += ["--prompt", args.prompt]
    if args.tokens is not None:
        cmd += ["--tokens", args.tokens]
    if args.n is not None:
        cmd += ["-n", str(args.n)]
    if args.fir_f32:
        cmd.append("--fir-f32")
    cmd += ["--group", str(args.group), "--engine", args.engine, "--q4-path", args.q4_path]
    return cmd


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(args: ServeOptions) -> int:
    try:
        from .webserve import GuardedServer
    except ImportError:
        raise FirError("firscope serve needs textual-serve: pip install 'firscope[serve]'") \
            from None
    if args.model is not None and not Path(args.model).exists():
        raise FirError(f"{args.model}: no such file")
    if not 1 <= args.port <= 65535:
        raise FirError(f"--port {args.port}: must be 1..65535")
    max_sessions = args.max_sessions
    if not 1 <= max_sessions <= 64:
        raise FirError(f"--max-sessions {max_sessions}: must be 1..64")
    if not _is_loopback(args.host):
        print(f"firscope serve: warning: listening on {args.host}: anyone who can reach this "
              "address can run the debugger as you", file=sys.stderr)
    server = GuardedServer(ui_command(args), host=args.host, port=args.port,
                           max_sessions=max_sessions)
    print(f"firscope serve: open {server.url} (ctrl+c stops; the token is needed, "
          f"at most {max_sessions} session{'s' if max_sessions > 1 else ''} at once)",
          file=sys.stderr, flush=True)
    try:
        server.serve()
    except OSError as e:  # the port is taken, or the address is not this machine's
        raise FirError(f"cannot listen on {args.host}:{args.port}: "
                       f"{e.strerror or e}") from None
    finally:
        for ui in list(server.sessions):  # whatever the server did not end: ended now
            ui.kill_now()
    refused = f" ({server.refusals} connection(s) refused)" if server.refusals else ""
    print(f"firscope serve: stopped{refused}", file=sys.stderr, flush=True)
    return 0
