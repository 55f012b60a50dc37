"""The UI's second round (issue 26, items 10-15): panes drawn while hidden, the cursor after
F9, one stop description, one token numbering across every surface, maximized panes, the
Registers tab at 80x24 and the smaller cuts. Pilot at 80x24, 120x36 and 200x50."""
from __future__ import annotations

from contextlib import asynccontextmanager

import pytest

from firscope.dap.views import THREAD_GRAPH, Views
from firscope.debug.commands import CommandInterpreter
from firscope.debug.diverge import attach_reference
from firscope.debug.session import Session
from firscope.model.tokens import ByteTokenizer
from firscope.runtime import load_model
from firscope.tui.app import FirscopeApp
from firscope.tui.graph_pane import NodeList
from firscope.tui.source_pane import SourceLines
from firscope.tui.state import Wants, build_view
from model_util import scale_bug_dump
from test_tui import SIZES, header, make_app
from tui_util import plain, press, run, screen_text, settle, wait_loaded

TOKENS = [3, 1, 4, 1]


@pytest.fixture
def bug_dump(random_model, tmp_path):
    return scale_bug_dump(random_model, tmp_path, TOKENS)


@asynccontextmanager
async def opened(app, size, *commands):
    """The app loaded at ``size``, each command run and settled."""
    async with app.run_test(size=size) as pilot:
        await wait_loaded(app, pilot)
        for c in commands:
            app.run_command(c)
            await settle(app, pilot)
        yield app, pilot


def against(model, dump) -> FirscopeApp:
    return FirscopeApp(model, n=0, engine="interp", against=str(dump), show_times=False)


def rows_of(app) -> list[str]:
    return screen_text(app).splitlines()


# -- 10: panes drawn while hidden ------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_console_lines_written_while_hidden_wrap_at_the_shown_width(size):
    async def go():
        async with opened(make_app(), size) as (app, pilot):
            await press(app, pilot, "4", "escape", "1", "n", "n", "4")
            rows = rows_of(app)
            for line in ("before positional (ext fir.embedding)  [token 0 100 'd' pos 0]",
                         "before embeddings (micro g2.add)  [token 0 100 'd' pos 0]"):
                assert any(line in r for r in rows), "\n".join(rows)
            # the first line is as long as the width allows, not cut at 20 columns
            first = next(r for r in rows if r.startswith("firscope: "))
            assert len(first.rstrip()) > min(size[0] - 10, 100), first
            # and a new width re-wraps what is there
            await pilot.resize_terminal(size[0] + 30, size[1])
            await settle(app, pilot)
            first = next(r for r in rows_of(app) if r.startswith("firscope: "))
            assert len(first.rstrip()) > min(size[0] - 10, 100) or "loaded" in first
    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_diff_tab_opened_after_the_stop_has_every_column(size, random_model, bug_dump):
    async def go():
        async with opened(against(random_model, bug_dump), size, "break diverge",
                          "continue") as (app, pilot):
            await press(app, pilot, "7")  # opened after the stop was drawn
            body = plain(app.query_one("#diff-body")).splitlines()
            head = next(r for r in body if "reference" in r and "index" in r)
            assert "difference" in head and "ULP" in head, body
            marked = next(r for r in body if r.startswith("▶"))
            assert len(marked.split()) == 6, marked  # ▶ index reference other difference ULP
            # and it scrolls to the element table at every size
            app.query_one("#diff-view").scroll_end(animate=False)
            await settle(app, pilot)
            assert any(r.strip().startswith("15 ") for r in rows_of(app))
    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_graph_drawn_while_hidden_is_redrawn_at_its_width(size):
    async def go():
        async with opened(make_app(), size) as (app, pilot):
            app.main_screen.show_loading(True)  # as during a reload: the panes are hidden
            await settle(app, pilot)
            app.run_command("until attention@0")
            await settle(app, pilot)
            app.main_screen.show_loading(False)
            await settle(app, pilot)
            rows = rows_of(app)
            assert any("attention_linear" in r for r in rows), "\n".join(rows)
            assert not any("attenti…" in r for r in rows)
    run(go())


