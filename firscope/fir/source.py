"""Reading the files a model names (the .fir, config.json, index files) as bounded data.

A path in a model file can name anything: ``/dev/zero`` (reading never
ends), a FIFO (opening blocks until someone writes), a directory, a socket.
Only regular files are read, and never more than a limit, so a hostile path
gives an error instead of a hang or an exhausted memory. Files of the kernel's
pseudo file systems (``/proc``, ``/sys``) are refused too although they look
regular: ``config /proc/self/environ`` must not read the process environment.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import FirError


def regular_file_size(path: Path, what: str, missing: str | None = None) -> int:
    """The size of ``path`` after checking it is a regular file (without opening it)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise FirError(missing or f"{path}: no such file") from None
    except OSError as e:
        raise FirError(f"{path}: cannot read: {e.strerror}") from None
    except ValueError as e:  # e.g. a NUL byte in the path
        raise FirError(f"{path!s:.200}: not a usable file name ({e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise FirError(f"{path}: is a directory, expected {what}")
    if not stat.S_ISREG(st.st_mode):
        raise FirError(f"{path}: is not a regular file (a device, FIFO or socket), expected "
                       f"{what}")
    if _is_pseudo_file(path, st):
        raise FirError(f"{path}: is not a regular file (a /proc or /sys entry of the kernel), "
                       f"expected {what}")
    return st.st_size


# Where the kernel mounts its pseudo file systems (their files report regular
# modes and size 0 or 4096, whatever they hold).
PSEUDO_ROOTS = ("/proc", "/sys")


def _is_pseudo_file(path: Path, st: os.stat_result) -> bool:
    for root in PSEUDO_ROOTS:
        try:
            dev = os.stat(root).st_dev
            mounted = dev != os.stat("/").st_dev  # without a mount there, it is an ordinary folder
        except OSError:
            continue
        if mounted and dev == st.st_dev:  # the same mount, reached by any path
            return True
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return False
    # cgroup, debugfs, securityfs... are separate mounts below /sys
    return any(real == root or real.startswith(root + "/") for root in PSEUDO_ROOTS)


def undecodable_at(raw: bytes, e: UnicodeDecodeError) -> tuple[int, int]:
    """(line, column) of the byte a UTF-8 decode of ``raw`` stopped at, as an editor counts."""
    line = raw[: e.start].count(b"\n") + 1
    return line, e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1


def read_limited(path: Path, what: str, limit: int, missing: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes."""
    size = regular_file_size(path, what, missing)
    if size > limit:
        raise FirError(f"{path}: {size} bytes is too large for {what} (limit {limit})")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)  # the file may have grown since stat
    except OSError as e:
        raise FirError(f"{path}: cannot read: {e.strerror}") from None
    if len(data) > limit:
        raise FirError(f"{path}: too large for {what} (limit {limit} bytes)")
    if size == 0 and data:  # a generated file that calls itself empty: not a file on disk
        raise FirError(f"{path}: is not a regular file (its size reads as 0 but it has "
                       f"content), expected {what}")
    return data
