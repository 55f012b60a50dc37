"""The UI never sends a control character from a file to the terminal (issue 10.6).

Rich and Textual pass ESC through (they strip only BEL, BS, VT, FF and CR), so
a kernel comment or a model folder named with an OSC sequence would set the
terminal's title or write its clipboard. What the terminal would receive is
the compositor's full update rendered with the app's console: the headless
driver of ``run_test`` writes nothing itself.
"""
from firscope.tui.app import FirscopeApp
from firscope.tui.source_pane import SourceLines
from tui_util import option_texts, plain, press, run, wait_loaded
from conftest import SEED_FIR, write_random_gpt2

TITLE = "\x1b]0;PWNED\x07"
CLIPBOARD = "\x1b]52;c;SGVsbG8=\x07"
CLEAR = "\x1b[2J"


def terminal_output(app) -> str:
    return app.screen._compositor.render_full_update().render_segments(app.console)


def test_escape_sequences_in_model_name_and_source_do_not_reach_the_terminal(tmp_path):
    text = SEED_FIR.read_text().replace("\nrtou 0 0\n", f"\nrtou 0 0  # {CLIPBOARD}{CLEAR}\n", 1)
    text = text.replace("model gpt2", f"model gpt2{TITLE}", 1)
    fir = write_random_gpt2(tmp_path / f"m{TITLE}", fir_text=text)

    async def go():
        app = FirscopeApp(fir, engine="interp", n=2, prompt_ids=[1])
        async with app.run_test(size=(160, 40)) as pilot:
            await wait_loaded(app, pilot)
            assert app.load_error is None
            await press(app, pilot, "f10", "n")  # into g2.add, whose first line has the comment
            assert app.session.node.full_name == "embeddings"
            out = terminal_output(app)
            for seq in (TITLE, CLIPBOARD, CLEAR, "\x1b]0;", "\x1b]52", "PWNED\x07"):
                assert seq not in out, repr(seq)
            # the user still sees what is in the file, escaped
            src = option_texts(app.query_one(SourceLines))
            assert any("# \\x1b]52;c;SGVsbG8=\\x07\\x1b[2J" in t for t in src), src
            status = plain(app.query_one("#status"))
            assert "m\\x1b]0;PWNED\\x07 · q4" in status, status
            assert "\\x1b]52;c;" in out and "m\\x1b]0;PWNED" in out
    run(go())


def test_text_no_pane_escaped_still_loses_its_control_characters():
    """The app's line filter is the last guard: a widget that shows raw file text (here a
    plain Static) sends no ESC or 8-bit CSI; the rest of its line keeps its place."""
    from textual.widgets import Static

    async def go():
        app = FirscopeApp(SEED_FIR, engine="interp", n=1, prompt_ids=[1])
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_loaded(app, pilot)
            raw = Static(f"left{TITLE}mid\x9b2Jright|", id="raw")
            await app.screen.mount(raw)
            await pilot.pause()
            out = terminal_output(app)
            assert "PWNED" in out and "\x1b]0;" not in out and "\x9b" not in out
            assert "left]0;PWNEDmid2Jright|" in out
    run(go())
