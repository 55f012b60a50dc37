"""The UI's start (issue 45, the first stop): the load's progress at most every
LOAD_PROGRESS_S, the panes shown without restyling the screen, and the cyclic collector off
until the first stop when the command line asks."""
from __future__ import annotations

import gc

import firscope.tui.app as app_mod
import firscope.tui.loading as loading
from firscope.tui.loading import LOAD_PROGRESS_S
from test_tui import SIZE, broken_sample, make_app
from tui_util import press, run, wait_loaded
from conftest import SAMPLE


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


def test_the_load_reports_its_progress_at_most_every_tenth_of_a_second(monkeypatch):
    """The sample's load reported 56 steps in ~50 ms, each a message and a layout on the
    UI's thread while the load waited for the GIL: now at most one per LOAD_PROGRESS_S,
    none in the first."""
    clock = FakeClock()
    monkeypatch.setattr(loading, "time", clock)
    shown: list[tuple[str, float]] = []
    real_open = app_mod.open_session

    def open_session(path, options, carried, probe, wants, progress):
        for i in range(100):  # a burst in the first tenth: nothing shown
            progress(f"burst {i}", i / 1000)
        clock.now += LOAD_PROGRESS_S * 1.5
        progress("later", 0.5)  # shown
        clock.now += LOAD_PROGRESS_S / 2
        progress("too soon", 0.6)  # not: the last was shown half a period ago
        clock.now += LOAD_PROGRESS_S
        progress("last", 0.9)  # shown
        return real_open(path, options, carried, probe, wants, lambda what, frac: None)
    monkeypatch.setattr(app_mod, "open_session", open_session)

    real = app_mod.FirscopeApp.on_load_progress

    def on_load_progress(self, message):
        shown.append((message.what, message.frac))
        real(self, message)
    monkeypatch.setattr(app_mod.FirscopeApp, "on_load_progress", on_load_progress)

    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            assert app.session is not None
    run(go())
    assert shown == [("later", 0.5), ("last", 0.9)]


def test_showing_the_panes_after_the_load_restyles_no_subtree():
    """The loading panel and the panes are two displays, not a class on the screen: a class
    there restyled the screen's ~80 widgets when the first stop came (~30-50 ms)."""
    async def go():
        app = make_app()
        restyled: list[int] = []
        async with app.run_test(size=SIZE) as pilot:
            real = app.stylesheet.update_nodes

            def update_nodes(nodes, animate=False):
                nodes = list(nodes)
                restyled.append(len(nodes))
                return real(nodes, animate=animate)
            app.stylesheet.update_nodes = update_nodes
            await wait_loaded(app, pilot)
            assert app.session is not None and not app.main_screen.loading
        return restyled
    restyled = run(go())
    assert restyled and max(restyled) <= 5, restyled


def test_the_collector_is_on_again_once_the_first_stop_is_drawn_or_the_load_failed(tmp_path):
    broken = broken_sample(tmp_path)

    async def go(fir):
        app = make_app(fir)
        app.gc_paused = True  # as launch.run_app sets it after the command line turned it off
        gc.disable()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            return gc.isenabled(), app.session is not None
    try:
        assert run(go(SAMPLE / "gpt2.fir")) == (True, True)
        assert run(go(broken)) == (True, False)
    finally:
        gc.enable()
        gc.unfreeze()


def test_the_ui_command_starts_with_the_collector_off_and_gives_it_back(monkeypatch):
    import firscope.tui.launch as launch
    from firscope.cli import main
    seen = []

    def run_app(args, gc_paused=False):
        seen.append((gc.isenabled(), gc_paused, args.model))
        return 0
    monkeypatch.setattr(launch, "run_app", run_app)
    assert gc.isenabled()
    assert main(["ui", str(SAMPLE / "gpt2.fir")]) == 0
    assert seen == [(False, True, str(SAMPLE / "gpt2.fir"))]
    assert gc.isenabled()


def test_the_footer_composes_its_keys_once_and_again_only_when_the_bindings_change(monkeypatch):
    """Textual's Footer composed its ~20 keys anew at every bindings change, three times
    before the first stop with the same keys; KeysFooter only when what it draws from
    changed (a focus whose widget has bindings of its own)."""
    from textual.widgets import Footer
    from firscope.tui.console_view import CommandInput
    from firscope.tui.debug_screen import KeysFooter
    from firscope.tui.graph_pane import NodeList
    composed = []
    real = Footer.recompose

    async def recompose(self):
        composed.append(type(self))
        return await real(self)
    monkeypatch.setattr(Footer, "recompose", recompose)

    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await pilot.pause()
            assert composed == [KeysFooter]
            footer = app.query_one(KeysFooter)
            keys = [k.description for k in footer.query("FooterKey")]
            assert "next" in keys and "step" in keys
            await press(app, pilot, "n", "s")  # steps: the same bindings, nothing composed
            assert len(composed) == 1
            app.query_one(CommandInput).focus()  # the input's own bindings join
            await pilot.pause()
            await pilot.pause()
            assert len(composed) == 2
            # the terminal loses focus: Textual composes nothing then, and a change then is
            # not taken as drawn: once focus is back the footer draws the keys as they are
            app.app_focus = False
            await pilot.pause()
            app.query_one(NodeList).focus()
            await pilot.pause()
            assert len(composed) == 2
            app.app_focus = True
            await pilot.pause()
            app.screen.refresh_bindings()
            await pilot.pause()
            await pilot.pause()
            assert len(composed) == 3
    run(go())
