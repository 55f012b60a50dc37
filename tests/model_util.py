"""Helpers the model-loading and trust tests share: a load that must fail, a line number
as an editor counts it, and the command line (in this process, or in a fresh one)."""
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


def firscope(*args, env=None, cwd=REPO, input=None, timeout=120, fresh=False):
    """``firscope ARGS`` with its exit status and output as text (a CompletedProcess).

    By default it runs in this process: ``firscope.cli.main``, what ``python -m firscope``
    runs, less the interpreter's start, NumPy's and numba's imports and the kernels'
    first dispatch (0.5-1.5 s a call; the suite makes ~200 such calls). A fresh
    ``python -m firscope`` runs it where the test needs a process of its own: ``fresh=True``
    (a hang must end in ``timeout``; the interpreter's exit and signals), or an ``env`` (read
    as a process starts). tests/test_cli.py keeps the entry point itself under test in
    fresh processes."""
    argv = [str(a) for a in args]
    if fresh or env:
        return subprocess.run([sys.executable, "-m", "firscope", *argv], input=input,
                              capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env={**os.environ, **(env or {})})
    return in_process(argv, cwd=cwd, input=input)


def in_process(argv: list[str], cwd=None, input: str | None = None):
    """``firscope.cli.main(argv)`` as a fresh process would see it: stdin holds ``input``
    (empty without it), stdout and stderr are pipes' encodings (UTF-8; surrogateescape and
    backslashreplace, as Python sets them under a UTF-8 locale) read back as
    ``subprocess.run(text=True)`` reads them (universal newlines), argparse lays its help
    out for 80 columns (a pipe's), Python's default warning filters apply and what they
    show is written to stderr (pytest would otherwise keep it), argparse's exit is the
    exit status, and the working directory is ``cwd`` for the call."""
    import contextlib
    import io
    import warnings
    from firscope.cli import main

    def pipe(errors):
        return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors=errors, newline=None,
                                write_through=True)

    def read(stream):
        stream.flush()
        return io.TextIOWrapper(io.BytesIO(stream.buffer.getvalue()), encoding="utf-8").read()

    out, err = pipe("surrogateescape"), pipe("backslashreplace")
    stdin = io.TextIOWrapper(io.BytesIO((input or "").encode()), encoding="utf-8")
    here = os.getcwd()
    with contextlib.ExitStack() as stack:
        shown = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.resetwarnings()  # a fresh interpreter's filters (the rest: "default"),
        for quiet in (ResourceWarning, ImportWarning, PendingDeprecationWarning,  # each put
                      DeprecationWarning):  # in front: the first in Python's list comes last
            warnings.filterwarnings("ignore", category=quiet)
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        old_stdin, sys.stdin = sys.stdin, stdin
        stack.callback(setattr, sys, "stdin", old_stdin)
        for k, v in (("COLUMNS", "80"), ("LINES", "24")):
            if k not in os.environ:
                os.environ[k] = v
                stack.callback(os.environ.pop, k, None)
        if cwd is not None:
            os.chdir(cwd)
            stack.callback(os.chdir, here)
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's usage errors and --help/--version
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
            if isinstance(e.code, str):
                print(e.code, file=err)
        for w in shown:
            err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno,
                                             w.line))
    return subprocess.CompletedProcess(["firscope", *argv], code, read(out), read(err))


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
