"""Confirming a race: does the node's result depend on the order its lanes run in?

A GPU runs lanes in parallel, in no fixed order; this VM runs them in lockstep
(the interpreter) or one after the other (the compiled engine). When racecheck
finds two lanes on one element, :func:`reorder_outcome` re-runs the node from
the state before it with the lanes one at a time, in reverse and in a few
shuffled orders, and compares what the node wrote with the lockstep result,
bit for bit. The arena is left holding the lockstep result (the reference).
"""
from __future__ import annotations

import numpy as np

from ..errors import FirError
from ..vm.interp import Dispatch, Observer

SHUFFLES = 3
# Lanes x instructions beyond which the re-runs are not attempted (each order runs every
# lane on its own through the interpreter).
MAX_WORK = 2_000_000


def lane_orders(lanes: int, seed: int = 0) -> list[tuple[str, np.ndarray]]:
    """(label, order): reverse, then SHUFFLES seeded shuffles (reproducible)."""
    rng = np.random.default_rng(seed)
    orders = [("reverse", np.arange(lanes)[::-1])]
    for i in range(SHUFFLES):
        orders.append((f"shuffle {i + 1}", rng.permutation(lanes)))
    return orders


def run_in_order(program, arena: np.ndarray, order, budget: int | None) -> None:
    """Run every lane of ``program`` to its end on its own, in ``order``."""
    d = Dispatch(program, arena)
    mask = np.zeros(program.threads, dtype=bool)
    for lane in order:
        mask[:] = False
        mask[int(lane)] = True
        d.pc, d.stack, d.steps = 0, [], 0
        d.set_mask(mask.copy())
        d.run(budget, observer=_SKIP_OUT_OF_BOUNDS)


class _SkipOutOfBounds(Observer):
    """Out-of-bounds accesses were reported by the lockstep run: here they are skipped."""

    wants_memcheck = True


_SKIP_OUT_OF_BOUNDS = _SkipOutOfBounds()


def reorder_outcome(program, arena: np.ndarray, before: list[tuple[int, np.ndarray]],
                    budget: int | None) -> str:
    """Re-run the node in other lane orders from ``before`` (copies of the regions it
    writes, taken before it ran); say whether the result changes. The arena holds the
    lockstep result before and after."""
    lanes = program.threads
    work = lanes * max(len(program.ops), 1)
    if work > MAX_WORK:
        return (f"not re-run in other lane orders ({lanes} lanes x {len(program.ops)} "
                "instructions is too much work)")
    lockstep = [(a, arena[a: a + old.size].copy()) for a, old in before]
    changed = []
    orders = lane_orders(lanes)
    try:
        for label, order in orders:
            for a, old in before:
                arena[a: a + old.size] = old
            run_in_order(program, arena, order, budget)
            if any(not np.array_equal(arena[a: a + v.size].view(np.uint32), v.view(np.uint32))
                   for a, v in lockstep):
                changed.append(label)
    except FirError as e:  # a lane on its own can fault where lockstep did not
        changed.append(f"a fault ({e.message})")
    finally:
        for a, v in lockstep:
            arena[a: a + v.size] = v
    tried = f"reverse and {SHUFFLES} shuffled lane orders"
    if changed:
        return (f"confirmed: the node's result changes with the lane order "
                f"({', '.join(changed)} of {tried})")
    return f"not confirmed: the node's result is the same in {tried}"
