"""The in-order sum split from the work feeding it (vm/split): which loops it takes, and the
interpreter's bits wherever it runs (chunks of SPLIT trips and what is left, a stride
other than one, the fed register rewritten after the sum, the checked path)."""
from __future__ import annotations

import numpy as np
import pytest

from firscope.runtime import load_model
from firscope.vm import split
from firscope.vm.compiled import CompiledRunner, generate
from test_compiled import model_with, node_named, randomize_buffers, run_both, same_bits

# Per lane: for each of `rows` elements, x = exp(in0[i] - 0.25) stored to out0[i] and
# added to a sum in order (attention's softmax), the sum stored to out1[lane].
SOFT = """
kernel t.soft{suffix} in=1 out=2 threads=3 tg=1 tgbytes=16
rtou 0 0
umulk 1 0 {lane_stride}
loadconstf32 14 {rows}
loadconstf32 11 {start}
loadconstf32 10 0.25
uaddk 6 1 0
forbegin 14
uloadf32 3 6 @in0
sub 3 3 10
{work}
ustoref32 3 6 @out0
{chain}
{after}
uaddk 6 6 {step}
forend
ustoref32 11 0 @out1
endkernel
"""
BUFS = """
buf sp_in f32 3*1200
buf sp_out f32 3*1200
buf sp_sum f32 3
"""
NODE = "node s micro t.soft sp_in -> sp_out sp_sum\n"


def soft(rows=600, step=1, work="exp 3 3", chain="add 11 11 3", after="", start=0):
    return SOFT.format(suffix="", rows=rows, step=step, work=work, chain=chain, after=after,
                       start=start, lane_stride=max(rows * step, 1))


def program_of(tmp_path, kernel):
    model = load_model(model_with(tmp_path, BUFS + kernel, NODE))
    return model, node_named(model, "s")


def check(tmp_path, kernel, seeds=range(2), scale=1.0):
    """The compiled runner's bits against the interpreter's on random data, the plain
    driver taking the dispatch; returns the generated source."""
    model, node = program_of(tmp_path, kernel)
    runner = CompiledRunner(model)
    for seed in seeds:
        rng = np.random.default_rng(seed)
        randomize_buffers(model, rng)
        r = model.regions["sp_in"]
        model.arena[r.base: r.stop] *= np.float32(scale)
        before = runner.plain_dispatches
        a, b = run_both(model, runner, node, model.arena)
        assert runner.plain_dispatches == before + 1, runner.fallbacks
        assert same_bits(a, b)
    return runner.plan(node).gen.source


@pytest.mark.parametrize("rows", [0, 1, 7, 255, 256, 257, 600])
def test_split_sums_match_the_interpreter_at_every_chunking(tmp_path, rows):
    """No trip, fewer than a chunk, exactly one, one and one trip, several and a rest."""
    src = check(tmp_path, soft(rows=rows))
    assert "while sn0 > 0:" in src and "R11 = R11 + sf[sj0]" in src


@pytest.mark.parametrize("case", [
    dict(step=2),  # a stride the fast loop versions at run time
    dict(after="mul 3 3 3"),  # x rewritten after the sum: the sum's x is kept, not the last
    dict(chain="mul 11 11 3", start=1, rows=40),  # another chain op
    dict(chain="add 11 3 11"),  # the sum read second
    dict(work="sigmoid 3 3"),
])
def test_split_variants_match_the_interpreter(tmp_path, case):
    src = check(tmp_path, soft(**case), scale=3.0)
    assert "while sn0 > 0:" in src


def test_huge_values_overflow_the_sum_as_written(tmp_path):
    """exp of large scores is inf and the sum inf, then NaN after an inf - inf: the same
    specials in the same trips."""
    check(tmp_path, soft(rows=300, work="exp 3 3\nmulconst 3 3 1e30"), scale=40.0)


@pytest.mark.parametrize("case, why", [
    (dict(work="mul 3 3 3"), "no transcendental op: the chain bounds the loop either way"),
    (dict(after="add 12 11 3"), "the sum read by another op of the body"),
    (dict(chain="add 11 11 10"), "the sum fed by no register the body writes"),
])
def test_loops_not_split(tmp_path, case, why):
    model, node = program_of(tmp_path, soft(**case))
    src = generate(node.program).source
    assert "while sn0 > 0:" not in src, why
    check(tmp_path, soft(**case))  # and its bits are the interpreter's as before


def test_plan_names_the_chain_and_its_feed(tmp_path):
    """The chain is taken only as one line naming exactly its registers (no check)."""
    model, node = program_of(tmp_path, soft(after="mul 3 3 3"))
    opener = next(op for op in node.program.ops if op.spec.opens is not None)
    body = node.program.ops[opener.pc + 1: opener.match]
    rendered = [["x"]] * len(body)
    rendered[4] = ["R11 = R11 + R3"]
    sp = split.plan(body, rendered)
    assert (sp.at, sp.chain, sp.fed) == (4, "R11", "R3")
    rendered[4] = ["if R3 != R3:", "    return -1"]
    assert split.plan(body, rendered) is None


def test_attention_splits_its_softmax_sum(random_model):
    """GPT-2's attention: the exp loop is split, the normalizing loop (no sum) is not."""
    model = load_model(random_model)
    program = next(n for n in model.nodes if n.target == "g2.attn_decode").program
    src = generate(program).source
    assert src.count("while sn0 > 0:") == 1 and "R11 = R11 + sf[sj0]" in src
