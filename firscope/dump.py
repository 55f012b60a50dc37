"""Writing a run's intermediate values as a dump firscope can diff against (issue 13).

This module needs only NumPy and the standard library, so a foreign runtime
(wgpu, CUDA, Metal, a notebook) can copy it or import it without the rest of
firscope. The format (docs/dump-format.md):

* a **safetensors** file (or an ``.npz`` with the same keys), one tensor per
  node output per decode step, key ``step{S}/{instance}/{buffer}``: ``S`` the
  0-based step, ``instance`` the node as firscope names it (``token``,
  ``attention@3``, ``head``), ``buffer`` the output buffer's name as declared
  in the ``.fir`` (``x``, ``scores``, ``logits``);
* values f32 (f16, bf16 and f64 are accepted by the reader and converted),
  in the buffer's declared layout, flattened or shaped;
* metadata (all strings): ``model`` (sha256 of the .fir), ``tokens`` (the fed
  token ids, comma-separated), ``producer`` (free-form). In an ``.npz`` the
  metadata is a JSON object stored as a string array named ``__metadata__``.

Usage::

    with DumpWriter("run.safetensors", tokens=ids, producer="my-wgpu-runtime") as w:
        for step, tok in enumerate(ids):
            ...
            w.add(step, "attention@3", "attn", attn_out)

The file appears (atomically, under its final name) when the writer closes
without an error; a run that fails leaves no half-written dump behind and
does not destroy an older file of the same name.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import secrets
import stat
import zipfile
from pathlib import Path

import numpy as np

__all__ = ["DumpWriter", "dump_key", "parse_key", "file_sha256", "METADATA_MEMBER",
           "check_output_target"]

METADATA_MEMBER = "__metadata__"  # the .npz member holding the metadata as JSON
# Keys as the format spells them; the reader is lenient about the step's digits.
_KEY = re.compile(r"step([0-9]{1,12})/([^/]+)/([^/]+)")
_ST_DTYPES = {2: "F16", 4: "F32", 8: "F64"}  # float itemsize -> safetensors dtype
# Header room reserved per key up front, so the header can be written in place at the
# end (a key's entry is about 100 bytes; a shortfall only costs one copy of the data).
_BYTES_PER_KEY = 160
_MIN_RESERVE = 64 * 1024


def dump_key(step: int, instance: str, buffer: str) -> str:
    """``step{S}/{instance}/{buffer}``: the one spelling of a dump key."""
    if isinstance(step, bool) or int(step) != step or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    for what, name in (("instance", instance), ("buffer", buffer)):
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"{what} must be a non-empty name without '/', got {name!r}")
    return f"step{int(step)}/{instance}/{buffer}"


def parse_key(key: str) -> tuple[int, str, str] | None:
    """(step, instance, buffer), or None when ``key`` is not spelled as the format says."""
    m = _KEY.fullmatch(key)
    if m is None:
        return None
    return int(m.group(1)), m.group(2), m.group(3)


def file_sha256(path: str | os.PathLike) -> str:
    """The ``model`` metadata value: the sha256 of the .fir file's bytes, in hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _as_stored(array) -> np.ndarray:
    """A little-endian, C-contiguous f16, f32 or f64 array (what the format stores)."""
    a = np.asarray(array)
    if a.dtype.kind == "f":
        if a.dtype.itemsize not in _ST_DTYPES:  # float128: f64 keeps what f32 would lose
            a = a.astype(np.float64)
    elif a.dtype.kind in "iub":  # integers and booleans: the model computes in f32
        a = a.astype(np.float32)
    else:
        raise TypeError(f"values must be real numbers, got dtype {a.dtype}")
    return np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"), copy=False))


class _SafetensorsSink:
    """Tensor data written as it comes, after room for the header; the header at the end."""

    kind, suffix = "safetensors", ".safetensors"

    def __init__(self, file, expected_keys: int):
        self._file = file
        self._offset = 0
        self._reserve = max(_MIN_RESERVE, int(expected_keys) * _BYTES_PER_KEY)
        self._reserve += -(8 + self._reserve) % 8  # tensor data starts 8-byte aligned
        file.write(b"\0" * (8 + self._reserve))

    def add(self, key: str, a: np.ndarray) -> tuple[str, tuple[int, ...], int, int]:
        begin = self._offset
        self._file.write(memoryview(a).cast("B"))
        self._offset += a.nbytes
        return _ST_DTYPES[a.dtype.itemsize], a.shape, begin, self._offset

    def finish(self, metadata: dict, keys: dict, tmp: Path, path: Path) -> Path:
        header = _st_header(metadata, keys)
        f = self._file
        if len(header) <= self._reserve:
            # safetensors allows trailing spaces in the header: pad to the reserved room
            f.seek(0)
            f.write(struct.pack("<Q", self._reserve) + header.ljust(self._reserve, b" "))
            f.flush()
            return tmp
        size = len(header) + (-(8 + len(header)) % 8)
        new, fd = _create_beside(path)
        with os.fdopen(fd, "wb") as out:  # the header outgrew its room: copy the data once
            out.write(struct.pack("<Q", size) + header.ljust(size, b" "))
            f.seek(8 + self._reserve)
            while block := f.read(1 << 24):
                out.write(block)
        f.close()
        tmp.unlink(missing_ok=True)
        return new

    def abort(self) -> None:
        pass


