"""The Buffers tab's statistics and q4 error come with the frozen view (built in the worker),
and a weight's are computed once per loaded model."""
from __future__ import annotations

import numpy as np

from firscope.debug.commands import CommandInterpreter
from firscope.debug.session import Session
from firscope.model.tokens import load_tokenizer
from firscope.runtime import load_model
from firscope.tui.attention_view import AttentionRecorder
from firscope.tui.buffers_view import q4_text
from firscope.tui.state import Wants, build_view
from conftest import SAMPLE


def test_q4_error_and_weight_stats_are_frozen_with_the_view_and_kept_per_model():
    model = load_model(SAMPLE / "gpt2.fir")
    tok = load_tokenizer(model.folder, model.vocab)
    s = Session(model, tok.encode("def "), 2, engine="interp")
    ci = CommandInterpreter(s, tok)
    rec = AttentionRecorder(s)
    wants = Wants(buffer="qkvw@0")
    first = build_view(s, ci, tok, rec, wants).buffer
    assert first.names == ("qkvw@0",) and first.stats is not None
    err = first.q4_error
    assert err is not None and 0 < err.rmse <= err.max_abs and err.rel_max <= 0.5 + 1e-3
    again = build_view(s, ci, tok, rec, wants).buffer
    assert again.stats is first.stats and again.q4_error is first.q4_error  # once per load
    w = model.weights["qkvw@0"]
    assert f"rmse {err.rmse:.3g}" in q4_text(w, 0, 0, err).plain
    inputs = build_view(s, ci, tok, rec, Wants()).buffer
    assert len(inputs.summaries) == len(inputs.names)
    lo, hi, mean, bad = inputs.summaries[0]
    a = np.asarray(inputs.arrays[0], dtype=np.float64)
    assert (lo, hi, bad) == (a.min(), a.max(), 0)


def test_summary_reads_finite_f32_in_place_with_the_copys_figures():
    """The in-place path (all finite f32) gives the f64 copy's min and max exactly and its
    mean to f64 rounding; arrays with NaN/Inf, or nothing finite, take the copy's path."""
    from firscope.tui.stats import summary
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((300, 77)) * 5 + 1).astype(np.float32)
    lo, hi, mean, bad = summary(a)
    f = a.astype(np.float64)
    assert (lo, hi, bad) == (f.min(), f.max(), 0)
    assert abs(mean - f.mean()) <= 1e-12 * np.abs(f).mean()
    b = a.copy()
    b[0, 0], b[1, 1] = np.nan, -np.inf
    lo, hi, mean, bad = summary(b)
    rest = np.delete(b.reshape(-1), [0, 77 + 1]).astype(np.float64)
    assert bad == 2 and (lo, hi) == (rest.min(), rest.max())
    assert summary(np.full(4, np.nan, dtype=np.float32)) is None


def test_buffer_stats_of_finite_f32_are_the_f64_copys_figures(monkeypatch):
    """stats_text reads an all-finite f32 array in f64 chunks (several chunks here: CHUNK
    made small) and shows what the whole array's f64 copy gives: min, max, mean and std to
    the digits shown, the histogram's counts and range, the sparkline's bin means (bins of
    np.array_split). An array with NaN/Inf keeps the copy's path and counts them."""
    from firscope.tui import heat, stats
    monkeypatch.setattr(heat, "CHUNK", 1000)
    monkeypatch.setattr(stats, "CHUNK", 1000)
    bars = "▁▂▃▄▅▆▇█"
    rng = np.random.default_rng(5)
    for a in (rng.standard_normal(12345).astype(np.float32) * 3 + 1,
              rng.uniform(-1e30, 1e30, 4001).astype(np.float32), np.full(2001, 2.5, np.float32),
              rng.standard_normal(39).astype(np.float32)):
        f = a.astype(np.float64)
        want_moments = (f"min {f.min():.6g}  max {f.max():.6g}  mean {f.mean():.6g}  "
                        f"std {f.std():.6g}  NaN 0  Inf 0")
        counts, edges = np.histogram(f, bins=24)
        top = counts.max()
        want_hist = "".join(bars[min(int(c / top * 7.999), 7)] if c else " " for c in counts)
        means = np.array([b.mean() for b in np.array_split(f, min(40, f.size))])
        want_spark = "".join(bars[min(int(v * 8), 7)] for v in heat.normalise(means))
        lines = stats.stats_text("x", a).plain.splitlines()
        assert lines[1] == want_moments, (lines[1], want_moments)
        assert lines[2] == f"hist {edges[0]:.3g} {want_hist} {edges[-1]:.3g}   spark {want_spark}"
    bad = rng.standard_normal(3000).astype(np.float32)
    bad[::10], bad[5] = np.nan, np.inf
    assert "NaN 300  Inf 1" in stats.stats_text("y", bad).plain
