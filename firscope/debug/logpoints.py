"""Log points (gdb's ``dprintf``, DAP's ``logMessage``): print a line, do not stop.

A log point is a breakpoint with a message: where it would stop, the message
is printed with every ``{EXPR}`` replaced by the value of EXPR in the
``print`` language (``{R3}``, ``{max(abs(x))}``, ``{scores@2[0:4]}``), and the
run goes on. ``{{`` and ``}}`` are literal braces. An expression that cannot
be evaluated there prints ``<error: ...>`` in its place (a log point never
stops the run because of its message). Every expression is checked when the
log point is set, so a typo is an error then, not a silent ``<error>`` later.

Batch and UI: ``dprintf LOCATION [if COND] "FORMAT"`` (gdb spells it
``dprintf LOCATION,"format",args``; here the arguments live in the format).
"""
from __future__ import annotations

import re
from typing import Callable

from ..errors import FirError
from .expr import DebugExpr

_PIECE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


def parse_format(text: str) -> list[str | DebugExpr]:
    """Literal text and the expressions between braces, in order."""
    out: list[str | DebugExpr] = []
    literal = []
    pos = 0
    for m in _PIECE.finditer(text):
        literal.append(text[pos:m.start()])
        pos = m.end()
        token = m.group(0)
        if token in ("{{", "}}"):
            literal.append(token[0])
        elif token in ("{", "}"):
            raise FirError(f"log message {text!r}: unmatched '{token}' at column {m.start() + 1}"
                           " (write {{ or }} for a brace)")
        else:
            expr = m.group(1).strip()
            if not expr:
                raise FirError(f"log message {text!r}: empty {{}} at column {m.start() + 1}")
            out.append("".join(literal))
            literal = []
            out.append(DebugExpr(expr))
    literal.append(text[pos:])
    out.append("".join(literal))
    return [p for p in out if not isinstance(p, str) or p]


def check_format(text: str, check: Callable[[DebugExpr], None]) -> None:
    """Every expression of a message parses and names things this model has."""
    for piece in parse_format(text):
        if isinstance(piece, DebugExpr):
            check(piece)


def interpolate(text: str, value_text: Callable[[DebugExpr], str]) -> str:
    out = []
    for piece in parse_format(text):
        if isinstance(piece, str):
            out.append(piece)
            continue
        try:
            out.append(value_text(piece))
        except FirError as e:
            out.append(f"<error: {e.message}>")
    return "".join(out)


def split_dprintf(rest: str) -> tuple[str, str]:
    """``LOCATION [if COND] "FORMAT"`` -> (location with its condition, format)."""
    rest = rest.strip()
    start = rest.find('"')
    if start < 0 or not rest.endswith('"') or start == len(rest) - 1:
        raise FirError('usage: dprintf LOCATION [if COND] "FORMAT with {EXPR}"')
    location = rest[:start].strip().rstrip(",").strip()
    body = rest[start + 1:-1]
    if not location:
        raise FirError('dprintf needs a location before the format: dprintf 156 "R3={R3}"')
    return location, body.replace('\\"', '"').replace("\\n", "\n")
