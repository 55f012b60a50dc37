"""The UI offers ``save breakpoints FILE`` at quit (q, then s) and notes it at F2 (issue 26,
item 17): the file is written through the command interpreter, so ``source FILE`` reads it
back and a failed write is reported like any command's error, with the app still running."""
import pytest

from firscope.tui.screens import PromptScreen, QuitScreen
from test_tui import SIZE, SIZES, console_log, copy_sample, make_app
from tui_util import press, run, screen_text, settle, wait_loaded

OFFER = "s: save breakpoints first"


async def _with_breakpoints(app, pilot):
    await wait_loaded(app, pilot)
    for line in ("break gelu@1 if max(abs(x)) > 0", "watch x[0:4]", "display max(abs(x))",
                 "dprintf ln2@0 \"x0={x[0]}\""):
        app.run_command(line)
    await settle(app, pilot)


async def _answer(app, pilot, value: str | None) -> None:
    assert isinstance(app.screen, PromptScreen), type(app.screen)
    if value is not None:
        app.screen.query_one("#prompt-input").value = value
    await press(app, pilot, "enter")


@pytest.mark.parametrize("size", SIZES)
def test_quit_offers_to_save_and_writes_a_file_source_reads_back(tmp_path, size):
    out = tmp_path / "bp.gdb"

    async def go():
        app = make_app()
        async with app.run_test(size=size) as pilot:
            await _with_breakpoints(app, pilot)
            await press(app, pilot, "q")
            assert isinstance(app.screen, QuitScreen) and OFFER in screen_text(app)
            await press(app, pilot, "s")
            await _answer(app, pilot, str(out))
        assert app.return_code == 0 and not app.is_running
    run(go())
    text = out.read_text()
    assert "break gelu@1 if max(abs(x)) > 0" in text and "watch x[0:4]" in text
    assert 'dprintf ln2@0 "x0={x[0]}"' in text and "display max(abs(x))" in text

    async def back():  # a new session reads the file back
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            app.run_command(f"source {out}")
            await settle(app, pilot)
            assert [bp.spec for bp in app.session.breakpoints] == ["gelu@1", "x[0:4]", "ln2@0"]
            assert [d.text for d in app.ci.displays.values()] == ["max(abs(x))"]
    run(back())


def test_the_offered_file_is_under_the_state_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await _with_breakpoints(app, pilot)
            await press(app, pilot, "q", "s")
            await _answer(app, pilot, None)  # the default, in a folder not made yet
        assert not app.is_running
    run(go())
    saved = tmp_path / "state" / "firscope" / "breakpoints" / "tiny-gpt2.gdb"
    assert "watch x[0:4]" in saved.read_text()


def test_a_failed_save_is_an_error_and_the_app_stays(tmp_path):
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await _with_breakpoints(app, pilot)
            await press(app, pilot, "q", "s")
            await _answer(app, pilot, str(tmp_path / "no" / "such" / "dir" / "bp.gdb"))
            assert app.is_running and app.session is not None
            assert not isinstance(app.screen, (QuitScreen, PromptScreen))
            assert "error: " in console_log(app) and "cannot write the breakpoints" in \
                console_log(app)
            assert len(app.session.breakpoints) == 3  # nothing lost
            # escape at the file prompt stays too
            await press(app, pilot, "q", "s", "escape")
            assert app.is_running
    run(go())


def test_no_offer_without_breakpoints():
    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "q")
            assert isinstance(app.screen, QuitScreen) and OFFER not in screen_text(app)
            await press(app, pilot, "s")  # not offered: does nothing
            assert isinstance(app.screen, QuitScreen)
            await press(app, pilot, "q")
        assert app.return_code == 0
    run(go())


def test_f2_notes_how_to_keep_breakpoints(tmp_path):
    fir = copy_sample(tmp_path)

    async def go():
        app = make_app(fir)
        async with app.run_test(size=SIZE) as pilot:
            await _with_breakpoints(app, pilot)
            assert "save breakpoints FILE" not in console_log(app)
            await press(app, pilot, "f2")
            assert "save breakpoints FILE (then source FILE)" in console_log(app)
    run(go())
