"""The UI against a dump (issue 13): the graph colours nodes by their error, the Diff tab
shows the first divergence and reference/other/difference around the first differing
element. View-models are tested without Pilot; one Pilot test opens the app with --against."""
from __future__ import annotations

import pytest
from rich.text import Text

from firscope.compare.views import Severity
from firscope.debug.commands import CommandInterpreter
from firscope.debug.diverge import attach_reference
from firscope.debug.session import Session
from firscope.runtime import load_model
from firscope.tui.diff_view import SEVERITY_STYLE, diff_text
from firscope.tui.graph_pane import node_rows
from firscope.tui.state import Wants, build_view
from model_util import scale_bug_dump

TOKENS = [3, 1, 4, 1]


@pytest.fixture
def bug_dump(random_model, tmp_path):
    """The same model with a wrong attention scale, dumped: attention@0 diverges at step 1."""
    return scale_bug_dump(random_model, tmp_path, TOKENS)


def _view(s, ci):
    from firscope.model.tokens import ByteTokenizer
    return build_view(s, ci, ByteTokenizer(), None, Wants())


def test_graph_and_diff_tab_show_the_divergence(random_model, bug_dump):
    m = load_model(random_model)
    s = Session(m, TOKENS, 0, engine="interp")
    attach_reference(s, bug_dump)
    ci = CommandInterpreter(s)
    ci.execute("break diverge")
    ci.execute("continue")
    view = _view(s, ci)
    peek = view.diff
    att = next(n.index for n in m.nodes if n.full_name == "attention@0")
    assert peek.severity[att] is Severity.DIVERGED and peek.step == 1
    assert peek.first.startswith("first divergence: step 1, attention@0")
    emb = next(n.index for n in m.nodes if n.full_name == "embeddings")
    assert peek.severity[emb] is Severity.EXACT
    # the side-by-side rows of the output that decided it, its first differing element marked
    buf = peek.buffer
    assert buf is not None and buf.name.startswith("attention@0/")
    marked = [r for r in buf.rows if r.marked]
    assert len(marked) == 1 and marked[0].differs and marked[0].index == buf.marked
    text = diff_text(peek).plain
    assert "first divergence: step 1, attention@0" in text and "reference" in text
    assert f"▶ {buf.marked:>7}" in text
    rows = {i: t for i, t, _ in node_rows(m, view, 40)}
    styled = [span.style for span in rows[str(att)].spans]
    assert any(str(st).endswith(SEVERITY_STYLE[Severity.DIVERGED]) for st in styled)


def test_diff_tab_without_a_dump_says_how_to_attach_one():
    assert "--against DUMP" in diff_text(None).plain
    assert isinstance(diff_text(None), Text)


def test_the_app_opens_against_a_dump(random_model, bug_dump):
    from firscope.tui.app import FirscopeApp
    from tui_util import run, screen_text, settle, wait_loaded
    app = FirscopeApp(random_model, n=0, engine="interp", against=str(bug_dump),
                      show_times=False)

    async def go():
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_loaded(app, pilot)
            assert app.session.sequence == TOKENS  # the dump's tokens
            app.run_command("break diverge")
            app.run_command("continue")
            await settle(app, pilot)
            assert "attention@0" in app.view.diff.first
            app.action_tab("diff")
            await settle(app, pilot)
            assert "first divergence: step 1, attention@0" in screen_text(app)
    run(go())


def test_isolate_colours_nodes_by_their_own_error(random_model, tmp_path):
    """Two independent bugs: with --isolate the graph shows gelu@0 and attention@0 diverged on
    their own and what only inherited their errors (ln1@1 after attention@0) not."""
    from test_isolate import buggy, dump_of
    dump = dump_of(buggy(random_model), tmp_path / "two.safetensors", tokens=TOKENS)
    m = load_model(random_model)
    idx = {n.full_name: n.index for n in m.nodes}
    for isolate in (False, True):
        s = Session(m, TOKENS, 0, engine="compiled")
        attach_reference(s, dump, isolate=isolate)
        ci = CommandInterpreter(s)
        ci.execute("break attention_linear@1")
        ci.execute("continue")
        ci.execute("continue")  # step 1, just after attention@1
        peek = _view(s, ci).diff
        assert peek.step == 1
        sev = peek.severity
        if not isolate:  # the chain: everything after the first bug differs
            assert sev[idx["ln1@1"]] is Severity.DIVERGED  # after attention@0's error
            assert peek.first.startswith("first divergence: step 0, gelu@0")
            continue
        assert sev[idx["attention@0"]] is Severity.DIVERGED
        assert sev[idx["attention@1"]] is Severity.DIVERGED
        for name in ("ln1@0", "qkv_bias@0", "attention_residual@0", "ln1@1", "qkv_linear@1"):
            assert sev[idx[name]] in (Severity.EXACT, Severity.WITHIN), name
        assert peek.first.startswith("first node wrong on its own: step 0, gelu@0")
        assert any("own error" in n and "0 not judged" in n for n in peek.notes)
        # the session's own chain is untouched by the runs made aside
        assert s.reference.results[(1, idx["ln1@1"])][0].diff.diverged


def test_the_app_opens_against_a_dump_with_isolate(random_model, bug_dump):
    from firscope.tui.app import FirscopeApp
    from tui_util import run, screen_text, settle, wait_loaded
    app = FirscopeApp(random_model, n=0, engine="interp", against=str(bug_dump),
                      isolate=True, show_times=False)

    async def go():
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_loaded(app, pilot)
            ref = app.session.reference
            assert ref.isolate and ref.view_own
            app.run_command("break diverge --isolate")
            app.run_command("continue")
            await settle(app, pilot)
            assert app.view.diff.first.startswith("first node wrong on its own: step 1, "
                                                  "attention@0")
            app.action_tab("diff")
            await settle(app, pilot)
            assert "first node wrong on its own: step 1, attention@0" in screen_text(app)
    run(go())
