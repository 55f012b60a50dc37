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
    from firscope.runtime import load_model
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


# --- resident Q4: the packed matvec equals "dequantize, then f32 matvec" ---------------------
U = 2.0 ** -24  # unit roundoff of f32


def expanded_min(q):
    return np.repeat(q.minimum, q.group, axis=1)[:, : q.cols].astype(np.float64)


def assert_reordering_close(q, x, y):
    """y is bit for bit the reference's sum of the dequantized weights (model/numerics), and
    |y - W'x| is within the f32 error bound of any summation order, 2 (cols + 4) u sum
    |w'||x|. A wrong code, scale, min or column is off by about sum |w' x| itself."""
    from firscope.model.numerics import dot_f32_numpy
    assert np.array_equal(y.view(np.uint32), dot_f32_numpy(q.dequantize_numpy(), x).view(np.uint32))
    d = q.dequantize().astype(np.float64)
    ref = d @ x.astype(np.float64)
    bound = 2 * (q.cols + 4) * U * ((np.abs(d) + np.abs(expanded_min(q))) @ np.abs(x))
    assert y.dtype == np.float32 and y.shape == (q.rows,)
    assert (np.abs(y - ref) <= bound).all(), np.max(np.abs(y - ref) / bound)
    # the bound is loose; the observed error is far below it, and BLAS's is alike
    blas = q.dequantize() @ x
    assert np.abs(y - ref).max() <= 64 * max(np.abs(blas - ref).max(), U * np.abs(ref).max())


SHAPES = [((1, 32), 32), ((1, 1), 32), ((1, 7), 32), ((3, 33), 32), ((5, 70), 32), ((64, 32), 32),
          ((7, 31), 32), ((130, 769), 32), ((768, 3072), 32), ((4, 7), 2), ((3, 33), 16),
          ((9, 100), 7), ((5, 300), 128), ((2, 5), 1), ((600, 999), 64)]


@pytest.mark.parametrize("shape,group", SHAPES)
@pytest.mark.parametrize("parallel", [False, True])
def test_matvec_equals_dequantized_matvec(shape, group, parallel):
    rng = np.random.default_rng(shape[0] * 1000 + shape[1] + group)
    w = (rng.standard_normal(shape) * rng.uniform(0.01, 3, (shape[0], 1))).astype(np.float32)
    q = quantize(w, group)
    for x in (rng.standard_normal(shape[1]).astype(np.float32),
              np.abs(rng.standard_normal(shape[1])).astype(np.float32) * 50):
        assert_reordering_close(q, x, q.matvec(x, parallel=parallel))


def test_matvec_uses_every_nibble_scale_and_min():
    """One-hot x reads one column: exactly that column of the dequantized matrix (a single
    nonzero term; q*s + m is one fused multiply-add, rounded once)."""
    from firscope.model.numerics import fma_f32_numpy
    rng = np.random.default_rng(7)
    w = rng.standard_normal((6, 70)).astype(np.float32)
    q = quantize(w, 32)
    d = q.dequantize()
    m = expanded_min(q).astype(np.float32)
    for c in range(70):
        x = np.zeros(70, dtype=np.float32)
        x[c] = 1
        y = q.matvec(x)
        assert np.array_equal(y, d[:, c]), c
        want = fma_f32_numpy(q.codes()[:, c].astype(np.float32), q.scale[:, c // 32], m[:, c])
        assert np.array_equal(d[:, c], want), c


def test_matvec_in_place_and_nan_inf_propagate():
    rng = np.random.default_rng(3)
    q = quantize(rng.standard_normal((70, 70)).astype(np.float32), 32)
    x = rng.standard_normal(70).astype(np.float32)
    want = q.matvec(x)
    buf = x.copy()
    q.matvec(buf, out=buf)  # fir.linear may write its input (in place)
    assert np.array_equal(buf, want)
    x[5] = np.nan
    assert np.isnan(q.matvec(x)).all()
    x[5] = np.inf
    blas = q.dequantize() @ x
    y = q.matvec(x)
    assert np.array_equal(np.isnan(y), np.isnan(blas))
    assert np.array_equal(np.isinf(y), np.isinf(blas))
    assert np.array_equal(np.sign(y[np.isinf(y)]), np.sign(blas[np.isinf(blas)]))


def test_matvec_checks_shapes():
    q = quantize(np.ones((4, 8), dtype=np.float32), 32)
    with pytest.raises(ValueError, match="8 columns"):
        q.matvec(np.ones(9, dtype=np.float32))
    with pytest.raises(ValueError, match=r"f32 \[4\]"):
        q.matvec(np.ones(8, dtype=np.float32), out=np.ones(4))


def test_every_q4_weight_of_the_sample_model(sample_fir):
    from firscope.runtime import load_model
    m = load_model(sample_fir)
    entries = [w for w in m.weights.values() if w.dtype == "q4"]
    assert len(entries) == 4 * m.layers
    rng = np.random.default_rng(11)
    for w in entries:
        assert w.matrix is None  # resident: no f32 copy
        x = rng.standard_normal(w.q4.cols).astype(np.float32)
        for parallel in (False, True):
            assert_reordering_close(w.q4, x, w.q4.matvec(x, parallel=parallel))


def test_dense_is_made_on_demand_once_and_read_only():
    rng = np.random.default_rng(5)
    q = quantize(rng.standard_normal((8, 64)).astype(np.float32))
    assert not q._dense
    d = q.dense()
    assert q.dense() is d and np.array_equal(d, q.dequantize()) and not d.flags.writeable
    q.drop_dense()
    assert not q._dense


# --- the two q4 paths of a loaded model --------------------------------------------------------
def test_packed_and_dequant_paths_decode_alike(sample_fir):
    from firscope.errors import FirError
    from firscope.runtime import load_model
    from firscope.runtime import Machine
    packed = load_model(sample_fir)
    deq = load_model(sample_fir, q4_path="dequant")
    assert all(w.matrix is None for w in packed.weights.values() if w.dtype == "q4")
    for name, w in deq.weights.items():
        if w.dtype == "q4":
            assert np.array_equal(w.matrix, w.q4.dequantize())
            assert np.array_equal(w.q4.packed, packed.weights[name].q4.packed)
    ids = [5, 17, 200, 3, 99, 42]
    a = np.stack(Machine(packed, engine="compiled").generate(ids, 1)[1])
    b = np.stack(Machine(deq, engine="compiled").generate(ids, 1)[1])
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))  # one computation
    from firscope.profile.data import describe_model
    assert describe_model(packed)["q4_path"] == "packed"
    assert describe_model(deq)["q4_path"] == "dequant"
    with pytest.raises(FirError, match="unknown q4 path 'fast'"):
        load_model(sample_fir, q4_path="fast")


