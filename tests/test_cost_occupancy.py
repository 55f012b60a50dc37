"""Issue 44, parts 3-5: register liveness (vm/liveness), occupancy and its limiter, per-line
counters and advice with its price, each checked against counts made by hand."""
from __future__ import annotations

import json
import math

import pytest

from firscope.cost import count, find_device, load_devices, predict, record
from firscope.cost.analyze import price_advice
from firscope.cost.devices import SHIPPED, read_file
from firscope.cost.model import REGISTER_OVERHEAD, registers_per_lane, residency
from firscope.errors import FirError
from firscope.runtime.opening import open_model
from firscope.vm.liveness import liveness
from kernel_util import kernel_program
from model_util import firscope


def ops_of(src: str, sizes: dict[str, int]):
    program, _, _ = kernel_program(src, sizes)
    return program.ops


def live_at(lv, pc: int) -> tuple[list[int], list[int]]:
    return lv.live_r(pc), lv.live_u(pc)


# -- liveness on hand-counted kernels ------------------------------------------------------
from test_cost import ADD  # noqa: E402 - the same one-add kernel as the counting tests


def test_straight_line_kernel_live_sets():
    lv = liveness(ops_of(ADD, {"in0": 64, "in1": 64, "out0": 64}))
    # pc 0 reads R0 (the lane id): live from the entry; then U0 to the store; R1 from its
    # load to the store; R2 from its load to the add
    assert [live_at(lv, pc) for pc in range(5)] == [
        ([0], []), ([], [0]), ([1], [0]), ([1, 2], [0]), ([1], [0])]
    assert (lv.max_r, lv.max_u, lv.max_live, lv.pressure) == (2, 1, 3, 3)
    assert lv.at_entry == ["R0"]


LOOP = """kernel k in=1 out=1 threads=1 tg=1 tgbytes=0
loadconstf32 15 8
uconst 0 0
loadconstf32 1 0
forbegin 15
uloadf32 2 0 @in0
add 1 1 2
uaddk 0 0 1
loadconstf32 7 3
mul 7 7 2
forend
uconst 0 0
ustoref32 1 0 @out0
endkernel
"""


def test_a_loop_carries_what_its_body_reads_before_writing():
    lv = liveness(ops_of(LOOP, {"in0": 8, "out0": 1}))
    # R1 (the sum) and U0 (the index) are read in the body before the body writes them: live
    # around the back edge, at the forend and at every body instruction. R15 is read once,
    # by the forbegin: dead inside. R7 is written and read inside one trip: live only from
    # its loadconst to its mul. R2 is dead after the mul.
    body = {4: ([1], [0]), 5: ([1, 2], [0]), 6: ([1, 2], [0]), 7: ([1, 2], [0]),
            8: ([1, 2, 7], [0]), 9: ([1], [0])}
    for pc, want in body.items():
        assert live_at(lv, pc) == want, pc
    assert live_at(lv, 3) == ([1, 15], [0])  # the forbegin reads the count
    assert live_at(lv, 10) == ([1], [])  # uconst 0 0 kills U0 after the loop
    assert lv.at_entry == []  # R0 is never read
    # 3 live at the mul (R1 R2 R7) + U0 = 4; one loop counter around the body
    assert (lv.max_r, lv.max_u, lv.max_live, lv.pressure) == (3, 1, 4, 5)
    assert lv.loops[3] == 0 and lv.loops[4] == 1 and lv.loops[9] == 1 and lv.loops[10] == 0


IF = """kernel k in=0 out=1 threads=32 tg=32 tgbytes=0
loadconstf32 5 7
loadconstf32 2 16
cmplt 3 0 2
ifbegin 3
loadconstf32 5 1
ifend
rtou 0 0
ustoref32 5 0 @out0
endkernel
"""


def test_a_write_inside_an_if_does_not_kill_the_value_before_it():
    lv = liveness(ops_of(IF, {"out0": 32}))
    # R5 = 7 reaches the store in the lanes that skip the body: live from pc 1 on, through
    # the if; R0 is read by cmplt and by rtou after the if: live from the entry to the rtou
    assert live_at(lv, 1) == ([0, 5], [])
    assert live_at(lv, 3) == ([0, 3, 5], [])  # ifbegin reads R3
    assert live_at(lv, 4) == ([0], [])  # the body's write kills R5 on that path only
    assert live_at(lv, 5) == ([0, 5], [])  # ifend: both paths meet
    assert lv.at_entry == ["R0"]
    unconditional = IF.replace("ifbegin 3\n", "").replace("ifend\n", "")
    lv2 = liveness(ops_of(unconditional, {"out0": 32}))
    assert 5 not in lv2.live_r(1)  # without the if, the second write kills the first


