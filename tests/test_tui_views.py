"""The UI's view-models without Pilot: pure functions from a frozen StopView (and the
static model) to rows, plus the key table, the palette's forms, completion and the
reload plan."""
from __future__ import annotations

import re

import numpy as np
import pytest

from firscope.debug.commands import CommandInterpreter
from firscope.debug.session import Session
from firscope.runtime import load_model
from firscope.model.tokens import load_tokenizer
from firscope.tui import keys
from firscope.tui.attention_view import AttentionRecorder
from firscope.tui.buffers_view import values_text
from firscope.tui.console_view import complete
from firscope.tui.graph_pane import fmt_time, node_rows
from firscope.tui.jobs import Probe
from firscope.tui.lens_view import end_of_layer, lens_rows
from firscope.tui.palette import concrete_forms, templates
from firscope.tui.registers_pane import register_table, watch_text
from firscope.tui.reload import carry, restore
from firscope.tui.source_pane import source_rows
from firscope.tui.state import Wants, build_view
from conftest import REPO, SAMPLE


@pytest.fixture(scope="module")
def sample():
    model = load_model(SAMPLE / "gpt2.fir")
    return model, load_tokenizer(model.folder, model.vocab)


def fresh(sample, wants=Wants()):
    model, tok = sample
    s = Session(model, tok.encode("def "), 3, engine="interp")
    ci = CommandInterpreter(s, tok)
    rec = AttentionRecorder(s)
    return s, ci, lambda: build_view(s, ci, tok, rec, wants)


def test_node_times_stay_on_the_node_line_at_every_width(sample):
    model, _ = sample
    s, ci, view = fresh(sample)
    ci.run("token")
    v = view()
    assert v.snapshot.node_times  # every node ran once
    for width in (20, 24, 30, 44):
        rows = [t.plain for i, t, d in node_rows(model, v, width) if not d]
        assert len(rows) == len(model.nodes)
        for node, text in zip(model.nodes, rows):
            shown = fmt_time(v.snapshot.node_times[node.index])
            assert text.endswith(shown), (width, text)  # the time whole, at the end
            assert len(text) <= width
            assert "\n" not in text
    # the long names are truncated, never the time
    narrow = {t.plain for i, t, d in node_rows(model, v, 22) if not d}
    assert any("…" in t for t in narrow)


def test_deterministic_times_replace_the_measured_ones(sample):
    model, _ = sample
    s, ci, view = fresh(sample)
    ci.run("token")
    rows = node_rows(model, view(), 30, {i: 1.25e-4 for i in range(len(model.nodes))})
    assert all(t.plain.endswith("125µs") for i, t, d in rows if not d)


def test_node_rows_made_before_are_the_same_rows_and_only_changed_ones_are_made(sample):
    """The graph pane keeps the rows it made: a step makes again the rows whose text changes
    (the ▶ leaves one node for the next: two rows, and the node run gets its time), the
    same objects otherwise; each is what node_rows makes from nothing."""
    model, _ = sample
    s, ci, view = fresh(sample)
    made: dict = {}
    before = node_rows(model, view(), 30, made=made)
    ci.run("next")
    v = view()
    after = node_rows(model, v, 30, made=made)
    fresh_rows = node_rows(model, v, 30)
    assert [(i, t.plain, t.spans, d) for i, t, d in after] == \
        [(i, t.plain, t.spans, d) for i, t, d in fresh_rows]
    new = [i for (i, a, _), (_, b, _) in zip(before, after) if a is not b]
    changed = [i for (i, a, _), (_, b, _) in zip(before, after)
               if (a.plain, a.spans) != (b.plain, b.spans)]
    assert new == changed and len(changed) == 2, (new, changed)


def test_source_rows_show_whole_instructions_at_narrow_widths(sample):
    model, _ = sample
    s, ci, view = fresh(sample)
    ci.run("until attention@0")
    ci.run("stepi 3")
    v = view()
    idx = v.node_index
    lines = model.fir.lines
    ops = {op.loc.line for op in model.nodes[idx].program.ops}
    for width in (50, 56, 80, 120):
        sv = source_rows(model, v, idx, width)
        for ln, t in sv.rows:
            code = lines[ln - 1].strip().split("#")[0].strip()
            if ln in ops:
                assert code in t.plain, (width, t.plain)  # an instruction is never cut
            assert t.cell_len <= width
    sv = source_rows(model, v, idx, 56)
    assert any("uaddk 4 4 hidden-headdim" in t.plain for _, t in sv.rows)
    pc_rows = [t.plain for _, t in sv.rows if "▶" in t.plain[:2]]
    assert len(pc_rows) == 1 and sv.focus_line == v.snapshot.location.line
    # counts show when there is room for them
    wide = source_rows(model, v, idx, 120)
    assert any("×" in t.plain for _, t in wide.rows)


