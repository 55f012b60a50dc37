"""Pilot-driven tests: press keys, check the engine state and what the screen shows.

Tests wait on the app's workers and the messages they post (``settle``), never on
fixed sleeps, so a loaded machine makes them slower, not flaky.
"""
import shutil
from pathlib import Path

import numpy as np
import pytest

from firscope.debug.breakpoints import LineBreakpoint
from firscope.tui.app import FirscopeApp
from firscope.tui.graph_pane import NodeList
from firscope.tui.source_pane import SourceLines
from tui_util import option_texts, plain, press, run, screen_text, settle, wait_loaded
from conftest import SAMPLE, SEED_FIR

SIZE = (120, 36)
SIZES = [(80, 24), (120, 36), (200, 50)]


def make_app(path=None, **kw):
    kw.setdefault("engine", "interp")
    kw.setdefault("n", 4)
    kw.setdefault("prompt_text", "def ")
    return FirscopeApp(Path(path or SAMPLE / "gpt2.fir"), **kw)


def copy_sample(tmp_path, name="m") -> Path:
    folder = tmp_path / name
    shutil.copytree(SAMPLE, folder)
    return folder / "gpt2.fir"


def spinning_model(tmp_path, body: str) -> Path:
    """The sample with a layernorm that first spins a billion times running ``body``:
    far too long to wait for."""
    fir = copy_sample(tmp_path, "slow")
    fir.write_text(SEED_FIR.read_text().replace(
        "loadconstf32 15 in0.size", f"loadconstf32 20 1000000000\nforbegin 20\n{body}\n"
        "forend\nloadconstf32 15 in0.size", 1))
    return fir


def header(app) -> str:
    return plain(app.query_one("#status"))


def console_log(app) -> str:
    return "\n".join(app.query_one("#console-view").history)


def test_loads_sample_and_shows_graph_and_status():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            s = app.session
            assert s is not None and s.node_index == 0
            nodes = option_texts(app.query_one(NodeList))
            assert any("token" in t and "▶" in t for t in nodes)
            assert "▾ layer 3" in nodes
            status = header(app)
            assert "tiny-gpt2 · q4 · token 0 of 0..6" in status and "'d' pos 0" in status
            # the bottom opens on Buffers, showing the next node's inputs
            assert app.query_one("#bottom").active == "buffers"
            assert "inputs of token" in plain(app.query_one("#buf-stats"))
    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_every_size_shows_whole_instructions_times_and_help(size):
    async def go():
        app = make_app()
        async with app.run_test(size=size) as pilot:
            await wait_loaded(app, pilot)
            app.run_command("until attention@0")
            await settle(app, pilot)
            await press(app, pilot, "s")
            await press(app, pilot, "t")  # every node ran once: each has a time
            app.run_command("until g2.attn_decode:160")
            await settle(app, pilot)
            screen = screen_text(app)
            lines = screen.splitlines()
            # the source pane shows whole instructions, on one line each
            assert any("uaddk 4 4 hidden-headdim" in ln for ln in lines), screen
            assert any("cmplt 4 10 3" in ln for ln in lines)
            # node times on the node's own line
            graph = [ln for ln in lines if "qkv_bias" in ln]
            assert graph and all(("µs" in ln or "ms" in ln) for ln in graph), screen
            assert not any(ln.strip("│ ").endswith(("µs", "ms")) and not any(
                c.isalpha() for c in ln.replace("µs", "").replace("ms", "")) for ln in lines)
            # the status keeps the location, the footer shows help and quit
            assert "attention@0, line" in lines[0]
            assert "? help" in lines[-1] and "q quit" in lines[-1]
            # help is fully reachable: it scrolls to its last command
            await pilot.press("question_mark")
            await settle(app, pilot)
            body = app.screen.query_one("#help-body")
            body.scroll_end(animate=False)
            await settle(app, pilot)
            text = screen_text(app)
            assert "leave the debugger" in text and "escape closes" in text
            await pilot.press("escape")
    run(go())