def test_seed_kernels_live_registers_by_hand():
    model = open_model(None)
    kernels = {n.target: n.program for n in model.nodes if n.kind == "micro"}
    # g2.add: rtou 0 0 (R0) | load R1 (U0) | load R2 (U0 R1) | add (U0 R1 R2) | store (U0 R1)
    add = liveness(kernels["g2.add"].ops)
    assert (add.max_r, add.max_u, add.pressure) == (2, 1, 3)
    # g2.layernorm, third loop, at `sub 2 2 1`: R1 (mean), R2, R3 (rsqrt var), R4 (gamma),
    # R5 (beta) and U0, plus that loop's counter; R15 is no longer read after its forbegin
    ln = liveness(kernels["g2.layernorm"].ops)
    assert (ln.max_r, ln.max_u, ln.max_live, ln.pressure) == (5, 1, 6, 7)
    assert ln.at_entry == []  # it never reads R0 (one lane)


# -- occupancy against the device figures -------------------------------------------------
def wide_kernel(n: int = 30) -> str:
    """A kernel that loads R1..Rn and then sums them: n R registers + U0 live at the first
    add (all loaded, none consumed)."""
    loads = "".join(f"uloadf32 {r} 0 @in0+{64 * (r - 1)}\n" for r in range(1, n + 1))
    adds = "".join(f"add 1 1 {r}\n" for r in range(2, n + 1))
    return (f"kernel k in=1 out=1 threads=1024 tg=256 tgbytes=0\nrtou 0 0\n{loads}{adds}"
            "ustoref32 1 0 @out0\nendkernel\n")


def counted(src, sizes, tg, tgbytes=0, width=32):
    program, arena, _ = kernel_program(src, sizes)
    trace, _ = record(program, arena, None)
    return count(program, trace, tg, tgbytes, width), program, trace


def test_register_limited_occupancy_on_h200_by_hand():
    c, _, _ = counted(wide_kernel(), {"in0": 64 * 30 + 1024, "out0": 1024}, tg=256)
    assert (c.max_live_r, c.max_live_u, c.register_pressure) == (30, 1, 31)
    h200 = find_device("h200")
    assert (h200.registers_per_cu, h200.max_registers_per_lane,
            h200.register_alloc_granularity) == (65536, 255, 8)
    # 31 + 2 = 33 registers, rounded up to 8: 40 per lane. A threadgroup of 256 lanes holds
    # 40 x 256 = 10240 registers: 65536 // 10240 = 6 threadgroups per SM = 1536 lanes of
    # 2048: 75%; lanes would allow 2048 // 256 = 8, threadgroups 32
    assert REGISTER_OVERHEAD == 2 and registers_per_lane(c, h200) == (40, False)
    r = residency(c, h200)
    assert r.limits == {"lanes": 8, "threadgroups": 32, "registers": 6,
                        "threadgroup memory": None}
    assert (r.limiter, r.per_cu, r.occupancy) == ("registers", 6, 0.75)
    p = predict(c, h200)
    assert p.residency == r and p.waves == 1


def test_seed_add_on_h200_is_limited_by_threadgroups():
    model = open_model(None)
    node = next(n for n in model.nodes if n.target == "g2.add")
    trace, _ = record(node.program, model.arena.copy(), None)
    c = count(node.program, trace, 1, 16, 32)
    r = residency(c, find_device("h200"))
    # one lane per threadgroup = one warp of 32 lane slots: lanes allow 2048 // 32 = 64,
    # threadgroups 32, registers (3 + 2 -> 8) 65536 // (8 x 32) = 256, tg memory
    # 233472 // 16 = 14592: 32 threadgroups of 32 lane slots = 1024 of 2048 = 50%
    assert r.limits == {"lanes": 64, "threadgroups": 32, "registers": 256,
                        "threadgroup memory": 14592}
    assert (r.limiter, r.registers, r.occupancy) == ("threadgroups", 8, 0.5)


