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
