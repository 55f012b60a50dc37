"""The argument rules ``diff --engine gpu`` shares with ``diff`` and ``run``: one --budget
check (runtime/opening.check_budget) and one account of where the tokens came from
(compare/command.given_tokens). The refusals run before any adapter is needed."""
from __future__ import annotations

import argparse
import json

import pytest

from conftest import SEED_FIR
from firscope.compare.command import given_tokens
from firscope.errors import FirError
from firscope.runtime.machine import DEFAULT_BUDGET
from firscope.runtime.opening import check_budget
from gpu_util import gpu  # noqa: F401 - gpu is a fixture


def test_check_budget_defaults_keeps_and_refuses():
    assert check_budget(None) == DEFAULT_BUDGET
    assert check_budget(1) == 1 and check_budget(12345) == 12345
    for bad in (0, -3):
        with pytest.raises(FirError, match=rf"--budget {bad}: must be at least 1 instruction"):
            check_budget(bad)


def _main(capsys, *argv):
    from firscope.cli import main
    code = main([*map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv", [
    ["diff", SEED_FIR, "--against", "nothing.safetensors"],  # before the dump is opened
    ["diff", SEED_FIR, "--engine", "gpu"],  # before the GPU is opened
    ["run", SEED_FIR, "--tokens", "3"],
])
def test_every_budget_refusal_is_the_same_line(capsys, argv):
    # the argument parser bounds --budget (1..10^15) for every command: a usage error
    with pytest.raises(SystemExit) as e:
        _main(capsys, *argv, "--budget", "0")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().endswith(
        "argument --budget: must be 1..1000000000000000 instructions (got '0')"), err
    assert "Traceback" not in err


def test_given_tokens_says_where_the_ids_came_from():
    def ids(args, model):
        return [5, 6], "unused"
    cases = [({"tokens": "5,6", "prompt": None}, "--tokens"),
             ({"tokens": None, "prompt": "hi"}, "--prompt"),
             ({"tokens": None, "prompt": ""}, "--prompt"),  # an empty prompt is still given
             ({"tokens": None, "prompt": None}, "the default prompt")]
    for given, said in cases:
        assert given_tokens(argparse.Namespace(**given), None, ids) == ([5, 6], said)


def test_the_gpu_diff_reports_where_its_tokens_came_from(gpu, capsys):
    code, out, err = _main(capsys, "diff", SEED_FIR, "--engine", "gpu", "--tokens", "3",
                           "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["tokens"] == [3] and report["tokens_from"] == "--tokens"
    code, out, err = _main(capsys, "diff", SEED_FIR, "--engine", "gpu", "--tokens", "3",
                           "--budget", "4")  # small enough that ln1@0 runs out
    assert code == 1
    assert "executed more than 4 instructions" in out
