"""A compiled dispatch either completes or leaves the arena as it found it (issue 10.2).

The compiled engine runs lanes one after the other and checks at run time that each
lane stays in its own slice of what it writes. When lanes stray into each other's
slices (a loop count read from a buffer), the runner must undo what the lanes stored,
run the node on the interpreter (the reference) and return normally: `run`, a Machine
and the debugger then give the interpreter's bits. Faults, budget overruns and stops
undo the dispatch too. Everything is compared bitwise (arenas viewed as uint32).
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, SEED_FIR, write_random_gpt2
from firscope.errors import BudgetExceeded, FirError, FirFault
from firscope.model.numerics import sigmoid_f32_numpy
from firscope.runtime import load_model
from firscope.runtime import Machine
from firscope.vm import compiled as C, kernel_plan
from firscope.vm.interp import Dispatch

# Lane l updates x[3l .. 3l + position + 1] in place (x = x * 0.5 + l + 0.125): from
# position 2 on each lane reaches into the next lane's three elements, and the result
# depends on the order lanes run in (lockstep: lane 1's trip 1 before lane 0's trip 4).
STRAY = """kernel t.stray in=1 out=1 threads=4 tg=1 tgbytes=16
rtou 0 0
umulk 1 0 3
uconst 2 0
uloadf32 1 2 @in0
addconst 1 1 2
forbegin 1
uloadf32 3 1 @out0
mulconst 3 3 0.5
add 3 3 0
addconst 3 3 0.125
ustoref32 3 1 @out0
uaddk 1 1 1
forend
endkernel
"""


def stray_fir_text(kernel: str = STRAY, node: str = "node stray micro t.stray position -> x"):
    """The seed model with ``kernel`` defined and ``node`` run in every layer, after the
    attention residual (so what it leaves in x reaches the logits)."""
    text = SEED_FIR.read_text()
    text = text.replace("node token ext", kernel + "node token ext", 1)
    anchor = "node attention_residual micro g2.add x mix -> x\n"
    assert anchor in text
    return text.replace(anchor, anchor + node + "\n", 1)


@pytest.fixture
def stray_model(tmp_path):
    return write_random_gpt2(tmp_path / "stray", n_layer=2, n_embd=32, n_head=4,
                             n_positions=16, vocab=64, fir_text=stray_fir_text())


def same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def assert_plain_run_is_the_interpreters(runner, node, arena) -> None:
    """``runner`` runs ``node`` on ``arena`` on its plain driver, with the interpreter's
    bits (the interpreter runs on a copy)."""
    ref = arena.copy()
    Dispatch(node.program, ref).run()
    before = runner.plain_dispatches
    runner.run(node, arena, None)
    assert runner.plain_dispatches == before + 1
    assert same_bits(arena, ref)


def test_the_kernel_really_conflicts_and_order_matters(stray_model):
    """Not vacuous: lanes stray at position 2, and running them one after the other
    (what the compiled engine does) gives other bits than lockstep."""
    model = load_model(stray_model)
    node = next(n for n in model.nodes if n.target == "t.stray")
    runner = C.CompiledRunner(model)
    assert runner.plan(node).gen is not None and runner.plan(node).slicing  # compiled, checked
    model.arena[model.inputs["position"].base] = 2
    x = model.regions["x"]
    model.arena[x.base: x.base + x.size] = np.linspace(-1, 1, x.size, dtype=np.float32)
    lockstep = model.arena.copy()
    Dispatch(node.program, lockstep).run()
    one_by_one = model.arena.copy()
    for lane in range(4):  # each lane alone, in lane order
        prog = node.program
        d = Dispatch(prog, one_by_one)
        d.set_mask(np.arange(prog.threads) == lane)
        d.run()
    assert not same_bits(lockstep, one_by_one)
    arena = model.arena.copy()
    runner.run(node, arena, None)
    assert same_bits(arena, lockstep)
    assert "lane 0 accessed x[3]" in runner.fallbacks[node.full_name]


def test_machine_compiled_equals_interp_bit_for_bit(stray_model):
    mi = Machine(load_model(stray_model), engine="interp")
    mc = Machine(load_model(stray_model), engine="compiled")
    ids = [5, 9, 2, 7]
    gi, li = mi.generate(ids, 3)
    gc, lc = mc.generate(ids, 3)
    assert gi == gc
    for a, b in zip(li, lc):
        assert same_bits(a, b)
    assert same_bits(mi.arena, mc.arena)
    assert set(mc.kernel_runner.fallbacks) == {"stray@0", "stray@1"}


def test_cli_run_compiled_equals_interp(stray_model, tmp_path):
    outs = {}
    for engine in ("interp", "compiled"):
        path = tmp_path / f"{engine}.npy"
        p = subprocess.run([sys.executable, "-m", "firscope", "run", str(stray_model), "--ids",
                            "--tokens", "3,1,4", "-n", "3", "--engine", engine,
                            "--logits-out", str(path)], cwd=REPO, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        outs[engine] = (p.stdout, np.load(path))
    assert outs["interp"][0] == outs["compiled"][0]
    assert same_bits(outs["interp"][1], outs["compiled"][1])
    assert outs["interp"][1].shape[0] == 5  # 3 prompt steps + 2 generated


def test_debugger_next_gives_the_interpreters_arena(stray_model):
    from firscope.debug.session import Session
    ids = [3, 1, 4]
    sc = Session(load_model(stray_model), ids, 2, engine="compiled")
    si = Session(load_model(stray_model), ids, 2, engine="interp")
    nodes = 0
    while not sc.finished:
        stop_c, stop_i = sc.next(), si.next()
        assert stop_c.reason == stop_i.reason, (stop_c, stop_i)
        assert stop_c.reason in ("step", "finished"), stop_c
        assert (sc.step, sc.node_index) == (si.step, si.node_index)
        assert same_bits(sc.arena, si.arena), f"after node {nodes}"
        nodes += 1
    assert si.finished and nodes == 4 * len(sc.nodes)
    assert "stray@0" in sc.machine.kernel_runner.fallbacks


# --- faults, budget and journal growth leave the arena as before the dispatch -----------------
FILL = """kernel t.fill in=1 out=1 threads=4 tg=1 tgbytes=16
rtou 0 0
uloadf32 1 0 @in0
umulk 2 0 64
forbegin 1
ustoref32 1 2 @out0
uaddk 2 2 1
forend
{tail}endkernel
"""
# After its stores, a lane loads in0[its count]: a fault for counts of 16 and more.
PROBE = "rtou 3 1\nuloadf32 5 3 @in0\n"


def fill_model(tmp_path, tail: str = "", size: int = 256):
    """Lane l stores in0[l] into in0[l] elements of its 64-wide slice of a 256-element
    buffer (then runs ``tail``)."""
    text = SEED_FIR.read_text().replace(
        "node token ext", "buf fin f32 16\nbuf fout f32 " + str(size) + "\n"
        + FILL.format(tail=tail) + "node token ext", 1)
    text += "node fill micro t.fill fin -> fout\n"
    return load_model(write_random_gpt2(tmp_path / f"fill{len(tail)}", fir_text=text))


def set_counts(model, counts):
    r = model.regions["fin"]
    model.arena[r.base: r.base + r.size] = np.asarray(counts + [0] * (16 - len(counts)),
                                                      dtype=np.float32)


def test_a_compiled_fault_leaves_the_arena_as_before(tmp_path):
    model = fill_model(tmp_path, PROBE)
    node = next(n for n in model.nodes if n.full_name == "fill")
    set_counts(model, [64, 10, 0, 33])
    before = model.arena.copy()
    arena = before.copy()
    with pytest.raises(FirFault, match="lane 0.*load from @in0 index 64") as compiled:
        C.CompiledRunner(model).run(node, arena, None)
    assert same_bits(arena, before)  # 107 stores were made and undone
    with pytest.raises(FirFault) as interp:  # the same error as the reference
        Dispatch(node.program, before.copy()).run()
    assert str(compiled.value) == str(interp.value)


def test_a_budget_overrun_leaves_the_arena_as_before(tmp_path):
    model = fill_model(tmp_path)
    node = next(n for n in model.nodes if n.full_name == "fill")
    set_counts(model, [64, 64, 64, 64])
    arena = model.arena.copy()
    with pytest.raises(BudgetExceeded):
        C.CompiledRunner(model).run(node, arena, 100)  # a lane needs ~200
    assert same_bits(arena, model.arena)


def test_a_full_journal_grows_and_the_run_matches(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_plan, "JOURNAL_START", 8)
    model = fill_model(tmp_path)
    node = next(n for n in model.nodes if n.full_name == "fill")
    set_counts(model, [64, 64, 64, 64])
    runner = C.CompiledRunner(model)
    assert runner.plan(node).journal == 8
    arena, want = model.arena.copy(), model.arena.copy()
    runner.run(node, arena, None)
    Dispatch(node.program, want).run()
    assert same_bits(arena, want)
    assert runner.plan(node).journal == 256  # 8 -> 64 -> 256 (the buffer's size)
    assert runner.fallbacks == {}


def test_a_kernel_storing_more_than_it_writes_copies_the_regions(tmp_path, monkeypatch):
    """A lane that stores into one element again and again (65 loads of the journal for
    a 64-element buffer): the runner copies the written region instead, and still undoes
    a fault exactly."""
    monkeypatch.setattr(kernel_plan, "JOURNAL_START", 8)
    kernel = FILL.replace("uaddk 2 2 1\n", "")
    text = SEED_FIR.read_text().replace(
        "node token ext", "buf fin f32 16\nbuf fout f32 256\n"
        + kernel.format(tail="") + "node token ext", 1) + "node fill micro t.fill fin -> fout\n"
    model = load_model(write_random_gpt2(tmp_path / "again", fir_text=text))
    node = next(n for n in model.nodes if n.full_name == "fill")
    runner = C.CompiledRunner(model)
    set_counts(model, [300, 2, 0, 1])
    arena, want = model.arena.copy(), model.arena.copy()
    runner.run(node, arena, None)
    Dispatch(node.program, want).run()
    assert same_bits(arena, want)
    assert runner.plan(node).journal == C.COPY_WRITTEN
    arena = model.arena.copy()
    with pytest.raises(BudgetExceeded):
        runner.run(node, arena, 200)
    assert same_bits(arena, model.arena)


def test_parallel_lanes_undo_their_own_segments(stray_model):
    model_p, model_i = load_model(stray_model), load_model(stray_model)
    mp = Machine(model_p, engine="compiled")
    mp.kernel_runner = C.CompiledRunner(model_p, parallel=2)
    mi = Machine(model_i, engine="interp")
    for tok in (9, 8, 7, 6):
        assert same_bits(mp.step(tok).logits, mi.step(tok).logits)
    assert same_bits(model_p.arena, model_i.arena)
    assert "stray@1" in mp.kernel_runner.fallbacks
    assert mp.kernel_runner.split_dispatches > 0  # lanes did run in two ranges


# --- random kernels whose lanes overlap at run time (tests/fuzzing.py) --------------------------
@pytest.fixture(scope="module")
def overlap_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("overlap") / "model"
    write_random_gpt2(folder, n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab=64)
    return folder


def test_the_overlap_generator_makes_lanes_conflict(overlap_folder):
    """The property below is not vacuous: generated kernels do send lanes into each other's
    slices, the compiled engine catches it, and the interpreter's bits come out."""
    import random

    import fuzzing as F
    rng = random.Random(0)
    conflicts = 0
    for _ in range(4):
        text = F.overlapping_kernel_model(SEED_FIR.read_text(), rng.randrange)
        path = overlap_folder / "gen.fir"
        path.write_text(text)
        outcome, detail = F.compare_engines(path)
        assert outcome == F.SAME, detail
        conflicts += any("shared memory" in why for why in detail[1].values())
    assert conflicts >= 2


