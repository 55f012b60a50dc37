"""One instruction loop (issue 11 §2): running, stepping, observing and budgets agree.

Before, three loops executed instructions and disagreed: on a faulting kernel
``Dispatch.run`` counted the faulting instruction (steps 3, line counts
[1, 1, 1]) while ``Dispatch.step`` did not (steps 2, [1, 1, 0]), which is what
its docstring promises. Now every path is ``Dispatch.run``.
"""
from __future__ import annotations

import numpy as np
import pytest

from firscope.errors import BudgetExceeded, FirFault
from firscope.vm.interp import Dispatch, Ended, Observer
from kernel_util import FAULTING, kernel_program

LOOP = """
kernel k in=1 out=1 threads=3 tg=3 tgbytes=0
  loadconstf32 1 4
  forbegin 1
    addconst 2 2 1
    ifbegin 0
      mulconst 3 2 2
    ifend
  forend
  rtou 1 0
  ustoref32 3 1 @out0
endkernel
"""


def _fresh(src, sizes):
    program, arena, _ = kernel_program(src, sizes)
    return Dispatch(program, arena)


def test_run_and_step_agree_on_a_faulting_kernel():
    by_run = _fresh(FAULTING, {"in0": 4, "out0": 2})
    with pytest.raises(FirFault):
        by_run.run()
    by_step = _fresh(FAULTING, {"in0": 4, "out0": 2})
    with pytest.raises(FirFault):
        while not by_step.done:
            by_step.step()
    for d in (by_run, by_step):
        assert d.steps == 2 and d.pc == 2  # the faulting load did not execute
        assert d.line_counts.tolist() == [1, 1, 0]


def test_observer_sees_every_instruction_and_counts_match_a_plain_run():
    plain = _fresh(LOOP, {"in0": 3, "out0": 3})
    plain.run()

    class Trace(Observer):
        wants_before = wants_after = True

        def __init__(self):
            self.before_pcs, self.after_pcs = [], []

        def before(self, d, op):
            self.before_pcs.append(op.pc)
            return False

        def after(self, d, op):
            self.after_pcs.append(op.pc)
            return False

    seen = _fresh(LOOP, {"in0": 3, "out0": 3})
    t = Trace()
    assert seen.run(observer=t) is Ended.DONE
    assert t.before_pcs == t.after_pcs and len(t.before_pcs) == plain.steps == seen.steps
    assert seen.line_counts.tolist() == plain.line_counts.tolist()
    assert np.array_equal(seen.arena, plain.arena)
    # lane 0 never enters the if: its line ran once per trip for the other lanes
    assert plain.line_counts[4] == 4


def test_stopping_before_and_after_and_resuming_gives_the_same_end_state():
    plain = _fresh(LOOP, {"in0": 3, "out0": 3})
    plain.run()

    class StopAt(Observer):
        wants_before = wants_after = True

        def before(self, d, op):
            return op.pc == 4 and d.steps == 9  # once, inside the second trip

        def after(self, d, op):
            return op.pc == 2 and d.steps == 3

    d = _fresh(LOOP, {"in0": 3, "out0": 3})
    obs = StopAt()
    assert d.run(observer=obs) is Ended.AFTER and d.pc == 3 and d.steps == 3
    assert d.run(observer=obs) is Ended.BEFORE and d.pc == 4 and d.steps == 9
    assert d.run(limit=2) is Ended.LIMIT and d.steps == 11
    assert d.run() is Ended.DONE
    assert d.steps == plain.steps and np.array_equal(d.arena, plain.arena)
    assert d.line_counts.tolist() == plain.line_counts.tolist()


def test_budget_is_per_dispatch_whoever_runs_it():
    whole = _fresh(LOOP, {"in0": 3, "out0": 3})
    with pytest.raises(BudgetExceeded) as e1:
        whole.run(budget=6)
    pieces = _fresh(LOOP, {"in0": 3, "out0": 3})
    pieces.run(limit=4)
    with pytest.raises(BudgetExceeded) as e2:
        pieces.run(budget=6)
    assert whole.steps == pieces.steps == 6 and whole.pc == pieces.pc
    assert str(e1.value) == str(e2.value)