def test_keys_step_next_finish_and_reverse():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            s = app.session
            await press(app, pilot, "f10", "n")  # token, positional
            assert s.node.full_name == "embeddings"
            await press(app, pilot, "f11")  # one instruction into g2.add
            assert s.dispatch is not None and s.dispatch.pc == 1
            assert "lane 0 of 128" in app.query_one("#right RegistersPane").border_title
            await press(app, pilot, "s", "s")
            assert s.dispatch.pc == 3
            src = option_texts(app.query_one(SourceLines))
            assert any(t.lstrip().startswith("▶") and "add 1 1 2" in t for t in src)
            await press(app, pilot, "r")  # reverse-stepi
            assert s.dispatch.pc == 2
            await press(app, pilot, "f")  # finish the kernel
            assert s.dispatch is None and s.node.full_name == "ln1@0"
            await press(app, pilot, "shift+f10")  # reverse-next: back before embeddings
            assert s.node.full_name == "embeddings" and s.dispatch is None
            await press(app, pilot, "t")  # next token
            assert s.step == 1 and s.node_index == 0
            assert "token 1 of 0..6" in header(app)
    run(go())


def test_breakpoint_key_on_graph_and_on_kernel_line_then_continue():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            s = app.session
            nodes = app.query_one(NodeList)
            nodes.focus()
            target = nodes.index_of_node(s.model.node_index("attention@1"))
            nodes.highlighted = target
            await press(app, pilot, "f9")
            assert [bp.spec for bp in s.breakpoints] == ["attention@1"]
            assert option_texts(nodes)[target].startswith("●")
            await press(app, pilot, "f5")
            assert s.node.full_name == "attention@1" and s.step == 0
            assert "stopped: breakpoint 1 at attention@1" in header(app)
            assert app.focused is nodes  # a run never moves focus
            nodes.highlighted = nodes.index_of_node(s.node_index)
            await press(app, pilot, "b")  # toggle it off again
            assert not s.breakpoints
            src = app.query_one(SourceLines)
            src.focus()
            line = next(i for i, t in enumerate(option_texts(src)) if "cmplt 4 10 3" in t)
            src.highlighted = line
            await press(app, pilot, "f9")
            bp = next(iter(s.breakpoints))
            assert isinstance(bp, LineBreakpoint) and bp.kernel == "g2.attn_decode"
            await press(app, pilot, "c")
            loc = s.location()
            assert loc.in_kernel and loc.line == bp.line and loc.node == "attention@1"
            assert f"breakpoint 2 at attention@1, line {bp.line}" in header(app)
    run(go())


def test_one_shows_the_buffers_and_one_again_takes_a_name():
    """A newcomer pressed 1 and typed wte: t stepped a token and e exported a report. 1
    shows the Buffers tab (stepping keys still step) and says how to type a name; 1 with
    the tab showing focuses the name field, whose typed keys run nothing."""
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            s = app.session
            await pilot.press("2")
            await pilot.press("1")
            await settle(app, pilot)
            assert app.query_one("#bottom").active == "buffers"
            assert "1 again" in header(app)
            before = (s.step, s.node_index)
            await pilot.press("n")  # still a stepping key
            await settle(app, pilot)
            assert (s.step, s.node_index) != before
            before = (s.step, s.node_index)
            await pilot.press("1")
            await settle(app, pilot)
            assert app.focused.id == "buf-name"
            for ch in "wte":
                await pilot.press(ch)
            await settle(app, pilot)
            assert (s.step, s.node_index) == before and app.focused.value == "wte"
            await pilot.press("enter")
            await settle(app, pilot)
            assert "wte" in plain(app.query_one("#buf-stats"))
    run(go())


