"""``firscope serve``: the terminal UI in a browser tab, through textual-serve.

textual-serve runs ``firscope ui ...`` as a child process for each browser
connection and relays its screen over a websocket. It binds 127.0.0.1 unless
told otherwise: whoever reaches the port runs the debugger as this user.
It lives beside the DAP server as the other way an editor-less user reaches
the debugger; it imports no part of the UI, only starts it.
"""
from __future__ import annotations

import ipaddress
import shlex
import sys
from pathlib import Path

from ..errors import FirError

LOOPBACK = "127.0.0.1"


def ui_command(args) -> list[str]:
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


def serve(args) -> int:
    try:
        from textual_serve.server import Server
    except ImportError:
        raise FirError("firscope serve needs textual-serve: pip install 'firscope[serve]'") \
            from None
    if args.model is not None and not Path(args.model).exists():
        raise FirError(f"{args.model}: no such file")
    if not 1 <= args.port <= 65535:
        raise FirError(f"--port {args.port}: must be 1..65535")
    if not _is_loopback(args.host):
        print(f"firscope serve: warning: listening on {args.host}: anyone who can reach this "
              "address can run the debugger as you", file=sys.stderr)
    command = shlex.join(ui_command(args))
    server = Server(command, host=args.host, port=args.port, title="firscope")
    print(f"firscope serve: open http://{args.host}:{args.port} (ctrl+c stops)",
          file=sys.stderr, flush=True)
    try:
        server.serve()
    except OSError as e:  # the port is taken, or the address is not this machine's
        raise FirError(f"cannot listen on {args.host}:{args.port}: "
                       f"{e.strerror or e}") from None
    return 0