def test_registers_and_watch_list_render_the_snapshot(sample):
    model, _ = sample
    s, ci, view = fresh(sample)
    ci.run("display max(abs(x))")
    ci.run("until ln1@0")  # the embeddings wrote x: the display changed
    w = watch_text(view())
    assert w.plain.startswith("1: max(abs(x)) = ")
    assert any("on yellow" in str(span.style) for span in w.spans)
    ci.run("until attention@0")
    ci.run("stepi 2")
    v = view()
    table = register_table(model, v, ("R", 0))
    from rich.console import Console
    con = Console(width=60, record=True, color_system=None)
    con.print(table)
    text = con.export_text()
    regs = v.snapshot.lane
    assert "U1" in text and str(int(regs.U[1])) in text
    # inside the attention kernel x does not change: no highlight
    assert not v.snapshot.displays[0].changed
    assert not any("on yellow" in str(span.style) for span in watch_text(v).spans)


def test_buffers_default_to_the_next_nodes_inputs(sample):
    s, ci, view = fresh(sample)
    ci.run("until attention@0")
    v = view()
    node = s.model.nodes[v.node_index]
    assert v.buffer.title == "inputs of attention@0"
    assert list(v.buffer.names) == [a.display for a in node.args
                                    if a.kind in ("buffer", "weight")]
    assert np.array_equal(v.buffer.arrays[0], s.buffer_value("qkv"))
    assert not v.buffer.arrays[0].flags.writeable  # a frozen copy
    ci.run("next")  # the copy does not follow the live arena
    assert v.snapshot.location.node == "attention@0"


def test_values_page_marks_the_cursor(sample):
    arr = np.arange(200, dtype=np.float32)
    t = values_text(arr, 70, 8)
    assert t.plain.startswith("[     64]")
    assert "cursor [70]" in t.plain
    rev = [t.plain[s.start:s.end].strip() for s in t.spans if "reverse" in str(s.style)]
    assert rev == ["70"]


def test_lens_rows_and_the_end_of_a_layer(sample):
    model, tok = sample
    s, ci, view = fresh(sample, Wants(lens=True))
    ci.run("until final_norm")
    v = view()
    rows = lens_rows(v)
    assert [r[0] for r in rows] == [None] + [str(i) for i in range(model.layers)]  # embed
    assert v.lens.rows[-1].top[0][0] in v.lens.pieces
    assert end_of_layer(model, 1) == "ln1@2"
    s2, ci2, view2 = fresh(sample, Wants(lens=True))
    assert "nothing has written" in lens_rows(view2())[0][1].plain


def test_palette_offers_concrete_forms_and_templates(sample):
    s, ci, view = fresh(sample)
    forms = dict(concrete_forms(ci.table))
    for line in ("info breakpoints", "info registers", "info watch", "info display",
                 "info checkpoints", "info patches", "continue", "reverse-next", "lens --all",
                 "where", "checkpoint"):
        assert line in forms, line
    assert not any("|" in f or "  " in f for f in forms)
    usages = {u: p for u, p, h in templates(ci.table)}
    assert usages["break LOCATION [if COND]"] == "break "
    assert all(p.endswith(" ") for p in usages.values())
    assert "history BUF[i]" in usages and "display EXPR" in usages


def test_completion_of_commands_and_names():
    words = ["break", "backtrace", "key_cache", "value_cache", "x", "info", "breakpoints"]
    assert complete("inf", words) == ("info ", [])
    assert complete("print max(key", words) == ("print max(key_cache", [])
    new, choices = complete("b", words)
    assert new == "b" and choices == ["backtrace", "break", "breakpoints"]
    assert complete("watch va", words)[0] == "watch value_cache "
    assert complete("zzz", words) == ("zzz", [])


def test_help_and_readme_come_from_the_one_key_table():
    shown = [k for k, _ in keys.rows()]
    for must in ("1", "2", "3", "4", "[", "]", "m", "tab / shift+tab", "=", "?"):
        assert any(must in k.split(" / ") or must == k for k in shown), must
    readme = (REPO / "README.md").read_text()
    assert keys.markdown_table() in readme
    actions = {b.action for b in keys.bindings()}
    assert {"tab('console')", "maximize_focused", "lane_step(-1)", "quit"} <= actions


def test_progress_line_only_after_half_a_second():
    p = Probe()
    p.reset("continue")
    assert p.line(p.started + 0.2) is None
    p.token, p.node = (2, 7), (45, 61)
    line = p.line(p.started + 1.5)
    assert line.startswith("running: continue") and "token 2 of 0..6" in line \
        and "node 45/61" in line and "1.5 s" in line


