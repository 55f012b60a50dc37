"""Fuzz generators and judges for issue 39's surfaces (benchmarks/fuzz.py runs them by the
thousand; tests/test_fuzz.py a few under hypothesis):

* ``gpuloop``: a one-lane kernel with long loops (trip counts around and above 65535,
  nested, runaway) on the GPU engine and on the reference: the same value, or a fault
  that says the driver ended a loop, or the same budget stop; never another value;
* ``devices``: a devices.toml with hostile figures, names and nesting: a positioned
  FirError, or a cost report whose every figure is finite and whose JSON is strict;
* ``outputs``: ``save breakpoints``, ``capture -o`` and ``run --logits-out`` aimed at
  new names, files firscope did not write, links, folders, devices and the run's own
  inputs: written only where allowed, and nothing else changed;
* ``dapauth``: a ``dap --port`` session with no, a wrong, an empty, a non-text or the
  right token: nothing but ``initialize`` is answered until the right one comes.
"""
from __future__ import annotations

import io
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np

from fuzzing import DECODED, ESCAPE, FIRERROR, run_cli_case
from firscope.errors import BudgetExceeded, FirError, FirFault

# -- GPU kernels with long loops ----------------------------------------------------------
TRIP_COUNTS = (1, 255, 65534, 65535, 65536, 70000, 100000, 1e30)


def gpu_loop_kernel(pick) -> tuple[str, float | None]:
    """(kernel text, the value it stores when it finishes: None for a runaway)."""
    outer = TRIP_COUNTS[pick(len(TRIP_COUNTS))]
    nested = pick(3) == 0
    inner = (1, 2, 300, 1000)[pick(4)] if nested else 1
    if nested and outer > 1000 and outer != 1e30:
        outer = (50, 70, 300, 1000)[pick(4)]
    lines = [f"loadconstf32 15 {outer:g}", f"loadconstf32 14 {inner}", "loadconstf32 1 0",
             "forbegin 15"]
    lines += ["forbegin 14", "addconst 1 1 1", "forend"] if nested else ["addconst 1 1 1"]
    lines += ["forend", "uconst 0 0", "ustoref32 1 0 @out0"]
    src = "kernel k in=0 out=1 threads=1 tg=1 tgbytes=0\n" + "\n".join(lines) + "\nendkernel\n"
    total = outer * inner
    return src, (None if total > 2 ** 24 else float(total))


def gpu_loop_case(gpu, pick, budget: int = 1_000_000):
    from gpu_util import both
    src, want = gpu_loop_kernel(pick)
    try:
        ref, got, regions = both(src, {}, {"out0": 1}, gpu=gpu, budget=budget)
    except Exception as e:  # noqa: BLE001 - a finding
        return ESCAPE, e
    if isinstance(ref, Exception):
        if isinstance(ref, BudgetExceeded) and (isinstance(got, BudgetExceeded) or (
                isinstance(got, FirFault) and "the GPU driver ended" in str(got))):
            return FIRERROR, None  # a runaway; the GPU may stop at the driver's limit first
        return ESCAPE, AssertionError(f"reference {ref!r} but GPU {got!r}: {src}")
    value = ref[regions["out0"].base]
    if want is not None and value != want:
        return ESCAPE, AssertionError(f"the reference stored {value}, not {want}")
    if isinstance(got, FirFault) and "the GPU driver ended lane 0's loop" in str(got):
        return FIRERROR, None  # refused, saying why: right
    if isinstance(got, Exception):
        return ESCAPE, AssertionError(f"the GPU raised {got!r} where the reference stored "
                                      f"{value}: {src}")
    if got[regions["out0"].base] != value:
        return ESCAPE, AssertionError(f"the GPU stored {got[regions['out0'].base]}, the "
                                      f"reference {value}, and nothing said so: {src}")
    return DECODED, None


# -- devices.toml ------------------------------------------------------------------------------
HOSTILE_NUMBERS = ("1e308", "-1e308", "5e-324", "1e-320", "0", "-0.0", "-1", "nan", "inf",
                   "-inf", "1.7976931348623157e308", "9" * 40, "1", "0.5", "2.5", "true",
                   '"x"', "[]", "{}", "1e-3", "100000", "1e6", "3.4e38")
HOSTILE_NAMES = ('"\\u0000default"', '"a b"', '"\\u001b[31m"', '""', "mine", '"x.y"',
                 '"' + "n" * 80 + '"', '"ünï"')


