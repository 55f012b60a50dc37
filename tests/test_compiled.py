"""The compiled micro-kernels against the step interpreter (the reference).

Every comparison is bitwise (arenas viewed as uint32, so -0.0 and NaN payloads
count): both engines do IEEE f32 arithmetic op for op in the same order, and
exp/sigmoid are the same functions (model/numeric_kernels, the reference's
definitions), so there is no rounding difference to tolerate. Lockstep vs per-lane execution order cannot
matter for these kernels: lanes only touch their own slice of what they write
(checked by the compiled path at run time).
"""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, SEED_FIR, write_random_gpt2
from firscope.errors import BudgetExceeded, FirError, FirFault, Interrupted
from firscope.runtime import load_model
from firscope.runtime import Machine
from firscope.vm.compiled import CompiledRunner, StopFlag, generate, lane_partition
from firscope.vm.interp import Dispatch
from firscope.vm.operands import Address


def sample_firs() -> list[Path]:
    """Every bundled sample model whose checkpoint is present."""
    return sorted(p for p in (REPO / "sample_models").glob("*/gpt2.fir")
                  if (p.parent / "model.safetensors").exists()
                  and (p.parent / "config.json").exists())


RANDOM_SHAPES = {
    "rand-small": dict(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab=256),
    "rand-odd": dict(n_layer=1, n_embd=48, n_head=3, n_positions=20, vocab=97, seed=5),
}


@pytest.fixture(params=list(RANDOM_SHAPES) + [p.parent.name for p in sample_firs()])
def any_model(request, tmp_path) -> Path:
    if request.param in RANDOM_SHAPES:
        return write_random_gpt2(tmp_path / request.param, **RANDOM_SHAPES[request.param])
    return REPO / "sample_models" / request.param / "gpt2.fir"


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


def first_difference(a: np.ndarray, b: np.ndarray, model) -> str:
    bad = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
    if not bad.size:
        return "none"
    i = int(bad[0])
    where = next((r.name for r in model.regions.values() if r.base <= i < r.base + r.size), "?")
    return f"{bad.size} elements differ, first at {i} in {where}: interp {a[i]!r} compiled {b[i]!r}"


def randomize_buffers(model, rng) -> None:
    """Random data in every buffer, valid token/position inputs."""
    for name, r in model.regions.items():
        if name.split("@")[0] in model.buffers:
            model.arena[r.base: r.base + r.size] = rng.normal(0, 1, r.size).astype(np.float32)
    model.arena[model.inputs["token"].base] = rng.integers(0, model.vocab)
    limit = model.n_positions or 1
    model.arena[model.inputs["position"].base] = rng.integers(0, limit)


def run_both(model, runner, node, arena, budget=10_000_000):
    a, b = arena.copy(), arena.copy()
    Dispatch(node.program, a).run(budget)
    runner.run(node, b, budget)
    return a, b


# --- every kernel of every model ---------------------------------------------------------
def test_every_micro_node_matches_interpreter_bitwise(any_model):
    model = load_model(any_model)
    runner = CompiledRunner(model)
    assert runner.fallbacks == {} or all("g2." not in k for k in runner.fallbacks)
    machine = Machine(model, engine="interp")
    for tok in (3, 1, 4, 1, 5):  # a realistic arena: caches filled by a few decode steps
        machine.step(tok % model.vocab)
    arenas = [model.arena.copy()]
    rng = np.random.default_rng(7)
    for _ in range(2):
        randomize_buffers(model, rng)
        arenas.append(model.arena.copy())
    checked = set()
    for arena in arenas:
        for node in model.nodes:
            if node.kind != "micro":
                continue
            a, b = run_both(model, runner, node, arena)
            assert same_bits(a, b), f"{node.full_name}: {first_difference(a, b, model)}"
            checked.add(node.target)
    assert checked == set(model.kernels), "some kernel was never run"
    assert runner.fallbacks == {}, runner.fallbacks  # the seed kernels all compile


def test_whole_decode_matches_interpreter(any_model):
    model_i = load_model(any_model)
    model_c = load_model(any_model)
    mi = Machine(model_i, engine="interp")
    mc = Machine(model_c, engine="compiled")
    ids = [int(t) for t in np.random.default_rng(1).integers(0, model_i.vocab, 6)]
    gen_i, logits_i = mi.generate(ids, 4)
    gen_c, logits_c = mc.generate(ids, 4)
    assert gen_i == gen_c
    for li, lc in zip(logits_i, logits_c):
        assert same_bits(li, lc)
    assert same_bits(model_i.arena, model_c.arena)  # KV caches and every buffer too


def test_compiled_decode_agrees_with_numpy_gpt2(tmp_path):
    """Not only equal to the interpreter: also right (f32 rounding differences only)."""
    from safetensors.numpy import load_file

    from npgpt2 import NumpyGPT2
    fir = write_random_gpt2(tmp_path / "m", **RANDOM_SHAPES["rand-small"])
    import json
    ref = NumpyGPT2(load_file(str(fir.parent / "model.safetensors")),
                    json.loads((fir.parent / "config.json").read_text()))
    mc = Machine(load_model(fir, fir_f32=True), engine="compiled")
    for tok in (5, 17, 200, 3):
        got = mc.step(tok).logits
        want = ref.step(tok)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def test_runner_works_on_any_arena_copy(random_model):
    model = load_model(random_model)
    runner = CompiledRunner(model)
    randomize_buffers(model, np.random.default_rng(3))
    before = model.arena.copy()
    node = next(n for n in model.nodes if n.target == "g2.attn_decode")
    other = model.arena.copy()
    runner.run(node, other, None)
    assert same_bits(model.arena, before)  # the model's own arena is untouched
    want = model.arena.copy()
    Dispatch(node.program, want).run()
    assert same_bits(other, want)
    assert not same_bits(other, before)  # and the kernel did write something