# -- 11: F9 on a kernel line keeps the cursor ------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_f9_on_a_kernel_line_keeps_the_source_cursor(size):
    async def go():
        async with opened(make_app(), size) as (app, pilot):
            app.run_command("until attention@0")
            await settle(app, pilot)
            await press(app, pilot, "s")
            lines = app.query_one(SourceLines)
            lines.focus()
            await settle(app, pilot)
            pc_row = lines.highlighted
            await press(app, pilot, "down", "down", "down")
            want = lines.cursor_line()
            await press(app, pilot, "f9")
            assert lines.highlighted == pc_row + 3 and lines.cursor_line() == want
            assert any(bp.spec == f"g2.attn_decode:{want}" for bp in app.session.breakpoints)
            row = next(r for r in rows_of(app) if f"{want:4d} " in r and "●" in r)
            assert row
            await press(app, pilot, "b")  # and off again, still there
            assert lines.cursor_line() == want
            assert not any(bp.spec == f"g2.attn_decode:{want}" for bp in app.session.breakpoints)
    run(go())


# -- 12 and 13: one stop description, one numbering -------------------------------------------
def test_one_numbering_and_stop_description_in_every_surface(random_model, bug_dump):
    s = Session(load_model(random_model), TOKENS, 0, engine="interp")
    attach_reference(s, bug_dump)
    ci = CommandInterpreter(s)
    ci.execute("break diverge")
    batch = ci.execute("continue")
    assert s.step == 1
    # the header says what batch mode says
    caught = batch.splitlines()[0]
    assert caught.startswith("Catchpoint 1, attention@0 diverges from the dump at step 1")
    view = build_view(s, ci, ByteTokenizer(), None, Wants())
    assert view.status.startswith(caught)
    # token 1 everywhere: header, where, diff, info diff, DAP
    assert "token 1 of 0..3" in view.header
    assert view.diff.step == 1 and "step 1," in view.diff.first
    assert "#1  token 1 " in ci.execute("where") and "(of tokens 0..3)" in ci.execute("where")
    assert "\nstep 1: " in "\n" + ci.execute("info diff")
    from firscope.tui.diff_view import diff_text
    assert "token 1: compared outputs" in diff_text(view.diff).plain
    frames = Views(ci, {"path": str(random_model)}).frames(THREAD_GRAPH)
    assert frames[-1]["name"].startswith("token 1 ") and "of tokens 0..3" in frames[-1]["name"]
    # goto NODE token N lands on token N as the header numbers it
    ci.execute("delete 1")
    ci.execute("goto attention@1 token 2")
    assert s.step == 2
    view = build_view(s, ci, ByteTokenizer(), None, Wants())
    assert "token 2 of 0..3" in view.header and "pos 2" in view.header
    assert "[token 2 " in ci.where_line()
    # and break token N stops at the start of that token, numbered the same
    ci.execute("break token 3")
    assert ci.execute("continue").startswith("Breakpoint 2, token 3")
    assert s.step == 3 and s.node_index == 0
    assert "token 3 of 0..3" in build_view(s, ci, ByteTokenizer(), None, Wants()).header


@pytest.mark.parametrize("size", SIZES)
def test_the_header_shows_a_divergence_as_batch_mode_does(size, random_model, bug_dump):
    async def go():
        async with opened(against(random_model, bug_dump), size, "break diverge",
                          "continue") as (app, pilot):
            top = header(app)
            assert "Catchpoint 1, attention@0 diver" in top, top
            assert "breakpoint 1" not in top
            assert "token 1 of 0..3" in top  # never cut for the description
            app.run_command("delete 1")
            app.run_command("goto attention@1 token 2")
            await settle(app, pilot)
            assert "token 2 of 0..3" in header(app)
    run(go())