def devices_text(pick, base: dict) -> str:
    """A devices.toml: the shipped a100's figures with a few made hostile, a hostile table
    name now and then, deep nesting or an unknown field."""
    figures = {k: repr(v) if isinstance(v, float) else str(v) for k, v in base.items()}
    for _ in range(pick(4)):  # none at all now and then: a valid file
        key = sorted(figures)[pick(len(figures))]
        figures[key] = HOSTILE_NUMBERS[pick(len(HOSTILE_NUMBERS))]
    name = "mine" if pick(3) else HOSTILE_NAMES[pick(len(HOSTILE_NAMES))]
    body = "\n".join(f"{k} = {v}" for k, v in figures.items())
    text = f"default = {json.dumps(name.strip(chr(34)))}\n[{name}]\nname = \"fuzz\"\n{body}\n"
    extra = pick(8)
    if extra == 0:
        depth = 10 + pick(6000)
        text += "deep = " + "[" * depth + "]" * depth + "\n"
    elif extra == 1:
        text += "clock_mhz = 1500\n"
    elif extra == 2:
        text = text.replace("\n", "\r\n")
    return text


def devices_case(model, folder: Path, pick):
    """A hostile devices.toml read and used for a cost analysis of one step."""
    from firscope.cost.analyze import analyse_position
    from firscope.cost.devices import SHIPPED, find_device, load_devices, read_file
    from firscope.cost.render import render
    shipped, _ = read_file(SHIPPED)
    base = {k: v for k, v in shipped["a100"].as_dict().items()
            if k not in ("key", "name", "sources", "origin")}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "devices.toml"
    path.write_text(devices_text(pick, base), encoding="utf-8")
    try:
        devices = load_devices(user=path)
        device = find_device(None, devices)
        report = analyse_position(model, device, [3, 7], engine="interp")
        doc = json.dumps(report.as_dict(), allow_nan=False,
                         default=lambda v: v.item() if hasattr(v, "item") else str(v))
        text = render(report)
    except FirError as e:
        s = str(e)
        if str(path) not in s and "unknown device" not in s:
            return ESCAPE, AssertionError(f"an error that does not name the file: {s}")
        return FIRERROR, None
    except Exception as e:  # noqa: BLE001 - ValueError from allow_nan included
        return ESCAPE, e
    numbers = []
    _floats(json.loads(doc), numbers)
    if not all(math.isfinite(x) for x in numbers):
        return ESCAPE, AssertionError("a figure that is not finite")
    if " inf " in text or "nan" in text.split():
        return ESCAPE, AssertionError(f"inf or nan in the table: {text[:300]}")
    return DECODED, None


def _floats(v, out: list) -> None:
    if isinstance(v, dict):
        for x in v.values():
            _floats(x, out)
    elif isinstance(v, list):
        for x in v:
            _floats(x, out)
    elif isinstance(v, float):
        out.append(v)


# -- output paths of save breakpoints, capture -o and --logits-out ------------------------------
OUTPUT_TARGETS = ("new", "victim", "link_to_victim", "dangling_link", "folder", "dev_null",
                  "own_fir", "own_config", "own_checkpoint", "previous", "link_to_folder",
                  "under_a_file")


def prepare_outputs(folder: Path, sample: Path) -> dict[str, bytes]:
    """The scene: a copy of the model (the run's own inputs), a victim file, links; returns
    every file's bytes that must not change."""
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "m").mkdir(parents=True)
    for name in ("gpt2.fir", "config.json", "model.safetensors"):
        shutil.copy(sample / name, folder / "m" / name)
    (folder / "victim").write_text("precious")
    (folder / "elsewhere").mkdir()  # only a link points here: nothing may appear in it
    (folder / "emptydir").mkdir()  # an empty folder: capture may fill it
    (folder / "link").symlink_to(folder / "victim")
    (folder / "dangling").symlink_to(folder / "nowhere")
    (folder / "dirlink").symlink_to(folder / "elsewhere")
    return {str(p): p.read_bytes() for p in (folder / "victim", folder / "m" / "gpt2.fir",
                                             folder / "m" / "config.json",
                                             folder / "m" / "model.safetensors")}


def output_target(kind: str, folder: Path, command: str) -> str:
    previous = {"save": "prev.gdb", "logits": "prev.npy", "capture": "prev_case"}[command]
    return str({
        "new": folder / "out_new", "victim": folder / "victim", "link_to_victim": folder / "link",
        "dangling_link": folder / "dangling", "folder": folder / "emptydir",
        "dev_null": Path("/dev/null"), "own_fir": folder / "m" / "gpt2.fir",
        "own_config": folder / "m" / "config.json",
        "own_checkpoint": folder / "m" / "model.safetensors", "previous": folder / previous,
        "link_to_folder": folder / "dirlink", "under_a_file": folder / "victim" / "x",
    }[kind])