def test_one_compiled_function_serves_every_layer(random_model):
    from firscope.vm.kernel_cache import load_module as _load_module
    model = load_model(random_model)
    runner = CompiledRunner(model)
    runner.warmup()
    shas = {}
    for node in model.nodes:
        if node.kind == "micro":
            shas.setdefault(node.target, set()).add(runner.plan(node).gen.sha)
    # g2.add runs on three sizes (n_embd, 3*n_embd, 4*n_embd): sizes are arguments
    assert {k: len(v) for k, v in shas.items()} == {
        "g2.add": 1, "g2.layernorm": 1, "g2.attn_decode": 1, "g2.gelu_new": 1}
    for target, nodes in by_target(model).items():  # one Generated per kernel and sizes,
        gens = {}                                   # shared by the layers' nodes
        for n in nodes:
            plan = runner.plan(n)
            key = tuple(a.extent for op in n.program.ops for a in op.args
                        if isinstance(a, Address))
            assert gens.setdefault(key, plan.gen) is plan.gen, n.full_name
            fresh = generate(n.program, plan.slicing)
            assert (fresh.source, fresh.slots, fresh.fault_pcs, fresh.kf.tobytes(),
                    fresh.ki.tobytes()) == (plan.gen.source, plan.gen.slots, plan.gen.fault_pcs,
                                            plan.gen.kf.tobytes(), plan.gen.ki.tobytes())
        assert len(nodes) > len(gens), target  # shared: the model has several layers
    for n in model.nodes:  # warmup compiled the driver every node runs (attention, proved
        if n.kind == "micro":  # per dispatch, runs the plain one below its last position)
            plan = runner.plan(n)
            plain = plan.infallible is not None or plan.proofs is not None
            driver = "run_plain" if plain else "run_lanes"
            assert getattr(_load_module(plan.gen), driver).signatures, n.full_name
    assert any(runner.plan(n).proofs is not None for n in model.nodes if n.kind == "micro")


def test_a_kernels_lane_analysis_made_once_holds_for_every_node_that_binds_it(random_model):
    """The runner analyses each kernel's lanes once for the nodes that bind it alike
    (kernel_plan.lane_key) and rebases the result: each node's slicing, infallible steps and
    uniform reads (attention's position: an arena address per layer) equal those of an
    analysis of that node alone."""
    from firscope.vm.lanes import analyse, infallible_steps, uniform_reads
    model = load_model(random_model)
    runner = CompiledRunner(model)
    micro = [n for n in model.nodes if n.kind == "micro"]
    for n in micro:
        plan = runner.plan(n)
        an = analyse(n.program)
        slicing, why = lane_partition(n.program, an)
        infallible = infallible_steps(an, plan.gen.fault_pcs)
        reads = uniform_reads(an) if infallible is None else {}
        assert (plan.slicing, plan.infallible, plan.reads) == \
            (slicing, infallible, tuple(reads[pc] for pc in sorted(reads))), n.full_name
    assert len(runner._lane_facts) < len(micro)  # made once per kernel and shapes
    attn = [runner.plan(n) for n in micro if n.target == "g2.attn_decode"]
    assert len({p.reads for p in attn}) == 1 and attn[0].reads  # the one position buffer
    assert len({tuple(p.slicing) for p in attn}) == len(attn)  # each layer's own caches

def test_lane_keys_tell_bases_apart_only_where_regions_stay_disjoint():
    """Moved to other bases the same kernel has the same key; where two of its regions
    overlap (one buffer bound at two places) it has none: the analysis could then find an
    address inside a written region that another layout keeps outside."""
    from firscope.compare.lanes import relocate
    from firscope.vm.kernel_plan import lane_key
    from kernel_util import kernel_program
    src = ("kernel k in=2 out=1 threads=4 tg=4 tgbytes=0\nrtou 0 0\nuloadf32 1 0 @in0\n"
           "uloadf32 2 0 @in1\nadd 1 1 2\nustoref32 1 0 @out0\nendkernel\n")
    program, _, regions = kernel_program(src, {"in0": 4, "in1": 4, "out0": 4})
    key, bases = lane_key(program)
    moved = relocate(program, {0: 100, 4: 50, 8: 8})
    assert lane_key(moved) == (key, (100, 50, 8))
    assert lane_key(relocate(program, {0: 0, 4: 2, 8: 8})) is None  # in0, in1 overlap
    bigger, _, _ = kernel_program(src, {"in0": 4, "in1": 8, "out0": 4})
    assert lane_key(bigger)[0] != key  # a region's size is part of the key


RACE = """
import sys, time
from pathlib import Path
from firscope.runtime import load_model
from firscope.vm.codegen import generate
from firscope.vm.kernel_cache import compiled_driver
model = load_model(sys.argv[1])
node = min((n for n in model.nodes if n.kind == "micro"), key=lambda n: len(n.program.ops))
gen = generate(node.program)
go = Path(sys.argv[2])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.002)
fn = compiled_driver(gen, "run_plain")
print(sum(fn.stats.cache_misses.values()), sum(fn.stats.cache_hits.values()), flush=True)
"""


def test_processes_sharing_the_cache_compile_a_kernel_once(tmp_path):
    """Two processes that need the same uncached driver at the same instant: one compiles
    it, the other waits for it (vm/kernel_cache's file lock) and loads the machine code
    from numba's cache (without the lock both compile, seconds each for a large kernel)."""
    import os
    import subprocess
    import sys
    # a kernel folder of their own (the kernel's machine code is cached by its file's
    # path); numba's cache stays the test run's (the helpers every kernel calls, loaded)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(SEED_FIR), str(go)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()[-2000:]
        go.write_text("")  # both call compiled_driver now
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    misses_hits = sorted(tuple(map(int, out.split())) for out, _ in outs)
    assert misses_hits == [(0, 1), (1, 0)], misses_hits


BUMP = """
buf al_x f32 64
buf al_y f32 64
kernel t.bump in=1 out=1 threads=64 tg=64 tgbytes=0
rtou 0 0
uloadf32 1 0 @in0
addconst 1 1 1
ustoref32 1 0 @out0
endkernel
"""
BUMP_NODES = """
node same micro t.bump al_x -> al_x
node apart micro t.bump al_x -> al_y
node back micro t.bump al_y -> al_x
"""


