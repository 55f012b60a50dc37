"""SVG snapshots of the UI with fixed inputs (pytest-textual-snapshot), times shown.

Node times are shown, from a deterministic function of which nodes have run
(``time_of``), so the pictures are stable and still catch a time that wraps
onto its own line. Update after an intended UI change with:
pytest tests/test_tui_snapshots.py --snapshot-update
"""

import pytest

from firscope.tui.app import FirscopeApp
from tui_util import press, settle, wait_loaded
from conftest import SAMPLE

pytest.importorskip("pytest_textual_snapshot")


def fixed_times(times):
    """A made-up but plausible time per node that ran: µs for most, ms for a few."""
    return {i: (7 + (i * 37) % 90) * 1e-5 * (30 if i % 11 == 0 else 1) for i in times}


def app():
    return FirscopeApp(SAMPLE / "gpt2.fir", prompt_text="def ", n=4, engine="interp",
                       show_times=False, time_of=fixed_times)


async def stopped_in_attention(a, pilot):
    await wait_loaded(a, pilot)
    a.run_command("break g2.attn_decode:156")
    await settle(a, pilot)
    await press(a, pilot, "t", "c", "s", "s")


@pytest.mark.parametrize("size", [(80, 24), (120, 36), (200, 50)])
def test_snapshot_stopped_in_attention_kernel(snap_compare, size):
    a = app()

    async def run_before(pilot):
        await stopped_in_attention(a, pilot)

    assert snap_compare(a, terminal_size=size, run_before=run_before)


def test_snapshot_buffers_q4_weight(snap_compare):
    a = app()

    async def run_before(pilot):
        await wait_loaded(a, pilot)
        await press(a, pilot, "n", "n", "n", "n")
        a.query_one("#buffers-view").show_name("fcw@1")
        await settle(a, pilot)

    assert snap_compare(a, terminal_size=(120, 36), run_before=run_before)


def test_snapshot_help(snap_compare):
    a = app()

    async def run_before(pilot):
        await wait_loaded(a, pilot)
        await press(a, pilot, "question_mark")

    assert snap_compare(a, terminal_size=(120, 36), run_before=run_before)
