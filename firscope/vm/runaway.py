"""A runaway the step interpreter need not run: when the path to the budget is certain
before running, the pc the interpreter would name is computed from the lane analysis."""
from __future__ import annotations

import weakref

from .isa import MAX_TRIPS, FrameKind
from .lanes import Analysis, analyse, most_steps

__all__ = ["runaway_stop"]


class _Uncertain(Exception):
    """The path to the budget is not known before running (a branch, a loop whose count
    is not one constant, an op that may fault, a store)."""


_RUNAWAY: dict[int, tuple] = {}  # id(program) -> (program, analysis, total steps or None)
# Loops nested deeper than this are not analysed here: the lane analysis walks each loop's
# body twice, 2^depth walks in all (a fuzzed kernel nested 30 deep never finished).
MAX_DEPTH = 6


def _depth(ops) -> int:
    deepest = level = 0
    for op in ops:
        if op.spec.opens is FrameKind.FOR:
            level += 1
            deepest = max(deepest, level)
        elif op.spec.closes is FrameKind.FOR:
            level -= 1
    return deepest


def runaway_stop(program, budget: int) -> int | None:
    """The pc the step interpreter names when a dispatch of ``program`` runs out of
    ``budget`` instructions, when that is certain before running: every lane takes the same
    path (no if, every loop count one constant), no op on the way can fault (proved by the
    analysis) and none stores (the arena is then what the interpreter leaves). None when the
    dispatch fits the budget or the path is not certain: run it. A runaway loop in a kernel
    whose lanes share memory (no compiled code: interpreted) took 30-100 s to be reported;
    this answers in microseconds, with the interpreter's words."""
    key = id(program)
    got = _RUNAWAY.get(key)
    if got is None or got[0] is not program:
        if _depth(program.ops) > MAX_DEPTH:
            got = (program, None, None)  # the analysis walks a loop's body twice a level
        else:
            an = analyse(program)
            got = (program, an, most_steps(an.ops, 0, len(an.ops), an.trips))
        _RUNAWAY[key] = got
        weakref.finalize(program, _RUNAWAY.pop, key, None)
    _, an, total = got
    if total is None or total <= budget:
        return None
    try:
        return _stop_pc(an, 0, len(an.ops), budget)[1]
    except _Uncertain:
        return None


def _stop_pc(an: Analysis, a: int, b: int, left: int) -> tuple[int, int | None]:
    """Walk ops a..b-1 (blocks whole) with ``left`` instructions to go: (instructions used,
    the pc next to run when they ran out, or None when the ops fit)."""
    ops, pc, used = an.ops, a, 0
    while pc < b:
        if used == left:
            return used, pc
        op = ops[pc]
        if op.spec.opens is FrameKind.IF or op.spec.stores or not an.proved.get(pc, True):
            raise _Uncertain
        if op.spec.opens is None:
            used, pc = used + 1, pc + 1
            continue
        if not an.exact.get(pc, False) or an.trips.get(pc) is None:
            raise _Uncertain
        n = an.trips[pc]
        used += 1  # the forbegin
        if n == 0:
            pc = op.match + 1
            continue
        body, _ = _stop_pc(an, pc + 1, op.match + 1, MAX_TRIPS)  # a trip, forend included
        r = left - used
        if n * body <= r:
            used, pc = used + n * body, op.match + 1
            continue
        _, stop = _stop_pc(an, pc + 1, op.match + 1, r % body)
        return left, stop
    return used, None
