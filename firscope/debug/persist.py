"""``save breakpoints FILE`` and ``source FILE``, as gdb has them.

A saved file is a batch script: one command per breakpoint, watchpoint,
catchpoint or log point, as typed (``break attention@1 if R3 > 0``,
``watch lane 2 U4``, ``dprintf g2.attn_decode:156 "R3={R3}"``), followed by
``ignore $bpnum N`` / ``disable $bpnum`` where they apply, and one
``display EXPR`` per display. ``source FILE`` runs any such file a line at a
time through the command interpreter (``$bpnum`` is the number of the
breakpoint made last, as in gdb); it stops at the first line that fails and
names it ``FILE:LINE: message``. Commands that move execution are refused
there (the UI runs movements in a worker; ``firscope debug -x`` runs scripts
that move). The F2 reload of the UI keeps breakpoints as
the same commands (:meth:`~firscope.debug.breakpoints.Breakpoint.command`).
"""
from __future__ import annotations

from pathlib import Path

from ..errors import FirError
from ..text import printable

HEADER = "# firscope breakpoints (load with: source FILE)"


def save_lines(session, displays) -> tuple[list[str], list[str]]:
    """(the script's lines, a note per breakpoint that could not be saved)."""
    lines, skipped = [HEADER], []
    for bp in session.breakpoints:
        command = bp.command()
        if command is None:
            skipped.append(f"{bp.what} {bp.number} ({bp.spec}) is not saved: it needs what "
                           "the session was started with (--against); set it again")
            continue
        lines.append(command)
        if bp.ignore_count:
            lines.append(f"ignore $bpnum {bp.ignore_count}")
        if not bp.enabled:
            lines.append("disable $bpnum")
    lines += [f"display {expr.text}" for expr in displays]
    return lines, skipped


def save_command(ci, rest: str) -> str:
    """``save breakpoints FILE``, as typed."""
    what, _, name = rest.strip().partition(" ")
    if what != "breakpoints" or not name.strip():
        raise FirError("usage: save breakpoints FILE")
    return save_breakpoints(ci, Path(name.strip()).expanduser())


def save_breakpoints(ci, path: Path) -> str:
    """Write ``ci``'s breakpoints and displays to ``path``; says what was saved.

    The project's output rule: ``path`` is a new file or a previous breakpoints file (its
    first line is :data:`HEADER`); a link, a folder, a device or any other file is refused,
    and the file is written under a temporary name and renamed into place."""
    from ..runtime.opening import write_output
    _check_replaceable(path)
    lines, skipped = save_lines(ci.s, ci.displays.values())
    write_output(path, ("\n".join(lines) + "\n").encode("utf-8"), "the breakpoints")
    count = len(ci.s.breakpoints) - len(skipped)
    out = [f"Saved {count} breakpoint{'s' if count != 1 else ''} and {len(ci.displays)} "
           f"display{'s' if len(ci.displays) != 1 else ''} to {path}."]
    return "\n".join(out + skipped)


def _check_replaceable(path: Path) -> None:
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size == 0:
            return  # new or empty; write_output refuses a link, a folder or a device
        with open(path, "rb") as f:
            first = f.readline(len(HEADER) + 2)
    except OSError:
        return  # the write says what is wrong
    if first.rstrip(b"\r\n") != HEADER.encode("utf-8"):
        raise FirError(f"{printable(str(path))}: exists and is not a breakpoints file "
                       "(save breakpoints replaces only a file it wrote, whose first line is "
                       f"'{HEADER}'); remove it or choose another name")


def source_file(ci, rest: str) -> str:
    name = rest.strip()
    if not name:
        raise FirError("usage: source FILE")
    path = Path(name).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FirError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.split(None, 1)[0] == "source":
            raise FirError(f"{path}:{number}: a sourced file cannot source another")
        if ci.resumes(line):  # the UI runs movements in a worker; this runs in place
            raise FirError(f"{path}:{number}: '{line.split()[0]}' moves execution: source "
                           "sets breakpoints, displays and the like (run a script that moves "
                           "with firscope debug -x)")
        if "$bpnum" in line:
            made = [bp.number for bp in ci.s.breakpoints]
            if not made:
                raise FirError(f"{path}:{number}: $bpnum: no breakpoint was made yet")
            line = line.replace("$bpnum", str(max(made)))
        try:
            result = ci.run(line)
        except FirError as e:
            done = f" (the {len(out)} lines before it ran)" if out else ""
            raise FirError(f"{path}:{number}: {e.message}{done}") from None
        if result.text:
            out.append(result.text)
    return "\n".join(out)