def test_console_takes_typed_commands_without_running_keys():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            s = app.session
            await pilot.press("4")
            await settle(app, pilot)
            assert app.focused.id == "console-input"
            before = (s.step, s.node_index)
            for ch in "print x[0]":
                await pilot.press("space" if ch == " " else {"[": "left_square_bracket",
                                                             "]": "right_square_bracket"
                                                             }.get(ch, ch))
            await pilot.press("enter")
            await settle(app, pilot)
            assert (s.step, s.node_index) == before  # no key action ran
            assert "(firscope) print x[0]" in console_log(app) and "$ = " in console_log(app)
            assert app.focused.id == "console-input"  # a command never moves focus
            # history: up brings the command back
            await pilot.press("up")
            assert app.focused.value == "print x[0]"
            # Tab completes a command name
            app.focused.value = "inf"
            app.focused.cursor_position = 3
            await pilot.press("tab")
            assert app.focused.value == "info "
            # escape leaves the input, back to the pane the user was in
            await pilot.press("escape")
            assert isinstance(app.focused, NodeList)
            # a console continue to a breakpoint shows the breakpoint in the header
            app.run_command("break ln2@1")
            app.run_command("continue")
            await settle(app, pilot)
            assert s.node.full_name == "ln2@1"
            assert "stopped: breakpoint 1 at ln2@1" in header(app)
    run(go())


def test_errors_show_in_the_header_until_the_next_good_command():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            app.run_command("until")
            await settle(app, pilot)
            assert "error: usage: until LOCATION" in header(app)
            app.run_command("bogus command")
            await settle(app, pilot)
            assert "unknown command 'bogus'" in console_log(app)
            app.run_command("print max(abs(x))")
            await settle(app, pilot)
            assert "error" not in header(app) and "stopped" in header(app)
            assert app.session.node.full_name == "token"
    run(go())


def test_lane_choice_and_registers_across_lanes():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            app.run_command("until attention@0")
            await settle(app, pilot)
            await press(app, pilot, "s", "s")
            await pilot.press("l")
            await settle(app, pilot)
            inp = app.screen.query_one("#prompt-input")
            inp.value = "3"
            await press(app, pilot, "enter")
            assert app.ci.lane == 3
            regs = app.query_one("#right RegistersPane")
            assert "lane 3 of 4" in regs.border_title
            await press(app, pilot, "left_square_bracket")
            assert app.ci.lane == 2
            # choose U1 with the register cursor: shown across lanes
            regs.focus()
            regs.cursor = ("U", 1)
            await press(app, pilot, "enter")
            text = plain(regs.query_one(".lanes"))
            assert "U1 over lanes" in text and "mask 4/4" in text
            for lane in range(4):  # U1 = lane * headdim (32 for the sample)
                assert str(lane * 32) in text
    run(go())


def test_set_on_a_register_and_a_buffer_element_and_the_watch_list():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            s = app.session
            app.run_command("display x[3]")
            app.run_command("until ln1@0")
            await settle(app, pilot)
            watch = plain(app.query_one("#right WatchPane .watch"))
            assert watch.startswith("1: x[3] = ")
            # = on a buffer element: x is ln1's first input
            values = app.query_one("#buf-values")
            values.focus()
            await press(app, pilot, "right", "right", "right")
            await pilot.press("equals_sign")
            await settle(app, pilot)
            assert "set x[3] =" in str(app.screen.query_one("Label").content)
            app.screen.query_one("#prompt-input").value = "2.5"
            await press(app, pilot, "enter")
            assert float(s.buffer_value("x")[3]) == 2.5
            assert "1: x[3] = 2.5" in plain(app.query_one("#right WatchPane .watch"))
            assert "patched (1)" in header(app)
            # = on a register
            app.run_command("stepi")
            await settle(app, pilot)
            regs = app.query_one("#right RegistersPane")
            regs.focus()
            regs.cursor = ("R", 0)
            await pilot.press("equals_sign")
            await settle(app, pilot)
            app.screen.query_one("#prompt-input").value = "7"
            await press(app, pilot, "enter")
            assert float(s.dispatch.R[0, app.ci.lane]) == 7.0
    run(go())


