"""The q4 cache (model/q4_cache): a checkpoint's q4 weights are quantized once and read back
from disk afterwards, bit for bit what quantizing gives; an edited checkpoint, another
group, a damaged entry or a tensor that cannot be quantized are never served from it."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import firscope.model.weights as W
from firscope.errors import FirError
from firscope.model import q4_cache
from firscope.runtime import Machine, load_model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of this test; every q4 tensor kept (the random models'
    matrices are smaller than MIN_ELEMENTS)."""
    folder = tmp_path / "q4cache"
    folder.mkdir()
    monkeypatch.setattr(q4_cache, "_folder", lambda: folder)
    monkeypatch.setattr(q4_cache, "MIN_ELEMENTS", 0)
    monkeypatch.delenv("FIRSCOPE_Q4_CACHE", raising=False)
    return folder


def q4_arrays(model) -> dict[str, tuple[np.ndarray, ...]]:
    return {name: (e.q4.packed, e.q4.scale, e.q4.minimum) for name, e in model.weights.items()
            if e.q4 is not None}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x.view(np.uint8), y.view(np.uint8))
        for k in a for x, y in zip(a[k], b[k]))


def no_quantizing(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("quantized although the cache holds the tensor")
    monkeypatch.setattr(W, "quantize_conv1d", refuse)


def test_a_second_load_reads_the_same_bits_without_quantizing(make_model, cache, monkeypatch):
    fir = make_model()
    first = load_model(fir)
    entries = sorted(cache.glob("*.q4"))
    n_q4 = len(q4_arrays(first))
    assert n_q4 == 8 and len(entries) == n_q4  # 4 linears x 2 layers
    with monkeypatch.context() as m:
        no_quantizing(m)
        again = load_model(fir)
    assert same(q4_arrays(first), q4_arrays(again))
    monkeypatch.setenv("FIRSCOPE_Q4_CACHE", "0")
    fresh = load_model(fir)  # the cache off: quantized again, the same bits
    assert same(q4_arrays(first), q4_arrays(fresh))
    # and the decode on them is the same to the last bit
    logits = [Machine(mdl, engine="interp").step(5).logits for mdl in (first, again)]
    assert np.array_equal(logits[0].view(np.uint32), logits[1].view(np.uint32))


def test_the_cache_off_writes_nothing(make_model, cache, monkeypatch):
    monkeypatch.setenv("FIRSCOPE_Q4_CACHE", "0")
    load_model(make_model())
    assert not list(cache.iterdir())


def test_an_edited_checkpoint_is_quantized_afresh_even_with_its_old_times(make_model, cache,
                                                                          monkeypatch):
    """Edited in place (same inode, same size), its modification time put back: the change
    time, which no one can set back, still tells."""
    from firscope.model.checkpoint import Checkpoint
    fir = make_model()
    ckpt = fir.parent / "model.safetensors"
    before = q4_arrays(load_model(fir))
    st = ckpt.stat()
    time.sleep(0.05)  # past the file system's clock tick: the edit gets a new change time
    name = "transformer.h.1.mlp.c_fc.weight"
    info = Checkpoint(fir.parent).info(name)
    with open(ckpt, "r+b") as f:
        f.seek(info.start)
        w = np.frombuffer(f.read(info.nbytes), dtype=np.float32)
        f.seek(info.start)
        f.write((w * 2).astype(np.float32).tobytes())
    os.utime(ckpt, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = ckpt.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    after = q4_arrays(load_model(fir))
    monkeypatch.setenv("FIRSCOPE_Q4_CACHE", "0")
    want = q4_arrays(load_model(fir))
    assert same(after, want)
    changed = [k for k in want if not all(np.array_equal(x, y) for x, y in zip(want[k], before[k]))]
    assert changed == ["fcw@1"]


def test_each_group_has_its_own_entries(make_model, cache, monkeypatch):
    fir = make_model()
    g32 = q4_arrays(load_model(fir, group=32))
    g16 = q4_arrays(load_model(fir, group=16))
    assert len(list(cache.glob("*.q4"))) == 16
    assert all(g16[k][1].shape[1] == 2 * g32[k][1].shape[1] for k in g32)
    with monkeypatch.context() as m:
        no_quantizing(m)
        assert same(q4_arrays(load_model(fir, group=16)), g16)


@pytest.mark.parametrize("damage", ["truncated", "longer", "other header", "other bytes",
                                    "empty"])
def test_a_damaged_entry_is_quantized_again_and_rewritten(make_model, cache, damage):
    fir = make_model()
    want = q4_arrays(load_model(fir))
    for entry in cache.glob("*.q4"):
        raw = entry.read_bytes()
        entry.write_bytes({"truncated": raw[:-3], "longer": raw + b"\0",
                           "other header": raw[:20] + bytes([raw[20] ^ 1]) + raw[21:],
                           "other bytes": os.urandom(len(raw)),
                           "empty": b""}[damage])
    assert same(q4_arrays(load_model(fir)), want)
    good = {e.name: e.read_bytes() for e in cache.glob("*.q4")}
    assert len(good) == 8 and all(len(b) > 40 for b in good.values())
    assert same(q4_arrays(load_model(fir)), want)


def test_a_tensor_with_nan_fails_on_every_load_and_is_never_kept(make_model, cache):
    from firscope.model.checkpoint import Checkpoint
    fir = make_model()
    ckpt = fir.parent / "model.safetensors"
    tensors = load_file(str(ckpt))
    bad = "transformer.h.0.attn.c_proj.weight"
    tensors[bad][3, 4] = np.nan
    save_file(tensors, str(ckpt))
    for _ in range(2):
        with pytest.raises(FirError, match="NaN or Inf"):
            load_model(fir)
    entry = q4_cache.entry_path(Checkpoint(fir.parent), bad, 32)
    assert entry is not None and entry.parent == cache and not entry.exists()


def test_small_tensors_are_not_kept(make_model, cache, monkeypatch):
    monkeypatch.setattr(q4_cache, "MIN_ELEMENTS", 64 * 192 + 1)  # c_attn (64 x 192) and smaller
    load_model(make_model())
    assert len(list(cache.glob("*.q4"))) == 4  # c_fc and mlp c_proj (64 x 256) of 2 layers


def test_the_least_recently_used_entries_go_past_the_limit(make_model, cache, monkeypatch):
    fir_a = make_model("a")
    load_model(fir_a)
    a_entries = set(cache.glob("*.q4"))
    size_a = sum(p.stat().st_size for p in a_entries)
    old = time.time() - 100
    for p in a_entries:
        os.utime(p, (old, old))
    monkeypatch.setattr(q4_cache, "LIMIT_BYTES", size_a + size_a // 2)
    load_model(make_model("b", seed=1))
    left = set(cache.glob("*.q4"))
    b_entries = left - a_entries
    assert len(b_entries) == 8  # the new ones stay
    assert 0 < len(a_entries - left) < 8  # the old ones go, only as many as needed
    assert sum(p.stat().st_size for p in left) <= size_a + size_a // 2


def test_pruning_removes_what_a_killed_write_left_once_it_is_an_hour_old(make_model, cache):
    old, fresh = cache / "a.q4.1.2.tmp", cache / "b.q4.1.3.tmp"
    for f in (old, fresh):
        f.write_bytes(b"half")
    hour_ago = time.time() - 3700
    os.utime(old, (hour_ago, hour_ago))
    load_model(make_model())  # writes entries, then prunes
    assert not old.exists() and fresh.exists()  # a write under way is left alone
