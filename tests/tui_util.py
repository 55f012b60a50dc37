"""Helpers for driving the Textual app in tests: wait on workers and messages, not on time."""
from __future__ import annotations

import asyncio
import io

from rich.console import Console

from firscope.tui.app import FirscopeApp


def _quick_idle() -> None:
    """Textual's pilot waits, after every key it presses and in every ``pause()``, until a
    window of ``SLEEP_GRANULARITY`` (20 ms) passes in which the process used under a
    twentieth of it in CPU: two such windows a key, and two more in each :func:`settle`,
    were a third of the pilot tests' time (the rest of the suite waiting on them). These
    tests wait on what they need explicitly (workers, the app's jobs and queued messages:
    :func:`settle`), so the window only has to outlast a frame: 5 ms, above the 1/240 s
    between the frames firscope asks Textual for (firscope/tui sets TEXTUAL_FPS), with the
    same one-twentieth rule. The pilot tests took 215 s -> 140 s of one worker."""
    import textual._wait as wait
    wait.SLEEP_GRANULARITY = 1 / 200
    wait.SLEEP_IDLE = wait.SLEEP_GRANULARITY / 20


_quick_idle()


def plain(widget) -> str:
    """What a Static shows (or a Rich renderable), as plain text."""
    content = widget.content if hasattr(widget, "content") else widget
    if hasattr(content, "plain"):
        return content.plain
    out = io.StringIO()
    Console(file=out, width=200, height=500, color_system=None, force_terminal=False,
            legacy_windows=False).print(content)
    return out.getvalue()


def option_texts(option_list) -> list[str]:
    return [option_list.get_option_at_index(i).prompt.plain
            for i in range(option_list.option_count)]


async def settle(app: FirscopeApp, pilot, rounds: int = 10_000) -> None:
    """Until no worker runs and no job is queued: each round waits for the workers to
    complete, then lets the app handle the messages they posted (which may start more)."""
    for _ in range(rounds):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not app.workers._workers and not app.busy and not app.pending:
            await pilot.pause()
            return
    raise AssertionError("the app kept starting work")


async def wait_loaded(app: FirscopeApp, pilot) -> None:
    await settle(app, pilot)
    assert app.session is not None or app.load_error is not None, "the app did not load"


wait_idle = settle


async def press(app, pilot, *keys: str) -> None:
    for k in keys:
        await pilot.press(k)
        await settle(app, pilot)


def screen_text(app) -> str:
    """The whole screen as plain text, one line per row (what a user sees)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in strip) for strip in strips)


def run(coro):
    return asyncio.run(coro)
