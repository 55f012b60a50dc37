"""Editing a kernel where the debugger stands: ``kernel edit / replay / revert / write`` in a
batch session and through DAP (the REPL and the ``firscopeKernel`` request)."""
from __future__ import annotations

import shutil

from conftest import REPO, SAMPLE
from model_util import firscope
from test_dap_wire import Client

EDITS = REPO / "tests" / "data" / "edits"


def debug(script: str, tmp_path, *args):
    f = tmp_path / "script.txt"
    f.write_text(script)
    return firscope("debug", *args, "--tokens", "3,1,4", "-n", 1, "-x", f, timeout=300)


def test_batch_edit_replay_revert(tmp_path):
    r = debug(f"""goto ln1@0
kernel edit g2.layernorm {EDITS / 'ln_wrong.fir'}
kernel replay
next
print norm[0]
kernel revert g2.layernorm
reverse-next
next
print norm[0]
kernel edit g2.add {EDITS / 'add_regs.fir'}
goto qkv_bias@0
kernel replay
kernel replay --all
""", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "kernel g2.layernorm edited from" in out and "9 node(s) dispatch it" in out
    assert "ln1@0 (g2.layernorm): DIFFERS" in out
    assert f"stored by lane 0 at {EDITS / 'ln_wrong.fir'}:" in out
    assert "predicted on" in out and " -> " in out
    # the session ran the edit (norm from the edited code), then, reverted and gone back,
    # the original: two different values of norm[0]
    values = [line for line in out.splitlines() if line.startswith("$ = ")]
    assert len(values) == 2 and values[0] != values[1]
    assert "qkv_bias@0 (g2.add): identical at all 1 step(s)" in out
    assert "mlp_residual@3 (g2.add): identical" in out  # --all: every node that runs it


def test_batch_errors_change_nothing(tmp_path):
    r = debug(f"""kernel edit g2.add {EDITS / 'add_syntax.fir'}
kernel edit g2.gelu_new {EDITS / 'add_regs.fir'}
kernel replay
goto ln1@0
stepi
kernel edit g2.layernorm {EDITS / 'ln_wrong.fir'}
""", tmp_path, "--keep-going")
    out = r.stdout + r.stderr
    assert r.returncode == 1
    assert f"{EDITS / 'add_syntax.fir'}:5:9: register R99 is outside 0..31" in out
    assert "holds no kernel 'g2.gelu_new'" in out
    assert "no kernel is edited" in out
    assert "inside a dispatch: finish it first" in out
    assert "Traceback" not in out


def test_kernel_write_puts_the_edit_in_the_file_with_a_backup(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(SAMPLE, folder)
    fir = folder / "gpt2.fir"
    original = fir.read_text()
    f = tmp_path / "script.txt"
    f.write_text(f"kernel edit g2.add {EDITS / 'add_regs.fir'}\nkernel write\n")
    r = firscope("debug", fir, "--tokens", "3", "-n", 1, "-x", f)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (folder / "gpt2.fir.orig").read_text() == original
    new = fir.read_text().split("\n")
    old = original.split("\n")
    edit = (EDITS / "add_regs.fir").read_text().split("\n")[1:8]  # the block, no comment
    start = next(i for i, line in enumerate(old) if line.startswith("kernel g2.add "))
    end = old.index("endkernel", start)
    assert new[:start] == old[:start] and new[start: start + len(edit)] == edit
    assert new[start + len(edit):] == old[end + 1:]  # every other line untouched
    assert firscope("check", fir).returncode == 0  # it loads
    r = firscope("debug", fir, "--tokens", "3", "-n", 1, "-x", f)
    assert r.returncode == 0 and (folder / "gpt2.fir.orig.1").exists()  # never replaced


def test_dap_edit_replay_revert(sample_fir):
    c = Client()
    try:
        c.response(c.send("initialize", {"adapterID": "firscope"}))
        assert c.response(c.send("launch", {"model": str(sample_fir), "tokens": [3, 1, 4],
                                            "steps": 1, "engine": "interp",
                                            "stopOnEntry": True}))["success"]
        c.response(c.send("configurationDone", {}))
        c.wait(lambda m: m.get("event") == "stopped")
        ask = c.send("evaluate", {"expression": f"kernel edit g2.add {EDITS / 'add_wrong.fir'}",
                                  "context": "repl"})
        assert "25 node(s) dispatch it" in c.response(ask)["body"]["result"]
        res = c.response(c.send("evaluate", {"expression": "goto embeddings",
                                             "context": "repl"}))
        assert res["success"], res
        c.wait(lambda m: m.get("event") == "stopped" and m["seq"] > res["seq"])
        rep = c.response(c.send("firscopeKernel", {"action": "replay"}))
        assert rep["success"], rep
        assert "embeddings (g2.add): DIFFERS" in rep["body"]["result"]
        assert "add_wrong.fir:" in rep["body"]["result"]
        ab = c.response(c.send("firscopeKernel", {"action": "toggle", "name": "g2.add"}))
        assert "g2.add: the model's own code runs" in ab["body"]["result"]
        hist = c.response(c.send("firscopeKernel", {"action": "history"}))
        assert "g2.add: runs the model's own code now; 1 edit(s) made" in \
            hist["body"]["result"]
        back = c.response(c.send("firscopeKernel", {"action": "revert", "name": "g2.add"}))
        assert "reverted g2.add" in back["body"]["result"]
        bad = c.response(c.send("firscopeKernel", {"action": "replay"}))
        assert not bad["success"] and "no kernel is edited" in bad["message"]
        bad = c.response(c.send("firscopeKernel", {"action": "explode"}))
        assert not bad["success"] and "unknown action" in bad["message"]
    finally:
        c.close()


def test_toggle_history_and_the_version_that_ran(tmp_path):
    """A/B keeps the edit while the model's own code runs; the session says which version
    ran each node, and a stop before a node that last ran another version says so."""
    r = debug(f"""goto ln1@0
kernel edit g2.layernorm {EDITS / 'ln_wrong.fir'}
next
print norm[0]
kernel toggle
reverse-next
next
print norm[0]
kernel history
kernel toggle g2.layernorm
reverse-next
kernel replay
kernel edit g2.layernorm {EDITS / 'ln_wrong.fir'}
kernel history
kernel toggle nothing
""", tmp_path, "--keep-going")
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out  # the last line is an error
    values = [line for line in out.splitlines() if line.startswith("$ = ")]
    assert len(values) == 2 and values[0] != values[1]  # edit 1, then the model's own code
    assert "from now on g2.layernorm: the model's own code runs" in out
    assert ("note: ln1@0 at token 0 last ran edit 1 (ln_wrong.fir) of g2.layernorm; from "
            "here the model's own code runs") in out
    assert ("g2.layernorm: runs the model's own code now; 1 edit(s) made\n"
            "  token 0 ln1@0: the model's own code (1 run(s))") in out
    assert "from now on g2.layernorm: edit 1 (ln_wrong.fir) runs" in out
    assert ("note: ln1@0 at token 0 last ran the model's own code of g2.layernorm; from "
            "here edit 1 (ln_wrong.fir) runs") in out
    assert "ln1@0 (g2.layernorm): DIFFERS" in out  # replay judges the kept edit
    assert "(edit 2): 9 node(s)" in out and "2 edit(s) made" in out
    assert "kernel 'nothing' is not edited (g2.layernorm)" in out


def test_the_report_lists_the_changed_lines_with_their_counts(tmp_path):
    r = debug(f"""goto ln1@0
kernel edit g2.layernorm {EDITS / 'ln_wrong.fir'}
kernel replay
goto qkv_bias@0
kernel edit g2.add {EDITS / 'add_tg32.fir'}
kernel replay
""", tmp_path)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    import re
    assert re.search(r"changed lines \(2; - before, \+ after\):\n"
                     r" +- line \d+ +add 2 2 5 +128 exec, 100% lanes, SIMD +\d+%, [\d.]+ us\n"
                     r" +\+ line 32 +sub 2 2 5 +128 exec", out), out
    assert "SIMD efficiency 3% -> 100%" in out  # tg=32 against tg=1


def test_line_breakpoints_follow_the_instruction_into_the_edit(tmp_path):
    """A breakpoint on an original line stops at the edit's instruction in its place (and
    says the edit's file and line); one whose instruction the edit replaced by two is named
    at the edit and does not stop while the edit runs."""
    edit = tmp_path / "add_two.fir"
    edit.write_text("kernel g2.add in=2 out=1 size=in0,in1,out0 threads=out0.size tg=1 "
                    "tgbytes=16\nrtou 0 0\nuloadf32 1 0 @in0\nuloadf32 2 0 @in1\n"
                    "sub 1 1 2\nmulconst 1 1 1\nustoref32 1 0 @out0\nendkernel\n")
    r = debug(f"""break g2.add:64
break g2.add:65
goto embeddings
kernel edit g2.add {edit}
continue
where
kernel toggle g2.add
""", tmp_path, "--keep-going")
    out = r.stdout + r.stderr
    assert "Traceback" not in out
    assert ("note: breakpoint 2 at g2.add:65: the edit has no instruction in its place; it "
            "does not stop while the edit runs") in out
    assert "Breakpoint 1, g2.add:64\nembeddings (g2.add) pc 2 at add_two.fir:4" in out
    assert "#0  g2.add pc 2 at add_two.fir:4" in out
    assert "Breakpoint 2," not in out  # never stopped at


def test_list_shows_the_edits_own_lines(tmp_path):
    r = debug(f"""break g2.layernorm:112
goto ln1@0
kernel edit g2.layernorm {EDITS / 'ln_wrong.fir'}
continue
list
""", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "●▶   32  sub 2 2 5\n     33  ustoref32 2 0 @out0" in r.stdout
