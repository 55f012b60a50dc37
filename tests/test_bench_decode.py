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
    assert fc[-2:] == ["20.00", "0.80"]  # in cache 1 MB / 0.05 ms; ceiling 0.04 / 0.05
    assert _row(out, "qkv_linear")[-2:] == ["33.33", "1.33"]
    assert _row(out, "head")[-2:] == ["-", "-"]
    assert "bound by their instructions" not in out  # 0.80 is not below the goal
    linears["fc_linear"]["hot_ms"] = 0.06  # ceiling 0.67
    bench.print_breakdown({"loadavg": 0.5, "micro_ms": 0.0, "per_target_ms": {},
                           "dispatch": {}, "linears": linears, "stream_gbs": 30.0,
                           "kv_bytes": 0, "threads": 2})
    bound = next(ln for ln in capsys.readouterr().out.splitlines()
                 if "bound by their instructions" in ln)
    assert "fc_linear" in bound and "qkv_linear" not in bound
