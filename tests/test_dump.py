"""The dump format (issue 13): the pure-NumPy writer and firscope's reader.

The writer's files are read back with the safetensors library and NumPy
themselves (not only with firscope's reader), and every way a file can be
bad gives a FirError naming the file, never a traceback.
"""
from __future__ import annotations

import json
import struct
import zipfile

import numpy as np
import pytest
from safetensors import safe_open

from firscope.compare.dumpfile import Dump
from firscope.dump import DumpWriter, dump_key, file_sha256, parse_key
from firscope.errors import FirError


def _values():
    rng = np.random.default_rng(0)
    return {
        (0, "token", "x"): rng.normal(size=64).astype(np.float32),
        (0, "attention@1", "scores"): rng.normal(size=(4, 32)).astype(np.float32),  # shaped
        (1, "ln1@0", "norm"): rng.normal(size=64).astype(np.float16),
        (2, "head", "logits"): rng.normal(size=256),  # f64
    }


@pytest.mark.parametrize("expected_keys", [0, 10_000])
def test_safetensors_written_in_place_or_copied_read_by_the_library(tmp_path, expected_keys):
    """0: the header outgrows its room (1500 keys) and the data is copied once; 10000: the
    header fits the reserved room and is written in place. Both are valid safetensors."""
    path = tmp_path / "run.safetensors"
    vals = _values()
    extra = {(3, f"n{i}", "x"): np.full(3, i, np.float32) for i in range(1500)}
    with DumpWriter(path, tokens=[5, 6, 7], producer="test", model="ab" * 32,
                    expected_keys=expected_keys) as w:
        for (s, inst, buf), v in {**vals, **extra}.items():
            w.add(s, inst, buf, v)
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert (8 + n) % 8 == 0  # tensor data starts aligned
    assert (n >= 10_000 * 100) == (expected_keys == 10_000)
    with safe_open(str(path), "np") as f:
        assert f.metadata() == {"tokens": "5,6,7", "producer": "test", "model": "ab" * 32}
        assert len(f.keys()) == len(vals) + 1500
        for (s, inst, buf), v in vals.items():
            got = f.get_tensor(f"step{s}/{inst}/{buf}")
            assert got.dtype == v.dtype and got.shape == v.shape and np.array_equal(got, v)
        assert np.array_equal(f.get_tensor("step3/n1499/x"), np.full(3, 1499, np.float32))
    d = Dump(path)
    assert d.tokens == [5, 6, 7] and d.producer == "test" and d.model_hash == "ab" * 32
    e = d.entries["step0/attention@1/scores"]
    assert (e.step, e.instance, e.buffer, e.dtype, e.elements) == (0, "attention@1", "scores",
                                                                    "F32", 128)
    assert d.read("step0/attention@1/scores").shape == (128,)
    assert d.read("step1/ln1@0/norm").dtype == np.float32
    assert np.array_equal(d.read("step2/head/logits"), vals[(2, "head", "logits")].astype(
        np.float32))


def test_npz_has_the_same_keys_and_metadata(tmp_path):
    path = tmp_path / "run.npz"
    vals = _values()
    with DumpWriter(path, tokens=[1, 2], producer="npz test") as w:
        for (s, inst, buf), v in vals.items():
            w.add(s, inst, buf, v)
    z = np.load(path, allow_pickle=False)
    assert sorted(z.files) == sorted([f"step{s}/{i}/{b}" for s, i, b in vals] + ["__metadata__"])
    assert json.loads(str(z["__metadata__"])) == {"tokens": "1,2", "producer": "npz test"}
    assert np.array_equal(z["step0/attention@1/scores"], vals[(0, "attention@1", "scores")])
    d = Dump(path)
    assert d.kind == "npz" and d.tokens == [1, 2]
    assert d.entries["step1/ln1@0/norm"].dtype == "F16"
    assert np.array_equal(d.read("step0/token/x"), vals[(0, "token", "x")])


def test_a_failed_run_leaves_the_old_file_and_no_partial_file(tmp_path):
    path = tmp_path / "run.safetensors"
    path.write_bytes(b"the user's older dump")
    with pytest.raises(RuntimeError):
        with DumpWriter(path) as w:
            w.add(0, "token", "x", np.ones(4, np.float32))
            raise RuntimeError("the run faulted")
    assert path.read_bytes() == b"the user's older dump"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.safetensors"]