def test_threadgroup_memory_and_lanes_limiters():
    c, _, _ = counted(ADD, {"in0": 64, "in1": 64, "out0": 64}, tg=64, tgbytes=100_000)
    assert residency(c, find_device("h200")).limiter == "threadgroup memory"  # 233472 // 1e5
    c, _, _ = counted(ADD, {"in0": 64, "in1": 64, "out0": 64}, tg=64)
    r = residency(c, find_device("rtx4090"))  # 1536 // 64 = 24 = its 24 threadgroups: a tie
    assert r.limits["lanes"] == r.limits["threadgroups"] == 24 and r.limiter == "lanes"


# -- devices.toml: the new figures are checked like the others ----------------------------
def _file(tmp_path, **changes):
    shipped, _ = read_file(SHIPPED)
    figures = {k: v for k, v in shipped["h200"].as_dict().items()
               if k not in ("key", "name", "sources", "origin")}
    figures.update(changes)
    body = "\n".join(f"{k} = {v}" for k, v in figures.items() if v is not None)
    p = tmp_path / "devices.toml"
    p.write_text(f"[mine]\nname = \"x\"\n{body}\n")
    return p, body


@pytest.mark.parametrize("field", ["registers_per_cu", "max_registers_per_lane",
                                   "register_alloc_granularity"])
@pytest.mark.parametrize("value, says", [("0", "more than 0"), ("-8", "more than 0"),
                                         ("nan", "whole number"), ("inf", "whole number"),
                                         ("8.5", "whole number")])
def test_bad_register_figures_are_positioned_errors(tmp_path, field, value, says):
    p, body = _file(tmp_path, **{field: value})
    line = 3 + next(i for i, t in enumerate(body.split("\n")) if t.startswith(f"{field} ="))
    with pytest.raises(FirError) as e:
        read_file(p)
    assert str(e.value).startswith(f"{p}:{line}:1:") and says in str(e.value), str(e.value)


def test_missing_register_figure_and_granularity_over_the_maximum(tmp_path):
    p, _ = _file(tmp_path, registers_per_cu=None)
    with pytest.raises(FirError, match=r"has no 'registers_per_cu' \(registers\)") as e:
        read_file(p)
    assert str(e.value).startswith(f"{p}:1:1:")
    p, _ = _file(tmp_path, register_alloc_granularity=512)
    with pytest.raises(FirError, match="must not be more than its 'max_registers_per_lane'"):
        read_file(p)


def test_a_bad_register_figure_stops_the_command_cleanly(tmp_path):
    (tmp_path / "firscope").mkdir()
    p, _ = _file(tmp_path / "firscope", registers_per_cu=0)
    done = firscope("cost", "--tokens", "3", "--json", env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"{p}:") and "'registers_per_cu'" in done.stderr
    assert "Traceback" not in done.stderr


def test_every_shipped_device_has_the_register_figures_with_sources():
    for d in load_devices().values():
        assert d.registers_per_cu >= d.max_registers_per_lane >= d.register_alloc_granularity
        for f in ("registers_per_cu", "max_registers_per_lane", "register_alloc_granularity"):
            assert d.sources.get(f), (d.key, f)


