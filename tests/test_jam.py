"""Unroll and jam in run_plain (vm/jam): which loops it takes, and the interpreter's bits
wherever it runs, falls back at run time (aliased regions, a step that wraps) or is
refused."""
from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import write_random_gpt2
from firscope.runtime import Machine, load_model
from firscope.vm import jam
from firscope.vm.compiled import CompiledRunner, generate
from firscope.vm.interp import Dispatch
from test_compiled import model_with, node_named, randomize_buffers, run_both, same_bits

# Per lane: for each of `rows` rows j, out0[lane*rows + j] = dot(in0 row j, in1 row lane)
# (a chain of adds per row), then a running maximum over the rows (an if in the
# epilogue, a register only the epilogue writes), stored in out1[lane].
DOTS = """
kernel t.dots{suffix} in=2 out=2 threads={lanes} tg=1 tgbytes=16
rtou 0 0
umulk 1 0 {width}
umulk 2 0 {stride}
uconst 3 {first}
uaddk 2 2 {out_first}
loadconstf32 14 {rows}
{lane_rows}
loadconstf32 15 {width}
loadconstf32 10 -3e38
forbegin 14
uaddk 5 1 0
{reset}
forbegin 15
uloadf32 1 5 @in1
uloadf32 2 3 @in0
mul 2 1 2
add 3 3 2
uaddk 3 3 {step}
uaddk 5 5 1
forend
ustoref32 3 2 @out0
cmplt 4 10 3
ifbegin 4
mulconst 10 3 1
ifend
uaddk 2 2 {out_step}
{row_step}
forend
ustoref32 10 0 @out1
endkernel
"""


def dots(suffix="", lanes=3, rows=13, reset="loadconstf32 3 0", step=1, first=0,
         row_step="", out_first=0, out_step=1, width=5, stride=None, lane_rows=""):
    return DOTS.format(suffix=suffix, lanes=lanes, rows=rows, reset=reset, step=step,
                       first=first, row_step=row_step, out_first=out_first,
                       out_step=out_step, width=width, stride=stride or rows,
                       lane_rows=lane_rows)


BUFS = """
buf jm_a f32 40*5
buf jm_q f32 3*5
buf jm_out f32 3*40
buf jm_max f32 3
buf jw_a f32 64*24
buf jw_q f32 4*24
buf jw_out f32 4*64
buf jw_max f32 4
"""


def check(tmp_path, kernels: str, nodes: str, names: list[str], seeds=range(3)):
    """Each node: the compiled runner's bits against the interpreter's, on random data,
    with the plain driver taking the dispatch. Returns the runner."""
    model = load_model(model_with(tmp_path, BUFS + kernels, nodes))
    runner = CompiledRunner(model)
    for seed in seeds:
        randomize_buffers(model, np.random.default_rng(seed))
        for name in names:
            node = node_named(model, name)
            before = runner.plain_dispatches
            a, b = run_both(model, runner, node, model.arena)
            assert runner.plan(node).gen is not None, runner.fallbacks
            assert runner.plain_dispatches == before + 1, f"{name}: not the plain driver"
            assert same_bits(a, b), name
    return model, runner


def test_attention_loops_are_jammed_and_others_not(random_model):
    """Attention's dot products (QK) and weighted sums (V) are the loops taken: the first
    steps its key index from trip to trip, the second its output index; the query element
    and the score are read once for the trips together."""
    model = load_model(random_model)
    program = next(n for n in model.nodes if n.target == "g2.attn_decode").program
    plans = {op.pc: jam.plan(program.ops, op) for op in program.ops
             if op.spec.opens is not None}
    taken = {pc: p for pc, p in plans.items() if p is not None}
    assert len(taken) == 2
    qk, v = (taken[pc] for pc in sorted(taken))
    assert qk.stepped == ["U4"] and {"U5", "R1"} <= set(qk.shared)
    assert v.stepped == ["U5"] and {"U6", "R1"} <= set(v.shared)
    assert "R3" in qk.renamed and "R12" in v.renamed
    for name in ("g2.layernorm", "g2.add", "g2.gelu_new"):
        prog = next(n for n in model.nodes if n.target == name).program
        assert all(jam.plan(prog.ops, op) is None for op in prog.ops
                   if op.spec.opens is not None)
    src = generate(program).source
    # QK's groups run with the heads side by side, V's wide: no plain eight-wide groups
    assert src.count(f"// {jam.JAM}):") == 0 and src.count("for gs in range(G):") == 1
    assert src.count("while r0 >= 16:") == 1