def test_random_overlapping_kernels_give_the_interpreters_bits(overlap_folder):
    import fuzzing as F
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=6, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def check(data):
        text = F.overlapping_kernel_model(SEED_FIR.read_text(),
                                          lambda n: data.draw(st.integers(0, n - 1)))
        path = overlap_folder / "hyp.fir"
        path.write_text(text)
        outcome, detail = F.compare_engines(path)
        assert outcome == F.SAME, f"{detail}\n{text[text.index('kernel fz.overlap'):][:800]}"

    check()


# --- kernels that cannot stop early need no journal ------------------------------------------
def test_which_seed_kernels_are_proved_unable_to_fault():
    """Adds, gelu and layernorm index only by lane and constant loop counts: nothing to
    journal. Attention's loop count comes from the position buffer: journaled."""
    model = load_model(SEED_FIR)
    runner = C.CompiledRunner(model)
    by_kernel = {n.target: runner.plan(n) for n in model.nodes if n.kind == "micro"}
    assert by_kernel["g2.add"].infallible == 5  # rtou, 2 loads, add, store
    assert by_kernel["g2.gelu_new"].infallible == 10
    hidden = model.regions["x"].size
    # 10 straight instructions and three forbegins, then per element of the row loops of
    # 4, 6 and 10 instructions (each counting its forend)
    assert by_kernel["g2.layernorm"].infallible == 13 + (4 + 6 + 10) * hidden
    assert by_kernel["g2.attn_decode"].infallible is None


