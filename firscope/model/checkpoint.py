"""Reading ``model.safetensors`` (single file or sharded) as data, never code.

The header is parsed and checked here (size, JSON, offsets, dtype sizes) so
that a truncated or corrupt file gets an error naming the file and the
tensor. The loader reads tensor bytes into its own arrays (:meth:`Checkpoint.load`:
no page of the file stays mapped); viewers map the file (:meth:`Checkpoint.read`,
zero-copy). Pickled checkpoints
(``pytorch_model.bin``, ``*.pt``) are refused: unpickling runs code.
Errors name the file, the tensor and the reason; what a header holds is shown
only as short, escaped names (:func:`shown`), never as raw text.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import FirError
from ..fir.source import read_limited, regular_file_size

_DTYPES = {
    "F32": (np.float32, 4),
    "F16": (np.float16, 2),
    "BF16": (np.uint16, 2),
    "F64": (np.float64, 8),
    "I64": (np.int64, 8),
    "I32": (np.int32, 4),
    "I16": (np.int16, 2),
    "I8": (np.int8, 1),
    "U8": (np.uint8, 1),
    "BOOL": (np.bool_, 1),
}
_FLOAT_DTYPES = {"F32", "F16", "BF16", "F64"}
MAX_HEADER = 100 * 1024 * 1024
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.bin", "model.pt",
           "model.pth", "model.ckpt")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offset in the file
    nbytes: int


MAX_SHOWN_NAME = 80


def shown(text) -> str:
    """A name read from a file, as an error message may quote it: escaped and short."""
    text = str(text)
    if len(text) > MAX_SHOWN_NAME:
        text = text[: MAX_SHOWN_NAME - 3] + "..."
    return ascii(text)[1:-1]


def _json_int(v) -> int:
    """An integer from a JSON header; floats, booleans and strings are corrupt."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(v)
    return v