@pytest.mark.parametrize("rows", [1, 7, 8, 13, 16, 40])
def test_jammed_rows_match_the_interpreter(tmp_path, rows):
    """Fewer rows than a group, exactly one or two groups, groups and a remainder."""
    check(tmp_path, dots(rows=rows), "node d micro t.dots jm_a jm_q -> jm_out jm_max\n", ["d"])


def test_attention_matches_the_interpreter_at_every_remainder(random_model):
    """Positions 0..19: every count of trips mod 8 in both jammed loops, each dispatch on
    the plain driver."""
    model = load_model(random_model)
    interp, comp = Machine(model, engine="interp"), Machine(load_model(random_model),
                                                              engine="compiled")
    for pos in range(20):
        a, b = interp.step(pos % 7 + 1).logits, comp.step(pos % 7 + 1).logits
        assert same_bits(a, b), f"position {pos}"
    assert comp.kernel_runner.plain_dispatches > 0


def test_an_epilogue_storing_into_what_later_trips_read_runs_the_loop_as_written(tmp_path):
    """One lane storing each row's result into the first element of the next row it
    reads (out0 is in0): trips run ahead of the stores would read the old values. The
    run-time check that the regions do not overlap sends it to the loop as written: the
    interpreter's bits, which differ from those of the same kernel on separate buffers."""
    kernels = dots(suffix=".one", lanes=1, rows=13, out_first=5, out_step=5)
    nodes = ("node alias micro t.dots.one jm_a jm_q -> jm_a jm_max\n"
             "node apart micro t.dots.one jm_a jm_q -> jm_out jm_max\n")
    model, runner = check(tmp_path, kernels, nodes, ["alias", "apart"])
    a, _ = run_both(model, runner, node_named(model, "alias"), model.arena)
    b, _ = run_both(model, runner, node_named(model, "apart"), model.arena)
    rows_a, out = model.regions["jm_a"], model.regions["jm_out"]
    results = [5 * (j + 1) for j in range(13)]  # where trip j stores its dot product
    alias = a[rows_a.base + np.array(results)]
    apart = b[out.base + np.array(results)]
    assert same_bits(alias[:1], apart[:1])  # trip 0 read nothing stored
    assert not same_bits(alias[1:], apart[1:])  # later trips read what the trip before stored
    # the runner generates a kernel's code once per aliasing of its operands (and numbers),
    # not once per node: these two nodes' differ, and each is what generate() makes
    plans = [runner.plan(node_named(model, n)) for n in ("alias", "apart")]
    assert plans[0].gen is not plans[1].gen
    for p in plans:
        assert p.gen.source == generate(p.program, p.slicing).source


def test_a_step_that_wraps_leaves_the_jam_for_the_loop_as_written(tmp_path):
    """Rows read backwards: the index steps by 2^32 - 1 and wraps below zero after each
    row's last element, so no group's accesses are proved and the trips run as written."""
    kernels = dots(suffix=".back", rows=13, step=4294967295, first=4,
                   row_step="uaddk 3 3 10")
    check(tmp_path, kernels, "node back micro t.dots.back jm_a jm_q -> jm_out jm_max\n",
          ["back"])


@pytest.mark.parametrize("change, why", [
    (dict(reset=""), "a sum carried from trip to trip (P reads R3 before writing it)"),
    (dict(reset="loadconstf32 3 0\nustoref32 3 2 @out0"), "a store before the inner loop"),
    (dict(row_step="mulconst 15 15 1"), "the inner count is written"),
])
def test_loops_that_cannot_be_jammed_are_refused_and_still_right(tmp_path, change, why):
    text = dots(suffix=".no", **change)
    model, _ = check(tmp_path, text, "node no micro t.dots.no jm_a jm_q -> jm_out jm_max\n",
                     ["no"])
    program = node_named(model, "no").program
    assert all(jam.plan(program.ops, op) is None for op in program.ops
               if op.spec.opens is not None), why