def test_an_infallible_kernel_under_a_smaller_budget_is_still_undone(tmp_path):
    model = load_model(SEED_FIR)
    node = next(n for n in model.nodes if n.full_name == "embeddings")  # g2.add x pos -> x
    arena = model.arena.copy()
    x = model.regions["x"]
    arena[x.base: x.base + x.size] = 1.0
    before = arena.copy()
    with pytest.raises(BudgetExceeded):
        C.CompiledRunner(model).run(node, arena, 4)
    assert same_bits(arena, before)


def test_one_lane_past_the_end_makes_the_kernel_fallible(tmp_path):
    """threads = size + 1: the last lane's store faults after the others stored."""
    kernel = ("kernel t.over in=1 out=1 threads=out0.size+1 tg=1 tgbytes=16\n"
              "rtou 0 0\nustoref32 0 0 @out0\nendkernel\n")
    text = SEED_FIR.read_text().replace("node token ext", "buf ov f32 16\n" + kernel
                                        + "node token ext", 1) + "node over micro t.over x -> ov\n"
    model = load_model(write_random_gpt2(tmp_path / "over", fir_text=text))
    node = next(n for n in model.nodes if n.full_name == "over")
    runner = C.CompiledRunner(model)
    assert runner.plan(node).infallible is None
    arena = model.arena.copy()
    with pytest.raises(FirFault, match="lane 16.*store to @out0 index 16"):
        runner.run(node, arena, None)
    assert same_bits(arena, model.arena)  # lanes 0..15 stored, and were undone


