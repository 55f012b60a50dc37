"""gdb's ``checkpoint`` / ``restart N``: save the whole session state, come back to it.

A checkpoint copies every buffer of the arena (and any weight a ``set
--weight`` patch changed), the session's state (:class:`~.state.SessionState`:
the cursor, the live dispatch's registers, mask and frames, the sequence and
logits so far, ...), the machine's position, and the undo log as it is (its
records are immutable, so that is a list of references): after ``restart``
reverse execution works from the restored place as it did then.
The patches stay as they are (they belong to the run, not to a place in it).

Memory: checkpoints and the undo log share one budget (the session's history
budget, 512 MiB by default). A checkpoint is charged its copies plus every
undo record it keeps (the log may drop them later while the checkpoint still
holds them); the live log gets what the checkpoints leave. A checkpoint that
does not fit drops the oldest ones (each named in the answer); one larger than
the whole budget is refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import FirError
from .history import Regions, copy_regions, restore_regions
from .state import SessionState


@dataclass(frozen=True)
class Checkpoint:
    number: int
    made_at: str
    state: SessionState  # a copy, never the session's own: restart copies it again
    arena: Regions
    records: tuple
    history_bytes: int
    history_truncated: bool
    machine: tuple  # position, tokens fed, current token
    nbytes: int = field(default=0)  # the copies it holds
    records_bytes: int = field(default=0)  # the undo records it keeps alive

    @property
    def charged(self) -> int:
        """The bytes this checkpoint counts against the session's memory budget."""
        return self.nbytes + self.records_bytes


def _spans(session) -> list[tuple[int, int]]:
    m = session.model
    spans = [(r.base, r.base + r.size) for r in m.buffer_regions()]
    for p in session.patches:
        if p.weight and p.addresses is not None:
            spans.append((int(p.addresses.min()), int(p.addresses.max()) + 1))
    return spans


def take(session, number: int, made_at: str) -> Checkpoint:
    state = session.state.copy()
    arena = copy_regions(session.arena, _spans(session))
    mach = session.machine
    ck = Checkpoint(
        number, made_at, state, arena, tuple(session.history.records),
        session.history.nbytes, session.history.truncated,
        (mach.position, tuple(mach.history), mach.current_token))
    size = sum(data.nbytes for _, data in arena) + state.nbytes
    return replace(ck, nbytes=size, records_bytes=sum(r.nbytes for r in ck.records))


def restore(session, ck: Checkpoint) -> None:
    from collections import deque
    restore_regions(session.arena, ck.arena)
    session.state = ck.state.copy()
    h = session.history
    h.records = deque(ck.records)
    h.nbytes, h.truncated = ck.history_bytes, ck.history_truncated
    mach = session.machine
    mach.position, mach.current_token = ck.machine[0], ck.machine[2]
    mach.history = list(ck.machine[1])
    session.breakpoints.refresh_watches(session.arena)


class Checkpoints:
    def __init__(self):
        self._all: dict[int, Checkpoint] = {}
        self._next = 1
        self.budget: int | None = None  # the session's whole budget, set at the first save

    def __iter__(self):
        return iter(list(self._all.values()))

    def __len__(self) -> int:
        return len(self._all)

    @property
    def charged(self) -> int:
        return sum(c.charged for c in self._all.values())

    def save(self, session) -> tuple[Checkpoint, list[Checkpoint]]:
        """Take a checkpoint; returns it and the older ones dropped to make room."""
        if self.budget is None:
            self.budget = session.history.budget
        loc = session.location()
        made_at = "end of generation" if session.finished else (
            f"token {session.step}, " + (f"{loc.node} pc {loc.pc}" if loc.in_kernel
                                         else f"before {loc.node}"))
        ck = take(session, self._next, made_at)
        if ck.charged > self.budget:
            raise FirError(f"checkpoint: it would hold {_mib(ck.charged)} (buffers and undo "
                           f"log), more than the whole {_mib(self.budget)} history budget; "
                           "not taken")
        dropped = []
        while self._all and self.charged + ck.charged > self.budget:
            oldest = min(self._all)
            dropped.append(self._all.pop(oldest))
        self._all[ck.number] = ck
        self._next += 1
        self.rebudget(session)
        return ck, dropped

    def get(self, number: int) -> Checkpoint:
        if number not in self._all:
            raise FirError(f"no checkpoint number {number}")
        return self._all[number]

    def delete(self, number: int, session=None) -> None:
        self.get(number)
        del self._all[number]
        if session is not None:
            self.rebudget(session)

    def rebudget(self, session) -> None:
        """The live undo log gets what the checkpoints leave of the one budget."""
        if self.budget is not None:
            session.history.set_budget(max(self.budget - self.charged, 0))

    def describe(self) -> str:
        if not self._all:
            return "No checkpoints."
        rows = [f"{c.number:<4}{c.made_at}  ({_mib(c.nbytes)} copies + {_mib(c.records_bytes)}"
                f" undo records)" for c in self._all.values()]
        rows.append(f"checkpoints hold {_mib(self.charged)} of the {_mib(self.budget or 0)} "
                    "budget they share with the undo log")
        return "\n".join(rows)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
