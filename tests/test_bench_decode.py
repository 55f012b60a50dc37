"""benchmarks/decode.py's --breakdown: the in-cache speed of each linear (the kernel's own
ceiling) and what the table says from it. Timings are not asserted; what is computed
from them is."""
import importlib.util
import sys

import pytest

from conftest import REPO


@pytest.fixture
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_decode", REPO / "benchmarks" / "decode.py")
    mod = importlib.util.module_from_spec(spec)
    # The script puts benchmarks/ first on sys.path for its own imports; left there, its
    # modules shadow installed packages of the same name in every later test.
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec.loader.exec_module(mod)
    return mod


def test_hot_linears_times_each_linear_that_fits_the_cache(bench, sample_fir, monkeypatch):
    from firscope.runtime import Machine, load_model
    model = load_model(sample_fir)
    machine = Machine(model, engine="interp")
    linears = {}
    for node in model.nodes:
        if bench.linear_bytes(node) is not None:
            linears.setdefault(node.name, []).append(node)
    hot = bench.hot_linears(machine)
    assert set(hot) == set(linears)  # the tiny model's matrices all fit
    assert all(v > 0 for v in hot.values())
    # a matrix larger than a quarter of the last-level cache is left out (read from memory
    # whatever one does, so "in cache" would mean nothing)
    biggest = max(linears, key=lambda k: bench.linear_bytes(linears[k][0]))
    size = bench.linear_bytes(linears[biggest][0])
    import bandwidth
    monkeypatch.setattr(bandwidth, "last_level_cache", lambda: 4 * size - 4)
    assert biggest not in bench.hot_linears(machine)


def _row(out: str, name: str) -> list[str]:
    return next(ln.split() for ln in out.splitlines() if ln.split()[:1] == [name])


def test_the_table_gives_each_linear_its_ceiling_and_names_the_bound_ones(bench, capsys):
    mb = 1e6
    linears = {
        # 1 MB: 0.1 ms in the decode (10 GB/s), 0.04 streamed (25), 0.05 in cache (20)
        "fc_linear": {"bytes": mb, "calls": 12, "ms": 0.1, "best_ms": 0.08, "stream_ms": 0.04,
                      "hot_ms": 0.05},
        # in cache faster than the stream: memory is what it waits for
        "qkv_linear": {"bytes": mb, "calls": 12, "ms": 0.1, "best_ms": 0.1, "stream_ms": 0.04,
                       "hot_ms": 0.03},
        "head": {"bytes": 100 * mb, "calls": 1, "ms": 4.0, "best_ms": 3.5, "stream_ms": 3.6,
                 "hot_ms": None},
    }
    bench.print_breakdown({"loadavg": 0.5, "micro_ms": 0.0, "per_target_ms": {},
                           "dispatch": {}, "linears": linears, "stream_gbs": 30.0,
                           "kv_bytes": 0, "threads": 2})
    out = capsys.readouterr().out
    fc = _row(out, "fc_linear")
    # in cache 1 MB / 0.05 ms; ceiling 0.04 / 0.05; goal: its bound max(0.04, 0.05) / 0.1
    assert fc[-3:] == ["20.00", "0.80", "0.50"]
    assert _row(out, "qkv_linear")[-3:] == ["33.33", "1.33", "0.40"]  # the stream: 0.04
    assert _row(out, "head")[-3:] == ["-", "-", "0.90"]  # no in-cache figure: the stream
    assert "bound by their instructions" not in out  # 0.80 is not below the goal
    linears["fc_linear"]["hot_ms"] = 0.06  # ceiling 0.67
    bench.print_breakdown({"loadavg": 0.5, "micro_ms": 0.0, "per_target_ms": {},
                           "dispatch": {}, "linears": linears, "stream_gbs": 30.0,
                           "kv_bytes": 0, "threads": 2})
    bound = next(ln for ln in capsys.readouterr().out.splitlines()
                 if "bound by their instructions" in ln)
    assert "fc_linear" in bound and "qkv_linear" not in bound


def test_the_floor_ratio_is_also_paired_round_by_round(bench, capsys):
    """A machine whose bandwidth drifts between rounds moves the medians of the engine and
    of the floor apart; the ratio of each round's pair says what the engine did against
    the floor measured next to it."""
    def run(ms):
        return {"times": [ms / 1e3] * 3, "load_s": 1.0, "rss_load": 1, "rss_end": 1,
                "loadavg": [0.5], "others_cpu": 0.0}

    def stream(ms):
        return {"floor_s": ms / 1e3, "bytes": 218e6, "floor_f32_s": 2 * ms / 1e3,
                "bytes_f32": 494e6, "threads": 2, "llc": 32 << 20, "loadavg": [0.5],
                "others_cpu": 0.0}
    # rounds: the machine fast (floor 4 ms, engine 5), then slow (6, 7.2), then fast again
    results = {"firscope-q4": [run(5.0), run(7.2), {"error": "died"}, run(5.2)],
               bench.STREAM: [stream(4.0), stream(6.0), stream(4.0), stream(4.0)]}
    summary = bench.summarize(results)
    floor = bench.summarize_floor(results[bench.STREAM])
    bench.print_ratios(summary, floor)
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("firscope-q4"))
    # medians: 5.2 / 4.0 = 1.30; pairs 1.25, 1.20, (round 3 failed), 1.30
    assert "/ floor 1.30 (paired by round: median 1.25, rounds 1.20-1.30)" in line


