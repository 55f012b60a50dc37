"""Helpers for tests of servers firscope starts: free ports, what listens where."""
from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_addresses(port: int, wait: float = 5.0) -> set[str]:
    """IPv4 addresses with a TCP socket listening on ``port`` (from /proc/net/tcp); IPv6
    listeners are reported by their raw hex address."""
    found: set[str] = set()
    deadline = time.monotonic() + wait
    while not found and time.monotonic() < deadline:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                rows = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                cols = row.split()
                addr, _, hexport = cols[1].rpartition(":")
                if cols[3] == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                    found.add(_address(addr))
        if not found:
            time.sleep(0.05)
    return found


def _address(hexaddr: str) -> str:
    if len(hexaddr) == 8:  # little-endian IPv4
        return ".".join(str(int(hexaddr[i: i + 2], 16)) for i in (6, 4, 2, 0))
    return hexaddr


def stop_server(proc: subprocess.Popen, sig=signal.SIGTERM, wait: float = 30) -> tuple[str, str]:
    """Signal a server to stop; its (stdout, stderr). Killed (and the test fails) if it
    does not stop within ``wait`` seconds."""
    proc.send_signal(sig)
    try:
        return proc.communicate(timeout=wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the server did not stop within {wait} s of {sig!r}") from None
