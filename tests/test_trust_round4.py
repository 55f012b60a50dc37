"""Trust, fourth round (issue 39): each defect's reproducer, failing before its fix."""
from __future__ import annotations

import subprocess
import sys

import pytest

from probe_util import probe_model


def firscope(*args, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "firscope", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


# -- 1. the GPU engine never returns a loop the driver cut short -----------------------------
def test_a_gpu_run_whose_loop_a_driver_ends_early_exits_1_and_writes_no_dump(tmp_path):
    from gpu_util import device_or_skip
    device_or_skip()
    fir = probe_model(tmp_path, ["loadconstf32 15 70000", "loadconstf32 1 0", "forbegin 15",
                                 "addconst 1 1 1", "forend", "uconst 0 0", "ustoref32 1 0 @out0"])
    dump = tmp_path / "o.safetensors"
    done = firscope("run", fir, "--engine", "gpu", "--tokens", "3", "-n", "1", "--dump", dump)
    if done.returncode == 0:  # a driver without the limit: then the value must be right
        from safetensors.numpy import load_file
        assert load_file(str(dump))["step0/probe/mix"][0] == 70000.0
        return
    assert done.returncode == 1, done.stderr
    assert "the GPU driver ended lane 0's loop" in done.stderr and "70000 trips" in done.stderr
    assert f"{fir}:" in done.stderr and "Traceback" not in done.stderr
    assert not dump.exists()
