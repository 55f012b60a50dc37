"""Instruction-level history of the live dispatch, for stepping back cheaply.

While the debugger interprets a dispatch, the tape keeps the old values of
every store (a journal) and a copy of the dispatch's registers, mask and
frames every ``interval`` instructions (marks). Going back to instruction
``t`` undoes the journal down to the last mark at or before ``t`` and
replays at most ``interval`` instructions from there, so ``reverse-stepi N``
costs about as much as ``stepi N`` instead of a replay from the kernel's
start per step (quadratic).

Memory is bounded: when there are too many marks every other one is
dropped and the interval doubles; when the journal outgrows its budget it
is given up and stepping back restores the node's start and replays from
there (slower, still exact).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..vm.interp import Dispatch, DispatchState, Observer

FIRST_INTERVAL = 64
MAX_MARKS = 256
DEFAULT_JOURNAL_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Mark:
    steps: int
    state: DispatchState
    journal_len: int
    counts: tuple[int, ...]


class Tape(Observer):
    wants_after = True
    wants_store = True

    def __init__(self, dispatch: Dispatch, journal_budget: int = DEFAULT_JOURNAL_BYTES):
        self.d = dispatch
        self.interval = FIRST_INTERVAL
        self.budget = journal_budget
        self.where: list[np.ndarray] = []
        self.old: list[np.ndarray] = []
        self.nbytes = 0
        self.complete = True  # False once the journal was given up
        self.marks: list[Mark] = []
        self.mark()

    # -- recording --------------------------------------------------------------------
    def mark(self) -> None:
        d = self.d
        self.marks.append(Mark(d.steps, d.snapshot(), len(self.where), tuple(d._counts)))
        if len(self.marks) > MAX_MARKS:
            self.marks = self.marks[:1] + self.marks[2::2]
            self.interval *= 2

    def store(self, d: Dispatch, where: np.ndarray, values) -> None:
        """Called before a store lands: keep what it overwrites."""
        if not self.complete:
            return
        where = np.array(where, dtype=np.int64).reshape(-1)
        self.where.append(where)
        self.old.append(d.arena[where].copy())
        self.nbytes += where.nbytes * 3 // 2
        if self.nbytes > self.budget:
            self.complete = False
            self.where.clear()
            self.old.clear()
            self.marks = self.marks[:0]

    def after(self, d: Dispatch, op) -> bool:
        if self.complete and d.steps - self.marks[-1].steps >= self.interval:
            self.mark()
        return False

    # -- going back ---------------------------------------------------------------------
    def can_rewind(self) -> bool:
        return self.complete and bool(self.marks)

    def rewind(self, steps: int) -> Mark:
        """Put the dispatch and the arena back at the last mark at or before ``steps``;
        the caller replays from there (with this tape observing)."""
        d = self.d
        i = max(k for k, m in enumerate(self.marks) if m.steps <= steps)
        mark = self.marks[i]
        arena = d.arena
        for where, old in zip(reversed(self.where[mark.journal_len:]),
                              reversed(self.old[mark.journal_len:])):
            arena[where] = old
        del self.where[mark.journal_len:]
        del self.old[mark.journal_len:]
        self.nbytes = sum(w.nbytes * 3 // 2 for w in self.where)
        del self.marks[i + 1:]
        d.restore(mark.state)
        d._counts = list(mark.counts)
        return mark