def test_a_wrong_proof_is_reported_not_hidden(tmp_path):
    """If the analysis ever called a faulting kernel infallible, the runner says so (and
    journals it from then on) instead of leaving a half-run node silently."""
    kernel = ("kernel t.over in=1 out=1 threads=out0.size+1 tg=1 tgbytes=16\n"
              "rtou 0 0\nustoref32 0 0 @out0\nendkernel\n")
    text = SEED_FIR.read_text().replace("node token ext", "buf ov f32 16\n" + kernel
                                        + "node token ext", 1) + "node over micro t.over x -> ov\n"
    model = load_model(write_random_gpt2(tmp_path / "wrong", fir_text=text))
    node = next(n for n in model.nodes if n.full_name == "over")
    runner = C.CompiledRunner(model)
    runner.plan(node).infallible = 2  # a deliberately wrong proof
    arena = model.arena.copy()
    with pytest.raises(FirError, match="internal error.*stopped early although no lane could"):
        runner.run(node, arena, None)
    # A straight kernel's plain driver checks every lane before the first store.
    assert "bad = False" in runner.plan(node).gen.source
    assert same_bits(arena, model.arena)
    assert runner.plan(node).infallible is None
    arena = model.arena.copy()
    with pytest.raises(FirFault):
        runner.run(node, arena, None)
    assert same_bits(arena, model.arena)


