"""``firscope ui --corpus``: the sensitivity sweep runs in its own process while the user
steps, and its ranking shows in the Profile tab."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from conftest import REPO, SAMPLE
from firscope.tui.app import FirscopeApp
from firscope.tui.profile_view import ProfileView
from tui_util import plain, press, run, screen_text, settle, wait_loaded

CORPUS = REPO / "tests" / "data" / "corpus_json_decoder.txt"


async def wait_corpus(app, pilot, timeout=180.0) -> None:
    pv = app.query_one(ProfileView)
    end = time.monotonic() + timeout
    while pv.corpus[0] is None and "in the background" in (pv.corpus[1] or ""):
        assert time.monotonic() < end, "the sweep did not finish"
        await asyncio.sleep(0.2)
        await pilot.pause()


def test_corpus_ranking_shows_in_the_profile_tab_while_stepping_goes_on(monkeypatch):
    shown: list[str] = []  # every note the Profile tab was given, in order
    real = ProfileView.set_corpus

    def spy(self, doc, note):
        shown.append(note or "")
        real(self, doc, note)

    monkeypatch.setattr(ProfileView, "set_corpus", spy)

    async def go():
        app = FirscopeApp(Path(SAMPLE / "gpt2.fir"), prompt_ids=[1, 2, 3], n=2,
                          show_times=False, corpus=str(CORPUS), corpus_ctx=32,
                          corpus_chunks=1)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_loaded(app, pilot)
            pv = app.query_one(ProfileView)
            # on a fast machine the sweep may be done before the load settles: what the
            # tab said while it ran is what the user saw
            assert shown and "in the background" in shown[0]
            await press(app, pilot, "t")  # stepping is not held up by the sweep
            assert app.session.machine.position >= 1
            await wait_corpus(app, pilot)
            doc, _ = pv.corpus
            assert doc is not None and len(doc["weights"]) == 16
            await press(app, pilot, "3")  # the Profile tab
            await settle(app, pilot)
            text = plain(app.query_one("#prof-corpus"))
            assert "weights by KLD alone" in text and "KLD alone summed per layer" in text
            top = doc["weights"][0]["name"]
            assert top in text and "layer   0" in text
            assert "corpus" in screen_text(app)
    run(go())


def test_a_corpus_that_fails_says_why_and_the_ui_stays():
    async def go():
        app = FirscopeApp(Path(SAMPLE / "gpt2.fir"), prompt_ids=[1], n=1, show_times=False,
                          corpus=str(CORPUS), corpus_ctx=999)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_loaded(app, pilot)
            await wait_corpus(app, pilot)
            pv = app.query_one(ProfileView)
            assert pv.corpus[0] is None and "above the model's n_positions 256" in pv.corpus[1]
            await press(app, pilot, "t")
            assert app.session.machine.position >= 1
    run(go())
