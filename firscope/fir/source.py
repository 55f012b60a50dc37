"""Reading the files a model names (the .fir, config.json, index files) as bounded data.

A path in a model file can name anything: ``/dev/zero`` (reading never
ends), a FIFO (opening blocks until someone writes), a directory, a socket.
Only regular files are read, and never more than a limit, so a hostile path
gives an error instead of a hang or an exhausted memory.
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
    return st.st_size


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
    return data