def test_a_peer_ratio_is_also_paired_round_by_round(bench, capsys):
    """The same against llama.cpp: its process ran next to firscope's in each round."""
    def run(ms):
        return {"times": [ms / 1e3] * 3, "load_s": 1.0, "rss_load": 1, "rss_end": 1,
                "loadavg": [0.5], "others_cpu": 0.0}
    # firscope 10, 15, 11 ms; llama.cpp 10, 12, 10 ms: medians 11 / 10 = 1.10, pairs
    # 1.00, 1.25, 1.10
    results = {"firscope-q4": [run(10.0), run(15.0), run(11.0)],
               "llama-Q4_1": [run(10.0), run(12.0), run(10.0)]}
    bench.print_ratios(bench.summarize(results))
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("firscope-q4"))
    assert "/ llama-Q4_1 1.10 (paired by round: median 1.10, rounds 1.00-1.25)" in line


def test_position_puts_firscope_and_the_numpy_gpt2_at_the_same_cache_rows(bench):
    """--position's cheap prefill: the same seeded K/V rows in firscope's caches and in the
    NumPy GPT-2's, so that a step from there computes the same logits (f32 weights)."""
    import numpy as np

    from firscope.runtime import Machine, load_model
    folder = REPO / "sample_models" / "tiny-gpt2"
    machine = Machine(load_model(folder / "gpt2.fir", fir_f32=True), engine="compiled")
    bench.firscope_seek(machine, 20)
    assert machine.position == 20 and len(machine.history) == 20
    ours = machine.step(7).logits
    step, _, seek = bench.make_engine("numpy", folder, 1)
    seek(20)
    theirs = step(7)
    assert np.allclose(ours, theirs, atol=2e-3, rtol=1e-3)


def test_the_whole_decode_is_set_against_the_restated_bound(bench, capsys):
    """Issue 45's restated whole-decode goal: a token against max(the bandwidth floor, the
    linears' own bound + the K/V rows), each linear's bound being max(stream, in cache)."""
    linears = {  # 10 ms streamed in all; in cache: fc slower than its stream, qkv faster
        "fc_linear": {"bytes": 1, "calls": 12, "ms": 3.0, "best_ms": 3.0, "stream_ms": 2.0,
                      "hot_ms": 2.5},
        "qkv_linear": {"bytes": 1, "calls": 12, "ms": 3.0, "best_ms": 3.0, "stream_ms": 2.0,
                       "hot_ms": 1.0},
        "head": {"bytes": 1, "calls": 1, "ms": 7.0, "best_ms": 7.0, "stream_ms": 6.0,
                 "hot_ms": None}}
    # 12 layers x 2.5 MB of K/V rows at 30 GB/s: 1 ms
    b = {"linears": linears, "kv_bytes": 2.5e6, "layers": 12, "stream_gbs": 30.0,
         "position": 1000, "step_ms": 14.0}
    bench.print_decode_bound(b, 15.0)
    out = capsys.readouterr().out
    assert "positions 1000.." in out
    assert "bandwidth floor 11.00 ms" in out and "(1.00 ms)" in out  # 10 + 1
    # in cache: fc 2.5 + qkv 1.0 + the head streamed 6 + 1: under the floor, which bounds
    assert "own bound 10.50 ms" in out and "= 11.00 ms/token" in out
    assert "14.00 ms: 1.27x" in out and "firscope-q4 15.00 ms: 1.36x" in out
    linears["fc_linear"]["hot_ms"] = 4.0  # fc's arithmetic now bounds the decode
    bench.print_decode_bound(b, None)
    out = capsys.readouterr().out
    assert "own bound 12.00 ms" in out and "= 12.00 ms/token" in out  # 4 + 1 + 6 + 1
    assert "14.00 ms: 1.17x" in out and "firscope-q4" not in out


def test_the_breakdown_at_a_position_steps_from_there(bench, sample_fir, capsys):
    """--breakdown --position P breaks down the steps at P.. (its child put the machine at
    P as the timed children do), not at 0.. as it did: the K/V bytes and attention's
    figure are those of positions P.."""
    import argparse
    import json
    import statistics
    args = argparse.Namespace(folder=str(sample_fir.parent), tokens="3,5,7,9", position=40)
    assert bench.breakdown_child(args) == 0
    b = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    e = json.loads((sample_fir.parent / "config.json").read_text())["n_embd"]
    assert b["position"] == 40
    assert b["kv_bytes"] == statistics.mean(2 * (40 + p + 1) * e * 4 for p in range(4))
    assert b["dispatch"]["g2.attn_decode"]["position"] == 42  # the middle of 40..43
    assert b["step_ms"] > 0 and b["layers"] == 4