def test_code_is_generated_once_per_aliasing_not_per_node(tmp_path):
    """The runner reuses a node's generated code for another node of the same kernel only
    when the operands alias alike (and sizes and numbers are equal): a kernel reading the
    region it writes gets code checking its reads against the lane's slice; the same
    kernel on two regions does not."""
    model = load_model(model_with(tmp_path, BUMP, BUMP_NODES, "alias"))
    runner = CompiledRunner(model)
    same, apart, back = (runner.plan(node_named(model, n)) for n in ("same", "apart", "back"))
    assert apart.gen is back.gen and same.gen is not apart.gen
    assert same.gen.source != apart.gen.source
    for p in (same, apart, back):
        assert p.gen.source == generate(p.program, p.slicing).source
    for name in ("same", "apart", "back"):
        a, b = run_both(model, runner, node_named(model, name), model.arena)
        assert same_bits(a, b), name


def by_target(model) -> dict[str, list]:
    out: dict[str, list] = {}
    for n in model.nodes:
        if n.kind == "micro":
            out.setdefault(n.target, []).append(n)
    return out


def test_models_of_every_shape_share_the_compiled_kernels(tmp_path):
    """The generated source depends on the instructions alone: a model with other widths,
    heads, positions and vocabulary compiles nothing new (numbers come in as slots)."""
    a = load_model(SEED_FIR)
    b = load_model(write_random_gpt2(tmp_path / "b", **RANDOM_SHAPES["rand-odd"]))
    shas = []
    for model in (a, b):
        runner = CompiledRunner(model)
        shas.append({n.target: runner.plan(n).gen.sha for n in model.nodes if n.kind == "micro"})
    assert shas[0] == shas[1]
    assert len(set(shas[0].values())) == 4
    # ... while the numbers each node binds differ: extents, 1/sqrt(headdim), offsets
    ra, rb = CompiledRunner(a), CompiledRunner(b)
    attn = [next(n for n in m.nodes if n.target == "g2.attn_decode") for m in (a, b)]
    ga, gb = ra.plan(attn[0]).gen, rb.plan(attn[1]).gen
    assert not np.array_equal(ga.kf, gb.kf) and not np.array_equal(ga.ki, gb.ki)
    assert np.float32(1 / np.sqrt(32)) in ga.kf and np.float32(1 / np.sqrt(16)) in gb.kf


def test_generated_code_comes_from_the_instructions_not_the_name(tmp_path):
    """Renaming every kernel gives the same generated code and the same decode."""
    text = SEED_FIR.read_text()
    for old in ("g2.attn_decode", "g2.layernorm", "g2.gelu_new", "g2.add"):
        text = text.replace(old, "zz." + old.split(".")[1][::-1])
    a = write_random_gpt2(tmp_path / "a", seed=2)
    b = write_random_gpt2(tmp_path / "b", seed=2, fir_text=text)
    ma, mb = load_model(a), load_model(b)
    ga = [generate(n.program).source.split("\n", 1)[1] for n in ma.nodes if n.kind == "micro"]
    gb = [generate(n.program).source.split("\n", 1)[1] for n in mb.nodes if n.kind == "micro"]
    assert ga == gb
    la = Machine(ma, engine="compiled").step(7).logits
    lb = Machine(mb, engine="compiled").step(7).logits
    assert same_bits(la, lb)


# --- divergent lanes ------------------------------------------------------------------------
DIVERGENT = """
buf dv_in f32 40
buf dv_out f32 40
buf dv_slab f32 40*8
buf dv_small f32 40
# Per-lane loop counts (some lanes run 0 trips), nested ifs, a loop inside an if,
# a store per trip into the lane's own 8-element slice.
kernel t.diverge in=1 out=2 threads=in0.size tg=1 tgbytes=16
rtou 0 0
uloadf32 1 0 @in0
mulconst 2 0 0.19
addconst 2 2 -1.5
loadconstf32 3 0
loadconstf32 6 1
umulk 1 0 8
forbegin 2
addconst 3 3 1.25
cmplt 4 3 1
ifbegin 4
mul 3 3 1
loadconstf32 5 2
forbegin 5
addconst 3 3 0.5
sigmoid 7 3
add 3 3 7
forend
ifend
cmplt 8 1 3
ifbegin 8
exp 9 1
div 3 3 9
ifbegin 6
rsqrt 10 9
sub 3 3 10
ifend
ifend
ustoref32 3 1 @out1
uaddk 1 1 1
forend
ustoref32 3 0 @out0
endkernel
# Loop counts read from data: lane-dependent, and a loop nested in a loop in an if.
kernel t.datacount in=1 out=1 size=in0,out0 threads=out0.size tg=1 tgbytes=16
rtou 0 0
uloadf32 1 0 @in0
mul 1 1 1
mulconst 1 1 3
loadconstf32 2 0
cmplt 3 2 1
ifbegin 3
forbegin 1
loadconstf32 4 1.5
forbegin 4
addconst 2 2 0.75
forend
mulconst 2 2 0.5
forend
ifend
ustoref32 2 0 @out0
endkernel
# uint32 wrap-around: (2^32-1)*3 + lane + 3 wraps back to lane.
kernel t.wrap in=1 out=1 size=in0,out0 threads=out0.size tg=1 tgbytes=16
rtou 0 0
uconst 2 4294967295
umulk 3 2 3
uadd 3 3 0
uaddk 3 3 3
uloadf32 1 3 @in0
ustoref32 1 0 @out0
endkernel
# Lanes that communicate: each reads its neighbour's freshly stored value.
kernel t.neighbour in=1 out=1 threads=in0.size-1 tg=1 tgbytes=16
rtou 0 0
uloadf32 1 0 @in0
ustoref32 1 0 @out0
uloadf32 2 0 @out0+1
add 1 1 2
ustoref32 1 0 @out0
endkernel
"""
DIVERGENT_NODES = """
node diverge micro t.diverge dv_in -> dv_out dv_slab
node datacount micro t.datacount dv_in -> dv_small
node wrap micro t.wrap dv_in -> dv_out
node neighbour micro t.neighbour dv_in -> dv_small
"""


def model_with(tmp_path, kernels: str, nodes: str, name="ext") -> Path:
    text = SEED_FIR.read_text()
    head, tail = text.split("node token ext", 1)
    fir_text = head + kernels + "node token ext" + tail + nodes
    return write_random_gpt2(tmp_path / name, fir_text=fir_text)


@pytest.fixture
def divergent_model(tmp_path):
    return load_model(model_with(tmp_path, DIVERGENT, DIVERGENT_NODES))


