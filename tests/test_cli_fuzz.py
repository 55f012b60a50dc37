"""The command line under hostile values and output paths (issue 10.7, 10.13), in-process.

Every command line ends with exit 0, 1 or 2 and a clean message: no "internal
error", no traceback, no raw control character printed, no file written
through a link, nothing written beside the path given. The generators live in
tests/fuzzing.py; benchmarks/fuzz.py --only cli runs them by the thousand.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzzing as F
from conftest import write_random_gpt2

RANDOM = bool(os.environ.get("FIRSCOPE_FUZZ_RANDOM"))
BIG = st.integers(0, 10**6)


@pytest.fixture(scope="module")
def cli_scene(tmp_path_factory):
    base = tmp_path_factory.mktemp("clifuzz")
    model = write_random_gpt2(base / "model", n_layer=2, n_embd=32, n_head=4, n_positions=16,
                              vocab=64)
    script = base / "cmds.gdb"
    script.write_text("print 1+1\nnext\nbogus\nprint 2\n")
    return model, base / "out", script


def check(outcome, detail, argv):
    assert outcome in (F.DECODED, F.FIRERROR), f"{F.describe(detail)}\n{argv!r}"


@settings(max_examples=40, deadline=None, database=None, derandomize=not RANDOM,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["run", "run", "run", "debug", "check"]),
       picks=st.lists(st.tuples(BIG, BIG, BIG), min_size=1, max_size=4))
def test_hostile_command_lines_end_cleanly(cli_scene, command, picks):
    model, folder, script = cli_scene
    F.prepare_output_folder(folder)
    argv = F.cli_argv(command, str(model), picks, folder, script)
    check(*F.run_cli_case(argv, folder), argv)


@pytest.mark.parametrize("kind", F.OUTPUT_KINDS)
def test_logits_out_to_every_kind_of_path(cli_scene, kind):
    model, folder, script = cli_scene
    F.prepare_output_folder(folder)
    path = F.cli_output_path(kind, folder)
    argv = ["run", str(model), "--tokens", "1,2", "-n", "1", "--engine", "interp",
            "--logits-out", path]
    outcome, detail = F.run_cli_case(argv, folder)
    check(outcome, detail, argv)
    # the output rule (issue 23): a new name or a regular file; a link, a device or a FIFO
    # is refused before the run, whatever it points to; an existing file only when it is a
    # .npy (issue 39.4: the run's own model file was overwritten): "exists" is plain text
    ok = {"new", "no_npy", "dot_dot", "control_chars", "not_utf8"}
    assert (outcome == F.DECODED) == (kind in ok), (kind, outcome)
    if kind in ok:
        assert not os.path.islink(path)
        assert np.load(path).shape == (2, 64)
    elif kind in ("link_to_victim", "dangling_link"):
        assert os.path.islink(path), "a refused link is left as it was"


@pytest.mark.parametrize("kind", ["folder", "link_to_victim", "under_a_file", "proc", "empty",
                                  "control_chars"])
def test_profile_report_folder_kinds(cli_scene, kind):
    model, folder, script = cli_scene
    folder = folder.parent / f"profile-{kind}"  # a scene of its own: -o makes folders
    F.prepare_output_folder(folder)
    path = F.cli_output_path(kind, folder)
    argv = ["profile", str(model), "--tokens", "1", "-n", "1", "--engine", "interp", "-o", path]
    outcome, detail = F.run_cli_case(argv, folder)
    check(outcome, detail, argv)
    # a new or empty folder, or a previous report: "folder" holds other files, so refused
    assert (outcome == F.DECODED) == (kind == "control_chars"), (kind, detail)