def test_a_step_inside_an_if_is_refused(tmp_path):
    text = dots(suffix=".cond", row_step="ifbegin 4\nuaddk 3 3 0\nifend")
    model, _ = check(tmp_path, text, "node c micro t.dots.cond jm_a jm_q -> jm_out jm_max\n",
                     ["c"])
    program = node_named(model, "c").program
    assert all(jam.plan(program.ops, op) is None for op in program.ops
               if op.spec.opens is not None)


def test_other_shapes_of_gpt2_match(tmp_path):
    """A model of other head sizes (3 heads of 8): both jammed loops with other counts."""
    path = write_random_gpt2(tmp_path / "m", seed=5, n_head=3, n_embd=24)
    a, b = Machine(load_model(path), engine="interp"), Machine(load_model(path),
                                                               engine="compiled")
    for pos in range(11):
        assert same_bits(a.step(pos + 2).logits, b.step(pos + 2).logits), pos


# Per lane: for each of `cols` columns c, out0[lane*span + c*step] = bias[same] + the sum
# over `rows` rows r of w[lane*rows + r] * m[r*lanes*span + lane*span + c*step] (attention's
# V loop: columns outer, rows inner, the column index stepping by `step` from trip to
# trip), then a running maximum of the sums (an if in the epilogue) in out1[lane].
WSUM = """
kernel t.wsum.{name} in=3 out=2 threads={lanes} tg=1 tgbytes=16
rtou 0 0
umulk 1 0 {span}
umulk 2 0 {rows}
loadconstf32 14 {rows}
loadconstf32 15 {cols}
loadconstf32 10 -3e38
uaddk 5 1 0
forbegin 15
uaddk 4 5 0
uaddk 6 2 0
uloadf32 12 5 @in2
forbegin 14
uloadf32 1 6 @in1
uloadf32 2 4 @in0
mul 2 1 2
add 12 12 2
uaddk 4 4 {row}
uaddk 6 6 1
forend
ustoref32 12 5 @out0
cmplt 4 10 12
ifbegin 4
mulconst 10 12 1
ifend
uaddk 5 5 {step}
forend
ustoref32 10 0 @out1
endkernel
"""


def wsum(name, cols, rows=5, lanes=3, step=1):
    span = cols * step
    kernel = WSUM.format(name=name, cols=cols, rows=rows, lanes=lanes, step=step, span=span,
                         row=lanes * span)
    bufs = (f"buf ws_m_{name} f32 {rows * lanes * span}\nbuf ws_w_{name} f32 {lanes * rows}\n"
            f"buf ws_b_{name} f32 {lanes * span}\nbuf ws_o_{name} f32 {lanes * span}\n"
            f"buf ws_x_{name} f32 {lanes}\n")
    node = f"node {name} micro t.wsum.{name} ws_m_{name} ws_w_{name} ws_b_{name} -> " \
           f"ws_o_{name} ws_x_{name}\n"
    return bufs + kernel, node


WIDE_COLS = (1, 15, 16, 17, 64, 256, 300, 600)


def test_columns_in_wide_groups_match_the_interpreter(tmp_path):
    """The V loop's pattern with 1..600 columns: fewer than a wide group (the eight-wide
    jam and the rest as written), exactly one, one and a remainder, several groups of
    WIDE_MAX and a remainder; and columns two elements apart (D = 2: no wide group at run
    time, the loop as written). Each node on the plain driver, the interpreter's bits."""
    parts = [wsum(f"c{c}", c) for c in WIDE_COLS] + [wsum("s2", 40, step=2)]
    kernels = "".join(k for k, _ in parts)
    nodes = "".join(n for _, n in parts)
    model, runner = check(tmp_path, kernels, nodes, [f"c{c}" for c in WIDE_COLS] + ["s2"])
    program = node_named(model, "c64").program
    opener = next(op for op in program.ops if op.spec.opens is not None)
    wp = jam.wide_plan(jam.plan(program.ops, opener))
    assert wp is not None and wp.stepped == ["U5"] and wp.affine == ["U4"]
    assert wp.carried == ["R12"]  # the sum; R2 is a temporary of each row
    assert wp.i_kind == ["shared", "trip", "trip", "trip", "step", "step"]
    gen = runner.plan(node_named(model, "c64")).gen
    assert gen.scratch == jam.WIDE_MAX and "while r0 >= 16:" in gen.source


