"""Text that came from a file, made safe to show on a terminal.

A model file, a config, a tokenizer, a debugger script or a file name can
hold bytes a terminal acts on instead of showing: ESC and CSI start escape
sequences (set the window title, write the clipboard with OSC 52, clear the
screen), CR and BS overwrite what was printed, bidi controls reorder it.
Neither Rich nor Textual removes ESC (they strip only BEL, BS, VT, FF and
CR), so firscope escapes such characters itself, everywhere it shows text it
did not write: :func:`printable` for terminals, CSV cells and HTML, and
:func:`json_text` for JSON documents, whose data must stay exact.
"""
from __future__ import annotations

import re

__all__ = ["printable", "json_text", "undecodable", "web_piece", "UNSAFE", "token_ids"]

# C0 controls except TAB (and LF, decided per call), DEL and the C1 controls
# (0x9B is CSI, 0x9D is OSC to a terminal that reads 8-bit controls); the
# bidi embeddings, overrides and isolates ("Trojan Source") and the Unicode line
# and paragraph separators; lone surrogates, which Python makes from bytes
# that are not UTF-8 (file names, argv) and which cannot be encoded for output.
_UNSAFE_CLASS = ("\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f\\u061c\\u200e\\u200f\\u2028-\\u202e"
                 "\\u2066-\\u2069\\ud800-\\udfff")
UNSAFE = re.compile(f"[{_UNSAFE_CLASS}\\n]")
_UNSAFE_KEEP_LF = re.compile(f"[{_UNSAFE_CLASS}]")


_SHORT = {"\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def printable(text: object, *, newlines: bool = False) -> str:
    """``text`` with every character a terminal would act on written as a Python escape.

    ``"a\\x1b]0;x\\x07"`` -> ``"a\\\\x1b]0;x\\\\x07"``. Tabs stay; line feeds stay only
    with ``newlines=True`` (for text firscope lays out in lines itself). Everything
    else, including non-ASCII letters, is unchanged.
    """
    s = text if isinstance(text, str) else str(text)
    return (_UNSAFE_KEEP_LF if newlines else UNSAFE).sub(_escape, s)


_JSON_UNSAFE = re.compile("[\\x7f-\\x9f\\u061c\\u200e\\u200f\\u2028-\\u202e\\u2066-\\u2069"
                          "\\ud800-\\udfff]")


def json_text(document: str) -> str:
    """A JSON document with the characters :func:`printable` escapes written as ``\\uXXXX``.

    ``json.dumps(..., ensure_ascii=False)`` already escapes C0 controls but writes
    DEL, C1 controls, bidi controls and lone surrogates raw. Outside strings a JSON
    document holds none of them, so escaping them everywhere keeps the document
    valid and its data identical: ``json.loads`` gives back the same strings.
    """
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", document)


_SURROGATE = re.compile("[\\ud800-\\udfff]")


def undecodable(text: str) -> str | None:
    """Why ``text`` is not UTF-8, or None if it is.

    Python passes bytes of argv, environment and file names that are not UTF-8
    on as lone surrogates (U+DC80..U+DCFF for byte 0x80..0xFF); no encoder or
    tokenizer accepts them.
    """
    bad = _SURROGATE.search(text)
    if bad is None:
        return None
    code = ord(bad.group())
    what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
    return f"{what} at character {bad.start() + 1} is not UTF-8 text"


# The byte tokenizer's token pictures (model/tokens.py) that common fonts lack: Debian's
# default fonts (DejaVu, Liberation) have no Control Pictures block, so Chromium drew ␠ as a
# box, in the report, in `serve` and in the UI's screenshots. The report and the terminal UI
# show characters every font has instead; report.json, batch mode and DAP keep the pieces.
_WEB_PICTURES = {0x2420: "·", 0x23CE: "↵", 0x21E5: "→", 0x2421: "\\x7f",
                 **{0x2400 + b: f"\\x{b:02x}" for b in range(0x20) if b not in (0x09, 0x0A)}}


def web_piece(text: str) -> str:
    """A token piece as the report and the UI show it: ``␠`` -> ``·``, ``⏎`` -> ``↵``,
    ``⇥`` -> ``→``, other control pictures as ``\\x01``."""
    return text.translate(_WEB_PICTURES)


_TOKEN_ID = re.compile(r"-?[0-9]{1,12}")


def token_ids(text: str) -> list[int]:
    """``"1,2,3"`` (spaces allowed around the commas) -> ids; ValueError naming the item
    that is empty or not an integer (``--tokens 3,,7``: item 2 is empty). Whether an id
    is in the vocabulary is the model's to say."""
    parts = text.split(",")
    if not text.strip():
        raise ValueError("no token ids given")
    ids = []
    for i, part in enumerate(parts, 1):
        item = part.strip()
        if not item:
            raise ValueError(f"item {i} is empty (expected ids like 1,2,3)")
        if not _TOKEN_ID.fullmatch(item):
            raise ValueError(f"item {i} ({printable(item)!r}) is not an integer (expected ids "
                             "like 1,2,3)")
        ids.append(int(item))
    return ids
