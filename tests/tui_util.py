"""Helpers for driving the Textual app in tests."""
from __future__ import annotations

import asyncio

from rich.console import Console

from firscope.tui.app import FirscopeApp


def plain(widget) -> str:
    """What a Static shows, as plain text."""
    content = widget.content
    if hasattr(content, "plain"):
        return content.plain
    console = Console(width=200, record=True, color_system=None)
    console.print(content)
    return console.export_text()


def option_texts(option_list) -> list[str]:
    return [option_list.get_option_at_index(i).prompt.plain
            for i in range(option_list.option_count)]


async def wait_loaded(app: FirscopeApp, pilot, timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.05)):
        await pilot.pause(0.05)
        if app.session is not None or app.load_error is not None:
            return
    raise AssertionError("the app did not finish loading")


async def wait_idle(app: FirscopeApp, pilot, timeout: float = 60.0) -> None:
    await pilot.pause(0.02)
    for _ in range(int(timeout / 0.02)):
        if not app.busy:
            await pilot.pause(0.02)
            return
        await pilot.pause(0.02)
    raise AssertionError("the engine did not stop")


async def press(app, pilot, *keys: str) -> None:
    for k in keys:
        await pilot.press(k)
        await wait_idle(app, pilot)


def run(coro):
    return asyncio.run(coro)
