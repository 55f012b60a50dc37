"""A newcomer's third round (issue 40): each item's reproducer, as the user met it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from textual import events

from firscope.tui.app import FirscopeApp
from tui_util import plain, press, run, screen_text, settle, wait_loaded
from conftest import SAMPLE

SIZES = [(80, 24), (120, 36)]


def make_app(path=None, **kw):
    kw.setdefault("engine", "interp")
    kw.setdefault("n", 4)
    kw.setdefault("prompt_text", "def ")
    return FirscopeApp(Path(path or SAMPLE / "gpt2.fir"), **kw)


def burst(app, *keys: str) -> None:
    """Keys as a fast typist sends them: all queued at once, none waiting for the screen."""
    for key in keys:
        char = {"space": " "}.get(key, key if len(key) == 1 else None)
        ev = events.Key(key, char)
        ev.set_sender(app)
        app._driver.send_message(ev)


# -- 2, 7: boxes replace their value, and keys typed before they open are not lost -------------
@pytest.mark.parametrize("size", SIZES)
def test_typing_in_a_box_replaces_its_value_and_keys_are_not_lost(size):
    async def go():
        app = make_app()
        async with app.run_test(size=size) as pilot:
            await wait_loaded(app, pilot)
            app.run_command("until attention@0")
            await settle(app, pilot)
            await press(app, pilot, "s", "s")
            # the lane box, pre-filled with 0: typing 2 gives lane 2, not 02 or 12
            await press(app, pilot, "l", "2", "enter")
            assert app.ci.lane == 2
            assert "lane 2" in app.query_one("#right RegistersPane").border_title
            # a burst: l, 3, enter queued before the box exists
            burst(app, "l", "3", "enter")
            await settle(app, pilot)
            assert app.ci.lane == 3, screen_text(app)
            assert app.query_one("#bottom").active == "buffers"  # '3' opened no tab
            # the old value is shown as a hint while the box is open
            await press(app, pilot, "l")
            hint = plain(app.screen.query_one("#prompt-hint"))
            assert "now 3" in hint
            await press(app, pilot, "escape")
            # keys right after 4 (the console) reach the console, not the bindings
            burst(app, "4", "p", "r", "i", "n", "t", "space", "1", "enter")
            await settle(app, pilot)
            log = "\n".join(app.query_one("#console-view").history)
            assert "$ = 1" in log, log[-500:]
    run(go())