class _NpzSink:
    """One stored (uncompressed) .npy member per key; the metadata as a JSON string member."""

    kind, suffix = "npz", ".npz"

    def __init__(self, file, expected_keys: int):
        self._zip = zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True)

    def add(self, key: str, a: np.ndarray) -> tuple[str, tuple[int, ...], int, int]:
        with self._zip.open(key + ".npy", "w", force_zip64=True) as member:
            np.lib.format.write_array(member, a, allow_pickle=False)
        return a.dtype.str, a.shape, 0, a.nbytes

    def finish(self, metadata: dict, keys: dict, tmp: Path, path: Path) -> Path:
        self._zip.writestr(METADATA_MEMBER + ".npy", _npy_bytes(
            np.array(json.dumps(metadata, sort_keys=True))))
        self._zip.close()
        return tmp

    def abort(self) -> None:
        try:
            self._zip.close()
        except (OSError, ValueError):
            pass


# The containers a dump can be written in, by the file name's suffix; any other name is
# written as safetensors. The reader's table is firscope/compare/dumpfile.py's READERS.
WRITERS = {sink.suffix: sink for sink in (_SafetensorsSink, _NpzSink)}


def _writer_for(path: Path):
    return WRITERS.get(path.suffix.lower(), _SafetensorsSink)


class DumpWriter:
    """Streams tensors into a dump; ``.safetensors`` or ``.npz`` by the file's suffix.

    ``model`` is the .fir's sha256 (see :func:`file_sha256`), ``tokens`` the fed
    token ids, ``producer`` any text saying what wrote the dump; ``metadata``
    adds more string entries. ``expected_keys`` (optional) sizes the
    safetensors header room so that closing never copies the data.
    """

    def __init__(self, path: str | os.PathLike, *, model: str | None = None,
                 tokens=None, producer: str | None = None, metadata: dict | None = None,
                 expected_keys: int = 0):
        self.path = Path(path)
        sink = _writer_for(self.path)
        self.kind = sink.kind
        meta = {str(k): str(v) for k, v in (metadata or {}).items()}
        if model is not None:
            meta["model"] = str(model)
        if tokens is not None:
            meta["tokens"] = ",".join(str(int(t)) for t in tokens)
        if producer is not None:
            meta["producer"] = str(producer)
        self.metadata = meta
        check_output_target(self.path)
        self.keys: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        self.closed = False
        self._tmp, fd = _create_beside(self.path)
        self._file = os.fdopen(fd, "w+b")
        try:
            self._sink = sink(self._file, expected_keys)
        except BaseException:
            self._file.close()
            self._tmp.unlink(missing_ok=True)
            raise

    def __enter__(self) -> "DumpWriter":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    def add(self, step: int, instance: str, buffer: str, values) -> str:
        """Store one node output of one step; returns its key."""
        if self.closed:
            raise ValueError("the dump writer is closed")
        key = dump_key(step, instance, buffer)
        if key in self.keys:
            raise ValueError(f"{key} was already written")
        self.keys[key] = self._sink.add(key, _as_stored(values))
        return key

    def close(self) -> Path:
        """Finish the file and move it to its name; returns the path."""
        if self.closed:
            return self.path
        try:
            self._tmp = self._sink.finish(self.metadata, self.keys, self._tmp, self.path)
            self._file.close()
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        self.closed = True
        return self.path

    def abort(self) -> None:
        """Drop what was written; the target file is left as it was."""
        self.closed = True
        self._sink.abort()
        try:
            self._file.close()
        finally:
            self._tmp.unlink(missing_ok=True)


def _st_header(metadata: dict, keys: dict) -> bytes:
    head: dict = {"__metadata__": metadata} if metadata else {}
    for key, (dtype, shape, begin, end) in keys.items():
        head[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}
    return json.dumps(head, separators=(",", ":")).encode("utf-8")


def check_output_target(path: str | os.PathLike) -> None:
    """The one rule for a file firscope writes at a name the user gave (``--dump``,
    ``--logits-out``): the output is written to a new file beside it and renamed over the
    name, so the name must be new or a regular file. A symbolic link is refused, never
    followed nor replaced (as root, renaming over the link ``/dev/stdout`` replaced it
    with a regular file, and following a link writes wherever it points); folders,
    devices, FIFOs and sockets are refused too. Raises OSError saying which."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "is a folder", str(path))
    if stat.S_ISLNK(st.st_mode):
        raise OSError(40, f"is a symbolic link (to {os.readlink(path)}); outputs are written "
                          "only to a new name or a regular file: give the file itself",
                      str(path))
    raise OSError(22, "is not a regular file (a device, FIFO or socket)", str(path))


def _create_beside(path: Path) -> tuple[Path, int]:
    """A new hidden file next to ``path`` (same file system, so the final rename is atomic),
    with the permissions a plain open would give (mkstemp's are owner-only)."""
    folder = path.parent if str(path.parent) else Path(".")
    for _ in range(100):
        # short (16 bytes): a name that is legal for the dump is legal with room to spare
        tmp = folder / f".fs{secrets.token_hex(4)}.part"
        try:
            return tmp, os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"{folder}: cannot create a temporary file for the dump")


def _npy_bytes(a: np.ndarray) -> bytes:
    import io
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, allow_pickle=False)
    return buf.getvalue()
