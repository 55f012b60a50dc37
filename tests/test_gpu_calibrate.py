"""``firscope gpu --calibrate`` (issue 44.2): the adapter measured into a device profile of
its own, and ``profile --engine gpu`` setting each dispatch beside it, with the share of
the step's time the prediction has within 2x. Skipped, saying why, without wgpu or an
adapter."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from conftest import SEED_FIR
from firscope.cost.devices import NUMBERS, load_devices, read_file
from firscope.errors import FirError
from gpu_util import gpu  # noqa: F401 - gpu is a fixture
from model_util import firscope

MEASURED = ("launch_overhead_us", "dram_bandwidth_gbs", "f32_tflops", "alu_latency_cycles",
            "memory_latency_ns", "cache_latency_ns")


@pytest.fixture
def config(tmp_path, monkeypatch):
    """A user config folder of the test's own, holding a device and a default already."""
    root = tmp_path / "config"
    (root / "firscope").mkdir(parents=True)
    mine = root / "firscope" / "devices.toml"
    shipped = (load_devices()["a100"])
    text = ['default = "a100"', "", "# my own card", "[mycard]", 'name = "My card"']
    text += [f"{k} = {getattr(shipped, k)!r}" for k in NUMBERS]
    mine.write_text("\n".join(text) + "\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(root))
    return mine


def _calibrate(capsys, *extra):
    from firscope.cli import main
    code = main(["gpu", "--calibrate", "--quick", *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_calibrate_writes_a_profile_of_measured_figures_and_keeps_the_rest(gpu, config,
                                                                          capsys):
    from firscope.gpu.calibrate import profile_key
    code, out, err = _calibrate(capsys)
    assert code == 0, out + err
    key = profile_key(gpu)
    devices, default = read_file(config)
    assert default == "a100" and "mycard" in devices  # the user's lines stay
    assert "# my own card" in config.read_text()
    me = devices[key]
    assert me.name == gpu.name
    for k in MEASURED:
        v = getattr(me, k)
        assert math.isfinite(v) and v > 0, k
        said = me.sources[k]
        assert said.startswith("measured by firscope gpu --calibrate on "), (k, said)
        assert gpu.name in said
    for k in set(NUMBERS) - set(MEASURED) - {"simd_width"}:
        assert not me.sources[k].startswith("measured"), k  # from the base, saying so
    if "llvmpipe" in gpu.name.lower():  # 256-bit vectors: 8 f32 lanes a subgroup
        assert me.simd_width == 8 and me.sources["simd_width"].startswith("measured")
        assert "one per CPU thread" in me.sources["compute_units"]
    assert f"wrote device profile [{key}]" in out and "measuring read bandwidth" in out
    # again: the profile is replaced, not added twice
    code, out, err = _calibrate(capsys)
    assert code == 0, out + err
    text = config.read_text()
    assert text.count(f"[{key}]") == 1 and text.count(f"[{key}.sources]") == 1


def test_profile_engine_gpu_uses_the_calibrated_profile_and_says_the_share_within_2x(
        gpu, config, capsys, tmp_path):
    from firscope.gpu.calibrate import profile_key
    code, out, err = _calibrate(capsys)
    assert code == 0, out + err
    r = firscope("profile", SEED_FIR, "--engine", "gpu", "--tokens", "3,7", "-n", "1",
                 "-o", tmp_path / "p", env={"XDG_CONFIG_HOME": str(config.parents[1])})
    assert r.returncode == 0, r.stderr
    sol = json.loads((tmp_path / "p" / "gpu-profile.json").read_text())["speed_of_light"]
    assert sol["predicted_for"] == profile_key(gpu) == sol["device_key"]
    assert sol["chosen_by"] == "the adapter's own profile, by name" and sol["same_chip"]
    within = [n for n in sol["nodes"] if 0.5 <= n["ratio"] <= 2.0]
    share = sum(n["measured_us"] for n in within) / sum(n["measured_us"] for n in sol["nodes"])
    assert sol["within_2x_share"] == pytest.approx(share)
    assert sol["within_2x_nodes"] == len(within)
    assert (f"the prediction is within 2x for {share:.0%} of the step's measured time "
            f"({len(within)} of {len(sol['nodes'])} node instances)") in r.stdout


def test_a_device_lost_while_calibrating_writes_nothing(gpu, config, capsys, monkeypatch):
    from firscope.gpu import calibrate
    before = config.read_text()
    calls = []

    def failing(self, *a, **kw):
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("Device lost: the driver went away")
        return 1e-3
    monkeypatch.setattr(calibrate._Bench, "run", failing)
    code, out, err = _calibrate(capsys)
    assert code == 1
    assert err.strip().startswith("firscope: the GPU failed while calibrating: Device lost")
    assert "Traceback" not in err and "\n" not in err.strip()
    assert config.read_text() == before


def test_a_gpu_no_profile_matches_needs_a_base_named(gpu, config):
    from firscope.gpu import GpuError
    from firscope.gpu.calibrate import base_profile
    odd = dataclasses.replace(gpu, info={**gpu.info, "device": "Acme Graphix 9000",
                                         "adapter_type": "DiscreteGPU"})
    with pytest.raises(GpuError) as e:
        base_profile(odd, None)
    assert "no device profile matches the adapter 'Acme Graphix 9000': name the nearest " \
           "chip with --device NAME" in str(e.value)
    values, sources, what = base_profile(odd, "a100")
    assert what == "profile a100" and values["compute_units"] == 108
    assert sources["compute_units"].startswith("not measured: from profile a100 (NVIDIA A100")


def test_a_profile_the_parser_refuses_is_never_written(tmp_path):
    from firscope.gpu.calibrate import profile_text, write_profile
    dev = load_devices()["a100"]
    values = {k: getattr(dev, k) for k in NUMBERS}
    path = tmp_path / "devices.toml"
    path.write_text('default = "a100"\n')
    values["dram_bandwidth_gbs"] = 0.0  # a measurement that went wrong
    with pytest.raises(FirError) as e:
        write_profile(path, "x", profile_text("x", "X", values, {k: "s" for k in NUMBERS}))
    assert str(e.value) == ("the profile measured is not valid ('dram_bandwidth_gbs' of device "
                            f"'x' must be more than 0 (got 0.0)): nothing was written to {path}")
    assert path.read_text() == 'default = "a100"\n' and not list(tmp_path.glob("*.tmp"))


def test_the_calibrate_options_go_with_calibrate(capsys):
    from firscope.cli import main
    assert main(["gpu", "--device", "a100"]) == 2
    assert "--device, --key and --quick go with --calibrate" in capsys.readouterr().err


def test_a_bad_key_or_base_is_refused_before_anything_is_measured(gpu, config, capsys):
    before = config.read_text()
    code, out, err = _calibrate(capsys, "--key", "bad key")
    assert code == 2 and "measuring" not in out
    assert err.strip() == ("firscope: --key 'bad key': give a name of letters, digits, '_', "
                           "'.', '+' or '-'")
    code, out, err = _calibrate(capsys, "--device", "nosuch")
    assert code == 1 and err.startswith("firscope: unknown device 'nosuch'")
    assert config.read_text() == before
