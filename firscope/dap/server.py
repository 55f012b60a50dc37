"""``firscope dap``: the adapter over stdio, or over TCP on 127.0.0.1 with ``--port N``.

Over stdio nothing but DAP messages may reach stdout, so the real stdout is
kept for the protocol and file descriptor 1 is pointed at stderr before any
model code runs: a stray ``print`` (ours, NumPy's, numba's) lands in the
editor's log instead of corrupting the stream. With ``--port`` the server
takes one client at a time, each a fresh session, until it is stopped
(VS Code's ``debugServer`` setting connects this way).
"""
from __future__ import annotations

import os
import socket
import sys

from ..errors import FirError
from .protocol import Writer, read_message

LOOPBACK = "127.0.0.1"


def serve_stdio() -> int:
    sys.stdout.flush()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)  # everything else written to fd 1 goes to stderr from now on
    sys.stdout = sys.stderr
    out = os.fdopen(protocol_fd, "wb", buffering=0)
    inp = os.fdopen(os.dup(0), "rb", buffering=0)
    closing, quiet = _quiet_interrupt_when_closing()
    try:
        run_session(inp, out, closing)
    finally:
        out.close()
    if quiet and closing.is_set():
        # The session is over: leave now, so that a SIGINT landing while Python shuts down
        # (nvim-dap sends one as it closes stdin) cannot turn exit 0 into 130.
        sys.stderr.flush()
        os._exit(0)
    return 0


def _quiet_interrupt_when_closing():
    """nvim-dap ends a session by closing stdin and sending SIGINT: once the client said
    disconnect or terminate, or stdin is closed, SIGINT ends the adapter with 0 and says
    nothing (not "exited with 130"); before that it interrupts as usual."""
    import signal
    import threading
    closing = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return closing, False

    def interrupt(signum, frame):
        if closing.is_set():
            sys.stderr.flush()
            os._exit(0)
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, interrupt)
    return closing, True


def run_session(inp, out, closing=None) -> None:
    from .capabilities import first_message
    reader = _buffered(inp)
    writer = Writer(out)
    first = first_message(lambda: read_message(reader), writer)  # before the engine loads
    from .adapter import Adapter
    adapter = Adapter(writer, closing=closing)
    adapter.serve(lambda: read_message(reader), first=first)


def _buffered(raw):
    import io
    return raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw)


def serve_tcp(port: int, host: str = LOOPBACK, ready=None) -> int:
    """Serve clients one after another on ``host:port`` until interrupted."""
    if not 0 <= port <= 65535:
        raise FirError(f"--port {port}: must be 0..65535")
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((host, port))
    except OSError as e:
        srv.close()
        raise FirError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    srv.listen(1)
    _stop_on_sigterm()
    bound = srv.getsockname()[1]
    print(f"firscope dap: listening on {host}:{bound}", file=sys.stderr, flush=True)
    if ready is not None:
        ready(bound)
    try:
        while True:
            conn, _ = srv.accept()
            with conn:
                inp = conn.makefile("rb")
                out = conn.makefile("wb")
                try:
                    run_session(inp, out)
                finally:
                    for f in (inp, out):
                        try:
                            f.close()
                        except OSError:
                            pass
    except KeyboardInterrupt:  # ctrl+c or SIGTERM: the normal way to stop a server
        print("firscope dap: stopped", file=sys.stderr, flush=True)
        return 0
    finally:
        srv.close()


def _stop_on_sigterm() -> None:
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():
        def stop(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, stop)