def test_history_of_a_buffer_element_jumps_to_the_writer():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            s = app.session
            await press(app, pilot, "t")  # a whole token: x written several times
            app.query_one("#buffers-view").show_name("x")
            await settle(app, pilot)
            app.query_one("#buf-values").focus()
            await press(app, pilot, "h")
            from firscope.tui.screens import HistoryScreen
            assert isinstance(app.screen, HistoryScreen)
            writes = app.screen.writes
            assert len(writes) >= 2
            target = writes[1]
            app.screen.query_one("#history-list").highlighted = 1
            await press(app, pilot, "enter")
            assert (s.step, s.node.full_name) == (target.step, target.node)
    run(go())


def test_lens_tab_updates_and_jumps_to_the_end_of_a_layer():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            s = app.session
            app.run_command("until final_norm")
            await settle(app, pilot)
            await press(app, pilot, "5")
            lens = app.query_one("#lens-view")
            rows = option_texts(lens)
            assert sum(r.startswith("layer ") for r in rows) == s.model.layers
            assert rows[1].startswith("embed ")  # the embeddings' own prediction first
            lens.focus()
            lens.highlighted = 3  # header row, embed, then layer 0, layer 1
            await press(app, pilot, "enter")
            assert s.node.full_name == "ln1@2" and s.step == 0
            rows = option_texts(lens)  # updated at this stop: layers 0 and 1 only
            assert sum(r.startswith("layer ") for r in rows) == 2
    run(go())


def test_m_maximizes_each_of_the_five_panes():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "n", "n", "n")
            targets = [("#nodes", "#graph"), ("#source-lines", "#source"),
                       ("#right RegistersPane", "#right RegistersPane"),
                       ("#right WatchPane", "#right WatchPane"), ("#buf-values", "#bottom")]
            for focus, pane in targets:
                app.query_one(focus).focus()
                await press(app, pilot, "m")
                assert app.screen.maximized is app.query_one(pane), focus
                await press(app, pilot, "m")
                assert app.screen.maximized is None
            # Tab cycles focus through the panes
            app.query_one("#nodes").focus()
            await press(app, pilot, "tab")
            assert app.focused is app.query_one("#source-lines")
    run(go())


def test_quit_asks_first():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            from firscope.tui.screens import QuitScreen
            await pilot.press("q")
            await settle(app, pilot)
            assert isinstance(app.screen, QuitScreen)
            await pilot.press("n")
            await settle(app, pilot)
            assert not isinstance(app.screen, QuitScreen) and app.is_running
            await pilot.press("ctrl+c")
            await settle(app, pilot)
            assert isinstance(app.screen, QuitScreen)
            await pilot.press("q")
            await settle(app, pilot)
        assert app.return_code == 0
    run(go())


def test_buffers_tab_shows_values_stats_and_q4_detail():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "n", "n", "n")
            view = app.query_one("#buffers-view")
            view.show_name("x")
            await settle(app, pilot)
            x = app.session.buffer_value("x")
            stats = plain(app.query_one("#buf-stats"))
            assert "shape [128]" in stats and f"max {x.max():.6g}" in stats
            assert f"{float(x[0]):.5g}" in plain(app.query_one("#buf-values"))
            view.show_name("qkvw@0")
            await settle(app, pilot)
            q4 = plain(app.query_one("#buf-q4"))
            assert "group 32" in q4 and "rmse" in q4 and "scale" in q4
            view.show_name("nope")
            await settle(app, pilot)
            assert "no buffer, weight or register named 'nope'" in plain(
                app.query_one("#buf-stats"))
    run(go())


def test_attention_heatmap_after_attention_ran():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "t", "t", "2")
            body = plain(app.query_one("#att-body"))
            assert "scores · layer" in body and "head 3" in body
            rows = app.view.attention[(1, 0)]
            assert rows.shape == (4, 2)
            assert np.allclose(rows.sum(axis=1), 1, atol=1e-5)
    run(go())


def broken_sample(tmp_path) -> Path:
    """The sample with a register out of range: it cannot load."""
    fir = copy_sample(tmp_path, "broken")
    fir.write_text(SEED_FIR.read_text().replace("add 1 1 2", "add 1 1 99", 1))
    return fir