def test_sanitizer_and_nan_catchpoints_read_the_same_in_the_header():
    from types import SimpleNamespace
    from firscope.debug.snapshot import Stop, StopReason
    s = Session(load_model(make_app().model_path), [1], 0, engine="interp")
    ci = CommandInterpreter(s)
    for reason, msg in ((StopReason.BREAKPOINT,
                         "Catchpoint 2, race (write after read): lanes 0 and 1 write x[3]"),
                        (StopReason.BREAKPOINT, "Catchpoint 3, uninit: lane 2 reads x[9]"),
                        (StopReason.NAN, "x[3] = nan written by lane 1")):
        stop = Stop(reason, msg, s.location(), 2)
        batch = ci.describe_stop(stop).splitlines()[0]
        assert batch.startswith("Catchpoint")
        assert ci.status_line(SimpleNamespace(stop=stop)).startswith(batch)


# -- 14: maximized panes, the Registers tab ----------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_m_on_the_graph_widens_it_and_keeps_the_header(size):
    async def go():
        async with opened(make_app(), size) as (app, pilot):
            app.run_command("until attention@0")
            await settle(app, pilot)
            app.query_one(NodeList).focus()
            await press(app, pilot, "m")
            rows = rows_of(app)
            assert "stopped at attention@0" in rows[0]  # the stop description stays
            box = next(r for r in rows if "Graph" in r)
            assert box.startswith("╭") and box.rstrip().endswith("╮") and \
                len(box.rstrip()) == size[0], box
            assert "╱" not in "".join(rows[1:-1])  # no hatching beside it
            await press(app, pilot, "m")
            rows = rows_of(app)
            assert any("positional" in r and "embeddings" not in r for r in rows)
            assert not any("posi…" in r for r in rows)
    run(go())


@pytest.mark.parametrize("size", [(80, 24), (90, 30)])
def test_registers_tab_shows_the_watch_list_and_every_lane(size):
    async def go():
        async with opened(make_app(), size) as (app, pilot):
            for c in ("until attention@0", "stepi", "display max(abs(x))", "display R3"):
                app.run_command(c)
                await settle(app, pilot)
            await press(app, pilot, "6")
            text = screen_text(app)
            assert "1: max(abs(x)) =" in text and "2: R3 = 0" in text, text
            assert "R0 over lanes" in text
            for lane in range(4):  # attention@0 runs 4 lanes: each with its value
                assert f"{lane:>3}■{lane:>12}" in text, text
    run(go())


def test_the_lanes_fit_beside_a_register_table_that_widens():
    """On the Registers tab (80 columns) the register table is as wide as its widest value:
    when a step widens it, the lanes beside it are laid out again for the width left (their
    bar was once drawn for the width before, and wrapped)."""
    async def go():
        async with opened(make_app(), (80, 24)) as (app, pilot):
            await press(app, pilot, "n", "6")
            lanes = app.query_one("#right-tab .lanes")
            widths = set()
            for _ in range(5):
                await press(app, pilot, "s")
                bars = [r for r in plain(lanes).splitlines() if "█" in r or "░" in r]
                if bars:  # a kernel is running
                    widths.add(lanes.content_size.width)
                    assert len(bars[0]) <= lanes.content_size.width, (bars, lanes.content_size)
            assert len(widths) > 1, widths  # the table did widen
    run(go())


@pytest.mark.parametrize("size", [(120, 36), (80, 24)])
def test_the_register_table_is_drawn_once_a_key_as_the_table_draws(monkeypatch, size):
    """The registers' table reaches its Static as the text of the table's lines, drawn once
    at the pane's width (tui/paint.py drawn: Textual drew a Rich table twice at every key,
    to measure its height and to show it): the same characters as the table, at 120x36 and
    on the 80-column Registers tab (beside the lanes, as wide as it needs), and again at
    another width."""
    import io

    from rich.console import Console
    from rich.text import Text
    from textual.visual import RichVisual

    from firscope.tui.registers_pane import RegistersPane, register_table
    measured = calls_of(monkeypatch, RichVisual, "get_height")

    async def go():
        async with opened(make_app(), size, "until ln1@1") as (app, pilot):
            if size[0] < 100:
                await press(app, pilot, "6")
            measured.clear()
            for key in ("s", "s", "s", "resize"):  # and at another width: drawn again
                if key == "resize":
                    await pilot.resize_terminal(size[0] - 10, size[1])
                    await settle(app, pilot)
                else:
                    await press(app, pilot, key)
                pane = next(p for p in app.query(RegistersPane) if p.display and p.size.width)
                table = pane.query_one(".regs")
                content = table.content
                assert isinstance(content, Text), type(content)
                out = io.StringIO()
                Console(file=out, width=pane.scrollable_content_region.width,
                        color_system=None).print(register_table(pane.model, pane.view,
                                                                pane.cursor))
                want = [r.rstrip() for r in out.getvalue().splitlines()]
                assert [r.rstrip() for r in content.plain.splitlines()] == want
                assert "R0" in content.plain
            assert not [v for v in measured if v._widget is table], "a table measured"
    run(go())