# -- cost --json: registers, occupancy, per-line counters, priced advice -------------------
@pytest.fixture(scope="module")
def cost_json():
    done = firscope("cost", "--tokens", "1,2,3", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_json_gives_registers_and_occupancy_per_kernel_and_device(cost_json):
    kernels = {k["kernel"]: k for k in cost_json["kernels"]}
    ln = kernels["g2.layernorm"]
    assert (ln["max_live_r"], ln["max_live_u"], ln["register_pressure"]) == (5, 1, 7)
    assert ln["occupancy"]["limiter"] == "threadgroups"
    assert ln["occupancy"]["theoretical_occupancy"] == 0.5
    assert set(ln["occupancy_by_device"]) == set(load_devices())
    mi = ln["occupancy_by_device"]["mi300x"]
    # 64-wide waves: one lane's threadgroup is a wave of 64 slots, 2048 // 64 = 32 = the
    # 32 workgroups per CU (a tie: lanes named first): 32 x 64 / 2048 = 100%
    assert mi["limiter"] == "lanes" and mi["theoretical_occupancy"] == 1.0
    assert "occupancy" not in kernels["fir.linear"]  # a library kernel: no registers
    node = next(n for n in cost_json["nodes"] if n["node"] == "ln1@0")
    assert node["max_live_r"] == 5 and node["limiter"] == "threadgroups"


def test_per_line_counters_sum_to_the_kernel(cost_json):
    for k in cost_json["kernels"]:
        if not k["lines"]:
            continue
        lines = k["lines"]
        for f in ("lane_instructions", "warp_instructions", "requests", "sectors", "flops"):
            assert sum(ln[f] for ln in lines) == k[f], (k["kernel"], f)
        # every line's time, plus the launches no line owns, is the kernel's time
        assert sum(ln["predicted_us"] for ln in lines) + k["terms"]["launch"] == \
            pytest.approx(k["predicted_us"])
        assert sum(ln["time_share"] for ln in lines) == \
            pytest.approx(1 - k["terms"]["launch"] / k["predicted_us"])
        for ln in lines:
            assert ln["executions"] >= 0 and 0 <= ln["active_lane_share"] <= 1
    attn = next(k for k in cost_json["kernels"] if k["kernel"] == "g2.attn_decode")
    taken = next(ln for ln in attn["lines"] if ln["text"] == "mulconst 10 3 1")  # in an if
    assert taken["active_lane_share"] < 1


def test_advice_is_ranked_by_saving_and_unpriceable_lines_say_so(cost_json):
    advice = cost_json["advice"]
    priced = [a for a in advice if a["not_computed"] is None]
    unpriced = [a for a in advice if a["not_computed"] is not None]
    assert priced and unpriced and advice == priced + unpriced  # priced first
    savings = [a["saving_us_per_token"] for a in priced]
    assert savings == sorted(savings, reverse=True)
    for a in priced:
        assert a["saving_us_per_token"] == pytest.approx(a["predicted_us"]
                                                         - a["predicted_us_after"])
    fuse = next(a for a in unpriced if a["kernel"] == "g2.add")
    assert fuse["not_computed"].startswith("not computed: ") and "fuse" in fuse["text"]
    assert fuse["predicted_us_after"] is None and fuse["saving_us_per_token"] is None
    text = firscope("cost", "--tokens", "1,2,3").stdout
    assert "advice, ranked by the time it saves per token" in text
    assert "saves 0.66 us" in text and "not computed: a fused kernel" in text


def test_a_priced_tg_advice_is_the_model_on_the_recounted_trace():
    """10240 lanes at tg=1: 10240 one-warp threadgroups over 132 SMs x 32 = 3 waves; at
    tg=32, 320 threadgroups fit in one. The price is predict() of the trace counted at 32."""
    src = ADD.replace("threads=64 tg=64", "threads=10240 tg=1")
    sizes = {"in0": 10240, "in1": 10240, "out0": 10240}
    c, program, trace = counted(src, sizes, tg=1)
    dev = find_device("h200")
    p = predict(c, dev)
    assert p.waves == math.ceil(10240 / (32 * 132)) == 3
    priced = price_advice(p, dev, lambda tg: count(program, trace, tg, 0, 32))
    tg = next(a for a in priced if a["text"].startswith("tg=32"))
    by_hand = predict(count(program, trace, 32, 0, 32), dev).predicted_us
    assert tg["predicted_us_after"] == by_hand < p.predicted_us
    assert all(a["not_computed"] for a in priced if a is not tg)


def test_one_lane_threadgroups_are_not_predicted_faster_than_full_warps():
    """The old hit fraction counted the 8 one-lane warps sharing a sector in one load as 7
    cache hits: g2.add was 2.57 us at tg=1 and 2.84 at tg=32 (docs/cost-model.md)."""
    model = open_model(None)
    node = next(n for n in model.nodes if n.target == "g2.add")
    trace, _ = record(node.program, model.arena.copy(), None)
    dev = find_device("h200")
    one, full = (count(node.program, trace, tg, 16, 32) for tg in (1, 32))
    assert one.cache_hit_fraction == full.cache_hit_fraction == 0.0
    assert predict(full, dev).predicted_us <= predict(one, dev).predicted_us
    # reuse by a later instruction still hits: layernorm's second pass over its row
    ln = next(n for n in model.nodes if n.target == "g2.layernorm")
    c = count(ln.program, record(ln.program, model.arena.copy(), None)[0], 1, 16, 32)
    assert c.cache_hit_fraction > 0.5


def test_info_cost_prints_registers_occupancy_and_prices(tmp_path):
    script = tmp_path / "s.txt"
    script.write_text("break ln1@1\ncontinue\ninfo cost\n")
    r = firscope("debug", "--tokens", "1,2", "-n", "1", "-x", script)
    assert r.returncode == 0, r.stderr
    assert "registers: live at most R 5, U 1 (with loop counters 7) -> 16 per lane" in r.stdout
    assert "occupancy 50%, limited by threadgroups" in r.stdout
    assert "not computed: it needs new kernel code" in r.stdout
