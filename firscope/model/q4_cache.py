"""q4 weights kept on disk between runs: a checkpoint's tensor is quantized once.

Quantizing is most of a load on GPT-2 small's shapes (85M weights, ~0.5 s on two
cores, every `firscope`, `cost`, `run` and UI start); reading the codes back is a
50 MB read. An entry is what :func:`~firscope.model.q4.quantize_conv1d` returned
(packed codes, scales, minimums), stored only when quantizing succeeded, so an entry
gives the same bits as quantizing again; a tensor with NaN or Inf, or out of range,
is never stored and fails as before on every load.

An entry is keyed by the quantizer's sources (any change to q4.py, q4_kernels.py or
the numerics they compile makes new keys), the group, the tensor (name, dtype, shape,
where it lies in the file) and the checkpoint file's identity: resolved path, device,
inode, size, modification and change times in nanoseconds. Rewriting the file changes
its change time (which ``touch`` and ``os.utime`` cannot set back), so an edited
checkpoint is quantized afresh; so is a copy (another inode). Files live under
``$XDG_CACHE_HOME/firscope/q4`` (jitcache: owned by this user, nobody else may
write it), the least recently used go first past LIMIT_BYTES, and an unreadable or
inconsistent entry is a miss, quantized again and rewritten. Tensors under
MIN_ELEMENTS are not kept (opening a file costs more than quantizing them).
``FIRSCOPE_Q4_CACHE=0`` turns the cache off.
"""
from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np

from ..jitcache import cache_dir, prune as prune_folder, save_atomic
from .q4 import Q4Matrix

MIN_ELEMENTS = 1 << 18
LIMIT_BYTES = 4 << 30
_SOURCES = ("q4.py", "q4_kernels.py", "numeric_kernels.py", "numerics.py")
_STAMP: list[str] = []


def _stamp() -> str:
    if not _STAMP:
        h = hashlib.sha256()
        for name in _SOURCES:
            h.update((Path(__file__).parent / name).read_bytes())
        _STAMP.append(h.hexdigest()[:16])
    return _STAMP[0]


def enabled() -> bool:
    return os.environ.get("FIRSCOPE_Q4_CACHE", "1") != "0"


def _folder() -> Path | None:
    try:
        return cache_dir("q4")
    except OSError:
        return None


def entry_path(ckpt, tensor: str, group: int) -> Path | None:
    """Where ``tensor`` of ``ckpt`` (a model.checkpoint.Checkpoint) quantized with
    ``group`` is kept, or None where it is not kept (too small, cache off or unusable,
    the file gone)."""
    if not enabled():
        return None
    info = ckpt.info(tensor)
    if math.prod(info.shape) < MIN_ELEMENTS:
        return None
    try:
        path = Path(info.file).resolve()
        st = path.stat()
    except OSError:
        return None
    folder = _folder()
    if folder is None:
        return None
    key = "|".join(map(str, (_stamp(), group, path, st.st_dev, st.st_ino, st.st_size,
                             st.st_mtime_ns, st.st_ctime_ns, tensor, info.dtype, info.shape,
                             info.start, info.nbytes)))
    return folder / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}.q4"


_MAGIC = b"firscope-q4\x00\x01"  # then rows, cols, group as int64; then the three arrays


def _arrays(rows: int, cols: int, group: int) -> tuple[np.ndarray, ...]:
    ng = -(-cols // group)
    return (np.empty((rows, (ng * group + 1) // 2), dtype=np.uint8),
            np.empty((rows, ng), dtype=np.float32), np.empty((rows, ng), dtype=np.float32))


def read(path: Path | None, shape: tuple[int, ...], group: int) -> Q4Matrix | None:
    """The entry at ``path`` as the Q4Matrix quantize_conv1d makes of a checkpoint tensor
    of ``shape`` ([in, out]) in groups of ``group``, or None (no entry, or one that does
    not hold exactly that: another header, or fewer or more bytes)."""
    if path is None or len(shape) != 2:
        return None
    cols, rows = shape
    head = _MAGIC + np.array([rows, cols, group], dtype="<i8").tobytes()
    arrays = _arrays(rows, cols, group)
    try:
        with open(path, "rb", buffering=0) as f:
            if f.read(len(head)) != head:
                return None
            for a in arrays:
                view = memoryview(a.reshape(-1).view(np.uint8))
                done = 0
                while done < a.nbytes:
                    n = f.readinto(view[done:])
                    if not n:
                        return None
                    done += n
            if f.read(1):
                return None
        os.utime(path)  # recently used: pruned last
    except OSError:
        return None
    return Q4Matrix(rows, cols, group, *arrays)


def write(path: Path | None, q: Q4Matrix) -> bool:
    """Keep ``q`` at ``path`` (atomically: a reader sees no entry or the whole one)."""
    def put(f):
        f.write(_MAGIC + np.array([q.rows, q.cols, q.group], dtype="<i8").tobytes())
        for a in (q.packed, q.scale, q.minimum):
            f.write(np.ascontiguousarray(a).tobytes())
    return path is not None and save_atomic(path, put)


def prune() -> None:
    """Delete the least recently used entries past LIMIT_BYTES."""
    folder = _folder()
    if folder is not None and enabled():
        prune_folder(folder, LIMIT_BYTES, ("*.q4",))
