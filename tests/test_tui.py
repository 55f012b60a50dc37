"""Pilot-driven tests: press keys, check the engine state and what the widgets show."""
from pathlib import Path

import numpy as np

from firscope.debug.breakpoints import LineBreakpoint
from firscope.tui.app import FirscopeApp
from firscope.tui.graph_pane import NodeList
from firscope.tui.source_pane import SourceLines
from tui_util import option_texts, plain, press, run, wait_idle, wait_loaded
from conftest import SAMPLE, SEED_FIR

SIZE = (120, 36)


def make_app(path=None, **kw):
    kw.setdefault("engine", "interp")
    kw.setdefault("n", 4)
    kw.setdefault("prompt_text", "def ")
    return FirscopeApp(Path(path or SAMPLE / "gpt2.fir"), **kw)


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
            status = plain(app.query_one("#status"))
            assert "tiny-gpt2 · q4 · token 1/7" in status and "'d' pos 0" in status
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
            regs = app.query_one("#registers")
            assert "lane 0 of 128" in regs.border_title
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
            assert "token 2/7" in plain(app.query_one("#status"))
    run(go())


def test_breakpoint_key_on_graph_and_on_kernel_line_then_continue():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            s = app.session
            nodes = app.query_one(NodeList)
            nodes.focus()
            # move the cursor to attention@1 and toggle a breakpoint with F9
            target = nodes.index_of_node(s.model.node_index("attention@1"))
            nodes.highlighted = target
            await press(app, pilot, "f9")
            assert [bp.spec for bp in s.breakpoints] == ["attention@1"]
            assert option_texts(nodes)[target].startswith("●")
            await press(app, pilot, "f5")
            assert s.node.full_name == "attention@1" and s.step == 0
            assert "stopped: breakpoint 1" in plain(app.query_one("#status"))
            # toggle it off again with b
            nodes.highlighted = nodes.index_of_node(s.node_index)
            await press(app, pilot, "b")
            assert not s.breakpoints
            # a kernel line breakpoint from the source pane
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
    run(go())


def test_lane_choice_and_registers_across_lanes():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            s = app.session
            s.until("attention@0")
            app.refresh_views()
            await press(app, pilot, "s", "s")
            await pilot.press("l")
            await pilot.pause(0.1)
            for ch in "\b\b3":
                await pilot.press("backspace" if ch == "\b" else ch)
            await pilot.press("enter")
            await pilot.pause(0.1)
            assert app.ci.lane == 3
            regs = app.query_one("#registers")
            assert "lane 3 of 4" in regs.border_title
            text = plain(app.query_one("#lanes"))
            assert "U1 over lanes" in text and "mask 4/4" in text
            # U1 = lane * headdim (32 for the sample) for every lane
            for lane in range(4):
                assert f" {lane}" in text and str(lane * 32) in text
    run(go())


def test_buffers_tab_shows_values_stats_and_q4_detail():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "n", "n", "n")
            app.action_tab("buffers")
            view = app.query_one("#buffers-view")
            view.show_name("x")
            await pilot.pause(0.05)
            x = app.session.buffer_value("x")
            stats = plain(app.query_one("#buf-stats"))
            assert "shape [128]" in stats and f"max {x.max():.6g}" in stats
            values = plain(app.query_one("#buf-values"))
            assert f"{float(x[0]):.5g}" in values
            view.show_name("qkvw@0")
            await pilot.pause(0.05)
            q4 = plain(app.query_one("#buf-q4"))
            assert "group 32" in q4 and "rmse" in q4 and "scale" in q4
            view.show_name("nope")
            await pilot.pause(0.05)
            assert "no buffer, weight or register named 'nope'" in plain(app.query_one("#buf-stats"))
    run(go())


def test_attention_heatmap_after_attention_ran():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "t", "t")  # two tokens done
            app.action_tab("attention")
            await pilot.pause(0.05)
            body = plain(app.query_one("#att-body"))
            assert "scores · layer" in body and "head 3" in body
            rec = app.recorder
            rows = rec.maps[(1, 0)]
            assert rows.shape == (4, 2)
            assert np.allclose(rows.sum(axis=1), 1, atol=1e-5)
    run(go())


def test_console_commands_and_errors_keep_the_session():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            app.run_command("break ln2@1")
            app.run_command("continue")
            await wait_idle(app, pilot)
            assert app.session.node.full_name == "ln2@1"
            app.run_command("bogus command")
            app.run_command("print max(abs(x))")
            await pilot.pause(0.05)
            log = "\n".join(app.query_one("#console-view").history)
            assert "unknown command 'bogus'" in log and "$ = " in log
            assert app.session.node.full_name == "ln2@1"
    run(go())