def calls_of(monkeypatch, cls, name: str) -> list:
    """A list that gets the instance of every call of ``cls.name`` from now on."""
    calls = []
    real = getattr(cls, name)

    def counted(self, *args, **kw):
        calls.append(self)
        return real(self, *args, **kw)
    monkeypatch.setattr(cls, name, counted)
    return calls


def test_stepping_inside_a_kernel_lays_nothing_out(monkeypatch):
    """A step key inside a kernel changes text, not sizes: the screen is repainted, not laid
    out again (Textual lays it out on every Static.update unless told it need not; that and
    a list emptied and refilled made each such key cost two layouts, tui/paint.py)."""
    from textual.screen import Screen
    layouts = calls_of(monkeypatch, Screen, "_refresh_layout")

    async def go():
        async with opened(make_app(), (120, 36), "until g2.attn_decode:160") as (app, pilot):
            before = header(app)
            layouts.clear()
            await press(app, pilot, "s", "s", "s")
            assert header(app) != before  # the keys did step
            assert layouts == [], f"{len(layouts)} layouts in three steps"
    run(go())


def test_a_step_key_repaints_what_changed_not_the_whole_screen(monkeypatch):
    """The app's stop (``FirscopeApp.view``, which every pane is bound to) is a var: as a
    reactive it repainted the app, that is the whole screen, at every step (a full update
    of every line, 8-16 ms a key on GPT-2 small), though each pane redraws itself."""
    from textual._compositor import Compositor
    full = calls_of(monkeypatch, Compositor, "render_full_update")
    partial = calls_of(monkeypatch, Compositor, "render_partial_update")

    async def go():
        async with opened(make_app(), (120, 36)) as (app, pilot):
            before = header(app)
            full.clear()
            partial.clear()
            await press(app, pilot, "n", "s", "r", "n")
            assert header(app) != before  # the keys did step, and were drawn
            assert partial and full == [], f"{len(full)} full updates in four steps"
    run(go())


@pytest.mark.parametrize("internals", [True, False])
def test_a_step_key_renders_again_only_the_graph_rows_that_changed(monkeypatch, internals):
    """A step moves the graph's ▶: two rows change. Only those are rendered again from their
    text (Textual's replace_option_prompt_at_index forgets every row's rendered lines, and
    the list rendered every visible row again, three times a key); the screen shows the ▶
    at the new stop only. Without the OptionList internals paint.py reads (another
    Textual), the public call draws the same."""
    import re

    from firscope.tui import paint
    if not internals:
        monkeypatch.setattr(paint, "_replace_prompts", lambda widget, changed: False)
    cleared = calls_of(monkeypatch, NodeList, "_clear_caches")
    drawn = calls_of(monkeypatch, NodeList, "render_line")  # a row drawn from its strips

    def marked(app) -> list[str]:
        return [m.group(1) for r in rows_of(app) for m in re.finditer(r"▶ *([\w.@]+)", r)]

    async def go():
        async with opened(make_app(), (120, 36)) as (app, pilot):
            for _ in range(3):
                before = app.session.node.name
                cleared.clear()
                drawn.clear()
                await press(app, pilot, "n")
                now = app.session.node.name
                assert now != before and now in marked(app) and before not in marked(app), \
                    (before, now, marked(app))
                assert (cleared == []) == internals, f"{len(cleared)} cache clears"
                if internals:  # the highlight and the ▶ left one row and took the next
                    assert len(drawn) <= 4, f"{len(drawn)} rows drawn again"
    run(go())


