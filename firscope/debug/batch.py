"""``firscope debug``: gdb-style batch mode, commands from -x SCRIPT or stdin.

Like ``gdb -batch -x``, the script stops at the first command that fails
(``keep_going`` runs the rest) and the exit status is 1 when any command
failed. Commands are read one line at a time, split at ``\\n`` only (as the
model loader numbers lines), with a cap on the length of a line and on the
whole input: ``-x /dev/zero`` or an endless pipe is an error, not a machine
out of memory. Everything written is escaped for the terminal: commands
echo the script, and results show names and text from the model's files.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import IO, Iterator

from ..defaults import DEFAULT_ENGINE, DEFAULT_STEPS
from ..errors import FirError
from ..runtime.opening import RunInput, check_steps
from ..text import printable
from .commands import CommandInterpreter
from .opening import open_session

MAX_SCRIPT_BYTES = 4 * 1024 * 1024
MAX_LINE_BYTES = 64 * 1024


def script_lines(stream: IO, source: str, *, max_line: int = MAX_LINE_BYTES,
                 max_total: int = MAX_SCRIPT_BYTES) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line of ``stream`` (binary or text), read lazily."""
    total = 0
    number = 0
    while True:
        raw = stream.readline(max_line + 1)
        if not raw:
            return
        if isinstance(raw, str):  # a text stream (tests, an embedding program)
            raw = raw.encode("utf-8", errors="surrogateescape")
        number += 1
        total += len(raw)
        if len(raw) > max_line:
            raise FirError(f"{source}:{number}: a line of more than {max_line} bytes: not a "
                           "command script")
        if total > max_total:
            raise FirError(f"{source}:{number}: more than {max_total} bytes of commands")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FirError(f"{source}:{number}:{e.start + 1}: not UTF-8 text") from None
        yield number, text.rstrip("\n").rstrip("\r")


def _open_script(path: Path) -> IO[bytes]:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise FirError(f"{printable(path)}: no such file") from None
    except IsADirectoryError:
        raise FirError(f"{printable(path)}: is a folder, expected a command script") from None
    except OSError as e:
        raise FirError(f"{printable(path)}: cannot read script: {e.strerror}") from None
    except ValueError:  # a NUL in the name
        raise FirError(f"{printable(path)}: not a usable file name") from None


def run_batch(source: RunInput, *, n: int = DEFAULT_STEPS, engine: str = DEFAULT_ENGINE,
              script: str | Path | None = None, keep_going: bool = False,
              against: str | Path | None = None,
              out: IO[str] | None = None, stdin: IO | None = None) -> int:
    """Run the commands of ``script`` (or ``stdin``) on ``source``; 1 if any failed.

    ``against``: a dump every node is compared with as the session runs it (``break
    diverge``, ``info diff``); without a prompt the session is fed the dump's tokens."""
    out = out or sys.stdout
    check_steps(n)
    if source.prompt is None and source.tokens is None and against is None:
        raise FirError("give the prompt: --prompt TEXT or --tokens IDS")
    # The script is opened first: a wrong name is reported before the model loads.
    if script is not None:
        stream = _open_script(Path(script))
        name = printable(script)
    else:
        stream = stdin if stdin is not None else sys.stdin
        stream = getattr(stream, "buffer", stream)
        name = "<stdin>"
    with stream if script is not None else contextlib.nullcontext(stream):  # stdin stays open
        session, ci = open_session(source, n=n, engine=engine, against=against)
        return _run_lines(ci, script_lines(stream, name), name, out, keep_going,
                          header=f"firscope debug: {session.model.path.name}, "
                                 f"{len(session.prompt)} prompt tokens, {n} to generate, "
                                 f"{len(session.nodes)} nodes per token")


def _run_lines(ci: CommandInterpreter, lines, name: str, out: IO[str], keep_going: bool,
               header: str) -> int:
    def emit(text: str) -> None:
        print(printable(text, newlines=True), file=out)

    emit(header)
    emit(ci.where_line())
    errors = 0
    try:
        for number, line in lines:
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            emit(f"(firscope) {text}")
            try:
                result = ci.execute(text)
            except FirError as e:
                errors += 1
                emit(f"{name}:{number}: error: {e}")
                if not keep_going:
                    emit(f"{name}: stopped at the first error (--keep-going runs the rest)")
                    break
                continue
            if result:
                emit(result)
            if ci.quit:
                break
    finally:
        out.flush()
    return 1 if errors else 0
