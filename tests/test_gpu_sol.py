"""The GPU's measured time beside the speed-of-light prediction (firscope/gpu/sol.py):
which device is predicted for, the fields of gpu-profile.json's ``speed_of_light``, what
the report says the ratios mean, and ``profile --engine gpu --device``. The pieces that
need no adapter run everywhere; the rest skip, saying why, without one."""
from __future__ import annotations

import dataclasses
import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import SEED_FIR
from firscope.cost import analyse_position, find_device, load_devices
from firscope.errors import FirError
from firscope.gpu.sol import (beside, caveats, choose_device, matching_device, predict_step,
                              render_beside, retime_last_step)
from firscope.runtime import load_model
from gpu_util import gpu  # noqa: F401 - gpu is a fixture
from model_util import firscope

FED = [3, 7, 11]


@pytest.fixture(autouse=True)
def _no_user_devices(tmp_path, monkeypatch):
    """The user's own ~/.config/firscope/devices.toml never changes what these tests see."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture(scope="module")
def sample():
    model = load_model(SEED_FIR)
    return model, predict_step(model, find_device("a100"), FED)


def fake_gpu(name="NVIDIA H200", *, software=False, timestamps=True):
    return SimpleNamespace(name=name, backend="Vulkan", is_software=software,
                           timestamps=timestamps)


@pytest.mark.parametrize("adapter, key", [
    ("NVIDIA H200", "h200"), ("NVIDIA H200 NVL", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("AMD Instinct MI300X", "mi300x"),
    ("Apple M3 Max", "m3max"), ("NVIDIA H100 80GB HBM3", None),
    ("llvmpipe (LLVM 15.0.6, 256 bits)", None), ("", None)])
def test_an_adapter_name_finds_its_own_profile(adapter, key):
    got = matching_device(adapter, load_devices())
    assert (got.key if got else None) == key


def test_short_names_never_match_and_the_longest_match_wins():
    h200 = find_device("h200")
    devices = {"h2": dataclasses.replace(h200, key="h2", name="H2"),
               "h200": h200,
               "h200nvl": dataclasses.replace(h200, key="h200nvl", name="NVIDIA H200 NVL")}
    assert matching_device("NVIDIA H200 NVL", devices).key == "h200nvl"
    assert matching_device("NVIDIA H200", devices).key == "h200"
    assert matching_device("H2 something", {"h2": devices["h2"]}) is None


def test_the_device_is_the_named_one_else_the_adapters_else_the_default(tmp_path,
                                                                       monkeypatch):
    dev, why = choose_device("a100", "NVIDIA H200")
    assert dev.key == "a100" and why == "--device"
    dev, why = choose_device(None, "NVIDIA H200")
    assert dev.key == "h200" and "adapter's own profile" in why
    dev, why = choose_device(None, "llvmpipe (LLVM 15.0.6, 256 bits)")
    assert dev.key == "h200" and why.startswith("the default")
    config = tmp_path / "mine"
    (config / "firscope").mkdir(parents=True)
    (config / "firscope" / "devices.toml").write_text('default = "rtx4090"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    assert choose_device(None, "llvmpipe")[0].key == "rtx4090"
    assert choose_device(None, "AMD Instinct MI300X")[0].key == "mi300x"  # its own wins
    with pytest.raises(FirError, match="unknown device 'h20': did you mean 'h200'"):
        choose_device("h20", "NVIDIA H200")


def test_predict_step_is_the_analysis_of_the_last_fed_step_and_leaves_the_buffers(sample):
    model, report = sample
    assert report.position == len(FED) - 1 and report.token == FED[-1]
    again = analyse_position(load_model(SEED_FIR), find_device("a100"), FED)
    assert [n.prediction.predicted_us for n in report.nodes] == \
        [n.prediction.predicted_us for n in again.nodes]
    for r in model.buffer_regions():  # something the analysis would overwrite everywhere
        model.arena[r.base: r.base + r.size] = np.arange(r.size, dtype=np.float32) % 7
    before = model.arena.copy()
    predict_step(model, find_device("h200"), FED)
    assert np.array_equal(model.arena, before)


def test_beside_sets_each_dispatch_beside_its_prediction(sample):
    model, report = sample
    measured = [1e-6 * (i + 1) for i in range(len(model.nodes))]  # node i took i+1 us
    sol = beside(measured, report, fake_gpu("NVIDIA A100-SXM4-80GB"), report.device,
                 "--device", repeats=3)
    assert [n["node"] for n in sol["nodes"]] == [n.full_name for n in model.nodes]
    for i, (row, cost) in enumerate(zip(sol["nodes"], report.nodes)):
        assert row["measured_us"] == pytest.approx(i + 1)
        assert row["predicted_us"] == cost.prediction.predicted_us
        assert row["bound"] == cost.prediction.bound
        assert row["ratio"] == pytest.approx((i + 1) / cost.prediction.predicted_us)
        assert row["kernel"] == model.nodes[i].target
    by_kernel = report.by_kernel()
    assert {k["kernel"] for k in sol["kernels"]} == set(by_kernel)
    for k in sol["kernels"]:
        mine = [i + 1 for i, n in enumerate(model.nodes) if n.target == k["kernel"]]
        assert k["nodes"] == len(mine) and k["measured_us"] == pytest.approx(sum(mine))
        assert k["predicted_us"] == pytest.approx(by_kernel[k["kernel"]]["predicted_us"])
        assert k["bound"] == by_kernel[k["kernel"]]["bound"]
        assert k["ratio"] == pytest.approx(k["measured_us"] / k["predicted_us"])
    assert [k["measured_us"] for k in sol["kernels"]] == \
        sorted((k["measured_us"] for k in sol["kernels"]), reverse=True)
    n = len(model.nodes)
    assert sol["measured_us_per_token"] == pytest.approx(n * (n + 1) / 2)
    assert sol["predicted_us_per_token"] == pytest.approx(report.total_us)
    assert sum(k["measured_share"] for k in sol["kernels"]) == pytest.approx(1.0)
    assert sol["same_chip"] and sol["predicted_for"] == "a100" and sol["repeats"] == 3
    assert sol["measured_on"] == "NVIDIA A100-SXM4-80GB" and sol["device"]["key"] == "a100"
    assert sol["position"] == len(FED) - 1 and sol["token"] == FED[-1]
    json.dumps(sol)  # the report's JSON takes it as it is


def test_the_report_says_what_the_ratios_mean(sample):
    model, report = sample
    measured = [1e-5] * len(model.nodes)

    def said(g):
        sol = beside(measured, report, g, report.device, "--device")
        return "\n".join(caveats(sol)), sol
    text, sol = said(fake_gpu("NVIDIA A100 80GB PCIe"))
    assert "is the device predicted for" in text and sol["same_chip"]
    text, sol = said(fake_gpu("NVIDIA H200"))
    assert "a different chip" in text and not sol["same_chip"]
    assert "measured on:   NVIDIA H200 (Vulkan)" in text
    assert "predicted for: NVIDIA A100 80GB SXM [a100, --device]" in text
    text, _ = said(fake_gpu("llvmpipe (LLVM 15.0.6, 256 bits)", software=True))
    assert "software adapter" in text and "means little" in text
    assert "different chip" not in text
    text, _ = said(fake_gpu(timestamps=False))
    assert "includes its submission's host overhead" in text
    assert "median of 5 runs of the step at position 2 (token 11)" in text
    assert "a prediction, not a measurement" in text
    lines = render_beside(sol, top=4)
    header = next(i for i, ln in enumerate(lines) if ln.startswith("node "))
    assert "measured/predicted" in lines[header]
    assert len([ln for ln in lines[header + 2:] if ln and not ln.startswith(" ")]) == 4
    assert f"... {len(model.nodes) - 4} more" in lines[-1]


def test_retiming_the_last_step_keeps_the_machine_where_it_was(gpu):
    from firscope.gpu import GpuMachine
    model = load_model(SEED_FIR)
    machine = GpuMachine(model, gpu=gpu)
    machine.reset()
    for t in FED:
        machine.step(t)
    logits = machine.runner.download(model.outputs["logits"])
    with pytest.raises(ValueError):
        retime_last_step(GpuMachine(model, gpu=gpu), 2)  # nothing has run there
    seconds = retime_last_step(machine, 3)
    assert len(seconds) == len(model.nodes) and all(s >= 0 for s in seconds)
    assert sum(seconds) > 0
    assert machine.position == len(FED) and machine.history == FED
    # the same step again rewrites the same values: the logits are the step's own
    assert np.array_equal(machine.runner.download(model.outputs["logits"]), logits)


def test_profile_engine_gpu_sets_every_dispatch_beside_the_device_named(gpu, tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    r = firscope("profile", SEED_FIR, "--engine", "gpu", "--tokens", "3,7", "-n", "2",
                 "--device", "a100", "-o", tmp_path / "p", env=env)
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "p" / "gpu-profile.json").read_text())
    sol = data["speed_of_light"]
    assert data["speed_of_light_error"] is None
    assert sol["predicted_for"] == "a100" and sol["chosen_by"] == "--device"
    assert sol["measured_on"] == gpu.name and sol["software_adapter"] == gpu.is_software
    model = load_model(SEED_FIR)
    assert [n["node"] for n in sol["nodes"]] == [n.full_name for n in model.nodes]
    fed = data["fed"]
    assert len(fed) == 3 and sol["position"] == 2 and sol["token"] == fed[-1]
    independent = analyse_position(model, find_device("a100"), fed)
    for row, cost in zip(sol["nodes"], independent.nodes):
        assert row["predicted_us"] == pytest.approx(cost.prediction.predicted_us)
        assert row["bound"] == cost.prediction.bound
        assert row["measured_us"] >= 0
        assert row["ratio"] == pytest.approx(row["measured_us"] / row["predicted_us"])
    assert sol["measured_us_per_token"] > 0
    text = (tmp_path / "p" / "gpu-profile.txt").read_text()
    for shown in (r.stdout, text):
        assert f"measured on:   {gpu.name}" in shown
        assert "predicted for: NVIDIA A100 80GB SXM [a100, --device]" in shown
        assert ("means little" in shown) == gpu.is_software
    assert all(n["node"] in text for n in sol["nodes"])  # the file has every node instance
    assert "more in gpu-profile.txt" in r.stdout


def test_profile_engine_gpu_refuses_an_unknown_device_before_the_run(gpu, tmp_path):
    r = firscope("profile", SEED_FIR, "--engine", "gpu", "--tokens", "3", "--device", "h2000",
                 "-o", tmp_path / "p", env={"XDG_CONFIG_HOME": str(tmp_path / "c")})
    assert r.returncode == 1
    assert r.stderr.strip().startswith("firscope: unknown device 'h2000': did you mean")
    assert "Traceback" not in r.stderr and not list((tmp_path / "p").glob("gpu-profile*"))


def test_a_failed_analysis_keeps_the_measurement(gpu, tmp_path, monkeypatch, capsys):
    import firscope.gpu.commands as commands
    from firscope.cli import main

    def refuse(*a, **k):
        raise FirError("no analysis today")
    monkeypatch.setattr(commands, "predict_step", refuse)
    code = main(["profile", str(SEED_FIR), "--engine", "gpu", "--tokens", "3", "-n", "1",
                 "-o", str(tmp_path / "p")])
    out = capsys.readouterr().out
    assert code == 0
    assert "no speed-of-light prediction: the cost analysis failed: no analysis today" in out
    data = json.loads((tmp_path / "p" / "gpu-profile.json").read_text())
    assert data["speed_of_light"] is None and "no analysis today" in data["speed_of_light_error"]
    assert data["gpu_ms_per_token"] > 0


def test_the_benchmark_sets_the_rounds_median_beside_the_prediction(sample, capsys, monkeypatch):
    """benchmarks/gpu.py's table from what its children report, as on an H200 (a hardware
    adapter that is the device predicted for): nothing of lavapipe is assumed."""
    import importlib.util

    from conftest import REPO
    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "benchmarks" / "gpu.py")
    bench = importlib.util.module_from_spec(spec)
    # The script puts benchmarks/ first on sys.path for its own imports; left there, its
    # modules shadow installed packages of the same name in every later test.
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec.loader.exec_module(bench)
    model, report = sample
    h200 = find_device("h200")
    report = predict_step(model, h200, FED)
    seconds = [2e-6] * len(model.nodes)
    sol = beside(seconds, report, fake_gpu("NVIDIA H200"), h200, "the adapter's own profile")
    rounds = []
    for scale in (1.0, 3.0, 2.0):  # per-kernel medians: the 2.0 round's
        kernel_us = {}
        for n in model.nodes:
            kernel_us[n.target] = kernel_us.get(n.target, 0.0) + 2.0 * scale
        rounds.append({"kernel_us": kernel_us, "position": len(FED) - 1,
                       "gpu_ms_per_token": 2e-3 * scale * len(model.nodes)})
    rounds[0]["speed_of_light"] = sol
    bench.kernels(rounds)
    out = capsys.readouterr().out
    assert "is the device predicted for" in out and "means little" not in out
    assert "different chip" not in out
    predicted = {k["kernel"]: k["predicted_us"] for k in sol["kernels"]}
    for kernel, pred in predicted.items():
        count = sum(n.target == kernel for n in model.nodes)
        row = next(ln.split() for ln in out.splitlines() if ln.split()[:1] == [kernel])
        assert float(row[1]) == pytest.approx(4.0 * count, abs=0.01)
        assert float(row[-1]) == pytest.approx(4.0 * count / pred, abs=0.01)