# --- f32 products of the ext ops (runtime.gemv) -------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (50, 768), (700, 1000)])
def test_f32_matvec_equals_blas_within_reordering(shape):
    from firscope.runtime import gemv
    rng = np.random.default_rng(shape[1])
    w = rng.standard_normal(shape).astype(np.float32)
    x = rng.standard_normal(shape[1]).astype(np.float32)
    ref = w.astype(np.float64) @ x
    bound = 2 * (shape[1] + 2) * U * (np.abs(w).astype(np.float64) @ np.abs(x))
    y = np.empty(shape[0], dtype=np.float32)
    gemv.f32_matvec(w, x, y)
    assert (np.abs(y - ref) <= bound).all()
    from firscope.model.numerics import dot_f32_numpy
    assert np.array_equal(y, dot_f32_numpy(w, x))
    yt = np.empty(shape[1], dtype=np.float32)
    ones = np.ones(shape[0], dtype=np.float32)
    gemv.f32_matvec(w.T, ones, yt)  # strided: copied, then the same defined sum
    assert np.allclose(yt, w.sum(axis=0), rtol=1e-4, atol=1e-4)
    assert np.array_equal(yt, dot_f32_numpy(np.ascontiguousarray(w.T), ones))
    if shape[0] == shape[1] or shape == (1, 1):
        buf = x.copy()
        gemv.f32_matvec(w, buf, buf)  # in place
        assert np.array_equal(buf, y)