def test_straight_kernels_run_vectorized_with_the_interpreters_bits():
    """g2.add and g2.gelu_new (no loop, indices from the lane alone) get run_plain's
    vector loops (checks, then the lanes without an exit); layernorm and attention do not.
    gelu over NaN, infinities, signed zeros, subnormals and the edges of sigmoid's clamp
    gives the interpreter's bits."""
    model = load_model(SEED_FIR)
    runner = C.CompiledRunner(model)
    kinds = {}
    for n in model.nodes:
        if n.kind == "micro":
            kinds[n.target] = "bad = False" in runner.plan(n).gen.source
    assert kinds == {"g2.add": True, "g2.gelu_new": True, "g2.layernorm": False,
                     "g2.attn_decode": False}
    node = next(n for n in model.nodes if n.target == "g2.gelu_new")
    src = dict(node.program.operands)["in0"]
    edge = np.float32(104.0) / np.float32(2 * np.sqrt(2 / np.pi))
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3e38,
                        -3e38, 9.0, -9.0, 9.5, -9.5], dtype=np.float32)
    special = np.concatenate([special, np.nextafter(edge, np.float32([0, 100, -100])),
                              -np.nextafter(edge, np.float32([0, 100, -100]))])
    rng = np.random.default_rng(3)
    for scale in (1.0, 8.0, 40.0):
        arena = model.arena.copy()
        vals = (rng.standard_normal(src.size) * scale).astype(np.float32)
        vals[:special.size] = special
        arena[src.base: src.base + src.size] = vals
        assert_plain_run_is_the_interpreters(runner, node, arena)
        # and the NumPy statement of the reference, op for op (kf: 0.044715, 2 sqrt(2/pi))
        c0, c1 = runner.plan(node).gen.kf
        with np.errstate(all="ignore"):
            t = (((vals * vals) * vals) * c0 + vals) * c1
            want = vals * sigmoid_f32_numpy(t)
        dst = dict(node.program.operands)["out0"]
        assert same_bits(arena[dst.base: dst.base + dst.size], want)


# One lane walks @out0 with a step of ``{step}`` (uint32) from element ``{start}``, ``{count}``
# trips, storing the trip's count of elements left (with ``first``, it steps before it
# stores): a loop the plain driver checks once, before its first trip, where the steps do
# not wrap around 2^32.
WALK = """kernel t.walk in=1 out=1 threads=1 tg=1 tgbytes=16
uconst 0 {start}
loadconstf32 1 {count}
loadconstf32 2 0
forbegin 1
{pre}ustoref32 1 0 @out0
uloadf32 2 0 @out0
addconst 1 1 -1
{post}forend
endkernel
"""


def walk_model(tmp_path, start: int, count: int, step: int, first: bool = False):
    move = f"uaddk 0 0 {step}\n"
    kernel = WALK.format(start=start, count=count, pre=move if first else "",
                         post="" if first else move)
    text = stray_fir_text(kernel, "node walk micro t.walk position -> x")
    return load_model(write_random_gpt2(tmp_path / f"walk{start}_{count}_{step}_{first}",
                                        n_layer=1,
                                        n_embd=32, n_head=4, n_positions=16, vocab=64,
                                        fir_text=text))


@pytest.mark.parametrize("start,count,step,first", [(0, 32, 1, False), (31, 32, 4294967295, False),
                                                    (5, 9, 3, False), (4, 9, 3, True)])
def test_a_loop_checked_once_gives_the_interpreters_bits(tmp_path, start, count, step, first):
    """The plain driver checks a loop's accesses once, from its first and last trip: a
    forward walk (checked once), a backward one (a step of 2^32 - 1: uint32 wrap-around,
    so the loop with its checks runs) and strided ones (stepping after and before the
    accesses) give the interpreter's arena."""
    model = walk_model(tmp_path, start, count, step, first)
    node = next(n for n in model.nodes if n.target == "t.walk")
    plan = C.CompiledRunner(model).plan(node)
    assert "# bounds" in plan.gen.source and " <= 1073741824 and " in plan.gen.source
    arena = model.arena.copy()
    ref = arena.copy()
    Dispatch(node.program, ref).run()
    assert plan.driver("run_plain")(*plan.plain_args(arena, 1)) == 0
    assert same_bits(arena, ref)


def test_a_loop_that_leaves_its_region_still_stops_the_plain_driver(tmp_path):
    """33 trips over a 32-element region: the check before the loop fails, the loop with
    its checks runs and stops at the last trip (run_plain's -1, which a wrong proof would
    get: the runner reports it)."""
    model = walk_model(tmp_path, 0, 33, 1)
    node = next(n for n in model.nodes if n.target == "t.walk")
    runner = C.CompiledRunner(model)
    plan = runner.plan(node)
    arena = model.arena.copy()
    assert plan.driver("run_plain")(*plan.plain_args(arena, 1)) == -1
    # stepping first, 31 trips from 0 reach element 31 (the last); 32 leave the region
    for count, status in ((31, 0), (32, -1)):
        p = C.CompiledRunner(walk_model(tmp_path, 0, count, 1, True))
        wp = p.plan(next(n for n in p.model.nodes if n.target == "t.walk"))
        got = wp.driver("run_plain")(*wp.plain_args(p.model.arena.copy(), 1))
        assert got == status
    with pytest.raises(FirFault):
        runner.run(node, model.arena.copy(), None)
    plan.infallible = 10 ** 6  # a deliberately wrong proof
    with pytest.raises(FirError, match="internal error.*stopped early although no lane could"):
        runner.run(node, model.arena.copy(), None)