def test_a_border_title_is_set_only_when_it_changes(monkeypatch):
    """Textual's border-title setter repaints the whole pane, even for the text it shows
    already (tui/paint.set_border): from one ext node to the next, the source pane sets its
    title and subtitle once each (its subtitle went to "" and back to the node's name), the
    graph pane neither (its "61 nodes")."""
    from textual.widget import _BorderTitle

    from firscope.tui.graph_pane import GraphPane
    from firscope.tui.source_pane import SourcePane
    real = _BorderTitle.__set__
    set_on = []

    def counted(self, obj, title):
        set_on.append((type(obj).__name__, self._internal_name))
        return real(self, obj, title)
    monkeypatch.setattr(_BorderTitle, "__set__", counted)

    async def go():
        async with opened(make_app(), (120, 36)) as (app, pilot):
            assert app.session.node.full_name == "token"
            set_on.clear()
            await press(app, pilot, "n")
            assert app.session.node.full_name == "positional"  # ext, as token is
            pane = app.query_one(SourcePane)
            assert pane.border_subtitle == "positional"
            assert sorted(set_on) == [("SourcePane", "_border_subtitle"),
                                      ("SourcePane", "_border_title")], set_on
            assert not [s for s in set_on if s[0] == GraphPane.__name__]
    run(go())


def test_stepping_into_a_kernel_and_back_out_lays_nothing_out_once_it_was_seen(monkeypatch):
    """The registers pane keeps the room a kernel's table and lanes took below "no kernel
    running" while the stop is before it: after a first visit, s into the kernel, r in it
    and R (reverse-next) back out before it change no size, so they lay nothing out (each
    cost two layouts: the table's height changed, then Textual's size update asked again). The table and the lanes are
    never cut: each is at least as tall as its content, at every stop."""
    from textual.screen import Screen
    from firscope.tui.registers_pane import RegistersPane, RightColumn
    layouts = calls_of(monkeypatch, Screen, "_refresh_layout")

    def whole(app):
        pane = app.query_one("#right", RightColumn).query_one(RegistersPane)
        for part in (".regs", ".lanes"):
            w = pane.query_one(part)
            size = w.content_size
            assert w.get_content_height(size, size, size.width) <= size.height, part
        return pane

    async def go():
        async with opened(make_app(), (120, 36), "until ln1@1") as (app, pilot):
            pane = whole(app)
            assert "no kernel running" in plain(pane.query_one(".regs"))
            await press(app, pilot, "s")  # the first visit: the kernel's room is taken
            layouts.clear()
            for key, inside in (("R", False), ("s", True), ("s", True), ("r", True),
                                ("R", False)):
                await press(app, pilot, key)
                pane = whole(app)
                assert ("no kernel running" in plain(pane.query_one(".regs"))) != inside
                assert ("over lanes" in plain(pane.query_one(".lanes"))) == inside
            assert layouts == [], f"{len(layouts)} layouts in five steps"
            await press(app, pilot, "n", "n")  # to other nodes: still whole
            whole(app)
    run(go())


def test_content_a_static_shows_already_is_not_drawn_again():
    """paint.update leaves a Static alone when it shows the same text already; a text that
    differs only in its base style is not the same (rich's own == says it is)."""
    from rich.table import Table
    from rich.text import Text
    from textual.widgets import Static
    from firscope.tui.paint import shows_already
    w = Static(Text("no displays", style="dim"))
    assert shows_already(w, Text("no displays", style="dim"))
    assert Text("no displays") == Text("no displays", style="dim")  # rich's ==
    assert not shows_already(w, Text("no displays"))
    assert not shows_already(w, Text("no displays!", style="dim"))
    w2 = Static(Text.assemble(("R1", "cyan"), " 0"))
    assert shows_already(w2, Text.assemble(("R1", "cyan"), " 0"))
    assert not shows_already(w2, Text.assemble(("R1", "magenta"), " 0"))
    assert not shows_already(Static("a"), Text("a")) and shows_already(Static("a"), "a")
    assert not shows_already(Static(Table()), Table())


