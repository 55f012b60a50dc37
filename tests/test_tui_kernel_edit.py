"""Key E: a kernel edited in the app, assembled and replayed on the current node's inputs,
applied to the session, reverted; errors shown at their line and nothing typed lost."""
from __future__ import annotations

from pathlib import Path

from conftest import SAMPLE
from firscope.tui.app import FirscopeApp
from firscope.tui.kernel_editor import KernelEditScreen
from textual.widgets import Static, TextArea
from tui_util import plain, press, run, screen_text, settle, wait_loaded


def swapped(text: str) -> str:
    """The layernorm with its gamma and beta loads swapped: other order, same bits."""
    a, b = "uloadf32 4 0 @in1", "uloadf32 5 0 @in2"
    return text.replace(a, "@@").replace(b, a).replace("@@", b)


def test_edit_replay_apply_revert_in_the_app():
    async def go():
        app = FirscopeApp(Path(SAMPLE / "gpt2.fir"), prompt_ids=[3, 1, 4], n=1,
                          show_times=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_loaded(app, pilot)
            app.run_command("goto ln1@0")
            await settle(app, pilot)
            await press(app, pilot, "E")
            screen = app.screen
            assert isinstance(screen, KernelEditScreen) and screen.kernel == "g2.layernorm"
            area = screen.query_one(TextArea)
            assert area.line_number_start == 82 and area.text.startswith("kernel g2.layernorm")
            original = area.text
            result = screen.query_one("#edit-result", Static)

            area.text = swapped(original)
            await press(app, pilot, "ctrl+s")
            assert "ln1@0 (g2.layernorm): identical" in plain(result)
            assert "predicted on" in plain(result)

            await press(app, pilot, "ctrl+g")  # every node that runs it, tokens so far
            text = plain(result)
            assert "ln2@3 (g2.layernorm): identical" in text and "final_norm" in text

            bug = original.replace("add 2 2 5", "sub 2 2 5")
            area.text = bug
            await press(app, pilot, "ctrl+s")
            text = plain(result)
            line = 82 + bug.split("\n").index("ustoref32 2 0 @out0")
            assert "DIFFERS" in text and f"stored by lane 0 at gpt2.fir (draft):{line}" in text

            area.text = original.replace("mul 2 2 3", "mul 2 2 33")
            await press(app, pilot, "ctrl+s")
            assert "line 110, column 9: register R33 is outside 0..31" in plain(result)
            assert area.cursor_location == (110 - 82, 8)  # moved to the error
            assert "mul 2 2 33" in area.text  # nothing lost
            await press(app, pilot, "ctrl+t")  # the text changed since the last good check
            assert "assemble it first" in plain(result)

            area.text = swapped(original)
            await press(app, pilot, "ctrl+s", "ctrl+t")
            assert app.session.model.edited == ("g2.layernorm",)
            await press(app, pilot, "escape")
            await settle(app, pilot)
            assert "edited: g2.layernorm" in screen_text(app)
            await press(app, pilot, "n")  # the edited kernel runs ln1@0
            assert app.session.node.full_name == "qkv_linear@0"
            app.run_command("goto ln2@0")  # another node that runs it
            await settle(app, pilot)
            await press(app, pilot, "E")  # the applied text comes back (a draft was kept)
            assert app.screen.query_one(TextArea).text == swapped(original)
            await press(app, pilot, "ctrl+r")
            assert app.session.model.edited == ()
            await press(app, pilot, "escape")
    run(go())


def test_ab_toggle_and_the_users_own_editor(tmp_path, monkeypatch):
    """ctrl+b runs the model's own code while the edit is kept (the header says so);
    ctrl+e hands the draft to $EDITOR and checks what it saved."""
    import contextlib
    editor = tmp_path / "ed.sh"  # an 'editor' that swaps the gamma and beta loads
    editor.write_text("#!/bin/sh\nsed -i -e 's/^uloadf32 4 0 @in1$/@@/' "
                      "-e 's/^uloadf32 5 0 @in2$/uloadf32 4 0 @in1/' "
                      "-e 's/^@@$/uloadf32 5 0 @in2/' \"$1\"\n")
    editor.chmod(0o755)
    monkeypatch.setenv("EDITOR", str(editor))
    monkeypatch.delenv("VISUAL", raising=False)

    async def go():
        app = FirscopeApp(Path(SAMPLE / "gpt2.fir"), prompt_ids=[3, 1, 4], n=1,
                          show_times=False)
        async with app.run_test(size=(120, 36)) as pilot:
            monkeypatch.setattr(app, "suspend", contextlib.nullcontext)  # headless: no tty
            await wait_loaded(app, pilot)
            app.run_command("goto ln1@0")
            await settle(app, pilot)
            await press(app, pilot, "E")
            screen = app.screen
            area = screen.query_one(TextArea)
            original = area.text
            result = screen.query_one("#edit-result", Static)
            await press(app, pilot, "ctrl+e")
            await settle(app, pilot)
            assert area.text == swapped(original)  # what the editor saved came back
            assert "ln1@0 (g2.layernorm): identical" in plain(result)  # and was checked
            await press(app, pilot, "ctrl+t")
            await press(app, pilot, "ctrl+b")
            assert "g2.layernorm: the model's own code runs" in plain(result)
            assert app.session.model.edited == ()  # A: the model's own code
            await press(app, pilot, "escape")
            await settle(app, pilot)
            assert "edited: g2.layernorm (edit 1 off)" in screen_text(app)
            await press(app, pilot, "E", "ctrl+b")
            assert app.session.model.edited == ("g2.layernorm",)  # B again
            result = app.screen.query_one("#edit-result", Static)
            assert "g2.layernorm: edit 1 (" in plain(result)
            monkeypatch.setenv("EDITOR", "/nonexistent/editor")
            await press(app, pilot, "ctrl+e")
            assert "cannot run $EDITOR" in plain(result)
            assert app.screen.query_one(TextArea).text == swapped(original)  # kept
            await press(app, pilot, "escape")
    run(go())
