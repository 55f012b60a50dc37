import numpy as np
import pytest

from firscope.model.q4 import quantize


@pytest.mark.parametrize("shape,group", [((8, 64), 32), ((5, 70), 32), ((3, 33), 16), ((4, 7), 32),
                                         ((16, 128), 128)])
def test_round_trip_error_at_most_half_a_step(shape, group):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal(shape) * rng.uniform(0.01, 3, (shape[0], 1))).astype(np.float32)
    q = quantize(w, group)
    deq = q.dequantize()
    assert deq.shape == w.shape and deq.dtype == np.float32
    # per-element step of its group
    scale = np.repeat(q.scale, group, axis=1)[:, : shape[1]]
    err = np.abs(w.astype(np.float64) - deq)
    # The bound is scale/2 in exact arithmetic; dequantizing in f32 adds at most one
    # rounding of w' (half an ulp of |w'|), which we allow explicitly.
    ulp = np.spacing(np.abs(deq).astype(np.float32)).astype(np.float64)
    assert (err <= scale / 2 + ulp).all()
    # and the bound is not vacuous: errors do reach a good fraction of it
    assert (err / scale).max() > 0.4


def test_codes_scales_mins_follow_the_formula():
    w = np.array([[-1.0, 6.5, 14.0, 0.2, 7.5] + [0.0] * 27], dtype=np.float32)
    q = quantize(w, 32)
    assert q.scale[0, 0] == 1.0 and q.minimum[0, 0] == -1.0  # (14 - -1) / 15
    codes = q.codes()[0]
    # 7.5 -> 8 and 8.5 -> 8: round half to even; 1.2 -> 1
    assert codes[:5].tolist() == [0, 8, 15, 1, 8]
    assert q.packed.shape == (1, 16) and q.packed[0, 0] == (0 | (8 << 4))


def test_flat_group_gets_scale_one_and_code_zero():
    w = np.full((2, 32), 0.75, dtype=np.float32)
    q = quantize(w, 32)
    assert (q.scale == 1).all() and (q.codes() == 0).all()
    assert (q.dequantize() == w).all()


def test_packing_two_codes_per_byte():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((3, 64)).astype(np.float32)
    q = quantize(w)
    assert q.packed.dtype == np.uint8 and q.packed.shape == (3, 32)
    assert q.nbytes == 3 * 32 + 2 * 3 * 2 * 4


# --- the overflow of issue 10.15: finite weights must never become NaN ---------------------------
def test_group_range_beyond_f32_is_refused_not_nan():
    from firscope.model.q4 import Q4RangeError, quantize_numpy
    w = np.zeros((3, 40), dtype=np.float32)
    w[2, 33], w[2, 38] = 3e38, -3e38  # row 2, group 1 (columns 32..39)
    for f in (quantize, quantize_numpy):
        with pytest.raises(Q4RangeError) as e:
            f(w, 32)
        assert (e.value.row, e.value.group_index, e.value.first, e.value.last) == (2, 1, 32, 39)
        assert "-3e+38 to 3e+38" in str(e.value)


def test_wide_group_that_fits_stays_finite_and_within_half_a_step():
    w = np.array([[1.5e38, -1.5e38, 0.0, 7e37] + [1.0] * 28], dtype=np.float32)
    q = quantize(w, 32)
    deq = q.dequantize()
    assert np.isfinite(q.scale).all() and np.isfinite(deq).all()
    assert np.abs(deq.astype(np.float64) - w).max() <= q.scale.max() / 2 * (1 + 1e-6)


def test_loader_names_the_tensor_whose_range_overflows(make_model):
    from safetensors.numpy import load_file, save_file
    from firscope.errors import FirError
    from firscope.model import load_model
    fir = make_model("wide")
    ck = fir.parent / "model.safetensors"
    t = load_file(str(ck))
    name = "transformer.h.1.mlp.c_proj.weight"  # Conv1D [in, out]: a group runs along 'in'
    t[name][3, 5], t[name][4, 5] = 3e38, -3e38
    save_file(t, str(ck))
    with pytest.raises(FirError) as e:
        load_model(fir)
    msg = str(e.value)
    assert "weight 'projw@1'" in msg and f"tensor '{name}'" in msg
    assert "row 5" in msg and "--fir-f32" in msg
    assert e.value.loc is not None and "projw" in e.value.loc.text
    m = load_model(fir, fir_f32=True)  # the suggested way out works
    assert np.isfinite(m.weights["projw@1"].matrix).all()
