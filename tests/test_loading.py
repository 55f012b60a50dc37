"""Loading without a mapped checkpoint and without a transposed copy (issue 16: load time and
peak memory). The checkpoint is read with plain reads into the loader's own arrays, and q4
weights are quantized from the checkpoint's Conv1D [in, out] layout directly; both must give
exactly what the straightforward path (map, transpose, quantize) gives."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from conftest import SEED_FIR, write_random_gpt2
from firscope.errors import FirError
from firscope.model.checkpoint import Checkpoint
from firscope.model.q4 import (NUMPY_BELOW, Q4NonFiniteError, Q4RangeError, count_nonfinite,
                               quantize, quantize_conv1d, quantize_numpy)
from firscope.runtime import load_model


def same_bits(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("shape,group", [((768, 96), 32), ((101, 37), 32), ((7, 5), 3),
                                         ((64, 4), 16), ((33, 3), 32), ((1, 2), 32),
                                         ((40, 17), 5), ((1, 1), 1), ((17, 40), 64),
                                         ((96, 70), 32)])
def test_quantizing_the_conv1d_layout_equals_transpose_then_quantize(shape, group):
    """[in, out] in, [out, in] codes out: equal to quantize(w.T) and to the NumPy formula,
    bit for bit, for odd sizes, odd groups, a partial last group and tiles of output rows
    (CONV1D_BLOCK) that do not divide the rows."""
    rng = np.random.default_rng(sum(shape) * 7 + group)
    w = rng.normal(0, 0.02, shape).astype(np.float32)  # Conv1D [in, out]
    w[: min(group, shape[0]), 0] = 0.25  # a flat group in output row 0
    if shape[0] > 3:
        w[1, -1] = w[2, -1] = np.float32(1e-30)
    got = quantize_conv1d(w, group, compiled=True)
    small = quantize_conv1d(w, group)  # the loader's way for a small matrix: NumPy's
    want = quantize(np.ascontiguousarray(w.T), group)
    ref = quantize_numpy(np.ascontiguousarray(w.T), group)
    assert (got.rows, got.cols, got.group) == (shape[1], shape[0], group)
    for f in ("packed", "scale", "minimum"):
        for other in (want, ref, small):
            assert getattr(got, f).tobytes() == getattr(other, f).tobytes(), f


@pytest.mark.parametrize("seed", range(4))
def test_small_matrices_quantized_by_numpy_give_the_compiled_bits(seed):
    """Below NUMPY_BELOW weights the loader quantizes with the NumPy formula (no numba on a
    small model's way to its first stop): the same bytes as the compiled kernel for signed
    zeros (a group's minimum is the first of -0.0 and 0.0, as the compiled loop keeps it;
    np.min may give the other), subnormals, flat groups, all-zero groups and odd groups."""
    rng = np.random.default_rng(seed)
    for trial in range(60):
        shape = (int(rng.integers(1, 70)), int(rng.integers(1, 90)))
        group = int(rng.choice([1, 3, 5, 16, 32, 48]))
        w = rng.normal(0, 0.02, shape).astype(np.float32)
        pick = rng.random(shape)
        w[pick < 0.15] = 0.0
        w[(pick >= 0.15) & (pick < 0.3)] = -0.0
        w[(pick >= 0.3) & (pick < 0.35)] = np.float32(1e-40) * rng.choice([-1, 1])
        if trial % 7 == 0:
            w[:] = np.float32(0.25)
        if trial % 11 == 0:
            w[:] = rng.choice([0.0, -0.0], shape).astype(np.float32)
        a, b = quantize_conv1d(w, group, compiled=True), quantize_conv1d(w, group)
        for f in ("packed", "scale", "minimum"):
            assert getattr(a, f).tobytes() == getattr(b, f).tobytes(), (trial, shape, group, f)
    # the case np.min gets wrong: 0.0 before -0.0 in a group keeps +0.0
    w = np.array([[0.0], [-0.0], [0.5], [-0.0], [0.0], [0.5]], dtype=np.float32)
    assert np.signbit(quantize_conv1d(w, 3).minimum).ravel().tolist() == [False, True]
    assert w.size < NUMPY_BELOW


@pytest.mark.parametrize("compiled", [True, False])
def test_conv1d_quantizer_refuses_nan_inf_and_overflowing_groups(compiled):
    w = np.zeros((40, 3), dtype=np.float32)
    w[7, 1] = np.inf
    with pytest.raises(Q4NonFiniteError):
        quantize_conv1d(w, compiled=compiled)
    w[7, 1] = np.nan
    with pytest.raises(Q4NonFiniteError):
        quantize_conv1d(w, compiled=compiled)
    w = np.zeros((40, 3), dtype=np.float32)
    w[33, 2], w[38, 2] = 3e38, -3e38  # output row 2, group 1
    with pytest.raises(Q4RangeError) as e:
        quantize_conv1d(w, 32, compiled=compiled)
    assert (e.value.row, e.value.group_index, e.value.first, e.value.last) == (2, 1, 32, 39)
    assert "-3e+38 to 3e+38" in str(e.value)


def test_count_nonfinite():
    a = np.arange(10, dtype=np.float32)
    assert count_nonfinite(a) == 0
    a[[2, 5, 9]] = [np.nan, np.inf, -np.inf]
    assert count_nonfinite(a) == 3
    assert count_nonfinite(a.reshape(2, 5)) == 3
    assert count_nonfinite(a[::2]) == 1  # a strided view
    # chunked: values at the first, the last and both sides of each chunk boundary
    from firscope.model.q4 import NONFINITE_CHUNK as C
    big = np.ones(2 * C + 6, dtype=np.float32)
    at = [0, C - 1, C, 2 * C - 1, 2 * C, 2 * C + 4]
    big[at] = [np.nan, np.inf, -np.inf, np.nan, np.inf, np.nan]
    assert count_nonfinite(big) == 6
    assert count_nonfinite(big[1:]) == 5 and count_nonfinite(big[:-2]) == 5
    assert count_nonfinite(big.reshape(-1, 2)) == 6
    assert count_nonfinite(big.astype(np.float64)) == 6


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    header, blobs, offset = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        raw = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_checkpoint_load_equals_the_mapped_read_for_every_float_dtype(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (3, 5)).astype(np.float32)
    bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)
    write_safetensors(tmp_path / "model.safetensors", {
        "f32": ("F32", x), "f16": ("F16", x.astype(np.float16)),
        "f64": ("F64", x.astype(np.float64)), "bf16": ("BF16", bf16)})
    ck = Checkpoint(tmp_path)
    for name in ("f32", "f16", "f64", "bf16"):
        got = ck.load(name)
        assert got.dtype == np.float32 and got.shape == (3, 5)
        assert same_bits(got, np.asarray(ck.read(name), dtype=np.float32)), name
        out = np.zeros(15, dtype=np.float32)
        assert ck.load(name, out=out) is not None and same_bits(out.reshape(3, 5), got)
    with pytest.raises(ValueError, match="contiguous f32"):
        ck.load("f32", out=np.zeros(14, dtype=np.float32))


def test_a_file_shortened_after_its_header_was_read_is_a_clear_error(tmp_path):
    x = np.arange(12, dtype=np.float32)
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"a": ("F32", x)})
    ck = Checkpoint(tmp_path)  # header checked against the full file
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(FirError, match="truncated safetensors file: tensor 'a' ends after 40 of"):
        ck.load("a")


def test_loading_never_maps_the_checkpoint(tmp_path, monkeypatch):
    """A mapped checkpoint keeps every page the loader touched resident until it is unmapped
    (GPT-2 XL's peak was mostly its 6 GB checkpoint): load_model reads with plain reads."""
    fir = write_random_gpt2(tmp_path / "m", n_layer=2, n_embd=64, n_head=4, n_positions=32)
    want = load_model(fir)
    def no_map(*a, **k):
        raise AssertionError("the checkpoint was memory-mapped")
    monkeypatch.setattr(np, "memmap", no_map)
    for fir_f32 in (False, True):
        got = load_model(fir, fir_f32=fir_f32)
        if not fir_f32:
            assert same_bits(got.arena, want.arena)
            for name, w in want.weights.items():
                if w.q4 is not None:
                    assert np.array_equal(got.weights[name].q4.packed, w.q4.packed)


def test_loaded_weights_are_the_checkpoints(tmp_path):
    """The arena holds the checkpoint's f32 tensors bit for bit; q4 weights are the
    quantization of the transposed tensor; --fir-f32 matrices are the transposed tensors."""
    from safetensors.numpy import load_file
    fir = write_random_gpt2(tmp_path / "m", n_layer=2, n_embd=48, n_head=3, n_positions=20,
                            vocab=97, seed=4)
    tensors = load_file(str(fir.parent / "model.safetensors"))
    m, mf = load_model(fir), load_model(fir, fir_f32=True)
    for name, w in m.weights.items():
        src = tensors[w.tensor]
        if w.region is not None:
            assert same_bits(m.arena[w.region.base: w.region.stop], src.reshape(-1)), name
        else:
            want = quantize(np.ascontiguousarray(src.T), m.group)
            assert np.array_equal(w.q4.packed, want.packed), name
            assert same_bits(w.q4.scale, want.scale) and same_bits(w.q4.minimum, want.minimum)
            assert same_bits(mf.weights[name].matrix, np.ascontiguousarray(src.T)), name


def test_a_nan_in_a_q4_or_arena_weight_is_refused_with_its_name(tmp_path):
    from safetensors.numpy import load_file, save_file
    for tensor in ("transformer.h.1.mlp.c_fc.weight", "transformer.h.0.ln_2.bias"):
        folder = tmp_path / tensor.split(".")[-2]
        fir = write_random_gpt2(folder, n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab=64)
        t = load_file(str(folder / "model.safetensors"))
        t[tensor].reshape(-1)[5] = np.nan
        save_file(t, str(folder / "model.safetensors"))
        with pytest.raises(FirError, match=f"tensor '{tensor}' contains NaN or Inf"):
            load_model(fir)
    assert SEED_FIR.exists()