def node_named(model, name):
    return next(n for n in model.nodes if n.full_name == name)


@pytest.mark.parametrize("seed", range(6))
def test_divergent_kernels_match_interpreter(divergent_model, seed):
    model = divergent_model
    runner = CompiledRunner(model)
    rng = np.random.default_rng(seed)
    randomize_buffers(model, rng)
    dv = model.regions["dv_in"]
    values = rng.normal(0, 1.5, dv.size).astype(np.float32)
    values[rng.integers(0, dv.size, 4)] = 0.0
    model.arena[dv.base: dv.base + dv.size] = values
    for name in ("diverge", "datacount", "wrap"):
        node = node_named(model, name)
        a, b = run_both(model, runner, node, model.arena)
        assert same_bits(a, b), f"{name}: {first_difference(a, b, model)}"
    assert runner.plan(node_named(model, "diverge")).gen is not None


def test_lanes_really_diverge(divergent_model):
    """The divergence test is only a test if lanes take different paths."""
    model = divergent_model
    randomize_buffers(model, np.random.default_rng(0))
    d = Dispatch(node_named(model, "diverge").program, model.arena.copy())
    masks = set()
    while not d.done:
        d.step()
        masks.add(d.active)
    assert len(masks) > 3
    assert d.lane_steps < d.steps * d.lanes


def test_communicating_kernel_falls_back_to_interpreter(divergent_model):
    model = divergent_model
    runner = CompiledRunner(model)
    node = node_named(model, "neighbour")
    slicing, why = lane_partition(node.program)
    assert slicing is None and "dv_small" in why
    randomize_buffers(model, np.random.default_rng(1))
    a, b = run_both(model, runner, node, model.arena)
    assert same_bits(a, b)
    assert "neighbour" in runner.fallbacks


# --- faults, budget, stop -----------------------------------------------------------------------
FAULTS = """
buf f_in f32 16
buf f_out f32 16
# Lane l starts at index l and walks by 3: higher lanes leave in0 on earlier trips.
kernel t.walk in=1 out=1 threads=8 tg=1 tgbytes=16
rtou 0 0
uloadf32 1 0 @in0
uaddk 2 0 0
forbegin 1
uaddk 2 2 3
uloadf32 3 2 @in0
forend
ustoref32 3 0 @out0
endkernel
kernel t.rtou in=1 out=1 threads=8 tg=1 tgbytes=16
rtou 0 0
uloadf32 1 0 @in0
rtou 1 1
ustoref32 1 0 @out0
endkernel
kernel t.nancount in=1 out=1 threads=8 tg=1 tgbytes=16
rtou 0 0
uloadf32 1 0 @in0
loadconstf32 2 2
forbegin 2
forbegin 1
addconst 3 3 1
forend
forend
ustoref32 3 0 @out0
endkernel
kernel t.store in=1 out=1 threads=8 tg=1 tgbytes=16
rtou 0 0
uloadf32 1 0 @in0
ustoref32 1 0 @out0+12
endkernel
# Lane l fills out0[4l ..] with as many values as in0[l] says: fine up to 4.
kernel t.fill in=1 out=1 threads=4 tg=1 tgbytes=16
rtou 0 0
uloadf32 1 0 @in0
umulk 2 0 4
forbegin 1
ustoref32 1 2 @out0
uaddk 2 2 1
forend
endkernel
kernel t.spin in=1 out=1 threads=4 tg=1 tgbytes=16
rtou 0 0
loadconstf32 1 1e9
forbegin 1
addconst 2 2 1
ifbegin 2
mulconst 2 2 0.5
ifend
forend
ustoref32 2 0 @out0
endkernel
"""
FAULT_NODES = """
node walk micro t.walk f_in -> f_out
node rtou micro t.rtou f_in -> f_out
node nancount micro t.nancount f_in -> f_out
node store micro t.store f_in -> f_out
node spin micro t.spin f_in -> f_out
node fill micro t.fill f_in -> f_out
"""


@pytest.fixture
def fault_model(tmp_path):
    return load_model(model_with(tmp_path, FAULTS, FAULT_NODES, "faults"))


def both_errors(model, node_name, inputs, budget=10_000_000):
    r = model.regions["f_in"]
    model.arena[r.base: r.base + r.size] = np.asarray(inputs, dtype=np.float32)
    node = node_named(model, node_name)
    errs = []
    for engine in ("interp", "compiled"):
        arena = model.arena.copy()
        with pytest.raises(FirError) as info:
            if engine == "interp":
                Dispatch(node.program, arena).run(budget)
            else:
                CompiledRunner(model).run(node, arena, budget)
        errs.append(info.value)
    return errs


def assert_same_error(ei, ec):
    assert type(ei) is type(ec)
    assert str(ei) == str(ec)
    if isinstance(ei, FirFault):
        assert (ei.kernel, ei.node, ei.layer, ei.lane, ei.pc, ei.address) == \
               (ec.kernel, ec.node, ec.layer, ec.lane, ec.pc, ec.address)


@pytest.mark.parametrize("counts", [
    [9] * 16,  # every lane faults; lane 7 first (trip 3), lockstep order decides
    [9, 9, 9, 9, 1, 1, 1, 1] + [0] * 8,  # only lanes 0..3 get far enough
    [0, 2, 0, 5, 0, 0, 1, 4] + [0] * 8,  # lane 3 (trip 5) vs lane 7 (trip 3)
])
def test_out_of_bounds_load_in_loop_same_fault(fault_model, counts):
    ei, ec = both_errors(fault_model, "walk", counts)
    assert isinstance(ei, FirFault) and "load from @in0" in str(ei)
    assert_same_error(ei, ec)


def test_rtou_fault_same(fault_model):
    vals = [1, 2, 3, -0.5, 5, np.nan, 7, 8] + [0] * 8
    ei, ec = both_errors(fault_model, "rtou", vals)
    assert "rtou of R1 = -0.5 in lane 3" in str(ei)
    assert_same_error(ei, ec)
    ei, ec = both_errors(fault_model, "rtou", [1, 2, 3, 4, 5, np.inf, 7, 8] + [0] * 8)
    assert "lane 5" in str(ei)
    assert_same_error(ei, ec)
    ei, ec = both_errors(fault_model, "rtou", [1, 2, 4294967040.0, 5e9] + [0] * 12)
    assert "rtou of R1 = 5000000000.0 in lane 3" in str(ei)  # 2^32 - 256 still converts
    assert_same_error(ei, ec)


