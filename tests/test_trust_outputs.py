"""Issue 23: one rule for every output the user names (--dump, --logits-out, profile -o,
the UI's export), and the argument bounds checked before anything runs."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from firscope.cli import main
from firscope.errors import FirError


def _fs(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def _run(model, *extra):
    return ("run", model, "--tokens", "1", "-n", "1", "--engine", "interp", *extra)


@pytest.mark.parametrize("flag", ["--dump", "--logits-out"])
def test_an_output_through_a_link_is_refused_and_the_link_and_its_target_kept(
        random_model, tmp_path, capsys, flag):
    victim = tmp_path / "victim.npy"
    victim.write_text("precious")
    link = tmp_path / ("out.safetensors" if flag == "--dump" else "out.npy")
    link.symlink_to(victim)
    code, _, err = _fs(capsys, *_run(random_model, flag, link))
    assert code == 1 and "is a symbolic link" in err, err
    assert link.is_symlink() and victim.read_text() == "precious"


@pytest.mark.parametrize("flag", ["--dump", "--logits-out"])
def test_an_output_on_a_device_or_a_link_to_one_is_refused(random_model, tmp_path, capsys,
                                                           flag):
    link = tmp_path / "stdout.npz"
    link.symlink_to("/dev/null")  # what /dev/stdout is: a link to a device
    for target in (link, "/dev/null"):
        code, out, err = _fs(capsys, *_run(random_model, flag, target))
        assert code == 1, err
        assert "symbolic link" in err or "not a regular file" in err, err
    assert link.is_symlink() and os.readlink(link) == "/dev/null"
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_two_outputs_naming_one_file_are_refused_before_running(random_model, tmp_path,
                                                                capsys):
    (tmp_path / "sub").mkdir()
    same = tmp_path / "out.npz"
    for dump, logits in ((same, same), (same, tmp_path / "sub" / ".." / "out.npz")):
        code, out, err = _fs(capsys, *_run(random_model, "--dump", dump, "--logits-out", logits))
        assert code == 1 and "--dump and --logits-out name the same file" in err, err
        assert out == "" and not same.exists(), "refused before the run"
    os.link(random_model, tmp_path / "hard.fir")  # a hard link: one file, two names
    code, _, err = _fs(capsys, *_run(random_model, "--dump", random_model,
                                     "--logits-out", tmp_path / "hard.fir"))
    assert code == 1 and "name the same file" in err


def test_a_legal_long_dump_name_is_written(random_model, tmp_path, capsys):
    name = "d" * (252 - len(".npz")) + ".npz"  # 252 bytes: legal on every Linux fs
    code, _, err = _fs(capsys, *_run(random_model, "--dump", tmp_path / name,
                                     "--logits-out", tmp_path / ("l" * 248 + ".npy")))
    assert code == 0, err
    assert (tmp_path / name).stat().st_size > 0
    assert np.load(tmp_path / ("l" * 248 + ".npy")).shape[0] == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("value", ["9223372036854775808", "0", "-1", "10" * 20])
def test_budget_is_bounded_at_the_argument_parser(random_model, capsys, value):
    with pytest.raises(SystemExit) as e:
        main(["run", str(random_model), "--tokens", "1", "--budget", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --budget: must be 1..1000000000000000" in err, err


def test_budget_at_its_bound_runs_on_the_compiled_engine(random_model, capsys):
    code, _, err = _fs(capsys, "run", random_model, "--tokens", "1", "-n", "1",
                       "--budget", str(10 ** 15))
    assert code == 0, err


def test_profile_refuses_a_folder_of_other_files_before_profiling(random_model, tmp_path,
                                                                  capsys):
    out = tmp_path / "rep"
    out.mkdir()
    foreign = {"report.json": '{"mine": true}', "notes.txt": "keep me"}
    for name, text in foreign.items():
        (out / name).write_text(text)
    code, _, err = _fs(capsys, "profile", random_model, "--tokens", "1", "-n", "1",
                       "--engine", "interp", "-o", out)
    assert code == 1 and "holds files and no firscope report" in err, err
    assert {p.name: p.read_text() for p in out.iterdir()} == foreign
    assert "loading the model" not in err, "refused before profiling"


def test_profile_writes_over_its_own_previous_report(random_model, tmp_path, capsys):
    out = tmp_path / "rep"
    args = ("profile", random_model, "--tokens", "1", "-n", "1", "--engine", "interp",
            "-o", out)
    assert _fs(capsys, *args)[0] == 0
    (out / "my-notes.txt").write_text("mine")  # a user's file beside a report: left alone
    assert _fs(capsys, *args)[0] == 0
    assert json.loads((out / "report.json").read_text())["format"] == "firscope-profile"
    assert (out / "my-notes.txt").read_text() == "mine"


def test_the_ui_export_follows_the_same_folder_rule(random_model, tmp_path):
    from firscope.profile.report import check_report_folder
    from firscope.tui.jobs import export_session
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "report.json").write_text("{}")
    with pytest.raises(FirError, match="holds files and no firscope report"):
        export_session(None, None, foreign, None)  # refused before any work
    assert (foreign / "report.json").read_text() == "{}"
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FirError, match="is a symbolic link"):
        check_report_folder(linked)
    previous = tmp_path / "previous"
    previous.mkdir()
    (previous / "report.json").write_text('{"format": "firscope-profile"}')
    assert check_report_folder(previous) == previous
