"""A corpus file as chunks of token ids, cut as llama-perplexity cuts them."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import FirError, UsageError
from ..fir.source import read_limited, undecodable_at
from ..text import printable

MAX_CORPUS_BYTES = 512 * 1024 * 1024
MAX_CTX = 512  # the default context is the model's n_positions, at most this


@dataclass(frozen=True)
class Corpus:
    path: Path
    digest: str  # sha256 of the file's bytes
    tokens: np.ndarray  # int64, the whole file
    ctx: int
    chunks: tuple[np.ndarray, ...]  # each ctx tokens (the first ctx*len(chunks) of the file)
    first_scored: int  # scored tokens of a chunk: first_scored..ctx-1
    notes: tuple[str, ...]  # what the cut left out, said once

    @property
    def scored_per_chunk(self) -> int:
        return self.ctx - self.first_scored


def encode_corpus(path: Path, tokenizer, vocab: int) -> tuple[np.ndarray, str]:
    raw = read_limited(path, "a corpus file", MAX_CORPUS_BYTES)
    if not raw:
        raise FirError(f"{printable(path)}: the corpus is empty")
    digest = hashlib.sha256(raw).hexdigest()
    if path.suffix == ".npy":  # token ids already: any model, tokenizer or not
        ids = _npy_ids(path, raw)
    elif tokenizer.kind == "bytes":  # byte-level: every byte is its own token, UTF-8 or not
        ids = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
    elif tokenizer.kind == "none":
        raise FirError(f"{printable(path)}: the model has no tokenizer (no tokenizer.json beside "
                       "it and a vocabulary other than 256 bytes), so a text corpus cannot be "
                       "encoded; give it as token ids instead, a 1-D integer .npy file")
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line, col = undecodable_at(raw, e)
            raise FirError(f"{printable(path)}:{line}:{col}: byte 0x{raw[e.start]:02x} is not "
                           f"UTF-8, and the model's tokenizer ({tokenizer.kind}) reads text") \
                from None
        ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= vocab))
    if len(bad):
        raise FirError(f"{printable(path)}: token {int(ids[bad[0]])} (the corpus's token "
                       f"{int(bad[0])}) is outside the vocabulary 0..{vocab - 1}")
    return ids, digest


def _npy_ids(path: Path, raw: bytes) -> np.ndarray:
    import io
    try:
        a = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise FirError(f"{printable(path)}: not a readable .npy file ({e})") from None
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise FirError(f"{printable(path)}: a .npy corpus holds token ids: a 1-D integer array "
                       f"(this one is {a.dtype} with shape {list(a.shape)})")
    if len(a) == 0:
        raise FirError(f"{printable(path)}: the corpus is empty")
    return a.astype(np.int64)


def cut(path: str | Path, tokenizer, *, vocab: int, n_positions: int | None,
        ctx: int | None = None, chunks: int | None = None,
        second_half: bool = False) -> Corpus:
    """Tokenize ``path`` and cut it into chunks of ``ctx`` tokens (default: n_positions, at
    most 512). A corpus shorter than one chunk is one chunk of all its tokens."""
    path = Path(path)
    limit = n_positions if n_positions is not None else None
    if ctx is not None:
        if ctx < 2:
            raise UsageError(f"--ctx {ctx}: a chunk needs at least 2 tokens (one to predict "
                             "from, one to score)")
        if limit is not None and ctx > limit:
            raise UsageError(f"--ctx {ctx} is above the model's n_positions {limit}")
    if chunks is not None and chunks < 1:
        raise UsageError(f"--chunks {chunks}: evaluate at least 1 chunk")
    ids, digest = encode_corpus(path, tokenizer, vocab)
    if len(ids) < 2:
        raise FirError(f"{printable(path)}: the corpus is {len(ids)} token long; scoring needs "
                       "at least 2 tokens")
    want = ctx if ctx is not None else min(limit or MAX_CTX, MAX_CTX)
    notes = []
    if len(ids) < want:
        notes.append(f"the corpus has {len(ids)} tokens, fewer than a chunk of {want}: one "
                     f"chunk of {len(ids)}")
        want = len(ids)
    n = len(ids) // want
    if chunks is not None and chunks < n:
        n = chunks
    elif chunks is not None and chunks > n:
        notes.append(f"--chunks {chunks}: the corpus holds {n} chunk(s) of {want} tokens")
    left = len(ids) - n * want
    if left:
        notes.append(f"{left} token(s) after the last whole chunk are not scored")
    # llama-perplexity's KL divergence scores logits ctx/2 .. ctx-2, that is tokens
    # ctx/2+1 .. ctx-1 (ctx-1-ctx/2 a chunk); without --second-half every token but the first
    first = want // 2 + 1 if second_half else 1
    if first >= want:
        first = want - 1
    parts = tuple(ids[i * want:(i + 1) * want] for i in range(n))
    return Corpus(path, digest, ids, want, parts, first, tuple(notes))