def test_broken_model_file_shows_error_and_app_survives(tmp_path):
    import shutil
    folder = tmp_path / "broken"
    shutil.copytree(SAMPLE, folder)
    fir = folder / "gpt2.fir"
    fir.write_text(SEED_FIR.read_text().replace("add 1 1 2", "add 1 1 99", 1))

    async def go():
        app = make_app(fir)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            assert app.session is None and app.load_error is not None
            err = plain(app.query_one("#load-error"))
            assert "register R99 is outside 0..31" in err and f"{fir}:" in err
            # fix the file and reload with F2
            fir.write_text(SEED_FIR.read_text())
            await pilot.press("f2")
            await wait_loaded(app, pilot)
            assert app.session is not None
    run(go())


def test_runtime_fault_is_shown_and_session_survives(tmp_path):
    import shutil
    folder = tmp_path / "oob"
    shutil.copytree(SAMPLE, folder)
    fir = folder / "gpt2.fir"
    fir.write_text(SEED_FIR.read_text().replace("uloadf32 2 0 @in1\nadd 1 1 2",
                                                "uaddk 5 0 1\nuloadf32 2 5 @in1\nadd 1 1 2"))

    async def go():
        app = make_app(fir)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "c")
            assert app.status_text.startswith("fault at embeddings")
            assert app.session.dispatch is not None  # stopped on the faulting instruction
            d = app.session.dispatch
            assert d.ops[d.pc].text == "uloadf32 2 5 @in1"
            await press(app, pilot, "r")  # and can step back
            assert app.session.dispatch.pc == 2
    run(go())


def test_interrupt_key_stops_a_long_run(tmp_path):
    import shutil
    folder = tmp_path / "slow"
    shutil.copytree(SAMPLE, folder)
    fir = folder / "gpt2.fir"
    # a layernorm that first spins a billion times: far too long to wait for
    fir.write_text(SEED_FIR.read_text().replace(
        "loadconstf32 15 in0.size", "loadconstf32 20 1000000000\nforbegin 20\nadd 21 21 21\n"
        "forend\nloadconstf32 15 in0.size", 1))

    async def go():
        app = make_app(fir)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await pilot.press("c")
            await pilot.pause(0.5)
            assert app.busy
            await pilot.press("escape")
            await wait_idle(app, pilot, timeout=30)
            assert app.status_text.startswith("interrupted"), app.status_text
            s = app.session
            assert s.node.full_name == "ln1@0" and s.dispatch is None  # the node was undone
            log = "\n".join(app.query_one("#console-view").history)
            assert "g2.layernorm" in log and ("line 85" in log or "line 86" in log)  # in the spin
    run(go())


def test_help_screen_lists_keys():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await pilot.press("question_mark")
            await pilot.pause(0.1)
            from firscope.tui.screens import HelpScreen
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            await pilot.pause(0.1)
            assert not isinstance(app.screen, HelpScreen)
    run(go())


def test_keys_typed_while_running_are_queued_and_palette_offers_commands():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            for _ in range(5):
                await pilot.press("f10")
            await wait_idle(app, pilot)
            for _ in range(50):
                if not app.pending and not app.busy:
                    break
                await pilot.pause(0.05)
            assert app.session.node.full_name == "qkv_bias@0"  # all five nodes ran, in order
            from firscope.tui.palette import DebuggerCommands
            provider = DebuggerCommands(app.screen)
            hits = [h async for h in provider.search("break attention@2")]
            assert hits and hits[0].text == "run: break attention@2"
            hits[0].command()
            await pilot.pause(0.05)
            assert [bp.spec for bp in app.session.breakpoints] == ["attention@2"]
    run(go())


def test_goto_node_under_cursor():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            nodes = app.query_one(NodeList)
            nodes.focus()
            nodes.highlighted = nodes.index_of_node(app.session.model.node_index("gelu@1"))
            await press(app, pilot, "g")
            assert app.session.node.full_name == "gelu@1"
            nodes.highlighted = nodes.index_of_node(app.session.model.node_index("ln2@0"))
            await press(app, pilot, "g")  # backwards too
            assert app.session.node.full_name == "ln2@0"
    run(go())


def test_export_key_writes_the_report_and_keeps_the_session(tmp_path):
    async def go():
        app = make_app(n=2)
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            s = app.session
            assert s is not None, app.load_error
            await press(app, pilot, "t", "n", "n", "n", "n")
            before = (s.step, s.node_index, s.arena.copy())
            await pilot.press("e")
            await pilot.pause(0.1)
            inp = app.screen.query_one("#prompt-input")
            inp.value = str(tmp_path / "rep")
            await pilot.press("enter")
            await wait_idle(app, pilot, timeout=120)
            for name in ("report.html", "report.json", "trace.json"):
                assert (tmp_path / "rep" / name).exists(), name
            assert (s.step, s.node_index) == before[:2]
            assert np.array_equal(s.arena, before[2])  # the export did not disturb the session
            assert "report written to" in app.status_text + "\n".join(
                app.query_one("#console-view").history)
    run(go())
