"""One owner for the engines (issue 44.6): what each engine can do is declared once
(firscope/engines.py), every front end reads it, and one constructor builds a machine for
any engine."""
from __future__ import annotations

import pytest

from conftest import SEED_FIR
from firscope.engines import ENGINE_SPECS, ENGINES, STEPPING_ENGINES, make_machine, \
    require_stepping
from firscope.errors import FirError
from firscope.runtime import Machine, load_model
from model_util import firscope


def test_the_engine_lists_every_front_end_reads_come_from_the_table():
    import firscope.defaults as d
    assert d.ENGINES == ENGINES == ("compiled", "interp", "gpu")
    assert d.STEPPING_ENGINES == STEPPING_ENGINES == ("compiled", "interp")
    assert all(ENGINE_SPECS[e].why_not for e in ENGINES if e not in STEPPING_ENGINES)
    from firscope.gpu import NO_STEPPING
    assert NO_STEPPING == ENGINE_SPECS["gpu"].why_not


def test_one_constructor_builds_a_machine_for_each_reference_engine():
    model = load_model(SEED_FIR)
    for engine in STEPPING_ENGINES:
        m = make_machine(model, engine, budget=1000)
        assert type(m) is Machine and m.engine == engine and m.budget == 1000
    with pytest.raises(FirError) as e:
        make_machine(model, "cuda")
    assert str(e.value) == "unknown engine 'cuda': one of compiled, interp, gpu"


def test_the_gpu_engine_comes_from_the_same_constructor(tmp_path):
    from gpu_util import device_or_skip
    gpu = device_or_skip()
    from firscope.gpu import GpuMachine
    model = load_model(SEED_FIR)
    m = make_machine(model, "gpu", gpu=gpu, page_cap=200 << 10)
    assert isinstance(m, GpuMachine) and len(m.runner.layout.pages) > 1


def test_a_command_that_stops_inside_kernels_refuses_an_engine_that_cannot_in_its_words():
    with pytest.raises(FirError) as e:
        require_stepping("gpu", "debug")
    assert str(e.value).startswith("debug --engine gpu: the GPU engine cannot stop at an "
                                   "instruction")
    require_stepping("interp", "debug")  # no error
    for command in ("debug", "sanitize"):
        r = firscope(command, SEED_FIR, "--engine", "gpu", "--tokens", "1")
        assert r.returncode == 1 and "Traceback" not in r.stderr
        assert r.stderr.startswith(f"firscope: {command} --engine gpu: the GPU engine "
                                   "cannot stop at an instruction"), r.stderr
