"""Text <-> token ids.

A ``tokenizer.json`` beside the model is used through HF ``tokenizers``.
Without one, a model whose vocabulary is exactly 256 is byte-level (token =
byte, as the bundled sample model is). Otherwise only ``--tokens`` works.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import FirError
from ..fir.source import regular_file_size

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
        size = regular_file_size(path, "a tokenizer.json file")  # not a FIFO or /dev/zero
        if size > MAX_TOKENIZER_BYTES:
            raise FirError(f"{path}: {size} bytes is too large for a tokenizer.json "
                           f"(limit {MAX_TOKENIZER_BYTES})")
        try:
            self._tok = _T.from_file(str(path))
        except Exception as e:  # the library raises its own exception types
            raise FirError(f"{path}: cannot read tokenizer: {e}") from None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


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
    ids = []
    for i, part in enumerate(text.replace(" ", "").split(",")):
        if not part:
            continue
        try:
            ids.append(int(part))
        except ValueError:
            raise FirError(f"--tokens: item {i + 1} ({part!r}) is not an integer "
                           "(expected ids like 1,2,3)") from None
    if not ids:
        raise FirError("--tokens: no token ids given")
    return ids
