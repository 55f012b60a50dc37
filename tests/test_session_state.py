"""Issue 22, items 2 and 3: the session's state is one object that checkpoints copy whole; a
goal is plain data; observers see stores and are installed only for the run they are given
to, several composed into one."""
from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from firscope.debug.commands import CommandInterpreter
from firscope.debug.session import Goal, Session
from firscope.debug.state import SessionState
from firscope.errors import FirError
from firscope.runtime import load_model
from firscope.errors import FirFault
from firscope.vm.interp import Dispatch, Ended, Observer, compose
from kernel_util import FAULTING as OUT_OF_BOUNDS, kernel_program


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from conftest import write_random_gpt2
    folder = tmp_path_factory.mktemp("state")
    write_random_gpt2(folder)
    return load_model(folder / "gpt2.fir")


def _fields_equal(a: SessionState, b: SessionState) -> list[str]:
    """The names of the fields where ``a`` and ``b`` differ (arrays bit for bit; the live
    dispatch by its place: pc, steps, registers, mask, counts)."""
    def same(x, y) -> bool:
        if isinstance(x, Dispatch) or isinstance(y, Dispatch):
            return (x is None) == (y is None) and (x is None or (
                x.pc == y.pc and x.steps == y.steps and x.line_counts.tolist()
                == y.line_counts.tolist() and np.array_equal(x.R.view(np.uint32),
                                                             y.R.view(np.uint32))
                and np.array_equal(x.U, y.U) and np.array_equal(x.mask, y.mask)))
        if isinstance(x, np.ndarray):
            return isinstance(y, np.ndarray) and np.array_equal(x.view(np.uint8),
                                                                y.view(np.uint8))
        if isinstance(x, (list, tuple)):
            return type(x) is type(y) and len(x) == len(y) and all(map(same, x, y))
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
        return x == y
    return [f.name for f in fields(SessionState) if f.name != "tape"
            and not same(getattr(a, f.name), getattr(b, f.name))]


def test_restart_brings_back_every_field_of_the_state(model):
    """Compared field by field over SessionState, so a field added to it is checked too."""
    s = Session(model, [104, 101, 108], 3, engine="interp")
    ci = CommandInterpreter(s)
    ci.execute("until attention@1")
    ci.execute("stepi 9")
    saved = s.state.copy()
    assert _fields_equal(saved, s.state) == []
    ci.execute("checkpoint")
    ci.execute("next 40")
    assert {"node_index", "dispatch"} <= set(_fields_equal(saved, s.state))
    ci.execute("restart 1")
    assert _fields_equal(saved, s.state) == []
    ci.execute("next 3")
    ci.execute("restart 1")  # a checkpoint restores more than once: it keeps its own copy
    assert _fields_equal(saved, s.state) == []
    assert s.tape is not None and not s.tape.complete  # stepping back replays from the start


def test_a_copy_shares_nothing_mutable(model):
    s = Session(model, [1, 2], 2, engine="interp")
    s.until("attention@0")
    s.stepi(5)
    copy = s.state.copy()
    assert copy.dispatch is not s.dispatch and copy.dispatch.pc == s.dispatch.pc
    assert copy.tape.d is copy.dispatch
    copy.sequence.append(7)
    copy.node_before[0][1][:] = 123.0
    copy.dispatch.R[1] = 5.0
    for value in copy.layer_values.values():
        value[2][:] = -1.0
    assert s.sequence == [1, 2]
    assert not np.any(s.node_before[0][1] == 123.0)
    assert not np.all(s.dispatch.R[1] == 5.0)
    assert all(not np.all(v[2] == -1.0) for v in s.layer_values.values())


def test_a_state_field_of_an_unknown_type_is_refused_not_shared():
    state = SessionState(sequence=[1])
    state.node_times = {0: object()}
    with pytest.raises(TypeError, match="no rule for a object"):
        state.copy()


def test_session_state_is_read_only_from_outside(model):
    s = Session(model, [1, 2], 2, engine="interp")
    with pytest.raises(AttributeError):
        s.step = 3


