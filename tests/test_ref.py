"""``name@layer`` is parsed and printed in one place, firscope.model.Ref (issue 11 §5).

Regions and plan nodes carry their declaration and layer, so nothing takes a
name apart again.
"""
from __future__ import annotations

import numpy as np
import pytest

from firscope.errors import FirError
from firscope.model import Ref
from firscope.runtime import Machine, load_model


@pytest.mark.parametrize("text,ref", [("x", Ref("x")), ("key_cache@3", Ref("key_cache", 3)),
                                      ("attention@0", Ref("attention", 0)),
                                      ("a@999999", Ref("a", 999999))])
def test_ref_parses_and_prints_name_at_layer(text, ref):
    assert Ref.parse(text) == ref and str(ref) == text


@pytest.mark.parametrize("text,msg", [
    pytest.param("x@" + "9" * 5000, "bad layer in 'x@999", id="5000-digits"),  # not int()'s
    # ValueError for exceeding Python's integer-digit limit
    ("x@1234567", "at most 6 digits"),
    ("x@\u0663", "bad layer in 'x@\\u0663'"),  # an Arabic-Indic three: int() takes it
    ("x@\u00b2", "bad layer"),
    ("x@", "bad layer"), ("x@-1", "bad layer"), ("x@1@2", "bad layer"), ("@3", "missing name"),
])
def test_ref_refuses_bad_layers_cleanly(text, msg):
    with pytest.raises(FirError) as e:
        Ref.parse(text)
    assert msg in str(e.value) and len(str(e.value)) < 200


def test_regions_and_nodes_carry_their_declaration(random_model):
    m = load_model(random_model)
    kc = m.regions["key_cache@1"]
    assert kc.ref == Ref("key_cache", 1) and kc.decl is m.buffers["key_cache"] and kc.is_buffer
    w = m.regions["ln1w@0"]
    assert w.is_weight and w.decl is m.weight_decls["ln1w"] and w.ref == m.weights["ln1w@0"].ref
    assert all(Ref.parse(n.full_name) == n.ref for n in m.nodes)
    assert all(Ref.parse(name) == r.ref for name, r in m.regions.items())


def test_reset_zeroes_buffers_only(random_model):
    m = load_model(random_model)
    weights = np.concatenate([m.view(r) for r in m.regions.values() if r.is_weight]).copy()
    mach = Machine(m)
    mach.step(3)
    mach.reset()
    assert all(not m.view(r).any() for r in m.buffer_regions())
    assert np.array_equal(np.concatenate([m.view(r) for r in m.regions.values() if r.is_weight]),
                          weights)
    # reset skips buffers whose bits are zero: a -0.0 (== 0) or a NaN alone is still reset
    x, kc = m.view(m.regions["x"]), m.view(m.regions["key_cache@1"])
    x[5], kc[-1] = -0.0, np.nan
    mach.reset()
    bits = [m.view(r).view(np.uint32) for r in m.buffer_regions()]
    assert not any(b.any() for b in bits)


def test_buffers_view_reads_name_at_layer_through_ref():
    """The UI's buffer box parses what is typed with Ref: a layer shows that instance,
    a bad one (5000 digits, a non-ASCII digit) is an error line and the view goes on."""
    from pathlib import Path

    from firscope.tui.app import FirscopeApp
    from tui_util import plain, press, run, settle, wait_loaded
    from conftest import SAMPLE

    async def go():
        app = FirscopeApp(Path(SAMPLE / "gpt2.fir"), engine="interp", n=2, prompt_text="de")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "n", "n")
            app.action_tab("buffers")
            view = app.query_one("#buffers-view")
            for bad in ("key_cache@" + "9" * 5000, "key_cache@\u0663"):
                view.show_name(bad)
                await settle(app, pilot)  # its values are asked for in a job: not a time
                assert "bad layer in 'key_cache@" in plain(app.query_one("#buf-stats"))
            view.show_name("ln1w@1")
            await settle(app, pilot)
            w = app.session.model.weights["ln1w@1"]
            stats = plain(app.query_one("#buf-stats"))
            assert stats.startswith("ln1w@1") and f"max {app.session.model.view(w.region).max():.6g}" \
                in stats
    run(go())
