"""``firscope dap``: the adapter over stdio, or over TCP on 127.0.0.1 with ``--port N``.

Over stdio nothing but DAP messages may reach stdout, so the real stdout is
kept for the protocol and file descriptor 1 is pointed at stderr before any
model code runs: a stray ``print`` (ours, NumPy's, numba's) lands in the
editor's log instead of corrupting the stream.

With ``--port`` the server holds one session at a time, each a fresh adapter
(VS Code's ``debugServer`` setting connects this way). Whoever reaches the port
can launch any model file this user can read, so the server is strict about
who it talks to: a second client while a session is open is told the server
is busy and closed; a client whose first bytes are not a DAP header (a
browser's HTTP request, say) is closed unread; one that sends no complete
first message within ``--idle-timeout`` seconds is closed; the first
malformed header ends the connection (no resynchronising on a stream that is
not DAP); the connection closes after ``disconnect``. SIGTERM and ctrl+c stop
the server in every state: the accept loop waits with a timeout and an open
session's socket is shut down, which wakes its reader.

Every TCP session must show a secret: the server prints a fresh token when it
starts (or takes ``FIRSCOPE_DAP_TOKEN``, at least 16 characters), and a client
gets nothing but its ``initialize`` answered until a ``launch`` carries it as
``"token"``; a launch without it, or with another, is refused and the
connection closed (adapter.Adapter._authenticated). Over stdio the editor
started the adapter itself: no token.
"""
from __future__ import annotations

import os
import select
import socket
import sys
import threading

from ..errors import FirError
from .protocol import ProtocolError, Writer, read_message

LOOPBACK = "127.0.0.1"
IDLE_TIMEOUT = 10.0  # seconds a new client has to send its first complete message
DAP_FIRST_BYTES = b"content-length:"
_POLL = 0.2  # the accept loop's wake-up interval: how soon a stop request is seen


def serve_stdio() -> int:
    sys.stdout.flush()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)  # everything else written to fd 1 goes to stderr from now on
    sys.stdout = sys.stderr
    out = os.fdopen(protocol_fd, "wb", buffering=0)
    inp = os.fdopen(os.dup(0), "rb", buffering=0)
    closing, quiet = _quiet_interrupt_when_closing(inp.fileno())
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


def _quiet_interrupt_when_closing(inp_fd: int):
    """nvim-dap ends a session by closing stdin and sending SIGINT: once the client said
    disconnect or terminate, or stdin is closed, SIGINT ends the adapter with 0 and says
    nothing (not "exited with 130"); before that it interrupts as usual.

    The signal can land before the reader thread has seen the end of stdin (the client
    closes and signals at once), so the handler also asks the descriptor itself."""
    import signal
    import threading
    closing = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return closing, False

    def interrupt(signum, frame):
        if closing.is_set() or input_closed(inp_fd):
            sys.stderr.flush()
            os._exit(0)
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, interrupt)
    return closing, True


def input_closed(fd: int) -> bool:
    """True when the other end of ``fd`` (a pipe, socket or tty) is closed and nothing is
    left to read: readable now, with no byte waiting. Reads nothing. False when it cannot
    tell (no FIONREAD on this system, a descriptor that is gone)."""
    try:
        import fcntl
        import struct
        import termios
        readable, _, _ = select.select([fd], [], [], 0)
        if not readable:
            return False
        waiting = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except (ImportError, OSError, ValueError):
        return False
    return waiting == 0


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


TOKEN_ENV = "FIRSCOPE_DAP_TOKEN"
MIN_TOKEN = 16


def session_token() -> str:
    """The secret a TCP client must show: ``FIRSCOPE_DAP_TOKEN``, else a fresh one."""
    import secrets
    given = os.environ.get(TOKEN_ENV)
    if given is None:
        return secrets.token_urlsafe(24)
    if len(given) < MIN_TOKEN or not given.isprintable() or not given.isascii():
        raise FirError(f"{TOKEN_ENV}: give at least {MIN_TOKEN} printable ASCII characters "
                       "(or unset it: the server then makes one)")
    return given


