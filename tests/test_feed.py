"""Machine.feed: a decode step for the KV cache alone (the head skipped), as `cost --at`
feeds a prompt up to the step it costs and `run` a prompt whose logits it does not save."""
from __future__ import annotations

import numpy as np
import pytest

from firscope.runtime import Machine
from firscope.runtime.machine import unread_nodes
from firscope.runtime.opening import open_model


@pytest.mark.parametrize("engine", ["compiled", "interp"])
def test_feed_leaves_the_state_a_step_leaves_without_the_outputs(engine):
    """``cost --at`` feeds the prompt with Machine.feed: the nodes whose results no node
    reads (GPT-2's head) are skipped; every other region ends bit for bit as step leaves it,
    and the logits are not written."""
    model = open_model(None)
    assert [model.nodes[i].full_name for i in unread_nodes(model)] == ["head"]
    stepped, fed = Machine(model.with_own_arena(), engine=engine), \
        Machine(model.with_own_arena(), engine=engine)
    for m in (stepped, fed):
        m.reset()
    for t in [5, 9, 2, 7]:
        stepped.step(t)
        fed.feed(t)
    assert (fed.position, fed.history) == (stepped.position, stepped.history) == (4, [5, 9, 2, 7])
    out = model.outputs["logits"]
    keep = np.ones(model.arena.size, dtype=bool)
    keep[out.base: out.base + out.size] = False
    assert np.array_equal(fed.arena.view(np.uint32)[keep], stepped.arena.view(np.uint32)[keep])
    assert not fed.arena[out.base: out.base + out.size].any()
    assert stepped.arena[out.base: out.base + out.size].any()
    # the next step from either gives the same logits, bit for bit
    assert np.array_equal(fed.step(3).logits.view(np.uint32),
                          stepped.step(3).logits.view(np.uint32))


def test_feed_with_a_hook_runs_every_node():
    """A tap on the head (the Python API's record=) sees it run: feed is then step."""
    model = open_model(None).with_own_arena()
    m = Machine(model, engine="compiled")
    m.reset()
    head = next(n for n in model.nodes if n.full_name == "head")
    seen = []
    m.hooks.at_node[head.index] = [lambda machine, node: seen.append(node.full_name)]
    m.feed(5)
    out = model.outputs["logits"]
    assert seen == ["head"] and m.arena[out.base: out.base + out.size].any()


def test_generate_without_the_prompts_logits_gives_the_same_tokens_and_logits():
    """``run`` without --logits-out feeds the prompt: the same tokens, and the logits of the
    steps it keeps (the prompt's last token's on) the same bits."""
    model = open_model(None)
    want_m, got_m = (Machine(model.with_own_arena(), engine="compiled") for _ in range(2))
    for m in (want_m, got_m):
        m.reset()
    prompt = [5, 9, 2, 7, 11]
    want, want_logits = want_m.generate(prompt, 4)
    got, got_logits = got_m.generate(prompt, 4, prompt_logits=False)
    assert got == want and len(want) == 4
    assert len(want_logits) == len(prompt) + 3 and len(got_logits) == 4
    for a, b in zip(got_logits, want_logits[len(prompt) - 1:]):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert got_m.position == want_m.position == len(prompt) + 3


def test_a_run_that_looks_at_the_stop_flag_between_nodes_stops_a_feed_too():
    """`firscope run` (runtime/interrupt.stop_between_nodes) stops before the next node on
    ctrl+c; its prompt's feeds take the plain loop, which looks at the flag as well."""
    from firscope.errors import Interrupted
    from firscope.runtime.interrupt import stop_between_nodes
    m = Machine(open_model(None).with_own_arena(), engine="compiled")
    m.reset()
    stop_between_nodes(m)
    assert not m.hooks.per_node  # no hook: the steps keep the plain loop
    m.stop_flag.set()
    with pytest.raises(Interrupted, match="before node token"):
        m.feed(5)
    m.stop_flag.clear()
    m.reset()
    m.feed(5)
    assert m.position == 1