def test_broken_model_file_shows_error_and_app_survives(tmp_path):
    fir = broken_sample(tmp_path)

    async def go():
        app = make_app(fir)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            assert app.session is None and app.load_error is not None
            assert app.main_screen.loading  # the loading panel says why, not the panes
            err = plain(app.query_one("#load-error"))
            assert "register R99 is outside 0..31" in err and f"{fir}:" in err
            fir.write_text(SEED_FIR.read_text())
            await press(app, pilot, "f2")
            assert app.session is not None and not app.main_screen.loading
    run(go())


def test_f2_after_an_edit_keeps_breakpoints_displays_and_position(tmp_path):
    fir = copy_sample(tmp_path)

    async def go():
        app = make_app(fir)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            for line in ("until ln2@1", "token", "until mlp_residual@0", "break gelu@1",
                         "break g2.attn_decode:156", "display max(abs(x))"):
                app.run_command(line)
            await settle(app, pilot)
            assert (app.session.step, app.session.node.full_name) == (1, "mlp_residual@0")
            # the edit moves every kernel line after it down by one
            fir.write_text(fir.read_text().replace("kernel g2.attn_decode",
                                                   "# an edit\nkernel g2.attn_decode", 1))
            await press(app, pilot, "f2")
            s = app.session
            assert (s.step, s.node.full_name) == (1, "mlp_residual@0")
            assert [bp.spec for bp in s.breakpoints] == ["gelu@1", "g2.attn_decode:157"]
            assert [d.text for d in app.ci.displays.values()] == ["max(abs(x))"]
            assert "restored: break g2.attn_decode:157" in console_log(app)
            # an edit that removes an instruction: listed as not restored
            fir.write_text(fir.read_text().replace("cmplt 4 10 3", "cmplt 4 3 10", 1))
            await press(app, pilot, "f2")
            assert [bp.spec for bp in app.session.breakpoints] == ["gelu@1"]
            assert "not restored: break g2.attn_decode:157" in console_log(app)
    run(go())


def test_f2_lists_patches_and_checkpoints_it_does_not_carry(tmp_path):
    """A reload keeps nothing of the old run's memory: patches and checkpoints are named
    as not carried (they were dropped without a word)."""
    fir = copy_sample(tmp_path)

    async def go():
        app = make_app(fir)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            for line in ("until ln2@0", "set x[0:4] = 0", "checkpoint"):
                app.run_command(line)
            await settle(app, pilot)
            await press(app, pilot, "f2")
            log = console_log(app)
            assert "not carried: patch 1 `set x[0:4] = 0` (made at token 0, before ln2@0)" in log
            assert "not carried: checkpoint 1 (token 0, before ln2@0)" in log
            assert len(app.session.patches) == 0
    run(go())


def test_runtime_fault_is_shown_and_session_survives(tmp_path):
    fir = copy_sample(tmp_path, "oob")
    fir.write_text(SEED_FIR.read_text().replace("uloadf32 2 0 @in1\nadd 1 1 2",
                                                "uaddk 5 0 1\nuloadf32 2 5 @in1\nadd 1 1 2"))

    async def go():
        app = make_app(fir)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "c")
            assert app.status_text.startswith("fault at embeddings")
            d = app.session.dispatch
            assert d is not None and d.ops[d.pc].text == "uloadf32 2 5 @in1"
            await press(app, pilot, "r")  # and can step back
            assert app.session.dispatch.pc == 2
    run(go())


async def wait_for(pilot, condition, timeout: float = 60.0) -> None:
    """Poll a condition the worker makes true (a run reaching a given node)."""
    for _ in range(int(timeout / 0.02)):
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError("the condition never came true")


def record_statuses(app) -> list[str]:
    """The texts the app puts in its header from now on, in order."""
    said, set_status = [], app.set_status

    def recording(text=None, **kw):
        if text is not None:
            said.append(text)
        set_status(text, **kw)
    app.set_status = recording
    return said