def outputs_case(folder: Path, sample: Path, pick):
    """One of the three commands aimed at one hostile target; nothing but the target (when
    allowed) may change, a link stays a link, nothing is written where a link points."""
    keep = prepare_outputs(folder, sample)
    command = ("save", "logits", "capture")[pick(3)]
    kind = OUTPUT_TARGETS[pick(len(OUTPUT_TARGETS))]
    if kind == "previous":  # a file this command wrote before: it may be replaced
        _make_previous(command, folder)
    target = output_target(kind, folder, command)
    model = str(folder / "m" / "gpt2.fir")
    if command == "save":
        argv = ["debug", model, "--engine", "interp", "--tokens", "3", "-n", "1"]
        stdin = f"break attention\nsave breakpoints {target}\n"
    elif command == "logits":
        argv = ["run", model, "--engine", "interp", "--tokens", "3", "-n", "1",
                "--logits-out", target]
        stdin = ""
    else:
        argv = ["capture", model, "--engine", "interp", "--node", "attention@0", "--step", "0",
                "--tokens", "3", "-o", target]
        stdin = ""
    outcome, detail = run_cli_case(argv, folder, stdin_text=stdin)
    problems = []
    for path, data in keep.items():
        if Path(path).read_bytes() != data:
            problems.append(f"{Path(path).name} changed")
    for link in ("link", "dangling", "dirlink"):
        if not (folder / link).is_symlink():
            problems.append(f"the link {link} was replaced")
    if os.listdir(folder / "elsewhere"):
        problems.append("something was written where a link points")
    if command != "capture" and os.listdir(folder / "emptydir"):
        problems.append("something was written into a folder given as a file name")
    if not os.path.exists("/dev/null") or os.path.isfile("/dev/null"):
        problems.append("/dev/null was replaced")
    if outcome != ESCAPE and problems:
        return ESCAPE, AssertionError(f"{command} -> {kind}: {'; '.join(problems)}")
    return outcome, detail


def _make_previous(command: str, folder: Path) -> None:
    if command == "save":
        (folder / "prev.gdb").write_text("# firscope breakpoints (load with: source FILE)\n"
                                         "break ln1\n")
    elif command == "logits":
        buf = io.BytesIO()
        np.save(buf, np.zeros((1, 4), np.float32))
        (folder / "prev.npy").write_bytes(buf.getvalue())
    else:
        (folder / "prev_case").mkdir()


# -- DAP over TCP: the token ---------------------------------------------------------------------
TOKEN_KINDS = ("none", "wrong", "empty", "number", "prefix", "right", "right_then_more")


def dap_auth_case(port: int, token: str, kind: str, private: Path, victim: Path):
    """A session that launches ``private`` (a file whose first line must never be shown)
    with a token of ``kind``, then asks to save breakpoints over ``victim``."""
    import socket
    from fuzzing_io import _msg, _responses
    given = {"none": None, "wrong": "x" * len(token), "empty": "", "number": 12345,
             "prefix": token[:-1], "right": token, "right_then_more": token + "x"}[kind]
    args = {"model": str(private)}
    if given is not None:
        args["token"] = given
    data = (_msg(1, "initialize", adapterID="fuzz")
            + _msg(2, "setFunctionBreakpoints", breakpoints=[{"name": "attention"}])
            + _msg(3, "launch", **args)
            + _msg(4, "evaluate", expression=f"save breakpoints {victim}", context="repl")
            + _msg(5, "disconnect"))
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        s.close()
        answers = {m["command"]: m for m in _responses(got) if m.get("type") == "response"}
    except Exception as e:  # noqa: BLE001 - a finding
        return ESCAPE, e
    text = got.decode("utf-8", "replace")
    problems = []
    if kind != "right" and "first line of a private file" in text:
        problems.append("the private file's first line was shown")
    if victim.read_text() != "IMPORTANT\n":
        problems.append("the victim file was written")
    launch = answers.get("launch")
    if launch is None:
        problems.append("no answer to launch")
    elif kind == "right":
        if "needs the token" in launch.get("message", ""):
            problems.append("the right token was refused")
    else:
        if launch.get("success") or "needs the token" not in launch.get("message", ""):
            problems.append(f"a launch with a {kind} token was not refused: {launch}")
        if "evaluate" in answers:
            problems.append("a request after the refused launch was answered")
    if problems:
        return ESCAPE, AssertionError(f"{kind}: {'; '.join(problems)}")
    return (DECODED if kind == "right" else FIRERROR), None
