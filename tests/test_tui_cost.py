"""The Profile tab's GPU prediction (--device, key G) and the source pane's cost marks."""
from __future__ import annotations

from pathlib import Path

from conftest import SAMPLE
from firscope.tui.app import FirscopeApp
from firscope.tui.profile_view import ProfileView
from firscope.tui.source_pane import LOW_SIMD_MARK, SourcePane, cost_marks
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
            assert "GPU µs/call" in text and "bound" in text
            # occupancy per kernel and the advice that would save the most, with its price
            assert "GPU occupancy per kernel" in text and "limiter" in text
            assert "g2.layernorm" in text and "threadgroups" in text
            assert "advice, ranked by the time it saves per token" in text and " us" in text
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
            # every sample kernel has tg=1: one lane per warp, so every line is marked
            # low-SIMD; none reads with a stride, so none is marked uncoalesced
            marks = app.query_one(SourcePane).cost_marks
            assert set(marks) == {"g2.add", "g2.gelu_new", "g2.layernorm", "g2.attn_decode"}
            assert set().union(*(m.values() for m in marks.values())) == {LOW_SIMD_MARK}
    run(go())


def test_source_rows_mark_uncoalesced_lines():
    """A kernel that reads with a stride gets the uncoalesced mark on that line only."""
    from firscope.cost import find_device
    from firscope.cost.analyze import analyse_step
    from firscope.tui.source_pane import UNCOALESCED_MARK
    from firscope.runtime import load_model
    from conftest import SEED_FIR
    import tempfile, shutil
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for f in SAMPLE.iterdir():
            if f.is_file():
                shutil.copy(f, folder / f.name)
        text = SEED_FIR.read_text().replace(
            "kernel g2.add in=2 out=1 size=in0,in1,out0 threads=out0.size tg=1 tgbytes=16\n"
            "rtou 0 0\nuloadf32 1 0 @in0\n",
            "kernel g2.add in=2 out=1 size=in0,in1,out0 threads=out0.size/8 tg=64 tgbytes=16\n"
            "rtou 0 0\numulk 5 0 8\nuloadf32 1 5 @in0\n")
        (folder / "gpt2.fir").write_text(text)
        model = load_model(folder / "gpt2.fir")
        report = analyse_step(model, find_device("h200"), position=0, token=1)
        marks = cost_marks(report)["g2.add"]
        line = next(i + 1 for i, t in enumerate(text.split("\n")) if t == "uloadf32 1 5 @in0")
        assert marks.get(line) == UNCOALESCED_MARK
        assert list(marks.values()).count(UNCOALESCED_MARK) == 1
        add = report.by_kernel()["g2.add"]
        read = next(ln for ln in add["lines"] if ln["line"] == line)
        # 16 lanes (a 128-element add) in one warp, 32 bytes apart: a sector each
        assert read["sectors_per_request"] >= 16 and read["coalescing_efficiency"] <= 2 / 16


def test_export_with_a_device_has_the_gpu_section(tmp_path):
    import json
    import threading
    from firscope.debug.session import Session
    from firscope.runtime.opening import open_model
    from firscope.tui.jobs import JobProgress, Probe, export_session
    s = Session(open_model(None), [1, 2], 1, engine="interp")
    done = export_session(s, None, tmp_path / "rep", JobProgress(Probe(), threading.Event()),
                          "a100")
    assert "gpu_nodes.csv" in done.files
    gpu = json.loads((tmp_path / "rep" / "report.json").read_text())["gpu"]
    assert gpu["device"]["key"] == "a100" and gpu["position"] == 1


def test_source_gutter_heat_and_the_help_legend_at_80_columns():
    """Key G gives the source pane each line's share of its kernel's predicted time: a heat
    cell in the gutter that fits 80 columns; the help screen explains every gutter mark."""
    from firscope.tui.keys import GUTTER
    from firscope.tui.screens import help_table
    from firscope.tui.source_pane import HEAT_MARKS, SourceLines

    async def go():
        app = FirscopeApp(Path(SAMPLE / "gpt2.fir"), prompt_ids=[1, 2], n=1, show_times=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "t", "G")
            await settle(app, pilot)
            pane = app.query_one(SourcePane)
            lines = pane.cost_lines
            assert set(lines) == {"g2.add", "g2.gelu_new", "g2.layernorm", "g2.attn_decode"}
            model = app.session.model
            ln = next(n for n in model.nodes if n.full_name == "ln1@0")
            pane.show(pane.model, pane.view, ln.index)  # as the graph cursor on ln1@0 does
            await settle(app, pilot)
            shares = lines["g2.layernorm"]
            assert sum(lc.time_share for lc in shares.values()) <= 1.0
            top = max(shares, key=lambda ln: shares[ln].time_share)
            options = app.query_one(SourceLines)
            rows = {int(options.get_option_at_index(i).id):
                    plain(options.get_option_at_index(i).prompt)
                    for i in range(options.option_count)}
            assert HEAT_MARKS[-1] in rows[top][:9]  # the kernel's costliest line: █
            assert all(len(r) <= 80 for r in rows.values())
            text = plain(help_table([]))
            assert "the kernel source's gutter" in text
            for mark, _ in GUTTER:
                assert mark in text
    run(go())