def reloaded(tmp_path, tok, old: str, new: str):
    """A copy of the sample with one edit, loaded, with a fresh session at its start."""
    import shutil
    folder = tmp_path / "m"
    shutil.copytree(SAMPLE, folder)
    fir = folder / "gpt2.fir"
    fir.write_text(fir.read_text().replace(old, new, 1))
    m2 = load_model(fir)
    s2 = Session(m2, tok.encode("def "), 3, engine="interp")
    return m2, s2, CommandInterpreter(s2, tok)


def test_reload_plan_re_resolves_a_moved_line(sample, tmp_path):
    model, tok = sample
    s, ci, view = fresh(sample)
    ci.run("until ln2@1")
    ci.run("break g2.attn_decode:156")
    ci.run("break attention@1 if lane == 0")
    ci.run("watch x[0:4]")
    ci.run("display max(abs(x))")
    ci.run("disable 2")
    carried = carry(s, ci)
    # two lines before the kernel body: every line number after moves by two
    m2, s2, ci2 = reloaded(tmp_path, tok, "kernel g2.attn_decode",
                           "# moved\n# moved\nkernel g2.attn_decode")
    c = next(b for b in carried.breaks if b.kernel)
    assert c.command_in(m2) == "break g2.attn_decode:158"
    notes = restore(ci2, carried)
    assert s2.node.full_name == "ln2@1" and s2.step == 0
    specs = [(bp.spec, bp.enabled) for bp in s2.breakpoints]
    assert specs == [("g2.attn_decode:158", True), ("attention@1", False), ("x[0:4]", True)]
    assert [d.text for d in ci2.displays.values()] == ["max(abs(x))"]
    assert not any(n.startswith("not restored") for n in notes)


def test_reload_lists_what_no_longer_resolves(sample, tmp_path):
    model, tok = sample
    s, ci, view = fresh(sample)
    ci.run("break g2.attn_decode:156")
    ci.run("break gelu@1")
    carried = carry(s, ci)
    m2, s2, ci2 = reloaded(tmp_path, tok, "cmplt 4 10 3", "cmplt 4 3 10")
    notes = restore(ci2, carried)
    assert [bp.spec for bp in s2.breakpoints] == ["gelu@1"]
    lost = [n for n in notes if n.startswith("not restored")]
    assert len(lost) == 1 and "g2.attn_decode:156" in lost[0] and "cmplt 4 10 3" in lost[0]


def test_views_do_not_change_when_the_session_moves(sample):
    """A StopView is frozen: a later run cannot change what is on screen."""
    s, ci, view = fresh(sample)
    ci.run("until attention@0")
    ci.run("stepi 3")
    v = view()
    before = (v.snapshot.lane.R.copy(), v.buffer.arrays[0].copy(), dict(v.kernel_counts))
    ci.run("continue")
    assert np.array_equal(v.snapshot.lane.R, before[0])
    assert np.array_equal(v.buffer.arrays[0], before[1])
    assert v.snapshot.location.node == "attention@0"
    assert re.match(r"stopped at attention@0, line \d+", v.status)


def test_reload_applies_kernel_edits_again_before_going_back(sample, tmp_path):
    model, tok = sample
    s, ci, view = fresh(sample)
    edit = REPO / "tests" / "data" / "edits" / "ln_wrong.fir"
    ci.run(f"kernel edit g2.layernorm {edit}")
    ci.run("until qkv_linear@0")
    norm = s.buffer_value("norm").copy()  # made by the edited layernorm
    carried = carry(s, ci)
    assert carried.edits == (("g2.layernorm", str(edit)),)
    m2, s2, ci2 = reloaded(tmp_path, tok, "# Resident", "# reloaded\n# Resident")
    notes = restore(ci2, carried)
    assert any(n.startswith("restored: the edit of kernel g2.layernorm") for n in notes)
    assert s2.model.edited == ("g2.layernorm",) and s2.node.full_name == "qkv_linear@0"
    assert np.array_equal(s2.buffer_value("norm"), norm)  # the way back ran the edit


def test_reload_keeps_an_edit_toggled_off(sample, tmp_path):
    model, tok = sample
    s, ci, view = fresh(sample)
    edit = REPO / "tests" / "data" / "edits" / "ln_wrong.fir"
    ci.run(f"kernel edit g2.layernorm {edit}")
    ci.run("kernel toggle g2.layernorm")  # A: the model's own code runs, the edit is kept
    carried = carry(s, ci)
    assert carried.edits_off == ("g2.layernorm",)
    m2, s2, ci2 = reloaded(tmp_path, tok, "# Resident", "# reloaded\n# Resident")
    notes = restore(ci2, carried)
    assert any(n.startswith("restored: g2.layernorm's edit toggled off") for n in notes)
    assert s2.model.edited == () and s2.kernel_edits.off == {"g2.layernorm"}
    assert "g2.layernorm" in s2.kernel_edits.blocks  # kept: kernel toggle runs it again
