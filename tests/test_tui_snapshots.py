"""A few SVG snapshots of the UI with fixed inputs (pytest-textual-snapshot).

Wall-clock times are hidden (show_times=False) so the pictures are stable.
Update after an intended UI change with: pytest tests/test_tui_snapshots.py --snapshot-update
"""

import pytest

from firscope.tui.app import FirscopeApp
from tui_util import press, wait_loaded
from conftest import SAMPLE

pytest.importorskip("pytest_textual_snapshot")


def app():
    return FirscopeApp(SAMPLE / "gpt2.fir", prompt_text="def ", n=4, engine="interp",
                       show_times=False)


def test_snapshot_stopped_in_attention_kernel(snap_compare):
    a = app()

    async def run_before(pilot):
        await wait_loaded(a, pilot)
        a.session.add_breakpoint("g2.attn_decode:156")
        await press(a, pilot, "t", "c", "s", "s")

    assert snap_compare(a, terminal_size=(120, 36), run_before=run_before)


def test_snapshot_buffers_q4_weight(snap_compare):
    a = app()

    async def run_before(pilot):
        await wait_loaded(a, pilot)
        await press(a, pilot, "n", "n", "n", "n")
        a.action_tab("buffers")
        a.query_one("#buffers-view").show_name("fcw@1")
        await pilot.pause(0.1)

    assert snap_compare(a, terminal_size=(120, 36), run_before=run_before)


def test_snapshot_help(snap_compare):
    a = app()

    async def run_before(pilot):
        await wait_loaded(a, pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.1)

    assert snap_compare(a, terminal_size=(120, 36), run_before=run_before)