def test_goals_are_plain_data_and_reusable(model):
    """No callable or counter in a goal: the same goal twice is the same movement."""
    assert Goal(at=(1, 0), lane=2) == Goal(at=(1, 0), lane=2)
    assert hash(Goal(nodes=2)) == hash(Goal(nodes=2))
    assert all(not callable(getattr(Goal(at=(0, 1)), f.name)) for f in fields(Goal))
    s = Session(model, [1, 2, 3], 2, engine="interp")
    s.next(len(s.nodes) + 4)
    start = s.cursor
    assert start == (1, 4)
    s.reverse_next(6)
    once = s.cursor
    assert once == (0, len(s.nodes) - 2)
    s.goto(start)
    s.reverse_next(6)
    assert s.cursor == once


def test_next_token_stops_at_the_next_token_start(model):
    s = Session(model, [1, 2, 3], 2, engine="interp")
    s.next(5)
    s.next_token()
    assert s.cursor == (1, 0)
    with pytest.raises(FirError):
        s.goto((99, 0))


# -- observers ---------------------------------------------------------------------------------
STORES = """
kernel k in=1 out=1 threads=3 tg=3 tgbytes=0
  loadconstf32 1 4
  addconst 2 1 1
  rtou 1 0
  ustoref32 2 1 @out0
  ustoref32 1 1 @out0
endkernel
"""


def _fresh(src, sizes):
    program, arena, _ = kernel_program(src, sizes)
    return Dispatch(program, arena)


class _Log(Observer):
    def __init__(self, name, log, stop_after=None, store=True):
        self.name, self.log, self.stop_after = name, log, stop_after
        self.wants_before = self.wants_after = True
        self.wants_store = store

    def before(self, d, op):
        self.log.append((self.name, "before", op.pc))
        return False

    def after(self, d, op):
        self.log.append((self.name, "after", op.pc))
        return op.pc == self.stop_after

    def store(self, d, where, values):
        self.log.append((self.name, "store", d.pc, np.asarray(values).tolist()))


def test_compose_calls_in_order_and_stops_at_the_first_that_asks():
    log = []
    a, b = _Log("a", log, stop_after=1), _Log("b", log)
    d = _fresh(STORES, {"in0": 3, "out0": 3})
    assert d.run(observer=compose(a, None, b)) is Ended.AFTER
    assert log[:4] == [("a", "before", 0), ("b", "before", 0), ("a", "after", 0),
                       ("b", "after", 0)]
    assert log[-1] == ("a", "after", 1), "b does not see the instruction a stopped after"
    assert d.pc == 2
    assert compose(a) is a and compose(None, None) is None


def test_observers_see_stores_in_order_and_only_during_their_run():
    log = []
    d = _fresh(STORES, {"in0": 3, "out0": 3})
    d.run(observer=compose(_Log("a", log), _Log("b", log), _Log("quiet", log, store=False)))
    stores = [e for e in log if e[1] == "store"]
    assert stores == [("a", "store", 3, [5.0] * 3), ("b", "store", 3, [5.0] * 3),
                      ("a", "store", 4, [4.0] * 3), ("b", "store", 4, [4.0] * 3)]
    assert d.store_hook is None and d.memcheck is None, "nothing left installed after the run"


class _Skip(Observer):
    wants_memcheck = True

    def __init__(self):
        self.seen = []

    def memcheck(self, d, op, addr, indices, lanes):
        self.seen.append((op.pc, list(indices), list(lanes)))


def test_a_memcheck_observer_skips_out_of_bounds_accesses_for_its_run_only():
    skip = _Skip()
    d = _fresh(OUT_OF_BOUNDS, {"in0": 4, "out0": 2})
    assert d.run(observer=skip) is Ended.DONE
    assert skip.seen == [(2, [5, 6], [0, 1])]
    again = _fresh(OUT_OF_BOUNDS, {"in0": 4, "out0": 2})
    again.run(observer=_Skip(), limit=2)  # installed for that run, then put back
    assert again.memcheck is None
    with pytest.raises(FirFault, match="outside"):
        again.run()