def _dot_q4_with(dequant):
    """A jitted caller of the no-tail q4 dot product that dequantizes one way."""
    from numba import njit

    from firscope.model.numeric_kernels import DOT_Q4_BY_DEQUANT
    from firscope.model.q4_kernels import split_x
    dot = DOT_Q4_BY_DEQUANT[dequant]

    @njit
    def run(packed, scale, minimum, x, y):
        xe, xo = split_x(x, packed.shape[1])
        for r in range(packed.shape[0]):
            dot(y, packed, scale, minimum, xe, xo, r, x.shape[0] // 32)
    return run


def test_both_ways_of_dequantizing_give_the_same_bits():
    """The q4 dot product looks each weight up in a table of fma(k, scale, min) where the
    CPU has AVX-512 and fuses fma(q, scale, min) itself elsewhere: the same bits for every
    code, with scales and mins chosen to break it (signed zeros, subnormals, huge, Inf,
    NaN) as well as real ones, and both equal to the matvec the model runs."""
    from firscope.model.numeric_kernels import Q4_DEQUANT
    assert Q4_DEQUANT in ("table", "convert")
    rng = np.random.default_rng(11)
    q = quantize(rng.standard_normal((48, 256)).astype(np.float32), 32)
    packed = q.packed.copy()
    packed[:16] = rng.integers(0, 256, packed[:16].shape, dtype=np.uint8)  # every code
    scale, minimum = q.scale.copy(), q.minimum.copy()
    odd = np.array([0.0, -0.0, 1e-45, -3e-39, 3e38, -3e38, np.inf, -np.inf, np.nan, 1.0],
                   dtype=np.float32)
    scale[16:32] = rng.choice(odd, scale[16:32].shape)
    minimum[24:40] = rng.choice(odd, minimum[24:40].shape)
    x = rng.standard_normal(256).astype(np.float32)
    x[::7] *= 1e-30
    got = {}
    for how in ("convert", "table"):
        y = np.full(48, 7.0, dtype=np.float32)
        _dot_q4_with(how)(packed, scale, minimum, x, y)
        got[how] = y.view(np.uint32)
    assert np.array_equal(got["convert"], got["table"])
    assert np.isnan(got["table"].view(np.float32)).any()  # the odd values reached the sums
    q.packed[...], q.scale[...], q.minimum[...] = packed, scale, minimum
    assert np.array_equal(q.matvec(x, parallel=False).view(np.uint32), got["convert"])


# --- calls bound once (the runtime's plain loop) ---------------------------------------------
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(5, 64), (512, 768)])
def test_a_bound_q4_call_gives_the_matvecs_bits_with_each_new_x(shape, threads):
    """Q4Matrix.matvec_call binds x and out once; each call reads x as it is then. The
    512x768 matrix spreads its rows on two threads, the small one never does."""
    from firscope.model.q4 import PARALLEL_MIN_WEIGHTS
    rng = np.random.default_rng(7)
    q = quantize(rng.standard_normal(shape).astype(np.float32), 32)
    x = np.empty(shape[1], dtype=np.float32)
    out = np.empty(shape[0], dtype=np.float32)
    fn, args = q.matvec_call(x, out, threads)
    assert args[3] is x and args[4] is out
    par = threads > 1 and shape[0] * shape[1] >= PARALLEL_MIN_WEIGHTS
    assert len(args) == (6 if par else 7)  # (.., chunk) or (.., r0, r1)
    for _ in range(3):
        x[:] = rng.standard_normal(shape[1])
        fn(*args)
        assert same_bits(out, q.matvec(x.copy(), parallel=False))


def test_a_q4_call_is_not_bound_where_matvec_does_more_than_one_kernel_call():
    rng = np.random.default_rng(8)
    q = quantize(rng.standard_normal((4, 64)).astype(np.float32), 32)
    x, out = np.zeros(64, dtype=np.float32), np.zeros(4, dtype=np.float32)
    assert q.matvec_call(x, out, 1) is not None
    assert q.matvec_call(np.zeros(64, dtype=np.float64), out, 1) is None  # converted first
    assert q.matvec_call(np.zeros(128, dtype=np.float32)[::2], out, 1) is None  # strided
    assert q.matvec_call(np.zeros(65, dtype=np.float32), out, 1) is None  # wrong size
    assert q.matvec_call(x, np.zeros(5, dtype=np.float32), 1) is None
    g16 = quantize(rng.standard_normal((4, 64)).astype(np.float32), 16)
    assert g16.matvec_call(x, out, 1) is None  # the general kernel copies x


def test_a_bound_f32_call_gives_f32_matvecs_bits_and_refuses_an_overlap(monkeypatch):
    from firscope.runtime import gemv
    rng = np.random.default_rng(9)
    w = rng.standard_normal((600, 768)).astype(np.float32)
    x = np.empty(768, dtype=np.float32)
    out = np.empty(600, dtype=np.float32)
    for threads in (1, 2):
        fn, args = gemv.f32_matvec_call(w, x, out, threads)
        x[:] = rng.standard_normal(768)
        fn(*args)
        ref = np.empty(600, dtype=np.float32)
        gemv.f32_matvec(w, x, ref)
        assert same_bits(out, ref)
    sq = rng.standard_normal((8, 8)).astype(np.float32)
    buf = np.zeros(8, dtype=np.float32)
    assert gemv.f32_matvec_call(sq, buf, buf, 1) is None  # in place: f32_matvec copies x
    assert gemv.f32_matvec_call(w.T, out, x, 1) is None  # a transposed view: copied per call
    monkeypatch.setitem(gemv.BACKEND, "f32", "blas")
    assert gemv.f32_matvec_call(w, x, out, 1) is None


def test_entry_for_is_the_dispatchers_code_for_those_types():
    from numba import njit

    from firscope.jitcache import entry_for

    @njit
    def twice(a, k):
        a *= k

    a = np.ones(3, dtype=np.float32)
    entry = entry_for(twice, (a, 2))
    assert entry is not twice  # compiled for (float32[::1], int64) by entry_for itself
    entry(a, 2)
    assert a.tolist() == [2.0, 2.0, 2.0]
    b = np.ones(3, dtype=np.float64)  # another signature: another entry
    entry_for(twice, (b, 3))(b, 3)
    assert b.tolist() == [3.0, 3.0, 3.0] and len(twice.overloads) == 2

    def plain(a, k):  # not a dispatcher: itself
        return a
    assert entry_for(plain, (a, 1)) is plain


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