def serve_tcp(port: int, host: str = LOOPBACK, ready=None,
              idle_timeout: float = IDLE_TIMEOUT, token: str | None = None) -> int:
    """Serve one client at a time on ``host:port`` until SIGTERM or ctrl+c; each must show
    ``token`` (default :func:`session_token`) in its launch."""
    token = token or session_token()
    if not 0 <= port <= 65535:
        raise FirError(f"--port {port}: must be 0..65535")
    if not idle_timeout > 0:
        raise FirError(f"--idle-timeout {idle_timeout}: must be > 0 seconds")
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((host, port))
    except OSError as e:
        srv.close()
        raise FirError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    srv.listen(8)
    stop = threading.Event()
    _stop_on_signals(stop)
    bound = srv.getsockname()[1]
    print(f"firscope dap: listening on {host}:{bound}; token {token} (give it as \"token\" "
          "in the launch configuration)", file=sys.stderr, flush=True)
    if ready is not None:
        ready(bound)
    current: TcpSession | None = None
    try:
        while not stop.is_set():
            try:
                readable, _, _ = select.select([srv], [], [], _POLL)
            except InterruptedError:
                continue
            if not readable:
                continue
            conn, _ = srv.accept()
            if current is not None and current.alive():
                threading.Thread(target=_refuse_busy, args=(conn,), daemon=True).start()
                continue
            current = TcpSession(conn, idle_timeout, token)
            current.start()
    except KeyboardInterrupt:
        pass
    finally:
        srv.close()
        if current is not None:
            current.close()
    print("firscope dap: stopped", file=sys.stderr, flush=True)
    return 0


class TcpSession:
    """One client's adapter on a thread of its own; :meth:`close` ends it from outside."""

    def __init__(self, conn: socket.socket, idle_timeout: float, token: str):
        self.conn = conn
        self.idle_timeout = idle_timeout
        self.token = token
        self.thread = threading.Thread(target=self._run, name="dap-session", daemon=True)
        self.finished = threading.Event()  # set before the client can see the close

    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive() and not self.finished.is_set()

    def close(self, wait: float = 5.0) -> None:
        _shutdown(self.conn)  # wakes a reader blocked in recv
        self.thread.join(timeout=wait)

    def _run(self) -> None:
        conn = self.conn
        try:
            conn.settimeout(self.idle_timeout)
            if not _starts_like_dap(conn, self.idle_timeout):
                return
            inp = conn.makefile("rb")
            out = conn.makefile("wb")
            writer = Writer(out)
            read = _strict_reader(inp, writer)
            from .capabilities import first_message
            first = first_message(read, writer)  # under the idle timeout; before the engine
            if first[0] == "eof":  # silence, a timeout, an early close or a broken header
                return
            conn.settimeout(None)
            from .adapter import Adapter
            Adapter(writer, token=self.token).serve(read, first=first)
        except OSError:
            pass
        finally:
            self.finished.set()
            _shutdown(conn)
            conn.close()


def _starts_like_dap(conn: socket.socket, timeout: float) -> bool:
    """Whether the first bytes the client sends begin a ``Content-Length`` header (peeked,
    not consumed); False for anything else, for silence and for an early close."""
    import time
    want = len(DAP_FIRST_BYTES)
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return False
        conn.settimeout(left)
        try:
            head = conn.recv(want, socket.MSG_PEEK)
        except OSError:
            return False
        if not head or not DAP_FIRST_BYTES.startswith(head.lower()[:want]):
            return False
        if len(head) >= want:
            return True
        r, _, _ = select.select([conn], [], [], min(left, 0.05))  # wait for more bytes


def _strict_reader(inp, writer: Writer):
    """The adapter's reader: messages until the first framing error, which is told to the
    client and ends the stream (None) instead of resynchronising."""
    broken = []

    def read() -> dict | None:
        if broken:
            return None
        try:
            return read_message(inp)
        except ProtocolError as e:
            broken.append(e)
            writer.event("output", {"category": "stderr", "output":
                                    f"firscope dap: closing the connection: {e}\n"})
            return None
        except OSError:  # the socket was shut down (server stopping) or reset
            return None
    return read


def _refuse_busy(conn: socket.socket) -> None:
    """Tell a second client the server is busy: an error response to its first request
    when one comes within a second or two, an output event otherwise; then close."""
    message = ("firscope dap: busy: another client has a session open on this server "
               "(one session at a time); try again when it disconnects")
    try:
        conn.settimeout(2.0)
        out = conn.makefile("wb")
        writer = Writer(out)
        request = None
        if _starts_like_dap(conn, 2.0):
            try:
                request = read_message(conn.makefile("rb"))
            except (ProtocolError, OSError):
                request = None
        if isinstance(request, dict) and request.get("type") == "request":
            writer.error(request, message)
        else:
            writer.event("output", {"category": "important", "output": message + "\n"})
    except OSError:
        pass
    finally:
        _shutdown(conn)
        conn.close()


def _shutdown(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _stop_on_signals(stop: threading.Event) -> None:
    import signal
    if threading.current_thread() is threading.main_thread():
        def handler(signum, frame):
            stop.set()
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

