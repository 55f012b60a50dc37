"""The last guard between file text and the terminal: no control character reaches it.

Rich and Textual pass ESC, CSI and OSC through to the terminal (they strip
only BEL, BS, VT, FF and CR), so a kernel comment or a folder name holding
``ESC ] 52 ;`` would write the user's clipboard. The panes escape file text
with :func:`firscope.text.printable` where they show it, so the user sees
``\\x1b``; this filter runs on every rendered line of every widget (titles
and borders included) and drops whatever control character is left, so a
place that forgot is still safe.
"""
from __future__ import annotations

from rich.segment import Segment
from textual.color import Color
from textual.filter import LineFilter

from ..text import UNSAFE

__all__ = ["ControlCharacterFilter"]


def _drop(match) -> str:
    # Rich measures control characters as 0 cells, so dropping them keeps the layout;
    # a lone surrogate measures 1 cell and cannot be encoded: show U+FFFD in its place.
    return "\ufffd" if "\ud800" <= match.group() <= "\udfff" else ""


class ControlCharacterFilter(LineFilter):
    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        out = segments
        for i, seg in enumerate(segments):
            if seg.control is None and UNSAFE.search(seg.text):
                if out is segments:
                    out = list(segments)
                out[i] = Segment(UNSAFE.sub(_drop, seg.text), seg.style, seg.control)
        return out