def test_non_finite_loop_count_same_fault(fault_model):
    ei, ec = both_errors(fault_model, "nancount", [1, 2, np.nan, 1, -np.inf, 1, 1, 1] + [0] * 8)
    assert "loop count R1 = nan in lane 2 is not finite" in str(ei)
    assert_same_error(ei, ec)


def test_out_of_bounds_store_same_fault(fault_model):
    ei, ec = both_errors(fault_model, "store", list(range(16)))
    assert "store to @out0+12 index 16" in str(ei) and "lane 4" in str(ei)
    assert_same_error(ei, ec)


@pytest.mark.parametrize("budget", [1, 2, 3, 4, 5, 1000, 12345])
def test_budget_overrun_same_error(fault_model, budget):
    ei, ec = both_errors(fault_model, "spin", [0] * 16, budget=budget)
    assert isinstance(ei, BudgetExceeded)
    assert f"more than {budget} instructions" in str(ei)
    assert_same_error(ei, ec)


def test_budget_counts_whole_kernel_exactly(fault_model):
    """A budget equal to the instruction count passes; one less stops at the last op."""
    node = node_named(fault_model, "store")
    r = fault_model.regions["f_in"]
    fault_model.arena[r.base: r.base + r.size] = 0
    node = node_named(fault_model, "rtou")
    d = Dispatch(node.program, fault_model.arena.copy())
    d.run()
    runner = CompiledRunner(fault_model)
    runner.run(node, fault_model.arena.copy(), d.steps)
    with pytest.raises(BudgetExceeded, match=f"pc {d.steps - 1}"):
        runner.run(node, fault_model.arena.copy(), d.steps - 1)


def test_stop_flag_interrupts_a_running_kernel(fault_model):
    node = node_named(fault_model, "spin")
    runner = CompiledRunner(fault_model)
    runner.warmup()
    flag = StopFlag()
    threading.Timer(0.3, flag.set).start()
    t = time.perf_counter()
    with pytest.raises(Interrupted, match="t.spin"):
        runner.run(node, fault_model.arena.copy(), None, stop=flag)
    assert time.perf_counter() - t < 5  # 1e9 trips x 4 lanes would take far longer
    flag.clear()
    with pytest.raises(BudgetExceeded):  # cleared: runs again (until its budget)
        runner.run(node, fault_model.arena.copy(), 100_000, stop=flag)


def test_a_set_plain_event_stops_before_the_dispatch(fault_model):
    ev = threading.Event()
    ev.set()
    with pytest.raises(Interrupted):
        CompiledRunner(fault_model).run(node_named(fault_model, "spin"),
                                        fault_model.arena.copy(), None, stop=ev)


# --- command line ------------------------------------------------------------------------------
def test_cli_run_engines_agree(random_model, tmp_path, capsys):
    from firscope.cli import main
    outs = {}
    for engine in ("interp", "compiled"):
        path = tmp_path / f"{engine}.npy"
        assert main(["run", str(random_model), "--tokens", "1,2,3", "-n", "3", "--ids",
                     "--engine", engine, "--logits-out", str(path)]) == 0
        outs[engine] = (capsys.readouterr().out, np.load(path))
    assert outs["interp"][0] == outs["compiled"][0]
    assert same_bits(outs["interp"][1], outs["compiled"][1])


# --- the compiled Q4 quantizer equals the format's NumPy formula -----------------------------
@pytest.mark.parametrize("shape,group", [((96, 768), 32), ((37, 101), 32), ((5, 7), 3),
                                         ((4, 64), 16), ((3, 33), 32), ((2, 1), 32)])