class SafetensorsFile:
    def __init__(self, path: Path):
        self.path = path
        self.tensors: dict[str, TensorInfo] = {}
        self.metadata: dict = {}  # the header's __metadata__ (dumps keep tokens, model hash)
        self._map: np.memmap | None = None
        size = regular_file_size(path, "a safetensors checkpoint")
        try:
            with path.open("rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise FirError(f"{path}: truncated safetensors file ({size} bytes, "
                                   "no header)")
                (n,) = struct.unpack("<Q", head)
                if n > MAX_HEADER or 8 + n > size:
                    raise FirError(f"{path}: corrupt or truncated safetensors file: header "
                                   f"claims {n} bytes but the file has {size}")
                raw = f.read(n)
        except OSError as e:
            raise FirError(f"{path}: cannot read: {e.strerror}") from None
        try:
            header = json.loads(raw.decode("utf-8"))
        except RecursionError:
            raise FirError(f"{path}: corrupt safetensors header (JSON nested too deeply)") \
                from None
        except UnicodeDecodeError as e:  # its message quotes the bytes
            raise FirError(f"{path}: corrupt safetensors header (not JSON: not UTF-8 text at "
                           f"byte {8 + e.start})") from None
        except ValueError as e:  # not JSON, or an integer too long to convert
            raise FirError(f"{path}: corrupt safetensors header (not JSON: {e})") from None
        if not isinstance(header, dict):
            raise FirError(f"{path}: corrupt safetensors header (not a JSON object)")
        data_start = 8 + n
        data_len = size - data_start
        for name, info in header.items():
            if name == "__metadata__":
                self.metadata = info if isinstance(info, dict) else {}
                continue
            try:
                dtype = info["dtype"]
                shape = tuple(_json_int(d) for d in info["shape"])
                begin, end = (_json_int(x) for x in info["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise FirError(f"{path}: corrupt safetensors entry for tensor "
                               f"'{shown(name)}'") from None
            if not isinstance(dtype, str) or dtype not in _DTYPES:
                what = (shown(dtype) if isinstance(dtype, str)
                        else f"of JSON type {type(dtype).__name__}")
                raise FirError(f"{path}: tensor '{shown(name)}' has unsupported dtype {what}")
            if any(d < 0 for d in shape):
                raise FirError(f"{path}: tensor '{shown(name)}' has a negative dimension {shape}")
            count = math.prod(shape)  # exact Python ints (np.prod cost 10 us a tensor)
            want = count * _DTYPES[dtype][1]
            if not 0 <= begin <= end or end - begin != want:
                raise FirError(f"{path}: corrupt safetensors entry for tensor '{shown(name)}': "
                               f"offsets [{begin}, {end}) do not hold {shape} {dtype}")
            if end > data_len:
                raise FirError(f"{path}: truncated safetensors file: tensor '{shown(name)}' needs "
                               f"bytes up to {data_start + end} but the file has {size}")
            self.tensors[name] = TensorInfo(name, dtype, shape, path, data_start + begin, want)

    def _check_float(self, name: str) -> TensorInfo:
        info = self.tensors[name]
        if info.dtype not in _FLOAT_DTYPES:
            raise FirError(f"{self.path}: tensor '{name}' is {info.dtype}; weights must be "
                           "floating point (F32, F16, BF16, F64)")
        return info

    def load(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """The tensor as float32, read into ``out`` (a C-contiguous f32 array of its size;
        a new one if None) with plain reads, not a mapping: once this returns no page of
        the file is part of this process (a mapping keeps every page it touched
        resident until it is unmapped: GPT-2 XL's 6 GB checkpoint was most of the
        loader's peak). f32 tensors go straight into ``out``; others through one
        temporary of their own dtype."""
        info = self._check_float(name)
        if out is None:
            out = np.empty(info.shape, dtype=np.float32)
        count = info.nbytes // _DTYPES[info.dtype][1]
        if out.dtype != np.float32 or out.size != count or not out.flags.c_contiguous:
            raise ValueError(f"load: out must be a contiguous f32 array of {info.shape}")
        raw = out if info.dtype == "F32" else np.empty(info.shape, dtype=_DTYPES[info.dtype][0])
        view = memoryview(raw.reshape(-1).view(np.uint8))
        try:
            with open(self.path, "rb", buffering=0) as f:
                f.seek(info.start)
                done = 0
                while done < info.nbytes:
                    n = f.readinto(view[done:])
                    if not n:
                        raise FirError(f"{self.path}: truncated safetensors file: tensor "
                                       f"'{shown(name)}' ends after {done} of its "
                                       f"{info.nbytes} bytes")
                    done += n
        except OSError as e:
            raise FirError(f"{self.path}: cannot read tensor '{shown(name)}': "
                           f"{e.strerror}") from None
        if raw is not out:
            if info.dtype == "BF16":
                raw = (raw.astype(np.uint32) << 16).view(np.float32)
            out.reshape(-1)[:] = raw.reshape(-1)
        return out.reshape(info.shape)

    def read(self, name: str) -> np.ndarray:
        """The tensor as float32 (zero-copy where the file is already f32: a view of the
        file mapped into memory, for viewers that look at one weight)."""
        info = self._check_float(name)
        if self._map is None:
            try:
                self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
            except (OSError, ValueError) as e:
                raise FirError(f"{self.path}: cannot map file: {e}") from None
        raw = self._map[info.start: info.start + info.nbytes]
        np_dtype = _DTYPES[info.dtype][0]
        arr = raw.view(np_dtype).reshape(info.shape)
        if info.dtype == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr.astype(np.float32, copy=False)


class Checkpoint:
    """All tensors of a model folder, possibly spread over shards."""

    def __init__(self, folder: Path):
        self.folder = folder
        single = folder / "model.safetensors"
        index = folder / "model.safetensors.index.json"
        self.files: dict[Path, SafetensorsFile] = {}
        self.where: dict[str, SafetensorsFile] = {}
        if single.exists():
            self._add(single)
        elif index.exists():
            self._load_index(index)
        else:
            pickled = [p for p in PICKLED if (folder / p).exists()]
            pickled += [p.name for p in folder.glob("*.bin")][:1] if not pickled else []
            if pickled:
                raise FirError(f"{folder / pickled[0]}: pickled checkpoints are refused (loading "
                               "them can run arbitrary code); convert the model to "
                               "model.safetensors, e.g. with save_pretrained(safe_serialization=True)")
            raise FirError(f"{single}: no such file (and no model.safetensors.index.json)")

    def _add(self, path: Path) -> SafetensorsFile:
        if path not in self.files:
            self.files[path] = SafetensorsFile(path)
        return self.files[path]

    def _load_index(self, index: Path) -> None:
        raw = read_limited(index, "a safetensors index", MAX_HEADER)
        try:
            data = json.loads(raw.decode("utf-8"))
            weight_map = data["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError
        except json.JSONDecodeError as e:
            raise FirError(f"{index}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
        except (KeyError, TypeError):
            raise FirError(f"{index}: expected an object with a 'weight_map'") from None
        except (ValueError, RecursionError) as e:
            raise FirError(f"{index}: not usable JSON ({type(e).__name__}: {e})") from None
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or not shard or "\0" in shard:
                what = "an empty string" if shard == "" else f"JSON type {type(shard).__name__}"
                raise FirError(f"{index}: shard for '{shown(name)}' must be a file name, found "
                               f"{what}")
            shard_path = (self.folder / shard)
            if shard_path.resolve().parent != self.folder.resolve():
                raise FirError(f"{index}: shard '{shown(shard)}' for '{shown(name)}' is outside "
                               "the model folder")
            f = self._add(shard_path)
            if name not in f.tensors:
                raise FirError(f"{shown(shard_path)}: tensor '{shown(name)}' listed in "
                               f"{index.name} is missing")
            self.where[name] = f

    def __contains__(self, name: str) -> bool:
        self._ensure_names()
        return name in self.where

    def _ensure_names(self):
        if not self.where:
            for f in self.files.values():
                for n in f.tensors:
                    self.where[n] = f

    def names(self) -> list[str]:
        self._ensure_names()
        return sorted(self.where)

    def info(self, name: str) -> TensorInfo:
        self._ensure_names()
        return self.where[name].tensors[name]

    def read(self, name: str) -> np.ndarray:
        self._ensure_names()
        return self.where[name].read(name)

    def load(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """The tensor read into memory of this process (see SafetensorsFile.load)."""
        self._ensure_names()
        return self.where[name].load(name, out)
