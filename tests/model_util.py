"""Helpers the model-loading and trust tests share: a load that must fail, a line number
as an editor counts it, and the CLI in a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO
from firscope.errors import FirError
from firscope.runtime import load_model


def load_err(path, **kw) -> FirError:
    """The FirError loading ``path`` raises (the test fails if it loads)."""
    with pytest.raises(FirError) as e:
        load_model(path, **kw)
    return e.value


def line_of(text: str, needle: str, start: int = 0) -> int:
    """The 1-based line of ``needle`` at or after 0-based line ``start``, counting lines at
    \\n only, as the loader and editors do."""
    return next(i + 1 for i, line in enumerate(text.split("\n")) if i >= start and needle in line)


def firscope(*args, env=None, timeout=120):
    """``python -m firscope ARGS`` from the repo, output captured as text."""
    return subprocess.run([sys.executable, "-m", "firscope", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, **(env or {})})


def scale_bug_dump(fir, folder, tokens):
    """A copy of ``fir`` with a wrong attention scale (1/headdim, not 1/sqrt(headdim)), run on
    ``tokens`` by the interpreter and dumped: attention@0 diverges at step 1."""
    from firscope.compare.record import DumpRecorder
    from firscope.runtime import Machine
    buggy = fir.parent / "bug.fir"
    buggy.write_text(fir.read_text().replace("mulconst 3 3 1/sqrt(headdim)",
                                             "mulconst 3 3 1/headdim"))
    mach = Machine(load_model(buggy), engine="interp")
    out = folder / "bug.safetensors"
    rec = DumpRecorder(mach, out, steps=len(tokens))
    mach.reset()
    for t in tokens:
        mach.step(t)
    rec.close()
    return out