def test_the_dump_gets_ordinary_file_permissions(tmp_path):
    """Written through a hidden temporary file, but readable as any file the user writes
    (mkstemp's files are owner-only)."""
    import os
    old = os.umask(0o022)
    try:
        with DumpWriter(tmp_path / "d.safetensors") as w:
            w.add(0, "token", "x", np.ones(2, np.float32))
    finally:
        os.umask(old)
    assert (tmp_path / "d.safetensors").stat().st_mode & 0o777 == 0o644


def test_writer_refuses_what_the_format_cannot_hold(tmp_path):
    with DumpWriter(tmp_path / "d.safetensors") as w:
        w.add(0, "token", "x", np.ones(2, np.float32))
        with pytest.raises(ValueError, match="already written"):
            w.add(0, "token", "x", np.ones(2, np.float32))
        with pytest.raises(ValueError, match="without '/'"):
            w.add(0, "a/b", "x", np.ones(2, np.float32))
        with pytest.raises(ValueError, match="step must be"):
            w.add(-1, "token", "x", np.ones(2, np.float32))
        with pytest.raises(TypeError, match="real numbers"):
            w.add(1, "token", "x", np.ones(2, np.complex64))
        w.add(1, "token", "x", np.arange(3))  # integers are stored as f32
    assert Dump(tmp_path / "d.safetensors").entries["step1/token/x"].dtype == "F32"


def test_key_spelling():
    assert dump_key(3, "attention@2", "attn") == "step3/attention@2/attn"
    assert parse_key("step12/attention@2/key_cache") == (12, "attention@2", "key_cache")
    for bad in ("step/x/y", "stepA/x/y", "step1/x", "step1/x/y/z", "1/x/y", "step1//y"):
        assert parse_key(bad) is None, bad


def test_file_sha256_is_the_sha_of_the_bytes(tmp_path):
    import hashlib
    p = tmp_path / "m.fir"
    p.write_bytes(b"fir 1\n" * 1000)
    assert file_sha256(p) == hashlib.sha256(b"fir 1\n" * 1000).hexdigest()


def test_bf16_is_converted(tmp_path):
    """BF16 (no NumPy dtype) written by hand: the reader widens the bits to f32."""
    values = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    header = json.dumps({"step0/token/x": {"dtype": "BF16", "shape": [4],
                                           "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bits.tobytes())
    assert np.array_equal(Dump(path).read("step0/token/x"), values)


def _file(path, data: bytes):
    path.write_bytes(data)
    return path


def _truncated(tmp_path):
    p = tmp_path / "t.safetensors"
    with DumpWriter(p) as w:
        w.add(0, "token", "x", np.ones(1000, np.float32))
    p.write_bytes(p.read_bytes()[:-100])
    return p


def _pickled_npz(tmp_path):
    p = tmp_path / "evil.npz"
    np.savez(p, **{"step0/token/x": np.array([{"a": 1}], dtype=object)})
    return p


def _not_npy_npz(tmp_path):
    p = tmp_path / "junk.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("step0/token/x.npy", b"not an array")
    return p


@pytest.mark.parametrize("make,message", [
    (lambda t: t / "missing.safetensors", "no such file"),
    (lambda t: t, "is a directory"),
    (_truncated, "truncated"),
    (lambda t: _file(t / "g.safetensors", b"\xff" * 64), "safetensors"),
    (lambda t: _file(t / "z.npz", b"PK\x03\x04garbage"), "npz"),
    (_not_npy_npz, "is not a .npy array"),
])
def test_unreadable_dumps_are_clear_errors(tmp_path, make, message):
    with pytest.raises(FirError, match=message) as e:
        Dump(make(tmp_path))
    assert str(tmp_path) in str(e.value)


def test_pickled_npz_member_is_refused_not_loaded(tmp_path):
    d = Dump(_pickled_npz(tmp_path))
    assert d.entries["step0/token/x"].dtype == "|O" and not d.entries["step0/token/x"].is_float
    with pytest.raises(FirError, match="floating-point"):
        d.read("step0/token/x")


def test_bad_tokens_metadata_is_named(tmp_path):
    p = tmp_path / "d.safetensors"
    with DumpWriter(p, metadata={"tokens": "1,2,x"}) as w:
        w.add(0, "token", "x", np.ones(2, np.float32))
    with pytest.raises(FirError, match=r"'tokens' item 3 \('x'\)"):
        Dump(p).tokens
