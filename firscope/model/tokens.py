"""Text <-> token ids.

A ``tokenizer.json`` beside the model is used through HF ``tokenizers``.
Without one, a model whose vocabulary is exactly 256 is byte-level (token =
byte, as the bundled sample model is). Otherwise only ``--tokens`` works.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import FirError
from ..fir.source import read_limited

MAX_TOKENIZER_BYTES = 256 * 1024 * 1024


class Tokenizer:
    kind = "none"

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    def piece(self, token: int) -> str:
        """How one token shows in the UI (control bytes made visible)."""
        return self.decode([token])


class ByteTokenizer(Tokenizer):
    kind = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(int(i) & 0xFF for i in ids).decode("utf-8", errors="replace")

    def piece(self, token: int) -> str:
        b = int(token) & 0xFF
        if b == 0x20:
            return "␠"
        if b == 0x0A:
            return "⏎"
        if b == 0x09:
            return "⇥"
        if b < 0x20 or b == 0x7F:
            return chr(0x2400 + b) if b < 0x20 else "␡"
        if b < 0x80:
            return chr(b)
        return f"\\x{b:02x}"


class HFTokenizer(Tokenizer):
    kind = "tokenizer.json"

    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer as _T
        except ImportError:
            raise FirError(f"{path}: reading tokenizer.json needs the 'tokenizers' package "
                           "(pip install tokenizers), or pass --tokens") from None
        # Read here, not by the library: a regular file only (not a FIFO, /dev/zero or
        # /proc entry), bounded, and opened once.
        raw = read_limited(path, "a tokenizer.json file", MAX_TOKENIZER_BYTES)
        text = _tokenizer_text(path, raw)
        try:
            self._tok = _T.from_str(text)
        except Exception as e:  # the library raises its own exception types
            raise FirError(f"{path}: cannot read tokenizer: {_library_reason(str(e))}"
                           f"{_library_position(str(e))}") from None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def _tokenizer_text(path: Path, raw: bytes) -> str:
    """The file as text, after checking it is JSON; errors give a position, never content."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FirError(f"{path}: cannot read tokenizer: not UTF-8 text") from None
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        raise FirError(f"{path}: cannot read tokenizer: not valid JSON: {e.msg} (line "
                       f"{e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise FirError(f"{path}: cannot read tokenizer: JSON nested too deeply") from None
    except ValueError as e:  # an integer with more digits than Python converts
        raise FirError(f"{path}: cannot read tokenizer: not usable JSON: {e}") from None
    return text


# The library's messages (serde's) end in "at line L column C" and quote values
# from the file in `backticks` or "double quotes": keep the position and the
# library's own words before the first quote, never a value.
_AT_POSITION = re.compile(r"\s*at line (\d+) column (\d+)\s*$")
MAX_REASON = 120


def _library_position(message: str) -> str:
    m = _AT_POSITION.search(message)
    return f" (line {m.group(1)}, column {m.group(2)})" if m else ""


def _library_reason(message: str) -> str:
    reason = _AT_POSITION.sub("", message)
    cut = min((i for i in (reason.find(q) for q in "`\"'") if i >= 0), default=-1)
    if cut >= 0:
        reason = reason[:cut].rstrip(" :,") + " (...)"
    reason = ascii(reason)[1:-1]  # control and non-ASCII characters escaped
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 3] + "..."


class NoTokenizer(Tokenizer):
    def __init__(self, vocab: int, folder: Path):
        self.vocab = vocab
        self.folder = folder

    def encode(self, text: str) -> list[int]:
        raise FirError(f"{self.folder}: no tokenizer.json beside the model and the vocabulary "
                       f"({self.vocab}) is not byte-level; give token ids with --tokens 1,2,3")

    def decode(self, ids: list[int]) -> str:
        return " ".join(str(int(i)) for i in ids)

    def piece(self, token: int) -> str:
        return f"<{int(token)}>"


def load_tokenizer(folder: Path, vocab: int) -> Tokenizer:
    path = folder / "tokenizer.json"
    if path.exists():
        return HFTokenizer(path)
    if vocab == 256:
        return ByteTokenizer()
    return NoTokenizer(vocab, folder)


def parse_token_list(text: str) -> list[int]:
    from ..text import token_ids
    try:
        return token_ids(text)
    except ValueError as e:
        raise FirError(f"--tokens: {e}") from None
