"""Reading a dump (docs/dump-format.md): safetensors or npz, lazily, as data only.

Opening a dump reads its key list, each entry's dtype and shape, and the
metadata; values are read one tensor at a time when the diff needs them, into
memory of their own (plain reads, never a mapping: a dump regenerated in place
while a session has it open truncated the mapped file and killed the process
with SIGBUS), so a dump larger than memory can be diffed. Each read first checks
that the file is still the one opened and says "the dump changed on disk"
otherwise. Everything a file can get wrong
is a :class:`~firscope.errors.FirError` naming the file (and the key), never
a traceback: npz members are read with ``allow_pickle=False``.
"""
from __future__ import annotations

import gc
import json
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..dump import METADATA_MEMBER, parse_key
from ..errors import FirError
from ..fir.source import regular_file_size
from ..model.checkpoint import SafetensorsFile, shown

FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
_NPY_FLOATS = {2: "F16", 4: "F32", 8: "F64"}  # float itemsize (either byte order)
MAX_METADATA = 16 * 1024 * 1024  # bytes of an npz's metadata member


@dataclass(frozen=True)
class DumpEntry:
    """One tensor of a dump: its key, what the key names, and what the file says it holds."""

    key: str
    step: int | None  # None when the key is not spelled step{S}/{instance}/{buffer}
    instance: str | None
    buffer: str | None
    dtype: str  # "F32", "F16", "BF16", "F64", or what else the file says ("I32", "<i8")
    shape: tuple[int, ...]

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES


def _entry(key: str, dtype: str, shape: tuple[int, ...]) -> DumpEntry:
    parsed = parse_key(key)
    step, instance, buffer = parsed if parsed is not None else (None, None, None)
    return DumpEntry(key, step, instance, buffer, dtype, tuple(int(d) for d in shape))


class _SafetensorsReader:
    """A safetensors dump: the header read at opening, each tensor read when asked."""

    kind, suffix = "safetensors", ".safetensors"

    @staticmethod
    def claims(path: Path) -> bool:
        return True  # the last in READERS: whatever no other container claims

    def __init__(self, path: Path, warnings: list[str]):
        self.entries: dict[str, DumpEntry] = {}
        # a dump's header names every output of every step (13k tensors for 64 steps of
        # GPT-2 small): the collector would walk the objects made here over and over
        # (a third of the opening's time) while none of them can form a cycle
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._st = SafetensorsFile(path)
            for name, t in self._st.tensors.items():
                self.entries[name] = _entry(name, t.dtype, t.shape)
        finally:
            if enabled:
                gc.enable()
        self.metadata = self._st.metadata

    def read(self, key: str) -> np.ndarray:
        return self._st.load(key).reshape(-1)

    def close(self) -> None:
        pass


class _NpzReader:
    """An .npz dump: one .npy member per key, the metadata as a JSON string member."""

    kind, suffix = "npz", ".npz"

    @staticmethod
    def claims(path: Path) -> bool:
        return _is_zip(path)

    def __init__(self, path: Path, warnings: list[str]):
        self.path = path
        self.warnings = warnings
        self.entries: dict[str, DumpEntry] = {}
        self.metadata = None  # None: the file has no (readable) metadata member
        try:
            self._zip = zipfile.ZipFile(path)
            infos = self._zip.infolist()
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError,
                RuntimeError) as e:  # NotImplementedError: "zip file version 22.8"
            raise FirError(f"{path}: not a readable .npz (zip) file: {e}") from None
        self._members: dict[str, str] = {}
        for info in infos:
            name = info.filename
            key = name[:-4] if name.endswith(".npy") else name
            if key == METADATA_MEMBER:
                self._read_metadata(name, info)
                continue
            dtype, shape = self._npy_header(name)
            self._members[key] = name
            self.entries[key] = _entry(key, dtype, shape)

    def _npy_header(self, name: str) -> tuple[str, tuple[int, ...]]:
        try:
            with self._zip.open(name) as f:
                shape, dtype = _npy_shape_dtype(f)
        except ValueError as e:  # read, but not an array
            raise FirError(f"{self.path}: member '{shown(name)}' is not a .npy array: "
                           f"{e}") from None
        except _MEMBER_ERRORS as e:
            raise _member_error(self.path, name, e) from None
        claimed = _claimed_bytes(shape, dtype)
        size = self._zip.getinfo(name).file_size
        if claimed > size:
            raise FirError(f"cannot read member '{shown(name)}' of {self.path}: its header "
                           f"claims {claimed} bytes of values but the member holds {size}")
        if dtype.kind == "f" and dtype.itemsize in _NPY_FLOATS:
            return _NPY_FLOATS[dtype.itemsize], tuple(shape)
        return dtype.str, tuple(shape)

    def _read_metadata(self, name: str, info: zipfile.ZipInfo) -> None:
        def ignored(why: str) -> None:
            self.warnings.append(f"{self.path}: the metadata member {why}; ignored")
        if info.file_size > MAX_METADATA:
            return ignored(f"is {info.file_size} bytes, more than {MAX_METADATA}")
        try:
            with self._zip.open(name) as f:
                shape, dtype = _npy_shape_dtype(f)
                claimed = _claimed_bytes(shape, dtype)
                if dtype.kind != "U" or claimed > min(MAX_METADATA, info.file_size):
                    # checked before numpy allocates what the header claims (10^13 strings)
                    return ignored(f"claims {claimed} bytes of {dtype.str} values, not a "
                                   f"string of at most {min(MAX_METADATA, info.file_size)}")
                count = 1
                for d in shape:
                    count *= d
                a = np.frombuffer(f.read(claimed), dtype=dtype, count=count).reshape(shape)
            meta = json.loads(str(a[()]))
        except (ValueError, OSError, zipfile.BadZipFile, EOFError, IndexError, TypeError,
                RecursionError, RuntimeError, NotImplementedError, zlib.error,
                SystemError) as e:  # SystemError: numpy on a code point past U+10FFFF
            return ignored(f"is not a JSON string ({type(e).__name__})")
        self.metadata = meta

    def read(self, key: str) -> np.ndarray:
        name = self._members[key]
        try:
            with self._zip.open(name) as f:
                a = np.lib.format.read_array(f, allow_pickle=False)
        except _MEMBER_ERRORS as e:
            raise _member_error(self.path, name, e) from None
        return np.asarray(a, dtype=np.float32).reshape(-1)

    def close(self) -> None:
        self._zip.close()