def test_a_step_that_ends_at_once_repaints_the_header_once_with_its_stop(monkeypatch):
    """A job says "running" only once it has run for RUNNING_AFTER (here made long, as if
    every step were quick): a step key does not first draw "running: next" and its stop a
    frame later (a header flickering at every key, the stop's repaint a frame late)."""
    import firscope.tui.app as app_module
    monkeypatch.setattr(app_module, "RUNNING_AFTER", 60.0)

    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            said = record_statuses(app)
            for key in "nnsn":
                await press(app, pilot, key)
            assert app.session.node_index == 3
            assert said and not any(t.startswith("running") for t in said), said
            assert "stopped at" in header(app) and "running" not in header(app)
    run(go())


def test_interrupt_key_stops_a_long_run_and_progress_shows(tmp_path):
    # a store in the spin: a register-only spin is a runaway known before running
    # (vm/runaway), reported at once instead of run
    fir = spinning_model(tmp_path, "add 21 21 21\nuconst 22 0\nustoref32 21 22 @out0")

    async def go():
        app = make_app(fir)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            said = record_statuses(app)
            await pilot.press("c")
            # the three nodes before ln1@0 are done: the run is inside the spin
            await wait_for(pilot, lambda: app.probe.node == (3, len(app.model.nodes)))
            await wait_for(pilot, lambda: "node 3/61" in header(app))  # progress, after 0.5 s
            assert app.busy and "running: continue" in header(app)
            # before the progress line: the run said, once it had run for RUNNING_AFTER
            assert said[0] == "running: continue (escape interrupts)", said
            await pilot.press("escape")
            await settle(app, pilot)
            assert app.status_text.startswith("interrupted"), app.status_text
            s = app.session
            assert s.node.full_name == "ln1@0" and s.dispatch is None  # the node was undone
            assert "g2.layernorm" in console_log(app)
    run(go())


def test_help_screen_lists_keys():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "question_mark")
            from firscope.tui.screens import HelpScreen
            assert isinstance(app.screen, HelpScreen)
            from firscope.tui.screens import help_table
            text = plain(help_table(app.screen.commands))
            for key in ("F5 / c", "m", "tab / shift+tab", "[", "=", "ctrl+p"):
                assert key in text
            for cmd in ("history BUF[i]", "lens [--all] [K]", "display EXPR", "set [--weight]"):
                assert cmd in text
            await press(app, pilot, "escape")
            assert not isinstance(app.screen, HelpScreen)
    run(go())


def test_keys_typed_while_running_are_queued_and_palette_runs_forms():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            for _ in range(5):
                await pilot.press("f10")
            await settle(app, pilot)
            assert app.session.node.full_name == "qkv_bias@0"  # all five nodes ran, in order
            from firscope.tui.palette import DebuggerCommands
            provider = DebuggerCommands(app.screen)
            hits = [h async for h in provider.search("break attention@2")]
            assert hits and hits[0].text == "run: break attention@2"
            hits[0].command()
            await settle(app, pilot)
            assert [bp.spec for bp in app.session.breakpoints] == ["attention@2"]
            hits = [h async for h in provider.search("info breakpoints")]
            assert str(hits[0].text) == "info breakpoints"
            hits[0].command()
            await settle(app, pilot)
            assert "1   breakpoint keep y   attention@2" in console_log(app)
            hits = [h async for h in provider.search("stats")]
            template = next(h for h in hits if "stats BUFFER" in str(h.text))
            template.command()
            await settle(app, pilot)
            inp = app.focused
            assert inp.id == "console-input" and inp.value == "stats "
            assert inp.cursor_position == len("stats ")
            await pilot.press("x")
            assert inp.value == "stats x"
    run(go())


def test_goto_node_under_cursor():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            nodes = app.query_one(NodeList)
            nodes.focus()
            nodes.highlighted = nodes.index_of_node(app.model.node_index("gelu@1"))
            await press(app, pilot, "g")
            assert app.session.node.full_name == "gelu@1"
            nodes.highlighted = nodes.index_of_node(app.model.node_index("ln2@0"))
            await press(app, pilot, "g")  # backwards too
            assert app.session.node.full_name == "ln2@0"
    run(go())


