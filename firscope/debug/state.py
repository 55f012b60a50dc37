"""Where a debugging session is, and what its run has produced so far, as one object.

:class:`SessionState` is the part of a :class:`~firscope.debug.session.Session`
that a checkpoint saves and ``restart`` brings back: the cursor (decode step,
next node), the live dispatch and its tape, the sequence and logits so far,
and what the UI reads of the last runs (layer values, node times, line
counts). What belongs to the session rather than to a place in its run (the
breakpoints, the patches, the undo log with its budget, the machine) stays
on the session.

:meth:`SessionState.copy` copies every field by its type, so a field added
here is saved and restored with no other change; a value of a type it has no
rule for is refused rather than shared between a checkpoint and the session.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from ..vm.interp import Dispatch
from .tape import Tape

_LIVE = ("dispatch", "tape")  # copied as a new dispatch at the same place (copy())


@dataclass(eq=False)
class SessionState:
    step: int = 0  # decode step (token position)
    node_index: int = 0  # the next node to run (or the live dispatch's)
    finished: bool = False
    sequence: list[int] = field(default_factory=list)  # prompt, then each token generated
    logits: list[np.ndarray] = field(default_factory=list)  # one per finished step
    dispatch: Dispatch | None = None  # the kernel being interpreted, when stopped inside one
    tape: Tape | None = None  # the live dispatch's instruction history (stepping back)
    # copies of the regions the live dispatch writes, taken at its start: (base, values)
    node_before: list[tuple[int, np.ndarray]] | None = None
    # The last value each layer left in a buffer that all layers share (scores@2,
    # x@3): (step, node index, copy), for the current token.
    layer_values: dict[tuple[str, int | None], tuple[int, int, np.ndarray]] = field(
        default_factory=dict)
    node_times: dict[int, float] = field(default_factory=dict)  # node -> seconds, last run
    line_counts: dict[str, np.ndarray] = field(default_factory=dict)  # kernel -> per-pc counts

    @property
    def cursor(self) -> tuple[int, int]:
        return self.step, self.node_index

    def copy(self) -> "SessionState":
        """An independent copy. The live dispatch becomes a new one at the same place
        (registers, mask, frames, counts) whose tape starts empty: stepping back from a
        restored place replays from the node's start."""
        values = {f.name: _copied(getattr(self, f.name)) for f in fields(self)
                  if f.name not in _LIVE}
        d = tape = None
        if self.dispatch is not None:
            old = self.dispatch
            d = Dispatch(old.program, old.arena)
            d.restore(old.snapshot())
            d.line_counts = old.line_counts
            tape = Tape(d)
            tape.complete = False
        return SessionState(**values, dispatch=d, tape=tape)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays the state holds (outside the live dispatch)."""
        return sum(_array_bytes(getattr(self, f.name)) for f in fields(self)
                   if f.name not in _LIVE)


def _copied(value):
    if value is None or isinstance(value, (bool, int, float, str, np.generic)):
        return value
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_copied(v) for v in value)
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    raise TypeError(f"SessionState.copy has no rule for a {type(value).__name__}: say in "
                    "debug/state.py how to copy it")


def _array_bytes(value) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_array_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_array_bytes(v) for v in value.values())
    return 0