# The containers a dump is read from: the first whose ``claims`` accepts the file opens it
# (an .npz by its suffix or its zip signature, anything else as safetensors). Each has
# ``kind``, ``entries`` and ``metadata`` (a JSON object, or None when the file has none)
# after opening, ``read(key)`` (flat f32 of its own) and ``close()``. The writer's table is
# firscope/dump.py's WRITERS.
READERS = (_NpzReader, _SafetensorsReader)
_SUFFIXES = " or ".join(r.suffix for r in reversed(READERS))  # for messages


class Dump:
    """An opened dump. ``entries`` by key; :meth:`read` gives one tensor as flat f32."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        regular_file_size(self.path, f"a dump ({_SUFFIXES})")
        self.warnings: list[str] = []
        self.metadata: dict[str, str] = {}
        self._stamp = _stamp(self.path)
        reader = next(r for r in READERS if r.claims(self.path))
        self._reader = reader(self.path, self.warnings)
        self.kind = reader.kind
        self.entries: dict[str, DumpEntry] = self._reader.entries
        if self._reader.metadata is not None:
            self._set_metadata(self._reader.metadata)

    # -- metadata ----------------------------------------------------------------------
    def _set_metadata(self, meta) -> None:
        if not isinstance(meta, dict):
            self.warnings.append(f"{self.path}: the metadata is not a JSON object; ignored")
            return
        for k, v in meta.items():
            if isinstance(v, str):
                self.metadata[str(k)] = v
            else:
                self.warnings.append(f"{self.path}: metadata '{shown(k)}' is not a string; "
                                     "ignored")

    @property
    def model_hash(self) -> str | None:
        return self.metadata.get("model")

    @property
    def producer(self) -> str | None:
        return self.metadata.get("producer")

    @property
    def tokens(self) -> list[int] | None:
        """The fed token ids from the metadata; None when the dump does not say."""
        text = self.metadata.get("tokens")
        if text is None:
            return None
        items = [t.strip() for t in text.split(",")] if text.strip() else []
        out = []
        for i, item in enumerate(items, 1):
            if not item.isascii() or not item.isdigit() or len(item) > 12:
                raise FirError(f"{self.path}: metadata 'tokens' item {i} ('{shown(item)}') is "
                               "not a token id; give --tokens instead")
            out.append(int(item))
        return out

    # -- values -------------------------------------------------------------------------
    def read(self, key: str) -> np.ndarray:
        """The tensor as a flat float32 array of its own (read now, not mapped)."""
        entry = self.entries[key]
        if not entry.is_float:
            raise FirError(f"{self.path}: '{shown(key)}' is {entry.dtype}; dumps hold "
                           "floating-point values")
        self.check_unchanged()
        return self._reader.read(key)

    def check_unchanged(self) -> None:
        """FirError when the file is no longer the one opened (rewritten or replaced)."""
        try:
            now = _stamp(self.path)
        except FirError:
            now = None
        if now != self._stamp:
            raise DumpChanged(f"{self.path}: the dump changed on disk since it was opened: "
                           "reload (F2 in the UI) or start the session again to use the "
                           "new one")

    def close(self) -> None:
        """Release the file (arrays read from it must not be used after this)."""
        self._reader.close()


class DumpChanged(FirError):
    """The dump file is no longer the one opened: every comparison with it ends here (never
    a node "not judged" and a report as if the rest were fine)."""


# What reading one zip member can raise: an encrypted member (RuntimeError), an unknown
# compression method (NotImplementedError), broken deflate data (zlib.error), ...
_MEMBER_ERRORS = (ValueError, OSError, zipfile.BadZipFile, EOFError, KeyError, RuntimeError,
                  NotImplementedError, zlib.error, MemoryError)


def _member_error(path: Path, name: str, e: BaseException) -> FirError:
    why = str(e) or type(e).__name__
    if isinstance(e, MemoryError):
        why = "out of memory"
    return FirError(f"cannot read member '{shown(name)}' of {path}: {why}")


def _npy_shape_dtype(f) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype a .npy header declares (the values are not read)."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    return tuple(shape), dtype


def _claimed_bytes(shape, dtype) -> int:
    n = int(dtype.itemsize)
    for d in shape:
        n *= int(d)
    return n


def _stamp(path: Path) -> tuple[int, int, int, int]:
    """What identifies the file's contents as opened: device, inode, size, change time."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise FirError(f"{path}: cannot read: {e.strerror}") from None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _is_zip(path: Path) -> bool:
    if path.suffix.lower() == ".npz":
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError as e:
        raise FirError(f"{path}: cannot read: {e.strerror}") from None
