"""A newcomer's third round (issue 40): each item's reproducer, as the user met it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from textual import events

from firscope.tui.app import FirscopeApp
from tui_util import plain, press, run, screen_text, settle, wait_loaded
from conftest import SAMPLE
from model_util import firscope

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


# -- 12: the README says how many steps run takes, and it is what run does -------------------
def test_the_readme_sentence_on_runs_step_count_is_what_run_does(tmp_path):
    from conftest import REPO
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "It runs `len(prompt) + max(N - 1, 0)` steps" in readme
    assert "(`--tokens 1,2,3 -n 0`: 3 steps; `-n 2`: 4)" in readme
    for n, want in [("0", 3), ("1", 3), ("2", 4), ("5", 7)]:
        out = tmp_path / f"l{n}.npy"
        done = firscope("run", "--tokens", "1,2,3", "-n", n, "--logits-out", str(out), cwd=None)
        assert done.returncode == 0, done.stderr
        import numpy as np
        assert np.load(out).shape[0] == want, n
        assert f"[{want} steps in" in done.stderr
    helped = firscope("run", "--help", cwd=None)
    assert "len(prompt) + max(N - 1, 0) steps" in " ".join(helped.stdout.split())


# -- 11: the lens right after the embeddings -----------------------------------------------------
def test_the_lens_after_the_embeddings_is_their_own_prediction():
    import numpy as np
    import firscope
    from firscope.debug.opening import open_session
    from firscope.runtime.opening import RunInput
    ci = open_session(RunInput(tokens=(100, 101, 102)), n=1, engine="interp").ci
    ci.goto("ln1@0", 1)
    text = ci.run("lens --all").text
    assert text.splitlines()[0].startswith("embed ") and "layer" not in text
    ci.goto("ln2@1", 1)
    labels = [ln.split()[0] + (" " + ln.split()[1] if ln.startswith("layer") else "")
              for ln in ci.run("lens --all").text.splitlines()]
    assert labels == ["embed", "layer 0", "layer 1"]  # layer 1: its attention wrote x
    # the same figures as the Python API's lens of the same step
    model = firscope.open(engine="interp")
    run = model.run(tokens=[100, 101, 102], record="embeddings/x,mlp_residual@*/x")
    api = run.lens(step=1)
    rows = ci.lens(5, every_layer=True)
    assert [t for t, _ in rows[0].top] == [t for t, _, _ in api.rows[0][1]]
    assert np.allclose([p for _, p in rows[0].top], [p for _, _, p in api.rows[0][1]])


@pytest.mark.parametrize("size", SIZES)
def test_the_lens_tab_shows_the_embed_row(size):
    async def go():
        app = make_app()
        async with app.run_test(size=size) as pilot:
            await wait_loaded(app, pilot)
            app.run_command("goto ln1@0")
            await settle(app, pilot)
            await press(app, pilot, "5")
            assert "embed" in screen_text(app)
            assert "nothing has written" not in screen_text(app)
    run(go())


# -- 10: a key that cannot act says why ------------------------------------------------------------
def test_m_on_a_hidden_pane_and_6_when_wide_say_why():
    async def go():
        app = make_app()
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "6")
            assert "the registers are beside the source at this width" in app.status_text
            # focus a widget of the Buffers tab, then show another tab: m has nothing shown
            await press(app, pilot, "1")
            app.query_one("#buf-values").focus()
            await settle(app, pilot)
            await press(app, pilot, "2")  # the Buffers tab is hidden: its pane loses focus
            assert app.focused is None or app.focused.id == "buf-values"
            await press(app, pilot, "m")
            assert app.screen.maximized is None
            assert app.status_text.startswith("m: no pane to maximize"), app.status_text
    run(go())


# -- 8: cost --device list shows each figure and its source ---------------------------------------
def test_device_list_shows_every_figure_with_its_source():
    from firscope.cost.devices import NUMBERS, load_devices
    done = firscope("cost", "--device", "list", cwd=None)
    assert done.returncode == 0
    h200 = load_devices()["h200"]
    block = done.stdout.split("\nh200: ")[1].split("\n\n")[0]
    for key in NUMBERS:
        line = next(ln for ln in block.splitlines() if ln.split()[0] == key)
        assert h200.sources[key][:40] in line, key
    assert "4800 GB/s" in block


# -- 1: one preempted call does not top the report's charts ----------------------------------------
def test_one_slow_call_cannot_top_the_time_charts_or_the_summary():
    import xml.etree.ElementTree as ET
    from firscope.profile import figures
    from firscope.profile.collect import Profiler, make_machine
    from firscope.profile.export import timing_section
    from firscope.profile.html import _time
    from firscope.runtime import load_model
    model = load_model(SAMPLE / "gpt2.fir")
    machine, _ = make_machine(model, "compiled")
    machine.kernel_runner.warmup()
    for t in (100, 101, 102):  # warm: the timed steps below are the kernels' own time
        machine.step(t)
    machine.reset()
    prof = Profiler(model, attention=False).attach(machine)
    for t in (100, 101, 102, 32, 105, 110):
        machine.step(t)
    data = prof.data()
    ln2 = model.node_index("ln2@1")
    data.tokens[3].node_ns[ln2] = 9_000_000  # one call preempted for 9 ms
    t = timing_section(data)
    by_name = {r["name"]: r for r in t["by_name"]}
    assert t["robust"] == "median x calls"
    raw_share = by_name["ln2"]["total_us"] / t["total_us"]
    assert raw_share > 0.3  # what the charts showed before
    assert by_name["ln2"]["share"] < 0.1, by_name["ln2"]
    top = max(t["by_name"], key=lambda r: r["median_calls_us"])["name"]
    assert top != "ln2"
    # the chart draws the same figure, and says which it is
    svg = ET.fromstring(figures.time_by_name(t))
    words = " ".join(x.text or "" for x in svg.iter("{http://www.w3.org/2000/svg}text"))
    assert "median call × calls" in words
    layer1 = next(r for r in t["by_layer"] if r["layer"] == 1)
    assert layer1["share"] < 0.5
    html = _time({"timing": t}, {})
    assert "median call × calls" in html and "micro" in html


# -- 6: one row per layer in the Lens tab, at 80 columns too ---------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_the_lens_tab_keeps_one_row_per_layer(size):
    async def go():
        app = make_app()
        async with app.run_test(size=size) as pilot:
            await wait_loaded(app, pilot)
            app.run_command("goto final_norm")
            await settle(app, pilot)
            await press(app, pilot, "5")
            lines = screen_text(app).splitlines()
            def label(ln):
                words = ln.split("▊")[-1].split()
                return words[:2] if words and words[0] in ("embed", "layer") else None
            rows = [i for i, ln in enumerate(lines) if label(ln)]
            labels = [label(lines[i]) for i in rows]
            assert len(rows) >= 3, "\n".join(lines)
            # consecutive screen lines: no row wrapped onto the next
            assert rows == list(range(rows[0], rows[0] + len(rows)))
            assert labels[0][0] == "embed" and labels[1] == ["layer", "0"]
            for i in rows:
                assert lines[i].count("0.") >= (4 if size[0] < 100 else 5)
    run(go())


# -- 3: the Profile tab keeps every column whole at 80 columns, units in the headers ---------------
@pytest.mark.parametrize("size", SIZES)
def test_the_profile_tab_columns_are_whole_with_units(size):
    async def go():
        app = make_app()
        async with app.run_test(size=size) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "s", "t", "3", "G")
            await settle(app, pilot)
            text = screen_text(app)  # as drawn, at this width
            heads = [ln for ln in text.splitlines() if "total ms" in ln]
            assert heads, text
            for col in ("node", "total ms", "ms/run", "share", "GPU µs/call", "bound"):
                assert col in heads[0], (col, heads[0])
            lines = plain(app.query_one("#prof-time")).splitlines()  # every row
            rows = [ln for ln in lines if ln.strip().startswith(("attention ", "ln1 ", "gelu "))]
            assert rows and all("%" in r for r in rows), rows
            bounds = ("mem", "cmp", "lat", "lch") if size[0] < 100 else (
                "memory", "compute", "latency", "launch")
            assert all(any(b in r for b in bounds) for r in rows), rows
            if size[0] < 100:
                assert "bound: mem cmp lat lch = memory" in text  # the abbreviations' legend
    run(go())


# -- 9: the cost figures a GPU kernel author questions -------------------------------------------
def test_cost_figures_say_what_one_lane_threadgroups_cost():
    import json
    done = firscope("cost", "--tokens", "3,7", "--json", cwd=None)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    nodes = {n["node"]: n for n in report["nodes"]}
    # ext ops: lanes in full warps, never 0 warps beside 384 lanes
    qkv = nodes["qkv_linear@0"]
    assert qkv["lanes"] == 384 and qkv["warps"] == 12 and qkv["tg"] == 32
    # a tg=1 kernel: 'coalesced' per warp of one lane, yet 4 of 32 bytes used per sector
    add = nodes["qkv_bias@0"]
    assert add["coalescing_efficiency"] == 1.0 and add["bytes_per_sector"] == 4.0
    assert "31 of 32 lanes of each warp idle" in add["advice"] and "tg=32" in add["advice"]
    text = firscope("cost", "--tokens", "3,7", cwd=None).stdout
    assert "B/sector" in text and "per warp (a warp of one lane is coalesced by itself)" in text


# -- 4: the report's GPU tables, as headless Chromium lays them out ----------------------------
LAYOUT_PROBE = """<script>
window.addEventListener('load', () => {
  const gpu = document.getElementById('gpu');
  const details = [], nodeRows = [], kernelRows = [], advice = [];
  for (let el = gpu.nextElementSibling; el && el.tagName !== 'H2'; el = el.nextElementSibling) {
    if (el.tagName === 'DETAILS') details.push(el.open);
    if (el.tagName === 'TABLE') {
      const rows = [...el.querySelectorAll('tbody tr')].map(
        (tr) => tr.getBoundingClientRect().height);
      (el.querySelector('.advice') ? kernelRows : nodeRows).push(...rows);
    }
    if (el.querySelectorAll) for (const a of el.querySelectorAll('.advice'))
      advice.push(a.getBoundingClientRect().width);
  }
  const out = document.createElement('pre');
  out.id = 'firscope-layout';
  out.textContent = JSON.stringify({details, nodeRows, kernelRows, advice,
    line: parseFloat(getComputedStyle(document.body).lineHeight)});
  document.body.appendChild(out);
});
</script></body>"""


def chromium_layout(html: Path) -> dict:
    import json
    import re
    import shutil
    import tempfile
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium; .ci/run "
                    "installs it): the report's layout is not checked")
    probe = html.with_name("probe.html")
    probe.write_text(html.read_text().replace("</body>", LAYOUT_PROBE))
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                               "--disable-quic", "--no-first-run",
                               "--disable-background-networking", "--disable-component-update",
                               "--disable-sync", f"--user-data-dir={profile}",
                               "--window-size=1400,900", "--virtual-time-budget=5000",
                               "--dump-dom", probe.as_uri()],
                              capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="firscope-layout">([^<]*)</pre>', done.stdout)
    assert m, done.stderr[-1000:]
    return json.loads(m.group(1).replace("&quot;", '"'))


def test_the_reports_gpu_tables_are_collapsed_and_readable(tmp_path):
    out = tmp_path / "rep"
    done = firscope("profile", "--tokens", "3,7", "-n", "2", "-o", str(out), "--device", "h200",
                    cwd=None)
    assert done.returncode == 0, done.stderr
    html = (out / "report.html").read_text()
    gpu = html[html.index("id='gpu'"):]
    gpu = gpu[: gpu.index("<h2", 10)]
    assert "<details open" not in gpu and "The 8 slowest of 61 nodes" in gpu
    layout = chromium_layout(out / "report.html")
    line = layout["line"]
    assert layout["details"] and not any(layout["details"])  # every long table collapsed
    assert max(layout["nodeRows"]) <= 1.5 * line  # a node is one line (advice per kernel)
    assert layout["advice"] and min(layout["advice"]) >= 250  # advice a column one can read
    assert max(layout["kernelRows"]) <= 6 * line


# -- 13: the cold start says what it compiles and how long is left ---------------------------------
def test_the_compile_progress_names_kernel_driver_and_time_left():
    from firscope.runtime import Machine, load_model
    from firscope.vm.compiled import _compiling
    said = []
    machine = Machine(load_model(SAMPLE / "gpt2.fir"), engine="compiled")
    machine.kernel_runner.warmup(progress=lambda what, frac: said.append((what, frac)))
    steps = [w for w, _ in said if w.startswith("compiling ")]
    assert steps and said[-1] == ("compiled", 1.0)
    total = len(steps)
    assert steps[0].startswith("compiling g2.") and f"1 of {total})" in steps[0]
    assert any("driver" in w for w in steps)
    # once a driver took seconds (numba compiling, not loading its cache): the time left
    assert _compiling("g2.attn_decode", "run_par", 2, 6, [0.01, 12.0]) == (
        "compiling g2.attn_decode (the threaded driver, 3 of 6), about 48 s left (a first "
        "run; later runs load them from the cache)")
    assert "left" not in _compiling("g2.add", "run_plain", 1, 6, [0.01])


def test_the_ui_load_stops_before_numba_is_even_imported():
    """(issue 45, fourth round) The UI's first stop waits for no compiled kernel: opening the
    sample's session in a fresh process imports no numba (its import and cache were half
    of the first stop); the app's first job loads them (next test)."""
    code = ("import sys\n"
            "from firscope.tui.jobs import Probe\n"
            "from firscope.tui.loading import UiOptions, open_session\n"
            "from firscope.tui.state import Wants\n"
            f"p = open_session(__import__('pathlib').Path({str(SAMPLE / 'gpt2.fir')!r}), "
            "UiOptions(engine='compiled', n=1, prompt_text='d'), None, Probe(), Wants(), "
            "lambda what, frac: None)\n"
            "print(p['view'].status, '|', 'numba' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    status, numba = done.stdout.strip().rsplit("|", 1)
    assert "stopped at" in status and numba.strip() == "False", done.stdout


def test_the_first_job_loads_each_kernel_by_name_and_keys_wait_behind_it(monkeypatch):
    """After the first stop the app loads every driver the compiled engine will call, in a
    job whose progress names each (the status bar shows it past half a second); a key typed
    meanwhile is queued behind it and runs once the kernels are there."""
    import gc
    import threading

    import firscope.debug.opening as opening
    from firscope.tui.jobs import Probe
    real, hold, made = opening.warm_session, threading.Event(), []

    def held(session, progress=None):
        assert hold.wait(60)
        made.append([])  # allocated by the job, as numba's import is
        real(session, progress)
    monkeypatch.setattr(opening, "warm_session", held)
    phases = []

    class Heard(Probe):
        def __setattr__(self, name, value):
            if name == "phase" and value:
                phases.append(value)
            super().__setattr__(name, value)

    async def go():
        app = make_app(engine="compiled")
        app.jobs.probe = Heard()
        async with app.run_test(size=(120, 36)) as pilot:
            try:
                while app.session is None:
                    await pilot.pause(0.01)
                assert app.busy and app.jobs.job.label == "loading kernels"
                await pilot.pause()
                # drawn, kernels or not: the stop's node in the source pane and the header's
                # token (the status bar says "stopped at" only until the job has run half a
                # second: under load that is over by now)
                text = screen_text(app)
                assert "node token ext fir.embedding" in text and "token 0 of 0..6" in text, text
                start = app.session.location()
                await pilot.press("n")
                assert len(app.pending) == 1 and app.session.location() == start
            finally:
                hold.set()
            await settle(app, pilot)
            # what the warm-up allocated (numba's import: ~10^5 objects) is frozen too: in
            # none of the collector's generations
            assert made and all(o is not made[0] for o in gc.get_objects())
            assert app.session.location() != start  # the queued key ran after it
            runner = app.session.machine.kernel_runner
            assert all(p.drivers for p in runner.kernels())  # every kernel's driver loaded
    run(go())
    names = [w for w in phases if w.startswith("compiling g2.")]
    assert names and names[0].endswith(f"1 of {len(names)})") and phases[-1] == "compiled"


def test_a_lane_typed_as_a_non_ascii_digit_is_an_error_not_a_crash():
    async def go():
        app = make_app()
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_loaded(app, pilot)
            app.run_command("until attention@0")
            await settle(app, pilot)
            await press(app, pilot, "s")
            app._focus_lane("\u00b2")  # '²'.isdigit() is True; int('²') raises
            await settle(app, pilot)
            assert app.is_running and app.ci.lane == 0
            assert app.status_text.startswith("error: expected a lane number")
    run(go())
