"""The differential-debugging docs do what they say (README worked example, dump-format.md).

The README's example is run as written: the foreign NumPy runtime with its
planted bug, `firscope diff`, then the debugger session; the standalone
20-line writer in docs/dump-format.md writes a file firscope reads.
"""
from __future__ import annotations

import io
import re
import subprocess
import sys

import numpy as np

from firscope.cli import main
from firscope.compare import Dump
from firscope.debug.batch import run_batch

from conftest import REPO

EXAMPLE = REPO / "docs" / "examples" / "numpy_runtime.py"


def _readme_block(after: str) -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(after)
    return text[start: text.index("```", start)]


def test_the_readme_example_finds_the_missing_head(tmp_path, capsys):
    dump = tmp_path / "mine.safetensors"
    p = subprocess.run([sys.executable, EXAMPLE, "--bug", "lasthead", dump],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    code = main(["diff", "--fir-f32", "--against", str(dump)])
    out = capsys.readouterr().out
    assert code == 1
    shown = _readme_block("$ firscope diff --fir-f32 --against mine.safetensors")
    for line in out.splitlines()[1:]:  # the first names the model by its absolute path
        if line.startswith(("first divergence:", "compared ", "attention@0/", "embeddings/",
                            "head/", "note:", "tokens:", "tolerance:")):
            assert line in shown, line
    assert "written by lane 3 at line 193" in out
    from firscope.runtime.opening import RunInput
    buf = io.StringIO()
    run_batch(RunInput(fir_f32=True), n=0, engine="compiled", against=str(dump), out=buf,
              stdin=io.StringIO("break diverge\ncontinue\ns\ninfo lanes R0\n"))
    shown = _readme_block("$ printf 'break diverge")
    for line in buf.getvalue().splitlines():
        assert line in shown, line


def test_the_example_without_a_bug_agrees(tmp_path, capsys):
    dump = tmp_path / "ok.safetensors"
    subprocess.run([sys.executable, EXAMPLE, dump], check=True, timeout=300)
    assert main(["diff", "--fir-f32", "--against", str(dump), "--engine", "interp"]) == 0
    assert "first divergence: none" in capsys.readouterr().out


def test_the_standalone_writer_in_the_docs_writes_a_dump(tmp_path):
    text = (REPO / "docs" / "dump-format.md").read_text()
    code = re.search(r"```python\n(# standalone dump writer\n.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) <= 30  # the "30-line snippet"
    scope: dict = {}
    exec(compile(code, "dump-format.md", "exec"), scope)
    values = {(0, "attention@1", "attn"): np.arange(6, dtype=np.float64).reshape(2, 3),
              (3, "head", "logits"): np.ones(4, np.float32)}
    scope["write_dump"](tmp_path / "d.safetensors", values, tokens=[7, 8], producer="docs")
    d = Dump(tmp_path / "d.safetensors")
    assert d.tokens == [7, 8] and d.producer == "docs"
    assert np.array_equal(d.read("step0/attention@1/attn"), np.arange(6, dtype=np.float32))
    assert d.entries["step3/head/logits"].dtype == "F32"


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _masked(line: str) -> str:
    """The line with every number replaced: the kernels' numerics may move the digits (another
    reduction order), not what the lines say."""
    return _NUMBER.sub("#", line)


def _session(block: str) -> list[tuple[str, list[str]]]:
    """The ``$ command`` lines of a README block (continuations joined), each with the output
    lines shown after it."""
    out: list[tuple[str, list[str]]] = []
    lines = block.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            cmd = line[2:]
            while cmd.endswith("\\"):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            out.append((cmd, []))
        elif out and line.strip():
            out[-1][1].append(line)
        i += 1
    return out


def _run_shown(block: str, cwd) -> list[tuple[str, list[str], str]]:
    """Run each command of a README block in ``cwd`` (``firscope`` as this interpreter's
    module, sample_models from the repo); (command, lines shown, output)."""
    runs = []
    for cmd, shown in _session(block):
        real = cmd.replace("firscope ", f"{sys.executable} -m firscope ").replace(
            "cp -r sample_models/", f"cp -r {REPO}/sample_models/")
        p = subprocess.run(["bash", "-c", real], cwd=cwd, capture_output=True, text=True,
                           timeout=600)
        assert "Traceback" not in p.stderr, (cmd, p.stderr)
        runs.append((cmd, shown, p.stdout))
    return runs


def test_the_readme_isolate_and_capture_example(tmp_path):
    runs = _run_shown(_readme_block("$ cp -r sample_models/tiny-gpt2 mine"), tmp_path)
    runs += _run_shown(_readme_block("$ firscope capture --node attention@0"), tmp_path)
    for cmd, shown, out in runs:
        got = {_masked(line) for line in out.splitlines()}
        for line in shown:
            if line != "...":
                assert _masked(line) in got, (cmd, line)
    iso = next(out for cmd, _, out in runs if "--isolate" in cmd)
    # what the figures say, derived rather than read off the README
    wrong = [line for line in iso.splitlines() if line.endswith(tuple(
        f"WRONG ON ITS OWN at step {s}" for s in range(4)))]
    assert {line.split("/")[0] for line in wrong} == {
        f"{k}@{i}" for k in ("attention", "gelu") for i in range(4)}
    assert "not judged" not in iso
    plain = subprocess.run([sys.executable, "-m", "firscope", "diff", "--against",
                            "all.safetensors"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=600).stdout
    first = next(line for line in plain.splitlines() if line.startswith("first divergence:"))
    assert ", gelu@0, output activated," in first
    text = (REPO / "README.md").read_text()
    n = re.search(r"\n(\d+) diverged\n", plain) or re.search(r"; (\d+) diverged\n", plain)
    assert f"names only `gelu@0` at step 0, and {n.group(1)} of" in " ".join(text.split())
    assert (tmp_path / "case" / "README").exists()