def test_a_step_that_leaves_the_watch_list_as_it_was_does_not_redraw_it(monkeypatch):
    """Steps inside a kernel change the registers, not the watch list ("no displays"): its
    Static is not updated (drawn) again; a display added to it is."""
    from textual.widgets import Static
    updated = calls_of(monkeypatch, Static, "update")

    async def go():
        async with opened(make_app(), (120, 36), "until g2.attn_decode:160") as (app, pilot):
            watch = app.query_one("#right .watch", Static)
            updated.clear()
            await press(app, pilot, "s", "s", "s")
            assert watch not in updated and any(w.has_class("regs") for w in updated)
            app.run_command("display R1")
            await settle(app, pilot)
            await press(app, pilot, "s")
            assert watch in updated and "R1" in plain(watch)
    run(go())


def test_a_kernel_shown_after_an_ext_node_is_drawn_once_at_its_width(monkeypatch):
    """From a linear (ext: the source pane shows its text, the kernel's list hidden) to the
    next micro node: the list's rows are made once, for the width the list then has (its
    scrollbar's column is kept, shown or not), not made for a guessed width and again when
    the list is laid out, and drawn once."""
    from firscope.tui.source_pane import SourceLines, SourcePane
    made = calls_of(monkeypatch, SourcePane, "redraw")
    drawn = calls_of(monkeypatch, SourceLines, "render_line")

    async def go():
        async with opened(make_app(), (120, 36), "until qkv_linear@0") as (app, pilot):
            assert app.query_one(SourcePane).ext
            await press(app, pilot, "n", "n", "R", "R")  # the list was shown at this width
            assert app.query_one(SourcePane).ext
            made.clear()
            drawn.clear()
            await press(app, pilot, "n")
            assert app.session.node.full_name == "qkv_bias@0"
            lines = app.query_one(SourceLines)
            assert lines.display and not app.query_one(SourcePane).ext
            assert len(made) == 1, f"the kernel's rows were made {len(made)} times"
            assert app.query_one(SourcePane).rows_width == lines.scrollable_content_region.width
            # and drawn once: shown again at the width it had, the list keeps what it drew
            # (Textual's OptionList forgets it at every resize, and drew every row twice)
            assert 0 < len(drawn) <= lines.size.height, (len(drawn), lines.size.height)
    run(go())


def test_the_kernel_list_keeps_the_stop_in_view_when_only_its_height_changes():
    """The console tab (key 4) gives the bottom row more height and the kernel list less:
    its rows stay (same width), and the stop's line stays in view."""
    from firscope.tui.source_pane import SourceLines

    async def go():
        async with opened(make_app(), (120, 36), "until g2.attn_decode:158") as (app, pilot):
            lines = app.query_one(SourceLines)
            height = lines.size.height
            await press(app, pilot, "4")
            assert lines.size.height < height  # the list did shrink
            top = lines.scroll_offset.y
            assert top <= lines.highlighted < top + lines.scrollable_content_region.height, \
                (top, lines.highlighted, lines.scrollable_content_region.height)
            assert "158" in str(lines.get_option_at_index(lines.highlighted).prompt)
    run(go())


# -- 15: the smaller cuts ----------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_buffers_placeholder_and_header_are_whole(size):
    async def go():
        async with opened(make_app(), size) as (app, pilot):
            app.run_command("until g2.attn_decode:160")
            await settle(app, pilot)
            text = screen_text(app)
            assert "the next node's inputs · or a name: x, qkvw@0" in text
            top = text.splitlines()[0]
            assert "token 0 of 0..6 'd' pos 0" in top, top  # token and position survive 80
    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_profile_tab_keeps_node_names_whole(size):
    async def go():
        async with opened(make_app(), size) as (app, pilot):
            await press(app, pilot, "t", "3")
            text = screen_text(app)
            # the profile's rows (the graph pane above may shorten a name beside a wide time)
            assert not any("attenti…" in r for r in text.splitlines() if "micro" in r), text
            row = next(r for r in text.splitlines() if " attention " in r and "micro" in r)
            assert "%" in row and "total ms" in text and "runs" in text, text
    run(go())


