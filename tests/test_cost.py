"""The GPU speed-of-light analysis (firscope/cost): hand-counted kernels, counts checked
against independent counts of the interpreter's trace, devices, and the command."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import write_random_gpt2
from firscope.cost import (analyse_position, analyse_step, count, data_independent,
                           ext_counts, find_device, load_devices, predict, record)
from firscope.cost.devices import read_file
from firscope.errors import FirError
from firscope.profile import run_instrumented
from firscope.runtime import load_model
from firscope.runtime.opening import open_model
from firscope.vm.interp import Dispatch, Observer
from kernel_util import kernel_program
from model_util import firscope

ADD = """kernel k in=2 out=1 threads=64 tg=64 tgbytes=0
rtou 0 0
uloadf32 1 0 @in0
uloadf32 2 0 @in1
add 1 1 2
ustoref32 1 0 @out0
endkernel
"""


def counted(src, sizes, tg, width=32):
    program, arena, _ = kernel_program(src, sizes)
    trace, d = record(program, arena, None)
    return count(program, trace, tg, 0, width), d, program


def test_64_lane_add_is_coalesced_and_full():
    c, d, _ = counted(ADD, {"in0": 64, "in1": 64, "out0": 64}, tg=64)
    assert (c.lanes, c.threadgroups, c.warps) == (64, 1, 2)
    assert c.lane_instructions == 5 * 64 and c.max_lane_instructions == 5
    assert c.warp_instructions == 5 * 2 and c.simd_efficiency == 1.0
    assert c.flops == 64 and c.sfu_ops == 0
    assert (c.bytes_read, c.bytes_written, c.unique_bytes) == (512, 256, 768)
    # 3 memory instructions x 2 warps; a full warp reads 32 x 4 B = 4 sectors of 32 B
    assert c.requests == 6 and c.sectors == 24 and c.sectors_per_request == 4.0
    assert c.coalescing_efficiency == 1.0
    assert c.dram_bytes == 3 * 8 * 32


def test_a_trace_counted_again_at_another_tg_gives_a_fresh_counts_figures():
    """The advice recounts one trace at other threadgroup sizes; what does not depend on
    them (distinct elements and sectors) is kept from the first count: every figure must
    equal that of a count of a fresh trace."""
    sizes = {"in0": 64, "in1": 64, "out0": 64}
    program, arena, _ = kernel_program(ADD, sizes)
    trace, _ = record(program, arena.copy(), None)
    again = [count(program, trace, tg, 0, 32) for tg in (64, 1, 16)]
    for tg, c in zip((64, 1, 16), again):
        fresh, _ = record(program, arena.copy(), None)
        f = count(program, fresh, tg, 0, 32)
        assert (c.unique_bytes, c.dram_bytes, c.sectors, c.requests, c.warps) == \
            (f.unique_bytes, f.dram_bytes, f.sectors, f.requests, f.warps)


def test_tg_1_puts_every_lane_in_its_own_warp():
    c, _, _ = counted(ADD, {"in0": 64, "in1": 64, "out0": 64}, tg=1)
    assert (c.threadgroups, c.warps) == (64, 64)
    assert c.simd_efficiency == pytest.approx(1 / 32)
    assert c.sectors_per_request == 1.0 and c.coalescing_efficiency == 1.0


def test_stride_64_reads_touch_one_sector_per_lane():
    src = """kernel k in=1 out=1 threads=32 tg=32 tgbytes=0
