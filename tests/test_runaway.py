"""A certain runaway is reported before running (vm/runaway.runaway_stop, issue 39.8), with
exactly the step interpreter's words: the same pc and message as running it to the budget."""
from __future__ import annotations

import time

import numpy as np
from hypothesis import given, settings, strategies as st

from firscope.errors import BudgetExceeded
from firscope.vm import runaway as lanes
from firscope.vm.interp import Dispatch, Observer
from kernel_util import kernel_program


class Watching(Observer):
    """An observer that looks at nothing: its presence makes run() interpret every step."""

    wants_before = wants_after = False


def outcome(program, arena, budget, *, shortcut: bool):
    d = Dispatch(program, arena.copy())
    try:
        d.run(budget, observer=None if shortcut else Watching())
    except BudgetExceeded as e:
        return "budget", str(e), d.pc
    return "done", None, d.steps


@st.composite
def uniform_kernels(draw, depth=0):
    """Lines of a kernel body: register arithmetic, in-bounds loads, constant-count loops."""
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["add", "addconst", "load", "loop"] if depth < 3
                                    else ["add", "addconst", "load"]))
        if kind == "add":
            lines.append(f"add {draw(st.integers(1, 6))} {draw(st.integers(1, 6))} "
                         f"{draw(st.integers(1, 6))}")
        elif kind == "addconst":
            lines.append(f"addconst {draw(st.integers(1, 6))} {draw(st.integers(1, 6))} 1.5")
        elif kind == "load":
            lines.append(f"uconst 9 {draw(st.integers(0, 3))}")
            lines.append(f"uloadf32 {draw(st.integers(1, 6))} 9 @in0")
        else:
            reg = 10 + depth
            lines.append(f"loadconstf32 {reg} {draw(st.integers(0, 6))}")
            lines.append(f"forbegin {reg}")
            lines += draw(uniform_kernels(depth + 1))
            lines.append("forend")
    return lines


@settings(max_examples=150, deadline=None)
@given(uniform_kernels(), st.integers(0, 400), st.integers(1, 3))
def test_the_shortcut_names_the_pc_the_interpreter_names(body, budget, threads):
    src = (f"kernel k in=1 out=0 threads={threads} tg=1 tgbytes=0\n" + "\n".join(body)
           + "\nendkernel\n")
    program, arena, regions = kernel_program(src, {"in0": 4})
    arena[:] = np.arange(arena.size, dtype=np.float32)
    assert outcome(program, arena, budget, shortcut=True) == \
        outcome(program, arena, budget, shortcut=False)


def test_a_runaway_loop_is_reported_at_once_with_the_interpreters_words():
    src = ("kernel k in=1 out=1 threads=64 tg=1 tgbytes=0\nrtou 0 0\nloadconstf32 15 1e30\n"
           "loadconstf32 1 0\nforbegin 15\naddconst 1 1 1\nforend\nuconst 0 0\n"
           "ustoref32 1 0 @out0\nendkernel\n")
    program, arena, _ = kernel_program(src, {"in0": 4, "out0": 1})
    assert lanes.runaway_stop(program, 50_000_000) == 4
    t = time.perf_counter()
    kind, message, pc = outcome(program, arena, 50_000_000, shortcut=True)
    assert time.perf_counter() - t < 1.0
    assert kind == "budget" and pc == 4
    assert "executed more than 50000000 instructions; stopped at pc 4" in message
    # a smaller budget, run for real, names the same kind of place
    assert outcome(program, arena, 1001, shortcut=False) == outcome(program, arena, 1001,
                                                                    shortcut=True)


def test_no_shortcut_where_the_path_is_not_certain():
    stores = ("kernel k in=1 out=1 threads=1 tg=1 tgbytes=0\nloadconstf32 15 1e30\nuconst 0 0\n"
              "forbegin 15\nustoref32 1 0 @out0\nforend\nendkernel\n")
    branch = ("kernel k in=1 out=1 threads=2 tg=1 tgbytes=0\nloadconstf32 15 1e30\n"
              "ifbegin 0\nforbegin 15\nforend\nifend\nendkernel\n")
    counted = ("kernel k in=1 out=1 threads=1 tg=1 tgbytes=0\nuconst 0 0\nuloadf32 15 0 @in0\n"
               "forbegin 15\nforend\nendkernel\n")
    for src in (stores, branch, counted):
        program, _, _ = kernel_program(src, {"in0": 4, "out0": 1})
        assert lanes.runaway_stop(program, 1000) is None


def test_deeply_nested_loops_are_not_analysed_and_still_run():
    """The analysis walks each loop's body twice, 2^depth in all: past MAX_DEPTH it is not
    asked (a fuzzed kernel nested 30 deep hung the suite), and the interpreter runs it."""
    depth = 30
    body = ["loadconstf32 10 1"] + ["forbegin 10"] * depth + ["addconst 1 1 1"] + \
        ["forend"] * depth
    src = "kernel k in=1 out=0 threads=1 tg=1 tgbytes=0\n" + "\n".join(body) + "\nendkernel\n"
    program, arena, _ = kernel_program(src, {"in0": 4})
    assert lanes.runaway_stop(program, 10) is None
    assert outcome(program, arena, 10, shortcut=True)[0] == "budget"
    assert outcome(program, arena, 10_000, shortcut=True)[0] == "done"
