"""Proofs that a compiled kernel's lanes cannot stop early, so that a dispatch may take
the plain driver (no budget, journal or slice checks): for every dispatch
(vm/lanes.infallible_steps, decided when the kernel is planned) or per range of the
values a kernel's uniform reads load (:class:`PlainProofs`, vm/lanes.infallible_for:
attention's position). The lane analysis they rest on is vm/lanes; the runner that
uses them is vm/compiled."""
from __future__ import annotations

import numpy as np

from .codegen import Generated
from .lanes import infallible_for

# The most instructions (all lanes together) a dispatch may run on the plain driver, which
# does not look at the stop flag: tens of milliseconds, which a stop request then waits.
PLAIN_MAX_WORK = 1 << 26


def plain_within(steps: int | None, limit: int, threads: int) -> bool:
    """Whether lanes that execute at most ``steps`` instructions each and cannot fault
    take the plain driver under ``limit`` instructions a lane: none can run past the
    budget, and the whole dispatch is short enough not to look at the stop flag."""
    return steps is not None and steps <= limit and steps * max(threads, 1) <= PLAIN_MAX_WORK


def takes_plain(plan, limit: int) -> bool:
    """Whether every dispatch of ``plan`` under ``limit`` instructions takes the plain driver:
    no lane can fault or run past the budget, and it is short (PLAIN_MAX_WORK)."""
    return plain_within(plan.infallible, limit, plan.program.threads)


class PlainProofs:
    """Proofs, per range of the values a kernel's uniform reads load, that no lane can stop
    early (vm/lanes.infallible_for): g2.attn_decode's loop counts come from the position
    buffer, so no proof holds for every dispatch, but one for positions 0..1022 does.

    ``steps(values)`` (the values the reads hold now) answers from a range already proved
    or proves a new one: the values up to the next power of two (from 0), else, with one
    read, the widest range from 0 up to below that the analysis proves (a bisection:
    attention's last positions), else the values alone. An analysis takes a millisecond or
    two, which the dispatch that waits for it would show as its own time (4 ms for
    attention in the UI's profile), so for a kernel with one such read the ranges 0..1,
    0..2, 0..4, ... and the widest below the first that fails are proved when it is
    planned (20 analyses for attention with 1024 positions). Shared by every node with
    the same instructions, numbers and aliasing (the runner's cache)."""

    def __init__(self, program, gen: Generated, slicing: dict, reads: dict[int, int]):
        self.program, self.fault_pcs, self.slicing = program, gen.fault_pcs, slicing
        self.pcs = tuple(sorted(reads))
        self.boxes: list[tuple[tuple, int]] = []  # ((lo, hi) per read, steps)
        self._last: tuple[tuple, int] | None = None  # the box the last answer came from
        self.refused: set[tuple] = set()  # values no proof holds for
        if len(self.pcs) == 1:
            self._ladder()

    def _ladder(self) -> None:
        """Prove 0..1, 0..2, 0..4, ... up to the first range that fails (or whose lanes
        would run longer than the plain driver may), then the widest range below it."""
        hi, last = 1.0, None
        while hi <= 2.0 ** 40:
            steps = self._prove(((0.0, hi),))
            if steps is None:
                if last is not None:
                    self._bisect(0.0, hi / 2, last, hi, hi / 2)
                return
            if steps * max(self.program.threads, 1) > PLAIN_MAX_WORK:
                return
            hi, last = hi * 2, steps

    def steps(self, values: tuple[float, ...]) -> int | None:
        last = self._last  # first: a decode asks again with the next position
        if last is not None and all(lo <= v <= hi for v, (lo, hi) in zip(values, last[0])):
            return last[1]
        for box, steps in self.boxes:
            if all(lo <= v <= hi for v, (lo, hi) in zip(values, box)):
                self._last = (box, steps)
                return steps
        if values in self.refused or not all(np.isfinite(values)):
            return None
        wide = tuple((min(v, 0.0), float(1 << max(int(v), 0).bit_length())) for v in values)
        found = self._prove(wide)
        if found is None and len(values) == 1:
            found = self._widest(values[0], wide[0])
        if found is None:
            found = self._prove(tuple((v, v) for v in values))
        if found is None:
            if len(self.refused) < 4096:
                self.refused.add(values)
            return None
        return found

    def _check(self, box: tuple) -> int | None:
        """infallible_for with the reads' values in ``box`` ((lo, hi) per read)."""
        return infallible_for(self.program, self.fault_pcs, self.slicing,
                              dict(zip(self.pcs, box)))

    def _prove(self, box: tuple) -> int | None:
        steps = self._check(box)
        if steps is not None:
            self.boxes.append((box, steps))
        return steps

    def _widest(self, v: float, box: tuple[float, float]) -> int | None:
        """The proof for (lo, h) with the largest whole h in v..box's end the analysis
        proves (v itself must be provable), by bisection."""
        lo, good = box[0], float(np.floor(v))
        steps = self._check(((lo, max(good, v)),))
        return None if steps is None else self._bisect(lo, good, steps, box[1], v)

    def _bisect(self, lo: float, good: float, steps: int, bad: float, v: float) -> int:
        """Keep the proof for (lo, max(good, v)), which holds with ``steps``, after moving
        ``good`` up towards ``bad`` (which fails) while the analysis proves (lo, good)."""
        while bad - good > 1:
            mid = float((good + bad) // 2)
            found = self._check(((lo, mid),))
            if found is None:
                bad = mid
            else:
                good, steps = mid, found
        self.boxes.append((((lo, max(good, v)),), steps))
        return steps

