"""The undo log: what each node (and each token boundary) changed, bounded in bytes.

Before a node runs, the regions it may write are copied; after it, only the
elements that changed are kept as a :class:`Change` (their offsets and old
values). Token boundaries are records too (the input buffers written by
``begin``, the sequence and logits appended by ``end``). The log is bounded
by ``budget`` bytes: the oldest records are dropped first and
``truncated`` says so.
"""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

import numpy as np

DEFAULT_HISTORY_BUDGET = 512 * 1024 * 1024
RECORD_OVERHEAD = 64  # bytes counted per record besides its arrays


class RecordKind(enum.Enum):
    NODE = "node"  # a node ran
    BEGIN = "begin"  # a token was written into the input buffers
    END = "end"  # a token finished (logits read, maybe a token appended)
    PATCH = "patch"  # the user set values between nodes (``set``)


@dataclass(frozen=True)
class Change:
    base: int
    index: np.ndarray  # int64 offsets from base that changed
    old: np.ndarray  # their previous values

    @property
    def nbytes(self) -> int:
        return self.index.nbytes + self.old.nbytes


@dataclass(frozen=True)
class Record:
    kind: RecordKind
    step: int
    node: int
    changes: tuple[Change, ...] = ()
    seq_len: int = 0  # END: the sequence length before

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.changes) + RECORD_OVERHEAD


Regions = list[tuple[int, np.ndarray]]  # (arena base, copy of the region)


def copy_regions(arena: np.ndarray, spans: list[tuple[int, int]]) -> Regions:
    return [(a, arena[a:b].copy()) for a, b in spans]


def restore_regions(arena: np.ndarray, saved: Regions) -> None:
    for a, data in saved:
        arena[a: a + data.size] = data


def changes_since(arena: np.ndarray, saved: Regions) -> tuple[Change, ...]:
    """The elements of the saved regions whose bits differ now."""
    out = []
    for a, old in saved:
        new = arena[a: a + old.size]
        idx = np.flatnonzero(old.view(np.uint32) != new.view(np.uint32))
        if idx.size:
            out.append(Change(a, idx, old[idx]))
    return tuple(out)


class History:
    def __init__(self, budget: int = DEFAULT_HISTORY_BUDGET):
        self.budget = budget
        self.records: deque[Record] = deque()
        self.nbytes = 0
        self.truncated = False  # older records were dropped to stay within the budget

    def __len__(self) -> int:
        return len(self.records)

    def push(self, rec: Record) -> None:
        self.records.append(rec)
        self.nbytes += rec.nbytes
        while self.nbytes > self.budget and len(self.records) > 1:
            old = self.records.popleft()
            self.nbytes -= old.nbytes
            self.truncated = True

    def set_budget(self, budget: int) -> None:
        """A new bound (checkpoints take their share of one budget); trimmed at once."""
        self.budget = budget
        while self.nbytes > self.budget and len(self.records) > 1:
            old = self.records.popleft()
            self.nbytes -= old.nbytes
            self.truncated = True

    def pop(self) -> Record:
        rec = self.records.pop()
        self.nbytes -= rec.nbytes
        return rec

    def has_node(self) -> bool:
        """Whether a node can still be undone (token bookkeeping alone is not a place to stop)."""
        return any(r.kind is RecordKind.NODE for r in self.records)

    def undo(self, rec: Record, arena: np.ndarray) -> None:
        for c in rec.changes:
            arena[c.base + c.index] = c.old