def test_wide_groups_on_threads_each_have_their_own_scratch(tmp_path):
    """Lanes split over two threads (run_par): each range's sums in its own part of sf."""
    kernels, nodes = wsum("par", 64, rows=9, lanes=8)
    model = load_model(model_with(tmp_path, BUFS + kernels, nodes))
    runner = CompiledRunner(model, parallel=2)
    for seed in range(2):
        randomize_buffers(model, np.random.default_rng(seed))
        node = node_named(model, "par")
        a, b = run_both(model, runner, node, model.arena)
        assert same_bits(a, b)
    assert runner.split_dispatches > 0


def test_a_sum_stored_into_the_rows_it_reads_leaves_the_wide_groups(tmp_path):
    """One lane whose out0 is in0 (the matrix): the run-time check that the regions do not
    overlap sends the loop to be run as written; the interpreter's bits."""
    kernels, _ = wsum("al", 64, lanes=1)
    nodes = "node al micro t.wsum.al ws_m_al ws_w_al ws_b_al -> ws_m_al ws_x_al\n"
    check(tmp_path, kernels, nodes, ["al"])


def test_attention_takes_wide_groups_for_its_v_loop_only(random_model):
    """QK's key index steps in its inner loop (its D depends on the count of it): the
    eight-wide jam only. The V loop goes wide, its sum carried in sf."""
    model = load_model(random_model)
    program = next(n for n in model.nodes if n.target == "g2.attn_decode").program
    plans = [jam.plan(program.ops, op) for op in program.ops if op.spec.opens is not None]
    qk, v = [p for p in plans if p is not None]
    assert jam.wide_plan(qk) is None
    wp = jam.wide_plan(v)
    assert wp is not None and wp.carried == ["R12"] and wp.stepped == ["U5"]
    # V: the value row AHEAD rows on prefetched, one line in LINE elements of the group's
    # w0; QK: each of the group's eight key rows GROUPS_AHEAD groups on, its n1 elements
    src = generate(program).source
    assert src.count("prefetch_l1(arena, ") == 1 and src.count("prefetch_l2(arena, ") == jam.JAM
    assert f"for pf in range(0, w0, {jam.LINE}):" in src
    assert re.search(rf"prefetch_l1\(arena, B\d+ \+ U4 \+ {jam.AHEAD} \* K\d+ \+ pf\)", src)
    ahead = jam.GROUPS_AHEAD * jam.JAM
    for j in range(jam.JAM):
        assert re.search(rf"prefetch_l2\(arena, B\d+ \+ U4_{j} \+ {ahead} \* DU4 \+ pf \* K\d+\)",
                         src)
    assert src.count(f"for pf in range(0, n1, {jam.LINE}):") == 1


def test_prefetch_is_a_hint_that_never_faults():
    """kernel_helpers' prefetches compile for an int64 index and, clamped into the array,
    touch nothing far below or far past it; the array is as it was."""
    from numba import njit
    from firscope.vm.kernel_helpers import prefetch_l1, prefetch_l2

    @njit(cache=False)
    def touch(a, lo, n):
        for i in range(lo, lo + n):
            prefetch_l1(a, i)
            prefetch_l2(a, i)
        return a.sum()
    a = np.arange(10, dtype=np.float32)
    for lo in (-(1 << 62), -5, 0, 7, 1 << 62):
        assert touch(a, lo, 4) == 45
    assert np.array_equal(a, np.arange(10, dtype=np.float32))