def test_export_writes_the_report_where_asked_and_keeps_the_session(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    async def go():
        app = make_app(n=2)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            s = app.session
            await press(app, pilot, "t", "n", "n", "n", "n")
            before = (s.step, s.node_index, s.arena.copy())
            await press(app, pilot, "e")
            inp = app.screen.query_one("#prompt-input")
            # the default is under the user's state folder, never the current directory
            assert inp.value.startswith(str(tmp_path / "state" / "firscope" / "reports"))
            inp.value = str(tmp_path / "rep")
            await press(app, pilot, "enter")
            for name in ("report.html", "report.json", "trace.json"):
                assert (tmp_path / "rep" / name).exists(), name
            assert (s.step, s.node_index) == before[:2]
            assert np.array_equal(s.arena, before[2])  # the export did not disturb the session
            assert f"report written to {tmp_path / 'rep'}" in header(app)
    run(go())


def test_escape_during_export_leaves_no_files(tmp_path, monkeypatch):
    # Writing the files waits (up to 20 s) for the escape, so the report of two steps cannot
    # finish before the key arrives on a fast, idle machine; the cancel is the job's own.
    import time

    import firscope.profile.report as report_mod
    real_write = report_mod.write_report

    def write_after_escape(data, out, progress=None):
        for _ in range(2000):
            progress._check()  # raises Interrupted once escape set the job's cancel flag
            time.sleep(0.01)
        return real_write(data, out, progress=progress)
    monkeypatch.setattr(report_mod, "write_report", write_after_escape)

    async def go():
        app = make_app(n=2)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "e")
            app.screen.query_one("#prompt-input").value = str(tmp_path / "rep")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.probe.phase != "")  # the export is under way
            await pilot.press("escape")
            await settle(app, pilot)
            assert "interrupted" in header(app)
            assert list(tmp_path.iterdir()) == []  # no report folder, no staging folder
            assert app.session.node_index == 0
    run(go())


def test_watchpoint_stop_shows_one_location_everywhere():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            app.run_command("until ln1@0")
            app.run_command("watch x[0:4]")
            app.run_command("continue")
            await settle(app, pilot)
            s = app.session
            loc = s.location()
            snap = app.view.snapshot
            assert snap.reason == "watchpoint" and snap.location == loc
            where = loc.node + (f", line {loc.line}" if loc.in_kernel else "")
            assert f"stopped: watchpoint 1 at {where}" in header(app)
            src = app.query_one("#source")
            if loc.in_kernel:  # the source pane's pc is the instruction after the write
                assert f":{loc.line}" in src.border_title and f"pc {loc.pc}" in \
                    src.border_subtitle
            await press(app, pilot, "R")  # reverse-next reports where it really is
            assert app.view.snapshot.location == app.session.location()
            assert app.view.status == app.ci.status_line(app.view.snapshot)
            assert app.view.status in header(app)
    run(go())


def test_panes_show_the_last_stop_while_a_run_goes_on(tmp_path):
    """No pane reads the live session while the worker runs: moving the graph cursor or
    resizing during a run redraws the frozen stop, not the registers being changed."""
    fir = spinning_model(tmp_path, "addconst 21 21 1")

    async def go():
        app = make_app(fir)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            app.run_command("until ln1@0")
            app.run_command("stepi 4")  # inside the spin: R21 counts up as it runs
            await settle(app, pilot)
            regs = app.query_one("#right RegistersPane")
            before_regs = plain(regs.query_one(".regs"))
            before_src = app.query_one("#source").border_title
            await pilot.press("c")
            await wait_for(pilot, lambda: app.session.dispatch is not None
                           and float(app.session.dispatch.R[21, 0]) > 1000)
            nodes = app.query_one(NodeList)
            nodes.highlighted = nodes.index_of_node(app.session.node_index)
            await pilot.resize_terminal(130, 38)
            await pilot.pause()
            assert app.busy
            assert plain(regs.query_one(".regs")) == before_regs
            assert app.query_one("#source").border_title == before_src
            await pilot.press("escape")
            await settle(app, pilot)
            assert app.status_text.startswith("interrupted")
    run(go())
