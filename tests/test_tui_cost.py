"""The Profile tab's GPU prediction (--device, key G) and the source pane's cost marks."""
from __future__ import annotations

from pathlib import Path

from conftest import SAMPLE
from firscope.tui.app import FirscopeApp
from firscope.tui.profile_view import ProfileView
from tui_util import plain, press, run, settle, wait_loaded


def test_profile_tab_predicts_beside_cpu_time():
    async def go():
        app = FirscopeApp(Path(SAMPLE / "gpt2.fir"), prompt_ids=[1, 2, 3], n=1,
                          device="mi300x", show_times=False)
        async with app.run_test(size=(140, 40)) as pilot:
            await wait_loaded(app, pilot)
            pv = app.query_one(ProfileView)
            assert pv.cost is None  # nothing is analysed before it is asked for
            await press(app, pilot, "t")  # a whole token
            assert pv.cost is None  # the Profile tab is not showing: no analysis
            await press(app, pilot, "3")
            await settle(app, pilot)
            cost = pv.cost
            assert cost is not None and cost.device.key == "mi300x"
            from firscope.cost import current_step
            assert (cost.position, cost.token) == current_step(app.session.machine)
            text = plain(app.query_one("#prof-time"))
            assert "GPU prediction on AMD Instinct MI300X" in text
            assert "GPU us" in text and "bound" in text
            await press(app, pilot, "t")
            await settle(app, pilot)
            assert pv.cost is not cost and pv.cost.position == cost.position + 1  # kept current
    run(go())


def test_key_g_without_device_uses_the_default():
    async def go():
        app = FirscopeApp(Path(SAMPLE / "gpt2.fir"), prompt_ids=[1, 2], n=1, show_times=False)
        async with app.run_test(size=(140, 40)) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "t", "G")
            await settle(app, pilot)
            pv = app.query_one(ProfileView)
            assert pv.cost is not None and pv.cost.device.key == "h200"
    run(go())