# vm/sink: the lanes of a jammed loop side by side
@pytest.mark.parametrize("rows", [1, 8, 13, 40])
def test_lanes_side_by_side_match_the_interpreter(tmp_path, rows):
    """Four lanes, rows of 24 elements: no group, one, one and a remainder, five. Then
    lanes with 0..3 rows more than the first, each lane its own count of groups (the
    phase of groups runs the most any lane has, each lane only its own): the lane analysis
    proves no plain dispatch for a count from the lane number, so its plain driver is
    called here directly (every access is in bounds: it returns 0)."""
    kernels = (dots(suffix=".w", lanes=4, rows=rows, width=24, stride=64)
               + dots(suffix=".v", lanes=4, rows=rows, width=24, stride=64,
                      lane_rows="add 14 14 0"))
    nodes = ("node w micro t.dots.w jw_a jw_q -> jw_out jw_max\n"
             "node v micro t.dots.v jw_a jw_q -> jw_out jw_max\n")
    model, runner = check(tmp_path, kernels, nodes, ["w"])
    gen = runner.plan(node_named(model, "w")).gen
    assert gen.sink_r > 0 and "for gs in range(G):" in gen.source
    node = node_named(model, "v")
    plan = runner.plan(node)
    for seed in range(3):
        randomize_buffers(model, np.random.default_rng(seed))
        a, b = model.arena.copy(), model.arena.copy()
        Dispatch(node.program, a).run(10_000_000)
        assert plan.driver("run_plain")(*plan.plain_args(b)) == 0
        assert same_bits(a, b)


def test_lanes_side_by_side_on_threads(tmp_path):
    """The lanes split over two threads (run_par): each range saves its lanes' registers in
    its own part of the scratch."""
    kernels = dots(suffix=".p", lanes=4, rows=40, width=24, stride=64)
    model = load_model(model_with(tmp_path, BUFS + kernels,
                                  "node p micro t.dots.p jw_a jw_q -> jw_out jw_max\n"))
    runner = CompiledRunner(model, parallel=2)
    for seed in range(2):
        randomize_buffers(model, np.random.default_rng(seed))
        a, b = run_both(model, runner, node_named(model, "p"), model.arena)
        assert same_bits(a, b)
    assert runner.split_dispatches > 0 and runner.plain_dispatches == 2


def test_a_lane_whose_group_is_not_proved_finishes_as_written(tmp_path):
    """Rows read backwards (the index wraps below zero in each row): no lane's group is
    proved, every lane leaves the phase of groups before any store and runs its trips as
    written; and rows of 15 elements, side by side like any other."""
    kernels = (dots(suffix=".b", lanes=4, rows=13, width=24, stride=64, step=4294967295,
                    first=23, row_step="uaddk 3 3 48")
               + dots(suffix=".s", lanes=4, rows=13, width=15, stride=64))
    nodes = ("node b micro t.dots.b jw_a jw_q -> jw_out jw_max\n"
             "node s micro t.dots.s jw_a jw_q -> jw_out jw_max\n")
    check(tmp_path, kernels, nodes, ["b", "s"])


def test_attention_runs_its_qk_loop_with_heads_side_by_side(random_model):
    """The QK loop is the one sunk (the V loop goes wide instead)."""
    model = load_model(random_model)
    node = next(n for n in model.nodes if n.target == "g2.attn_decode")
    gen = generate(node.program)
    assert gen.sink_r > 0 and gen.sink_i > 0 and gen.scratch > 0
    a = gen.source.index("for gs in range(G):")
    assert gen.source.count("for gs in range(G):") == 1
    assert "while r0 >= 16:" in gen.source[a:]  # the V loop, in the last phase


@pytest.mark.parametrize("rows", [7, 13, 40])
def test_a_jammed_loop_inside_an_if_keeps_its_eight_wide_groups(tmp_path, rows):
    """Not at the kernel's top level (inside an if): no lanes side by side, the jam's own
    groups of eight and the trips left as written."""
    text = dots(suffix=f".if{rows}", lanes=4, rows=rows, width=24, stride=64,
                lane_rows="loadconstf32 13 1\nifbegin 13")
    text = text.replace("forend\nustoref32 10 0 @out1", "forend\nifend\nustoref32 10 0 @out1")
    model, runner = check(tmp_path, text,
                          f"node i micro t.dots.if{rows} jw_a jw_q -> jw_out jw_max\n", ["i"])
    src = runner.plan(node_named(model, "i")).gen.source
    assert f"// {jam.JAM}):" in src and "for gs in range(G):" not in src