def test_quantize_equals_numpy_reference(shape, group):
    from firscope.model.q4 import quantize, quantize_numpy
    rng = np.random.default_rng(sum(shape) + group)
    w = rng.normal(0, 0.02, shape).astype(np.float32)
    w[0, : min(group, shape[1])] = 0.25  # a flat group: scale 1, codes 0
    if shape[1] > 3:
        w[-1, 1] = w[-1, 2] = np.float32(1e-30)  # ties and tiny values
    a, b = quantize(w, group), quantize_numpy(w, group)
    for f in ("packed", "scale", "minimum"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert same_bits(a.dequantize(), b.dequantize_numpy())
    assert np.array_equal(a.codes(), b.codes())
    assert np.abs(a.dequantize() - w).max() <= a.scale.max() / 2 * 1.0001


def test_parallel_lanes_give_the_same_bits(random_model):
    """Lanes over threads (ranges of lanes on model/threads' pool) are the same code."""
    model_p, model_i = load_model(random_model), load_model(random_model)
    mp = Machine(model_p, engine="compiled")
    mp.kernel_runner = CompiledRunner(model_p, parallel=2)
    mi = Machine(model_i, engine="interp")
    for tok in (9, 8, 7):
        assert same_bits(mp.step(tok).logits, mi.step(tok).logits)
    attn = next(n for n in model_p.nodes if n.target == "g2.attn_decode")
    assert mp.kernel_runner.plan(attn).gen.parallel
    # attention ran on two threads in every layer, every step; nothing else did
    assert mp.kernel_runner.split_dispatches == 3 * model_p.layers


@pytest.mark.parametrize("driver", ["plain", "checked"])
def test_parallel_true_spreads_only_long_dispatches(random_model, monkeypatch, driver):
    """parallel=True (a Machine's runner) splits a kernel with loops only once a dispatch
    of it took PARALLEL_PLAIN_MIN_SECONDS on the plain driver (run_par, numba's threads) or
    PARALLEL_MIN_SECONDS on the checked one (model/threads' pool), on numba's current
    thread count."""
    import firscope.vm.compiled as C
    model = load_model(random_model)
    runner = CompiledRunner(model, parallel=True)
    attn = next(n for n in model.nodes if n.target == "g2.attn_decode")
    if driver == "checked":
        runner.plan(attn).proofs = None  # no proof: the checked driver, journaled
    arena = model.arena.copy()
    runner.run(attn, arena, None)
    runner.run(attn, arena, None)
    assert runner.split_dispatches == 0  # a tiny model: far below the threshold
    assert runner.plain_dispatches == (2 if driver == "plain" else 0)
    monkeypatch.setattr(C, "PARALLEL_PLAIN_MIN_SECONDS" if driver == "plain"
                        else "PARALLEL_MIN_SECONDS", 0.0)
    monkeypatch.setattr(C, "matvec_threads", lambda: 2)
    runner.run(attn, arena, None)
    assert runner.split_dispatches == 1
    monkeypatch.setattr(C, "matvec_threads", lambda: 1)  # adapt() chose one thread
    runner.run(attn, arena, None)
    assert runner.split_dispatches == 1


def test_lanes_leaving_their_slice_at_run_time_are_caught(fault_model):
    """A lane that strays into another's slice is caught; the runner undoes the dispatch,
    interprets the node (the reference) and from then on, and the caller sees no error."""
    model = fault_model
    node = node_named(model, "fill")
    runner = CompiledRunner(model)
    r = model.regions["f_in"]
    model.arena[r.base: r.base + r.size] = [4, 0, 3, 1] + [0] * 12
    a, b = run_both(model, runner, node, model.arena)
    assert same_bits(a, b)
    assert runner.plan(node).gen is not None  # compiled, with run-time slice checks
    model.arena[r.base: r.base + r.size] = [5, 0, 3, 1] + [0] * 12  # lane 0 writes lane 1's
    a, b = run_both(model, runner, node, model.arena)
    assert same_bits(a, b)
    assert re.search(r"lane 0 accessed f_out\[4\].*lane 1's slice", runner.fallbacks["fill"])
    assert runner.plan(node).gen is None  # from now on interpreted: lockstep's results
    a, b = run_both(model, runner, node, model.arena)
    assert same_bits(a, b)


def test_a_lane_stride_beyond_64_bits_runs_on_the_interpreter(tmp_path):
    """Numbers the compiled code takes as arguments must fit int64: a lane stride of
    (2^32-1)^2 (two umulk) is refused with a reason, and the node runs on the interpreter
    (the uint32 index wraps back to the lane id: out0[lane] = in0[lane])."""
    kernel = ("kernel t.huge in=1 out=1 threads=4 tg=1 tgbytes=16\n"
              "rtou 0 0\numulk 1 0 4294967295\numulk 1 1 4294967295\n"
              "uloadf32 2 0 @in0\nustoref32 2 1 @out0\nendkernel\n")
    text = SEED_FIR.read_text().replace("node token ext", "buf hv f32 4\n" + kernel
                                        + "node token ext", 1) + "node huge micro t.huge x -> hv\n"
    model = load_model(write_random_gpt2(tmp_path / "huge", fir_text=text))
    node = node_named(model, "huge")
    runner = CompiledRunner(model)
    randomize_buffers(model, np.random.default_rng(0))
    a, b = run_both(model, runner, node, model.arena)
    assert same_bits(a, b)
    hv, x = model.regions["hv"], model.regions["x"]
    assert same_bits(b[hv.base: hv.base + 4], b[x.base: x.base + 4])
    assert "64-bit" in runner.fallbacks["huge"]


def test_hand_off_to_workers_is_not_taken_for_work(random_model, monkeypatch):
    """The split rule rests on the lanes' own time, never on waking workers: a split
    dispatch whose hand-off took a (fake) second but whose ranges took no time goes back
    to one thread; one whose ranges took long stays split. Under the old rule (elapsed
    x ranges) the first case stayed split for good: attention@0, split once while cold,
    cost 3x the other layers' attention with two threads (issue 27)."""
    import firscope.vm.compiled as C
    model = load_model(random_model)
    runner = CompiledRunner(model, parallel=True)
    attn = next(n for n in model.nodes if n.target == "g2.attn_decode")
    runner.plan(attn).proofs = None  # the checked driver: ranges on model/threads' pool
    arena = model.arena.copy()
    now = [0.0]
    tick = [0.0]  # what one clock read advances the fake time by

    def clock():
        now[0] += tick[0]
        return now[0]
    runner.clock = clock
    real_split = C.run_split

    def slow_hand_off(calls):
        now[0] += 1.0  # waking the workers, outside every range's own call
        return real_split(calls)
    monkeypatch.setattr(C, "run_split", slow_hand_off)
    monkeypatch.setattr(C, "matvec_threads", lambda: 2)
    plan = runner.plan(attn)
    plan.dispatched = True  # past the first dispatch, which loads the driver
    plan.work = 1.0  # the previous dispatch was long: this one is split
    runner.run(attn, arena, None)
    assert runner.split_dispatches == 1
    assert plan.work == 0.0  # the ranges' own calls; the hand-off second is not in it
    runner.run(attn, arena, None)
    assert runner.split_dispatches == 1  # back on one thread
    tick[0] = 1.0  # now every range's call takes (fake) time: the work is real
    plan.work = 1.0
    plan.alone = 100.0  # and one thread took far longer than the split will
    runner.run(attn, arena, None)
    runner.run(attn, arena, None)
    assert runner.split_dispatches == 3
    assert plan.work >= C.PARALLEL_MIN_SECONDS


def test_a_split_that_does_not_pay_goes_back_to_one_thread(random_model, monkeypatch):
    """A split dispatch that takes as long as the last one on one thread (its ranges waited
    on memory, on each other or on the hand-off) is not repeated until one thread's work
    has doubled: attention@0, split while cold after the head, stayed split at 2-3x the
    other layers' attention with two threads (issue 27). One that pays stays split."""
    import firscope.vm.compiled as C
    model = load_model(random_model)
    runner = CompiledRunner(model, parallel=True)
    attn = next(n for n in model.nodes if n.target == "g2.attn_decode")
    runner.plan(attn).proofs = None  # the checked driver: ranges on model/threads' pool
    arena = model.arena.copy()
    now = [0.0]
    runner.clock = lambda: now[0]
    took = {"ranges": [0.0, 0.0], "elapsed": 0.0}  # what the next split will take
    real = runner._split

    def fake_split(calls):
        out = real(calls)
        runner._range_seconds = list(took["ranges"])
        now[0] += took["elapsed"]
        return out
    monkeypatch.setattr(runner, "_split", fake_split)
    monkeypatch.setattr(C, "matvec_threads", lambda: 2)
    plan = runner.plan(attn)
    now[0], runner.clock = 0.0, lambda: now.__setitem__(0, now[0] + 5.0) or now[0]
    runner.run(attn, arena, None)  # the first dispatch (it loads the driver): 5 s
    assert plan.dispatched and plan.work == 0.0  # ... not taken for the lanes' work
    runner.run(attn, arena, None)
    assert plan.work == plan.alone == 5.0 and runner.split_dispatches == 0
    runner.clock = lambda: now[0]
    plan.work = plan.alone = 1.0  # one thread took a second: split
    took.update(ranges=[0.6, 0.6], elapsed=1.3)  # ... and the split took longer
    runner.run(attn, arena, None)
    assert runner.split_dispatches == 1
    assert plan.work == pytest.approx(1.2) and plan.retry_split_at == pytest.approx(2.0)
    runner.run(attn, arena, None)  # 1.2 s of work, under twice the split that did not pay
    assert runner.split_dispatches == 1
    assert plan.alone == 0.0  # that dispatch ran alone (on the fake clock: no time)
    plan.work = plan.alone = 2.5  # the work has doubled since: try again
    took.update(ranges=[1.2, 1.2], elapsed=1.3)  # now it pays
    runner.run(attn, arena, None)
    runner.run(attn, arena, None)
    assert runner.split_dispatches == 3


def test_a_plain_split_stays_split_with_the_interpreters_bits(random_model, monkeypatch):
    """On the plain driver (run_par: the ranges run inside one call, so each is taken to
    have lasted the whole call) a split dispatch is not given up when it took as long as
    the last one alone (numba's workers take a range in microseconds; layers differ by
    more): it stays split while there are threads, and goes back to one when adapt()
    leaves one. The bits are the interpreter's either way."""
    import firscope.vm.compiled as C
    model = load_model(random_model)
    runner = CompiledRunner(model, parallel=True)
    attn = next(n for n in model.nodes if n.target == "g2.attn_decode")
    plan = runner.plan(attn)
    threads = [2]
    monkeypatch.setattr(C, "matvec_threads", lambda: threads[0])
    now = [0.0]
    step = [0.0]  # fake seconds per clock read

    def clock():
        now[0] += step[0]
        return now[0]
    runner.clock = clock
    randomize_buffers(model, np.random.default_rng(4))
    arena = model.arena.copy()
    arena[model.inputs["position"].base] = 3
    ref = arena.copy()
    Dispatch(attn.program, ref).run()
    runner.run(attn, arena.copy(), None)  # loads the driver
    plan.work = plan.alone = 1.0  # one thread took a second: split
    step[0] = 0.5  # the split call takes 1.5 s in all, longer than alone
    for k in range(3):
        out = arena.copy()
        runner.run(attn, out, None)
        assert runner.split_dispatches == k + 1 and same_bits(out, ref)
    assert plan.retry_split_at == 0.0
    threads[0] = 1
    runner.run(attn, arena.copy(), None)
    assert runner.split_dispatches == 3


def test_the_first_dispatch_loads_run_par_on_no_lanes(random_model, monkeypatch):
    """Loading run_par (milliseconds from numba's cache) happens in a kernel's first
    dispatch, which is not taken for its work, on no lanes: not in the first dispatch
    that splits (attention@0 took 5.7 ms once in profile's second step, its mean 317 us
    against 38 for the other layers)."""
    import firscope.vm.compiled as C
    model = load_model(random_model)
    runner = CompiledRunner(model, parallel=True)
    monkeypatch.setattr(C, "matvec_threads", lambda: 2)
    monkeypatch.setattr(runner, "_may_split", lambda plan: True)  # a 1-core CI machine too
    attn = next(n for n in model.nodes if n.target == "g2.attn_decode")
    plan = runner.plan(attn)
    assert "run_par" not in plan.drivers
    arena = model.arena.copy()
    runner.run(attn, arena, None)
    assert "run_par" in plan.drivers and runner.split_dispatches == 0
    plan.work = 1.0  # a long dispatch: the next one splits
    runner.run(attn, arena, None)
    assert runner.split_dispatches == 1


def test_every_kernel_shares_one_threaded_driver_compiled_once(random_model):
    """run_par is vm/kernel_helpers' one function, its kernel's run_plain bound by address:
    no generated module carries a threaded loop of its own (2-3 s of cold compile each),
    and splitting two different kernels gives each its own bits, the interpreter's."""
    from firscope.vm import kernel_helpers
    model = load_model(random_model)
    runner = CompiledRunner(model, parallel=2)
    nodes = [next(n for n in model.nodes if n.target == t)
             for t in ("g2.attn_decode", "g2.gelu_new")]
    arena = model.arena.copy()
    rng = np.random.default_rng(5)
    arena[:] = rng.normal(0, 1, arena.size).astype(np.float32)
    arena[model.inputs["position"].base] = 3
    split = 0
    for node in nodes:
        plan = runner.plan(node)
        assert "def run_par" not in plan.gen.source and "prange" not in plan.gen.source
        if not plan.gen.parallel:
            continue
        ref, out = arena.copy(), arena.copy()
        Dispatch(node.program, ref).run()
        runner.run(node, arena.copy(), None)  # the first dispatch loads run_par, on no lanes
        before = runner.split_dispatches
        runner.run(node, out, None)
        assert runner.split_dispatches == before + 1 and same_bits(out, ref), node.full_name
        par = plan.drivers["run_par"]
        assert par.func is kernel_helpers.run_par and par.plain is plan.driver("run_plain")
        split += 1
    assert split >= 1 and len(kernel_helpers.run_par.signatures) == 1


def test_a_bound_dispatch_falls_back_to_run_where_run_would_not_take_the_plain_driver(
        random_model):
    """Attention's bound call takes the plain driver only where a proof holds for the
    position read now and the budget covers it; under a budget too small for it, the
    call is run's: the checked driver, which stops at the budget and leaves the arena as
    it was."""
    model = load_model(random_model)
    runner = CompiledRunner(model, parallel=True)
    attn = next(n for n in model.nodes if n.target == "g2.attn_decode")
    randomize_buffers(model, np.random.default_rng(5))
    arena = model.arena.copy()
    arena[model.inputs["position"].base] = 6
    ref = arena.copy()
    Dispatch(attn.program, ref).run()
    fn, args = runner.plain_call(attn, arena, None, None, 1)
    for _ in range(2):  # the first loads the driver
        out = arena.copy()
        fn(*args[:2] + (out,) + args[3:])
        assert same_bits(out, ref)
    assert runner.plain_dispatches == 2 and runner.split_dispatches == 0
    small = runner.plain_call(attn, arena, 50, None, 1)  # 50 instructions a lane
    fn, args = small
    out = arena.copy()
    with pytest.raises(BudgetExceeded):
        fn(*args[:2] + (out,) + args[3:])
    assert same_bits(out, arena) and runner.plain_dispatches == 2


def test_a_bound_dispatch_spreads_its_lanes_over_the_threads_it_was_bound_for(random_model):
    """The thread count a plain call is bound for (the Machine's, from adapt) decides
    whether a long dispatch splits, with the interpreter's bits either way."""
    model = load_model(random_model)
    runner = CompiledRunner(model, parallel=True)
    runner._may_split = lambda plan: True  # a 1-core CI machine too
    attn = next(n for n in model.nodes if n.target == "g2.attn_decode")
    plan = runner.plan(attn)
    randomize_buffers(model, np.random.default_rng(6))
    arena = model.arena.copy()
    arena[model.inputs["position"].base] = 4
    ref = arena.copy()
    Dispatch(attn.program, ref).run()
    one = runner.plain_call(attn, arena, None, None, 1)
    two = runner.plain_call(attn, arena, None, None, 2)
    for fn, args in (one, one, two):  # the first loads the drivers
        plan.work = 1.0  # a long dispatch: split where there are threads
        out = arena.copy()
        fn(*args[:2] + (out,) + args[3:])
        assert same_bits(out, ref)
    assert runner.split_dispatches == 1


@pytest.mark.parametrize("opts", [{}, {"fir_f32": True}, {"q4_path": "dequant"},
                                  {"group": 16}])
def test_the_plain_loop_binds_each_linears_call_once_with_the_same_bits(random_model, opts,
                                                                          monkeypatch):
    """Machine's plain loop calls each linear's kernel with its arguments bound once
    (extops.EXT_CALLS: Q4Matrix.matvec_call, gemv.f32_matvec_call), and a profiler's hooked
    path the same calls; the bits equal the ext ops' own functions'. Group 16 takes the
    general q4 kernel, which copies x: no bound call for it, the op's function runs."""
    from firscope.runtime import extops, gemv, machine
    tokens = (3, 1, 4, 1)
    plain = Machine(load_model(random_model, **opts), engine="compiled")
    hooked = Machine(load_model(random_model, **opts), engine="compiled")
    hooked.hooks.after_node.append(lambda m, node, dt: None)
    got = [plain.step(t).logits for t in tokens]
    assert all(same_bits(a, hooked.step(t).logits) for a, t in zip(got, tokens))
    linears = [c for c in plain.bound_calls() if c.node.target in ("fir.linear", "fir.linear_t")]
    impls = set(extops.EXT_IMPLS.values())
    bound = [c for c in linears if c.fn not in impls]
    if opts.get("group") == 16:  # only the f32 head
        assert [c.node.target for c in bound] == ["fir.linear_t"]
    else:
        assert len(bound) == len(linears) > 1
    monkeypatch.setattr(machine, "EXT_CALLS", {})  # every op through its own function
    unbound = Machine(load_model(random_model, **opts), engine="compiled")
    assert all(same_bits(a, unbound.step(t).logits) for a, t in zip(got, tokens))
    assert all(c.fn in impls for c in unbound.bound_calls() if c.node.kind == "ext")
    monkeypatch.setattr(machine, "EXT_CALLS", extops.EXT_CALLS)
    calls = plain.bound_calls()
    assert plain.bound_calls() is calls  # kept while nothing changes
    before = plain._threads
    plain._threads = before + 1  # adapt chose another count: bound again
    other = plain.bound_calls()
    assert other is not calls
    plain._threads = before  # ... and back: the first binding, kept
    assert plain.bound_calls() is calls
    plain._threads = before + 1
    assert plain.bound_calls() is other
    monkeypatch.setitem(gemv.BACKEND, "f32", "blas")  # the measuring switch: not bound
    head = next(c for c in plain.bound_calls() if c.node.target == "fir.linear_t")
    assert head.fn is extops.EXT_IMPLS["fir.linear_t"]


def test_plain_loop_takes_direct_calls_and_the_same_bits(random_model):
    """Machine.step with no hooks runs micro nodes through precomputed plain calls
    (CompiledRunner.plain_call): small ones straight into the driver's machine code,
    attention (proved per dispatch, may split) through the runner's bound method; the bits
    equal the hooked path's and the interpreter's, and a stop request still stops before
    a node."""
    from firscope.errors import Interrupted
    model_a, model_b = load_model(random_model), load_model(random_model)
    plain, hooked = Machine(model_a, engine="compiled"), Machine(model_b, engine="compiled")
    interp = Machine(load_model(random_model), engine="interp")
    hooked.hooks.after_node.append(lambda m, node, dt: None)
    for tok in (3, 1, 4):
        logits = plain.step(tok).logits
        assert same_bits(logits, hooked.step(tok).logits)
        assert same_bits(logits, interp.step(tok).logits)
    calls = plain.bound_calls()
    runner = plain.kernel_runner
    entry = {c.node.target for c in calls if c.plain and c.direct}
    assert {"g2.add", "g2.layernorm", "g2.gelu_new"} <= entry
    bound = [c for c in calls if c.node.target == "g2.attn_decode"]
    assert bound and all(c.plain and not c.direct for c in bound)  # the runner's wrapper
    assert bound[0].args[5] is plain.stop_flag  # a dispatch that falls back to run can stop
    dispatches = runner.plain_dispatches
    plain.step(5)
    assert runner.plain_dispatches - dispatches == len(bound)  # each on the plain driver
    plain.stop_flag.set()
    with pytest.raises(Interrupted, match="before node"):
        plain.step(5)