# --- kernels proved per dispatch, from the values they read -----------------------------------
def test_attention_is_proved_for_the_position_it_reads():
    """attn_decode's loop counts come from the position buffer: no proof for every dispatch,
    but one for the positions that keep every index in bounds and in its lane's slice
    (0..n_positions-1: position p stores row p of the caches and reads p + 1 scores)."""
    model = load_model(SEED_FIR)
    node = next(n for n in model.nodes if n.target == "g2.attn_decode")
    runner = C.CompiledRunner(model)
    plan = runner.plan(node)
    assert plan.infallible is None and plan.proofs is not None
    assert plan.reads == (model.inputs["position"].base,)
    n_pos = model.regions["scores"].size // node.program.threads
    proofs = plan.proofs
    made = len(proofs.boxes)  # proved when planned: no dispatch waits for an analysis
    few, last = proofs.steps((3.0,)), proofs.steps((float(n_pos - 1),))
    assert few is not None and last is not None and few < last
    assert len(proofs.boxes) == made
    assert proofs.steps((float(n_pos),)) is None  # stores past the caches' last row
    for bad in (-1.0, float("nan"), float("inf"), 1e30):
        assert proofs.steps((bad,)) is None
    assert proofs.steps((2.5,)) is not None  # truncated, as rtou does
    # one proof for every layer's node (the same instructions, numbers and aliasing)
    others = [runner.plan(n).proofs for n in model.nodes if n.target == "g2.attn_decode"]
    assert all(p is proofs for p in others)


def test_attention_takes_the_plain_driver_with_the_interpreters_bits():
    model = load_model(SEED_FIR)
    node = next(n for n in model.nodes if n.target == "g2.attn_decode")
    pos = model.inputs["position"].base
    runner = C.CompiledRunner(model)
    n_pos = model.regions["scores"].size // node.program.threads
    rng = np.random.default_rng(1)
    for p in (0, 5, n_pos - 1):
        arena = model.arena.copy()
        arena[:] = rng.standard_normal(arena.size).astype(np.float32)
        arena[pos] = p
        assert_plain_run_is_the_interpreters(runner, node, arena)
    arena = model.arena.copy()
    arena[pos] = n_pos  # past the end: the checked driver, the interpreter's fault
    before = arena.copy()
    with pytest.raises(FirFault, match="store to @in2"):
        runner.run(node, arena, None)
    assert same_bits(arena, before)
    assert runner.plain_dispatches == 3


def test_a_range_proof_does_not_let_lanes_stray(stray_model):
    """t.stray reads its loop count from the position: lane l writes x[3l .. 3l + position
    + 1], inside its three elements for positions 0 and 1 only. A proof made for a range
    of positions must hold for all of it (the induction variable's range widens with the
    count: a wider range than 0..1 would let lane 0 into lane 1's elements)."""
    model = load_model(stray_model)
    node = next(n for n in model.nodes if n.target == "t.stray")
    runner = C.CompiledRunner(model)
    proofs = runner.plan(node).proofs
    assert proofs.steps((0.0,)) is not None and proofs.steps((1.0,)) is not None
    assert proofs.steps((2.0,)) is None and proofs.steps((3.0,)) is None
    assert all(hi < 2 for box, _ in proofs.boxes for _, hi in box)
    x = model.regions["x"]
    for p, plain in ((1, True), (2, False)):
        arena = model.arena.copy()
        arena[model.inputs["position"].base] = p
        arena[x.base: x.base + x.size] = np.linspace(-1, 1, x.size, dtype=np.float32)
        ref = arena.copy()
        Dispatch(node.program, ref).run()
        before = runner.plain_dispatches
        runner.run(node, arena, None)
        assert (runner.plain_dispatches > before) == plain
        assert same_bits(arena, ref)