rtou 0 0
umulk 1 0 64
uloadf32 1 1 @in0
ustoref32 1 0 @out0
endkernel
"""
    c, _, program = counted(src, {"in0": 64 * 32, "out0": 32}, tg=32)
    load_line = next(op.line for op in program.ops if op.text.startswith("uloadf32"))
    store_line = next(op.line for op in program.ops if op.text.startswith("ustoref32"))
    assert c.lines[load_line].sectors_per_request == 32.0
    assert c.lines[load_line].coalescing_efficiency == pytest.approx(4 / 32)
    assert c.lines[store_line].sectors_per_request == 4.0
    assert c.requests == 2 and c.sectors == 36
    assert c.dram_bytes == (32 + 4) * 32 and c.unique_bytes == 64 * 4


LOOP = """kernel k in=1 out=1 threads=1 tg=1 tgbytes=0
loadconstf32 15 768
uconst 0 0
loadconstf32 1 0
forbegin 15
uloadf32 2 0 @in0
add 1 1 2
uaddk 0 0 1
forend
uconst 0 0
ustoref32 1 0 @out0
endkernel
"""


def test_one_lane_loop_over_768():
    c, d, _ = counted(LOOP, {"in0": 768, "out0": 1}, tg=1)
    # 3 set-up + forbegin + 768 x (3 body + forend) + uconst + store
    assert c.max_lane_instructions == 3 + 1 + 768 * 4 + 2 == d.steps
    assert c.lane_instructions == d.lane_steps == c.max_lane_instructions
    assert c.simd_efficiency == pytest.approx(1 / 32)
    assert c.flops == 768  # the adds (loadconstf32 is a constant, not arithmetic)
    assert c.max_lane_load_batches == 768
    assert c.requests == 769 and c.sectors == 769 and c.coalescing_efficiency == 1.0
    assert c.dram_bytes == (768 // 8 + 1) * 32
    p = predict(c, find_device("h200"))
    assert p.bound == "latency"
    assert "one lane walks 768 elements" in p.advice


def test_divergent_if_on_half_the_lanes():
    src = """kernel k in=0 out=1 threads=32 tg=32 tgbytes=0
