"""The --isolate walk's shortcuts change nothing (issue 25, speed follow-up).

run_isolated skips asking for a node's inputs while every output so far compared bit for
bit ("in step": the arena already holds the dump's values), and DumpInputs.loads leaves
out the inputs the arena holds. Each report here is checked against the walk without
either shortcut: an input source that is not a DumpInputs and ignores ``held``.
"""
from __future__ import annotations

from firscope.compare import Dump, DumpSource, Tolerance, run_lockstep
from firscope.compare.isolate import DumpInputs, isolating
from firscope.runtime import load_model

from test_isolate import BUGS, TOKENS, buggy, dump_of


class Plain:
    """DumpInputs without the shortcuts: every load, every node."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0

    def loads(self, step, node, held=None):
        self.calls += 1
        return self.inner.loads(step, node)


def _reports(fir, dump):
    model = load_model(fir)
    out = []
    for plain in (False, True):
        source = DumpSource(model, Dump(dump), len(TOKENS))
        inputs = DumpInputs(model, source)
        counted = Plain(inputs)
        if not plain:  # count the fast path's questions without taking it off the path
            inputs.loads = lambda step, node, held=None, f=inputs.loads: (
                setattr(counted, "calls", counted.calls + 1), f(step, node, held))[1]
        judge = isolating(counted if plain else inputs)
        rep = run_lockstep(model, source, TOKENS, Tolerance(), isolate=judge)
        out.append((rep, counted.calls))
    return out


def _same(a, b):
    assert a.results == b.results
    assert a.not_judged == b.not_judged
    assert a.inherited == b.inherited
    assert a.exit_code == b.exit_code


def test_a_clean_dump_is_walked_in_step_with_the_same_report(random_model, tmp_path):
    dump = dump_of(random_model, tmp_path / "clean.safetensors")
    (fast, asked), (plain, every) = _reports(random_model, dump)
    _same(fast, plain)
    assert fast.exit_code == 0 and fast.results
    assert asked == 0 and every == len(TOKENS) * len(load_model(random_model).nodes)


def test_two_bugs_leave_the_step_and_give_the_same_report(random_model, tmp_path):
    dump = dump_of(buggy(random_model), tmp_path / "two.safetensors")
    (fast, asked), (plain, every) = _reports(random_model, dump)
    _same(fast, plain)
    assert fast.diverged and fast.inherited
    assert 0 < asked < every  # in step up to gelu@0 at step 0, then asked for each node


def test_a_partial_dump_leaves_the_step_and_gives_the_same_report(random_model, tmp_path):
    dump = dump_of(buggy(random_model, BUGS[:1], "scale.fir"), tmp_path / "part.safetensors",
                   pattern="*/attn,*/qkv,*/key_cache,*/value_cache")
    (fast, asked), (plain, _) = _reports(random_model, dump)
    _same(fast, plain)
    assert fast.not_judged and asked > 0