def test_info_lanes_and_registers_say_what_the_star_means():
    app = make_app()
    model = load_model(app.model_path)
    s = Session(model, [1, 2], 0, engine="interp")
    ci = CommandInterpreter(s)
    ci.execute("until attention@0")
    ci.execute("stepi 3")
    ci.execute("lane 1")  # lane 1: U1 = 1 * headdim, changed
    for out in (ci.execute("info lanes U1"), ci.execute("info registers")):
        assert "*" in out.split("\n", 1)[1].rsplit("\n", 1)[0]  # something is marked
        assert out.splitlines()[-1].lstrip().endswith(
            "* changed since the last stop (or since the kernel started)")


def test_a_restored_display_shows_its_value():
    from firscope.model.tokens import load_tokenizer
    from firscope.tui.reload import carry, restore
    model = load_model(make_app().model_path)
    tok = load_tokenizer(model.folder, model.vocab)
    s = Session(model, tok.encode("def "), 2, engine="interp")
    ci = CommandInterpreter(s, tok)
    ci.execute("until ln1@0")
    ci.execute("display max(abs(x))")
    carried = carry(s, ci)
    s2 = Session(model, tok.encode("def "), 2, engine="interp")
    ci2 = CommandInterpreter(s2, tok)
    notes = restore(ci2, carried)
    shown = next(n for n in notes if n.startswith("restored: display"))
    d = ci2.last.displays[0]  # the Watch pane's value at the restored stop
    assert d.expr == "max(abs(x))" and not d.error
    assert shown == f"restored: display 1: max(abs(x)) = {d.text}"  # as gdb prints it


def test_ui_against_a_dump_stops_at_its_end_unless_n_is_given():
    from firscope.cli import build_parser
    from firscope.tui.launch import ui_steps
    p = build_parser()
    assert ui_steps(p.parse_args(["ui", "m.fir", "--against", "d.safetensors"])) == 0
    assert ui_steps(p.parse_args(["ui", "m.fir", "--against", "d.safetensors", "-n", "5"])) == 5
    assert ui_steps(p.parse_args(["ui", "m.fir", "--against", "d.st", "--prompt", "hi"])) == 12
    assert ui_steps(p.parse_args(["ui", "m.fir"])) == 12


def test_a_prompt_without_a_tokenizer_is_refused_before_loading(make_model, monkeypatch,
                                                                capsys):
    import firscope.runtime.load as load_mod
    import firscope.tui.launch as launch
    from firscope.cli import main
    fir = make_model("novocab", vocab=300)

    def never(*a, **kw):
        raise AssertionError("loaded the model before refusing the prompt")
    monkeypatch.setattr(launch, "FirscopeApp", never)
    monkeypatch.setattr(load_mod, "load_model", never)
    assert main(["ui", str(fir), "--prompt", "hello"]) == 1
    err = capsys.readouterr().err
    assert "no tokenizer.json beside the model" in err and "--tokens 1,2,3" in err
    assert "Traceback" not in err


def test_the_loaded_session_is_frozen_for_the_collector_until_the_app_ends():
    """After the first stop the loaded objects leave the cyclic collector's walks (full
    collections over them paused steps 90-120 ms); when the app ends they are handed back,
    so that a process running apps one after another (the tests) can collect them."""
    import gc

    async def go():
        async with opened(make_app(), SIZES[0]) as (app, pilot):
            await settle(app, pilot)
            assert gc.get_freeze_count() > 10_000
    gc.unfreeze()
    run(go())
    assert gc.get_freeze_count() == 0