loadconstf32 2 16
cmplt 3 0 2
ifbegin 3
mulconst 4 0 2
ifend
rtou 0 0
ustoref32 4 0 @out0
endkernel
"""
    c, d, program = counted(src, {"out0": 32}, tg=32)
    body = next(op.line for op in program.ops if op.text.startswith("mulconst"))
    assert c.lines[body].lane_instructions == 16 and c.lines[body].warp_instructions == 1
    assert c.lines[body].simd_efficiency(32) == 0.5
    # 5 instructions with 32 lanes, mulconst and ifend with 16 (ifend runs before it pops)
    assert c.lane_instructions == 5 * 32 + 2 * 16 == d.lane_steps
    assert c.warp_instructions == 7
    assert c.simd_efficiency == pytest.approx((5 * 32 + 2 * 16) / (7 * 32))
    assert c.max_lane_instructions == 7


def test_a_trace_composed_with_an_observer_of_every_instruction_counts_the_same():
    """The trace asks for before() at memory instructions only, and for each mask change;
    composed (vm/interp's compose) with an observer of every instruction, each still sees
    what it asked for: the counts equal the naive count's, a memory access per lane, and
    an if on three lanes and a loop of uneven trip counts, and the masks they make."""
    from firscope.cost.record import Trace
    from firscope.vm.interp import compose
    src = """kernel k in=1 out=1 threads=48 tg=16 tgbytes=0
rtou 0 0
loadconstf32 2 3
cmplt 3 0 2
uconst 5 0
forbegin 0
uloadf32 6 5 @in0
uaddk 5 5 1
forend
loadconstf32 7 3
div 8 0 7
ifbegin 3
uloadf32 1 0 @in0
mulconst 1 1 2
ifend
ustoref32 1 0 @out0
endkernel
"""
    program, arena, _ = kernel_program(src, {"in0": 64, "out0": 48})
    d = Dispatch(program, arena)
    trace, naive = Trace(d), NaiveCounter(16)
    memory = {op.pc for op in program.ops if op.spec.mem is not None}
    seen = []
    lanes_at = np.zeros(len(program.ops), dtype=np.int64)  # active lanes summed per pc

    class Every(Observer):
        wants_before = True

        def before(self, d, op):
            seen.append(op.pc)
            lanes_at[op.pc] += int(d.mask.sum())
            return False
    d.run(observer=compose(trace, naive, Every()))
    assert seen and set(seen) - memory and len(seen) == d.steps  # every instruction
    assert trace.before_only_at == frozenset(memory)
    c = count(program, trace, 16, 0, 32)
    assert (c.lane_instructions, c.warp_instructions, c.sectors) == \
        (naive.lane_instr, naive.warp_instr, naive.sectors)
    assert c.lane_instructions == d.lane_steps and c.instructions == d.steps
    assert c.max_lane_instructions == max(naive.per_lane.values())
    # per pc: an instruction that changes the mask (forbegin, forend, ifbegin, ifend) ran
    # under the mask before its change
    assert np.array_equal(c.per_pc["lane"], lanes_at)
    alone, _, _ = counted(src, {"in0": 64, "out0": 48}, tg=16)
    assert (alone.lane_instructions, alone.warp_instructions, alone.sectors,
            alone.load_hits) == (c.lane_instructions, c.warp_instructions, c.sectors,
                                 c.load_hits)


def test_wider_simd_from_the_device_profile():
    c, _, _ = counted(ADD, {"in0": 64, "in1": 64, "out0": 64}, tg=64, width=64)
    assert c.warps == 1 and c.simd_efficiency == 1.0
    assert c.requests == 3 and c.sectors_per_request == 8.0


def test_data_dependence_decides_reuse():
    sample = open_model(None)
    kinds = {n.target: data_independent(n.program) for n in sample.nodes if n.kind == "micro"}
    assert kinds == {"g2.add": True, "g2.gelu_new": True, "g2.layernorm": True,
                     "g2.attn_decode": False}  # its loops run to the position it loads


def test_q4_linear_reads_the_resident_weight():
    model = open_model(None)
    node = next(n for n in model.nodes if n.full_name == "qkv_linear@0")
    w = node.args[1].weight
    c = ext_counts(node, 32)
    n_in, n_out = node.args[0].size, node.outs[0].size
    assert c.bytes_read == w.q4.nbytes + 4 * n_in
    assert w.q4.nbytes == w.q4.packed.nbytes + w.q4.scale.nbytes + w.q4.minimum.nbytes
    assert c.bytes_written == 4 * n_out and c.flops == 2 * n_in * n_out


class NaiveCounter(Observer):
    """An independent count, lane by lane in plain Python: instructions per lane, warp
    issues and (warp, sector) pairs per memory instruction, for warps of 32 per tg."""

    wants_before = True

    def __init__(self, tg):
        self.tg, self.lane_instr, self.warp_instr, self.sectors = tg, 0, 0, 0
        self.per_lane: dict[int, int] = {}

    def warp(self, lane):
        per_tg = -(-self.tg // 32)
        return (lane // self.tg) * per_tg + (lane % self.tg) // 32

    def before(self, d, op):
        active = [i for i in range(d.lanes) if d.mask[i]]
        self.lane_instr += len(active)
        self.warp_instr += len({self.warp(i) for i in active})
        for i in active:
            self.per_lane[i] = self.per_lane.get(i, 0) + 1
        if op.spec.mem is not None:
            addr = op.args[op.spec.mem.address]
            u = d.U[op.args[op.spec.mem.index]]
            self.sectors += len({(self.warp(i), (int(u[i]) + addr.offset) // 8) for i in active})
        return False


def _check_against_trace(model, ids, at):
    """Every micro node's counts equal the naive count on a copy of the arena, and the
    instrumented profiler's count of the same step; reused counts equal recorded ones."""
    dev = find_device("h200")
    report = analyse_position(model, dev, ids, at)
    before = run_instrumented(model, ids[:at])
    after = run_instrumented(model, ids[: at + 1])
    for n in report.nodes:
        if n.kind != "micro":
            continue
        ni, prev = after.nodes[n.index], before.nodes.get(n.index)
        lane_steps = ni.lane_steps - (prev.lane_steps if prev else 0)
        warps = int(ni.warp_counts.sum()) - (int(prev.warp_counts.sum()) if prev else 0)
        assert n.counts.lane_instructions == lane_steps, n.node
        assert n.counts.warp_instructions == warps, n.node
    # the naive observer over the same step, node by node on the model's arena
    from firscope.runtime import Machine
    from firscope.cost.analyze import tokens_to
    m = Machine(model, engine="interp")
    toks = tokens_to(ids, at, m)
    m.begin_token(toks[at])
    for node in model.nodes:
        if node.kind != "micro":
            m.run_node(node)
            continue
        naive = NaiveCounter(report.nodes[node.index].counts.tg)
        m.dispatch(node).run(observer=naive)
        c = report.nodes[node.index].counts
        assert (c.lane_instructions, c.warp_instructions, c.sectors) == \
            (naive.lane_instr, naive.warp_instr, naive.sectors), node.full_name
        assert c.max_lane_instructions == max(naive.per_lane.values())
    return report


def test_counts_equal_independent_counts_on_the_sample():
    model = open_model(None)
    report = _check_against_trace(model, [5, 9, 2, 7], 3)
    assert report.recorded < sum(n.kind == "micro" for n in report.nodes)  # reuse happened
    assert any(n.reused_from for n in report.nodes)


def test_reuse_gives_the_counts_a_recording_gives(tmp_path):
    model = open_model(None)
    dev = find_device("h200")
    from firscope.runtime import Machine
    from firscope.cost.analyze import tokens_to
    toks = tokens_to([3, 1, 4], 2, Machine(model, engine="interp"))
    arena = model.arena.copy()
    fast = analyse_step(model, dev, arena=arena.copy(), position=2, token=toks[2])
    slow = analyse_step(model, dev, arena=arena.copy(), position=2, token=toks[2], dedup=False)
    assert slow.recorded == sum(n.kind == "micro" for n in model.nodes) > fast.recorded
    for a, b in zip(fast.nodes, slow.nodes):
        assert a.as_dict() | {"reused_from": None} == b.as_dict(), a.node


def test_counts_on_gpt2_small_shapes(tmp_path):
    fir = write_random_gpt2(tmp_path / "small", n_layer=1, n_embd=768, n_head=12,
                            n_positions=16, vocab=300)
    model = load_model(fir)
    report = _check_against_trace(model, [1, 2, 3], 2)
    ln = report.node("ln1@0").counts
    assert ln.lanes == 1 and ln.simd_efficiency == pytest.approx(1 / 32)
    att = report.node("attention@0")
    assert att.counts.lanes == 12 and att.prediction.bound == "latency"


def test_prediction_terms_and_bounds():
    dev = find_device("h200")
    model = open_model(None)
    report = analyse_position(model, dev, [1, 2], 1)
    for n in report.nodes:
        p = n.prediction
        t = p.terms
        assert p.predicted_us == pytest.approx(max(t["memory"], t["compute"], t["latency"])
                                               + t["launch"])
        assert p.bound in ("memory", "compute", "latency", "launch") and p.advice
    assert report.total_us == pytest.approx(sum(n.prediction.predicted_us for n in report.nodes))
    k = report.by_kernel()
    assert sum(v["share"] for v in k.values()) == pytest.approx(1.0)
    assert report.node("token").prediction.bound == "launch"


# -- devices -------------------------------------------------------------------------------
def test_shipped_devices_have_sources():
    devs = load_devices()
    for key in ("h200", "a100", "rtx4090", "m2max", "m3max", "mi300x", "uhd770"):
        d = devs[key]
        assert set(d.sources) >= {"compute_units", "dram_bandwidth_gbs", "f32_tflops"}
    h = devs["h200"]
    assert (h.compute_units, h.dram_bandwidth_gbs, h.f32_tflops) == (132, 4800, 67)
    assert devs["mi300x"].simd_width == 64
    assert round(h.f32_lanes_per_cu) == 128


def test_unknown_device_suggests():
    with pytest.raises(FirError, match="did you mean 'h200'"):
        find_device("h20")


def test_user_devices_file(tmp_path, monkeypatch):
    cfg = tmp_path / "firscope"
    cfg.mkdir()
    shipped, _ = read_file(__import__("firscope.cost.devices", fromlist=["SHIPPED"]).SHIPPED)
    body = "\n".join(f"{k} = {v}" for k, v in shipped["a100"].as_dict().items()
                     if k not in ("key", "name", "sources", "origin"))
    (cfg / "devices.toml").write_text(f'default = "mine"\n[mine]\nname = "My GPU"\n{body}\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    devs = load_devices()
    assert devs["mine"].name == "My GPU" and "h200" in devs
    assert find_device(None, devs).key == "mine"


def test_malformed_devices_file_names_the_line(tmp_path):
    p = tmp_path / "devices.toml"
    p.write_text("[mine]\nname = \"x\"\ncompute_units = = 3\n")
    with pytest.raises(FirError) as e:
        read_file(p)
    assert str(e.value).startswith(f"{p}:3:")
    p.write_text("[mine]\nname = \"x\"\ncompute_units = 3\n")
    with pytest.raises(FirError, match="no 'simd_width'"):
        read_file(p)
    shipped = load_devices()["a100"].as_dict()
    body = "\n".join(f"{k} = {v}" for k, v in shipped.items()
                     if k not in ("key", "name", "sources", "origin"))
    p.write_text("[mine]\n" + body.replace("compute_units = 108", "compute_units = 2.5"))
    with pytest.raises(FirError) as e:
        read_file(p)
    assert f"{p}:2:1:" in str(e.value) and "whole number" in str(e.value)


# -- the command -----------------------------------------------------------------------------
def test_cost_command_json():
    r = firscope("cost", "--tokens", "1,2,3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["position"] == 2 and out["device"]["key"] == "h200"
    assert out["predicted_us_per_token"] == pytest.approx(
        sum(n["predicted_us"] for n in out["nodes"]))
    ln = next(n for n in out["nodes"] if n["node"] == "ln1@0")
    assert ln["simd_efficiency"] == pytest.approx(1 / 32) and ln["bound"] == "latency"
    assert set(ln["terms"]) == {"memory", "compute", "latency", "launch"}


def test_cost_command_text_and_list():
    r = firscope("cost", "--tokens", "1,2", "--device", "mi300x", "--top", "5")
    assert r.returncode == 0, r.stderr
    assert "AMD Instinct MI300X" in r.stdout and "per kernel" in r.stdout
    assert "ranked by predicted time" in r.stdout and "4 more" not in r.stdout
    r = firscope("cost", "--tokens", "1,2", "--at", "5", "--top", "0")
    assert r.returncode == 0, r.stderr
    assert "position 5" in r.stdout and "positions 2..5 were fed the model's greedy tokens" \
        in r.stdout and "more (--top 0" not in r.stdout
    r = firscope("cost", "--device", "list")
    assert r.returncode == 0 and "h200" in r.stdout and "uhd770" in r.stdout


def test_cost_command_bad_input(tmp_path):
    r = firscope("cost", "--device", "a10")
    assert r.returncode == 1 and "did you mean 'a100'" in r.stderr
    assert "Traceback" not in r.stderr
    r = firscope("cost", "--tokens", "1", "--at", "256")
    assert r.returncode == 1 and "--at 256" in r.stderr and "n_positions 256" in r.stderr
    r = firscope("cost", "--at", "-1")
    assert r.returncode == 2
    (tmp_path / "firscope").mkdir()
    (tmp_path / "firscope" / "devices.toml").write_text("[x\n")
    r = firscope("cost", env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert r.returncode == 1 and "devices.toml:1:" in r.stderr
    assert "Traceback" not in r.stderr


def test_lanes_whose_sectors_interleave_are_counted_by_sector():
    """Each lane reads the element a table gives it: lanes 0, 2, 4.. sector 0, 1, 2.. and
    lanes 1, 3, 5.. sectors 5, 6, 7.. of the same buffer, so a warp's accesses arrive
    in no sector order and a sector comes back after another (the count must sort them,
    not take them as they come); and lanes reading downwards (element 63 - lane). Each
    equals the naive count lane by lane at every threadgroup size."""
    table = """kernel k in=2 out=1 threads=64 tg=64 tgbytes=0
rtou 0 0
uloadf32 3 0 @in1
rtou 1 3
uloadf32 1 1 @in0
uloadf32 2 1 @in0
ustoref32 1 0 @out0
endkernel
"""
    down = table.replace("uloadf32 3 0 @in1\nrtou 1 3", "umulk 1 0 4294967295\nuaddk 1 1 63")
    lanes = np.arange(64)
    for src, index in ((table, (lanes % 2) * 40 + lanes // 2), (down, None)):
        for tg in (64, 32, 16, 1):
            program, arena, regions = kernel_program(src, {"in0": 128, "in1": 64, "out0": 64})
            if index is not None:
                r = regions["in1"]
                arena[r.base: r.base + 64] = index
            trace, _ = record(program, arena.copy(), None)
            c = count(program, trace, tg, 0, 32)
            naive = NaiveCounter(tg)
            Dispatch(program, arena.copy()).run(observer=naive)
            assert c.sectors == naive.sectors, (tg, c.sectors, naive.sectors)
            assert c.requests == (3 + (index is not None)) * c.warps
            if index is not None and tg == 16:  # 8 lanes of each half of a warp read 8
                # elements in a row: a sector per half, 2 per access of in0
                load = next(op.line for op in program.ops if op.text == "uloadf32 1 1 @in0")
                assert c.lines[load].sectors == 2 * c.warps


def test_broadcast_read_is_not_better_than_ideal():
    src = """kernel k in=1 out=1 threads=32 tg=32 tgbytes=0
rtou 0 0
uconst 1 0
uloadf32 1 1 @in0
ustoref32 1 0 @out0
endkernel
"""
    c, _, program = counted(src, {"in0": 1, "out0": 32}, tg=32)
    load = next(op.line for op in program.ops if op.text.startswith("uloadf32"))
    assert c.lines[load].sectors == 1 and c.lines[load].coalescing_efficiency == 1.0


def test_info_cost_in_the_batch_debugger(tmp_path):
    script = tmp_path / "s.txt"
    script.write_text("break ln1@1\ncontinue\ninfo cost\ninfo cost m2max\ninfo cost nope\n")
    r = firscope("debug", "--tokens", "1,2", "-n", "1", "-x", script, "--keep-going")
    assert "node ln1@1 (micro g2.layernorm) on NVIDIA H200" in r.stdout
    assert "latency-bound" in r.stdout and "one lane walks 128 elements 3 times" in r.stdout
    assert "SIMD efficiency 3%" in r.stdout and "Apple M2 Max" in r.stdout
    assert "unknown device 'nope'" in r.stdout + r.stderr and r.returncode == 1
    assert "Traceback" not in r.stderr


def test_distinct_accesses_are_what_np_unique_counts():
    """record._distinct (a table per region, np.unique where the positions are sparse)
    against np.unique's count: no keys, one region, several, dense and sparse positions."""
    from firscope.cost.record import _REGION_SHIFT, _distinct
    rng = np.random.default_rng(7)
    assert _distinct(np.zeros(0, dtype=np.int64)) == 0
    for spread in (1, 10, 5000, 10**7, 10**11):
        for regions in (1, 3):
            n = int(rng.integers(1, 4000))
            keys = (rng.integers(0, regions, n) << _REGION_SHIFT) | rng.integers(0, spread, n)
            assert _distinct(keys) == np.unique(keys).size, (spread, regions)



def _attention_both_ways(monkeypatch):
    """The sample's step at position 7 costed with reuse (attention side by side) and with
    every node recorded on its own; and how many times the first recorded attention alone."""
    from firscope.cost import analyze
    from firscope.runtime import Machine
    model = open_model(None)
    dev = find_device("h200")
    toks = analyze.tokens_to([5, 9, 2, 7, 3, 8, 1, 4], 7, Machine(model, engine="compiled"))
    arena = model.arena.copy()
    alone = []
    real = analyze.record
    monkeypatch.setattr(analyze, "record", lambda program, *a: alone.append(program.name)
                        or real(program, *a))
    fast = analyse_step(model, dev, arena=arena.copy(), position=7, token=toks[7])
    n = alone.count("g2.attn_decode")
    slow = analyse_step(model, dev, arena=arena.copy(), position=7, token=toks[7], dedup=False)
    return fast, slow, n


def test_attention_recorded_side_by_side_gives_each_layer_its_own_counts(monkeypatch):
    """Attention branches on its scores, so each layer's counts are its own: the four
    layers run as one wide dispatch (cost/batch) whose split traces give each layer exactly
    the counts (and priced advice) of a recording of that node alone."""
    from firscope.cost import batch
    calls = []
    real = batch.Copies.record
    monkeypatch.setattr(batch.Copies, "record",
                        lambda self, *a: calls.append(self.n) or real(self, *a))
    fast, slow, alone = _attention_both_ways(monkeypatch)
    assert calls == [4] and alone == 0  # one wide recording of the four layers' attention
    assert fast.side_by_side == 4 and fast.as_dict()["recorded_side_by_side"] == 4
    attn = [n for n in fast.nodes if n.kernel == "g2.attn_decode"]
    assert len({n.counts.lane_instructions for n in attn}) > 1  # the layers differ
    assert fast.recorded == slow.recorded - sum(n.reused_from is not None for n in fast.nodes)
    for a, b in zip(fast.nodes, slow.nodes):
        assert a.as_dict() | {"reused_from": None} == b.as_dict(), a.node


def test_nodes_that_cannot_run_side_by_side_are_recorded_one_by_one(monkeypatch):
    """Where the wide dispatch gives up (an access it cannot make as each node would, a
    fault, the budget: batch.Unbatched), each node is recorded alone on its own regions."""
    from firscope.cost import batch

    def refuse(self, op):
        def run():
            raise batch.Unbatched("refused by the test")
        return run
    monkeypatch.setattr(batch._Wide, "_access", refuse)
    fast, slow, alone = _attention_both_ways(monkeypatch)
    assert alone == 4 and fast.side_by_side == 0
    for a, b in zip(fast.nodes, slow.nodes):
        assert a.as_dict() | {"reused_from": None} == b.as_dict(), a.node


def test_side_by_side_recordings_keep_to_their_memory(monkeypatch):
    """Each node's regions are copied (attention's K/V caches: 6.3 MB a layer on GPT-2
    small): past analyze.SIDE_BY_SIDE_BYTES of them the nodes are recorded in several wide
    dispatches, with the same counts."""
    from firscope.cost import analyze, batch
    sizes = []
    real = batch.Copies.record
    monkeypatch.setattr(batch.Copies, "record",
                        lambda self, *a: sizes.append((self.n, self.scratch.nbytes)) or
                        real(self, *a))
    attn = next(n for n in open_model(None).nodes if n.target == "g2.attn_decode")
    one = 4 * sum(r.size for r in batch.program_regions(attn.program))
    monkeypatch.setattr(analyze, "SIDE_BY_SIDE_BYTES", 3 * one)
    fast, slow, alone = _attention_both_ways(monkeypatch)
    assert [n for n, _ in sizes] == [3, 1] and alone == 0
    assert all(nbytes <= 3 * one for _, nbytes in sizes)
    for a, b in zip(fast.nodes, slow.nodes):
        assert a.as_dict() | {"reused_from": None} == b.as_dict(), a.node
