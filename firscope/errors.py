"""The one error type users see.

Every failure firscope can explain is a :class:`FirError`. It carries a
position when it has one and renders as ``FILE:LINE:COL: message`` followed
by the offending line and a caret, the way compilers report. The command
line prints ``str(err)`` and exits 1; nothing else escapes as a traceback.
"""
from __future__ import annotations

from dataclasses import dataclass

from .text import printable


@dataclass(frozen=True)
class Loc:
    """A position in a text file; line and col are 1-based."""

    path: str
    line: int
    col: int
    text: str = ""  # the whole source line, for the caret display

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"

    def shifted(self, delta: int) -> "Loc":
        return Loc(self.path, self.line, self.col + delta, self.text)


class FirError(Exception):
    """An error in the user's input or in what a model computes."""

    def __init__(self, message: str, loc: Loc | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.hint = hint

    def __str__(self) -> str:
        # Paths, messages and source lines carry text from files: control characters in
        # them are shown escaped, never sent to the terminal (issue 10.6).
        message = printable(self.message, newlines=True)
        if self.loc is None:
            out = message
        else:
            out = f"{printable(self.loc)}: {message}"
            if self.loc.text:
                line = self.loc.text.rstrip("\n")
                before = printable(line[: max(self.loc.col - 1, 0)]).expandtabs(1)
                out += f"\n    {printable(line).expandtabs(1)}\n    {' ' * len(before)}^"
        if self.hint:
            out += f"\n  hint: {printable(self.hint, newlines=True)}"
        return out


class FirFault(FirError):
    """A kernel did something illegal at run time (out-of-bounds access, bad rtou).

    Names the kernel, node, layer, lane, pc, source line and address.
    """

    def __init__(self, message: str, loc: Loc | None = None, *, kernel: str = "",
                 node: str = "", layer: int | None = None, lane: int | None = None,
                 pc: int | None = None, address: int | None = None):
        super().__init__(message, loc)
        self.kernel = kernel
        self.node = node
        self.layer = layer
        self.lane = lane
        self.pc = pc
        self.address = address


class BudgetExceeded(FirError):
    """A kernel ran past its instruction budget (a runaway loop)."""


class Interrupted(FirError):
    """The user stopped a long run (ctrl+c, a key in the UI)."""


class UsageError(FirError):
    """A command-line value outside its bounds that only the loaded model or corpus can
    judge (``--ctx`` above n_positions): exit 2, as argparse's own usage errors."""
