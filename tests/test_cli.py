"""The command line as a user meets it: exit codes, messages, no tracebacks."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from firscope.runtime import load_model
from firscope.runtime import Machine
from conftest import SEED_FIR
from model_util import firscope


def fs(*args, cwd=None, timeout=300, fresh=False):
    """The command line, in this process unless ``fresh`` (tests/model_util.firscope): the
    tests of the entry point itself (``python -m firscope`` in a process of its own: exit
    status, start-up, signals) pass ``fresh=True`` or run their own subprocess."""
    p = firscope(*args, cwd=cwd, timeout=timeout, fresh=fresh)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_check_prints_summary(random_model):
    p = fs("check", random_model, fresh=True)  # `python -m firscope` itself, end to end
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for needle in ("symbols:", "headdim     = 16", "buffers:", "key_cache", "arena:",
                   "weights:", "qkvw", "q4", "kernels:", "g2.attn_decode", "75 instructions",
                   "nodes: 33 (22 micro, 11 ext)"):
        assert needle in out, needle


def test_run_tokens_and_logits_out(random_model, tmp_path):
    out = tmp_path / "l.npy"
    p = fs("run", random_model, "--tokens", "1,2,3", "-n", "4", "--ids", "--engine", "interp",
           "--logits-out", out)
    assert p.returncode == 0, p.stderr
    ids = [int(x) for x in p.stdout.strip().split(",")]
    logits = np.load(out)
    assert logits.shape == (3 + 4 - 1, 256) and logits.dtype == np.float32
    # the same run in-process gives the same logits and the greedy tokens follow them
    m = Machine(load_model(random_model))
    gen, ref = m.generate([1, 2, 3], 4)
    assert np.array_equal(np.stack(ref), logits)
    assert ids == [1, 2, 3] + gen
    assert gen[0] == int(np.argmax(logits[2])) and gen[1] == int(np.argmax(logits[3]))


def test_run_prompt_is_byte_level_and_sampling_is_seeded(random_model):
    a = fs("run", random_model, "--prompt", "hi", "-n", "5", "--ids", "--engine", "interp",
           "--temperature", "1.5", "--seed", "7")
    b = fs("run", random_model, "--prompt", "hi", "-n", "5", "--ids", "--engine", "interp",
           "--temperature", "1.5", "--seed", "7")
    assert a.returncode == 0 and a.stdout == b.stdout
    assert a.stdout.startswith("104,105,")


@pytest.mark.parametrize("args,msg,code", [
    (["--tokens", "1,999"], "token id 999 is outside the vocabulary 0..255", 1),
    # malformed ids are a usage error, before the model loads (issue 39.11)
    (["--tokens", "1,x"], "argument --tokens: item 2 ('x') is not an integer", 2),
    (["--tokens", "1", "-n", "40"], "past n_positions 32", 1),
])
def test_run_input_errors(random_model, args, msg, code):
    p = fs("run", random_model, "--engine", "interp", *args)
    assert p.returncode == code and msg in p.stderr, p.stderr


def test_prompt_needs_a_tokenizer_when_not_byte_level(make_model):
    path = make_model("v", vocab=300)
    p = fs("run", path, "--prompt", "hi", "--engine", "interp")
    assert p.returncode == 1 and "give token ids with --tokens" in p.stderr
    p = fs("run", path, "--tokens", "299", "-n", "1", "--engine", "interp")
    assert p.returncode == 0, p.stderr


def test_broken_model_file_gives_position_and_caret(make_model):
    text = SEED_FIR.read_text().replace("add 1 1 2", "add 1 1 42", 1)
    path = make_model("b", fir_text=text)
    p = fs("check", path)
    assert p.returncode == 1
    first, src, caret = p.stderr.splitlines()[:3]
    line = next(i + 1 for i, l in enumerate(text.splitlines()) if l == "add 1 1 42")
    assert first == f"{path}:{line}:9: register R42 is outside 0..31"
    assert src.strip() == "add 1 1 42" and caret.strip() == "^"


def test_missing_model_file():
    p = fs("check", "/nonexistent/model.fir", fresh=True)
    assert p.returncode == 1 and "no such file" in p.stderr


def test_tokenizer_json_beside_the_model_is_used(make_model):
    """A tokenizer.json (HF tokenizers) turns --prompt into ids and ids back into text."""
    tokenizers = pytest.importorskip("tokenizers")
    path = make_model("tok", vocab=300)
    vocab = {f"w{i}": i for i in range(298)}
    vocab.update({"hello": 298, "[UNK]": 299})
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(path.parent / "tokenizer.json"))
    from firscope.model.tokens import load_tokenizer
    t = load_tokenizer(path.parent, 300)
    assert t.kind == "tokenizer.json" and t.encode("hello w7 zzz") == [298, 7, 299]
    p = fs("run", path, "--prompt", "hello w7", "-n", "2", "--ids", "--engine", "interp")
    assert p.returncode == 0, p.stderr
    ids = [int(x) for x in p.stdout.strip().split(",")]
    assert ids[:2] == [298, 7] and len(ids) == 4
    (path.parent / "tokenizer.json").write_text("{not json")
    p = fs("run", path, "--prompt", "hello", "--engine", "interp")
    assert p.returncode == 1 and "tokenizer.json: cannot read tokenizer" in p.stderr


# --- the command line parses; a bad value is a usage error (issue 12, issue 10.13) -------------
def quick(*args, **kw):
    """A command that must end before any model is loaded."""
    return fs(*args, **kw)


@pytest.mark.parametrize("word,hint", [("chek", "did you mean check?"),
                                       ("prfile", "did you mean profile?"),
                                       ("bogus", "commands: check, run, debug, profile, sanitize, ui")])
def test_a_word_that_is_no_command_and_no_file_is_a_usage_error(word, hint, tmp_path):
    # on the base commit this opened the full-screen UI: a process of its own, which a
    # regression cannot hang
    p = fs(word, cwd=tmp_path, fresh=True)
    assert p.returncode == 2, p.stderr
    assert f"firscope: error: '{word}' is neither a command nor an existing file; {hint}" \
        in p.stderr
    p = fs("ui", tmp_path / "missing.fir")
    assert p.returncode == 2 and "missing.fir: no such file" in p.stderr


def test_an_existing_file_or_an_option_first_still_means_the_ui(tmp_path):
    from firscope.cli import build_parser, with_command
    f = tmp_path / "m.fir"
    f.write_text("fir 1\n")
    parser = build_parser()
    assert with_command(parser, [str(f), "-n", "3"]) == ["ui", str(f), "-n", "3"]
    assert with_command(parser, ["--prompt", "x"]) == ["ui", "--prompt", "x"]
    assert with_command(parser, []) == ["ui"]
    assert with_command(parser, ["check", "x"]) == ["check", "x"]
    args = parser.parse_args(with_command(parser, [str(f), "-n", "3"]))
    assert (args.command, args.model, args.n) == ("ui", str(f), 3)


def test_the_in_process_runs_are_what_a_fresh_process_gives(random_model, tmp_path):
    """Most tests run the command line in their own process (tests/model_util.firscope): the
    same exit status, output and messages as ``python -m firscope`` in a fresh one (timings
    aside), for a summary, a usage error, help, a missing file, a decode, a batch debug
    session reading stdin and a sampled run."""
    import re

    def same(text):
        return re.sub(r"\d+(\.\d+)? ?(s|ms|steps/s)\b", "T", text)

    cases = [(["check", random_model], None), (["run", random_model, "--tokens", "x"], None),
             (["run", "--help"], None), (["check", tmp_path / "missing.fir"], None),
             (["run", random_model, "--tokens", "1,2", "-n", "2", "--ids", "--engine",
               "interp", "--logits-out", tmp_path / "l.npy"], None),
             (["debug", random_model, "--tokens", "1", "-n", "1", "--engine", "interp"],
              "next\nprint x[0:2]\nbogus\n"),
             (["run", random_model, "--tokens", "1", "-n", "3", "--temperature", "0.7",
               "--seed", "5", "--engine", "interp"], None)]
    for args, given in cases:
        here = firscope(*args, input=given, cwd=tmp_path)
        fresh = firscope(*args, input=given, cwd=tmp_path, fresh=True)
        assert (here.returncode, same(here.stdout), same(here.stderr)) == \
            (fresh.returncode, same(fresh.stdout), same(fresh.stderr)), args


def test_version():
    import firscope
    p = quick("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"firscope {firscope.__version__}"


def test_help_states_the_default_of_n_and_explains_engine():
    from firscope.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    defaults = {}
    for name, sp in sub.choices.items():
        acts = {a.dest: a for a in sp._actions}
        if "n" in acts:
            assert f"(default {acts['n'].default})" in acts["n"].help, name
            defaults[name] = acts["n"].default
        # dap takes its engine from the launch request; gpu and wgsl are about the GPU engine;
        # quant's actions (sensitivity, plan) each take one
        if name == "quant":
            qsub = next(a for a in sp._actions
                        if isinstance(a, __import__("argparse")._SubParsersAction))
            for qname, qp in qsub.choices.items():
                eng = next(a for a in qp._actions if a.dest == "engine")
                assert "interp" in eng.help, qname
        elif name not in ("check", "dap", "gpu", "wgsl"):
            assert acts["engine"].help and "interp" in acts["engine"].help, name
    assert defaults == {"ui": 12, "run": 16, "debug": 16, "profile": 16, "serve": 12,
                        "sanitize": 4, "replay": 0}
    p = quick("run", "--help")
    assert p.returncode == 0 and "tokens to generate (default 16)" in p.stdout
    assert "how micro-kernels run" in quick("debug", "--help").stdout


@pytest.mark.parametrize("args,msg", [
    (["--seed", "-1"], "argument --seed: must be 0 or more (got -1)"),
    (["--seed", "x"], "argument --seed: 'x' is not a whole number"),
    (["--temperature", "nan"], "argument --temperature: must be a finite number >= 0"),
    (["--temperature", "inf"], "argument --temperature: must be a finite number >= 0"),
    (["--temperature", "-0.5"], "argument --temperature: must be a finite number >= 0"),
    (["-n", "-1"], "argument -n: must be 0 or more (got -1)"),
    (["-n", "1.5"], "argument -n: '1.5' is not a whole number"),
    (["--logits-out", ""], "argument --logits-out: the path is empty"),
])
def test_bad_values_are_usage_errors_before_loading(args, msg):
    # the model does not exist: a usage error must come before anything is opened
    p = quick("run", "/nonexistent/gpt2.fir", "--tokens", "1", *args)
    assert p.returncode == 2 and msg in p.stderr, p.stderr
    assert "internal error" not in p.stderr and "no such file" not in p.stderr


def test_prompt_that_is_not_utf8_is_a_usage_error(random_model):
    p = subprocess.run([sys.executable, "-m", "firscope", "run", str(random_model), "--prompt",
                        b"a\xffb", "--engine", "interp"], capture_output=True, timeout=120)
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert "argument --prompt: byte 0xff at character 2 is not UTF-8 text" in err
    assert "internal error" not in err and "Traceback" not in err


def test_tiny_temperature_samples_the_top_token_without_warnings(random_model):
    greedy = fs("run", random_model, "--tokens", "1,2", "-n", "4", "--ids", "--engine", "interp")
    tiny = fs("run", random_model, "--tokens", "1,2", "-n", "4", "--ids", "--engine", "interp",
              "--temperature", "1e-320", "--seed", "3")
    assert greedy.returncode == 0 and tiny.returncode == 0, tiny.stderr
    assert tiny.stdout == greedy.stdout  # no ties in random logits: the limit is greedy
    assert "Warning" not in tiny.stderr and "internal error" not in tiny.stderr


def nan_model(make_model):
    """g2.add (the embeddings' first kernel) stores inf - inf: every logit is NaN."""
    text = SEED_FIR.read_text().replace(
        "add 1 1 2", "loadconstf32 3 3e38\nmulconst 3 3 10\nsub 1 3 3", 1)
    return make_model("nan", fir_text=text)


def test_sampling_nan_logits_is_a_clear_error(make_model):
    path = nan_model(make_model)
    p = fs("run", path, "--tokens", "1", "-n", "2", "--engine", "interp", "--temperature", "1",
           "--seed", "0")
    assert p.returncode == 1, p.stderr
    assert "the logits contain NaN or Inf: there is no distribution to sample from" in p.stderr
    assert "Warning" not in p.stderr and "internal error" not in p.stderr
    greedy = fs("run", path, "--tokens", "1", "-n", "2", "--engine", "interp", "--ids")
    assert greedy.returncode == 0  # greedy decoding of NaN logits still runs, as before


# --- ctrl+c while firscope starts (issue 10.16) -------------------------------------------------
# Python itself is up and the (tiny) package imported before the first signal: a signal during
# the interpreter's own start-up ends in Python's "Fatal Python error", which no program can catch.
HARNESS = ("import runpy, sys, importlib.util, firscope; sys.argv[0] = 'firscope'; "
           "importlib.util.find_spec('firscope.__main__'); sys.stderr.write('up\\n'); "
           "sys.stderr.flush(); runpy.run_module('firscope', run_name='__main__')")


def test_ctrl_c_during_start_up_exits_130_without_a_traceback(random_model):
    """SIGINT at a sweep of moments after Python is up (importing NumPy and numba, loading
    the model): each run ends with exit 130 and one line, or finished before the signal."""
    outcomes = []
    for delay in (0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3, 0.45, 0.7):
        proc = subprocess.Popen([sys.executable, "-c", HARNESS, "check", str(random_model)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr.readline() == "up\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert "Traceback" not in err, (delay, err)
        if proc.returncode == 130:
            assert err.strip() == "firscope: interrupted", err
        else:  # finished first, or the signal came while the interpreter was shutting down
            assert proc.returncode in (0, -signal.SIGINT) and "symbols:" in out, (delay, err)
        outcomes.append(proc.returncode)
    assert outcomes.count(130) >= 3, outcomes  # the sweep did interrupt the start-up


# --- debug: exit status, first error, line numbers, bounded reading (issue 10.9, 10.16) ----------
def debug(model, *args, **kw):
    return fs("debug", model, "--tokens", "1", "-n", "1", "--engine", "interp", *args, **kw)


def test_debug_stops_at_the_first_error_and_exits_1(random_model, tmp_path):
    script = tmp_path / "s.gdb"
    script.write_text("print 1+1\nbogus\nprint 40+2\n")
    p = debug(random_model, "-x", script)
    assert p.returncode == 1, p.stderr
    assert "(firscope) print 1+1\n$ = 2\n" in p.stdout
    assert f"{script}:2: error: unknown command 'bogus'" in p.stdout
    assert "print 40+2" not in p.stdout and "$ = 42" not in p.stdout
    p = debug(random_model, "-x", script, "--keep-going")
    assert p.returncode == 1 and "(firscope) print 40+2\n$ = 42" in p.stdout
    script.write_text("print 1+1\nprint 40+2\n")
    p = debug(random_model, "-x", script)
    assert p.returncode == 0 and "$ = 42" in p.stdout


def test_debug_counts_script_lines_at_newlines_only(random_model, tmp_path):
    """A form feed (or \\x1c, \\x85, \\u2028) inside a line does not start a new one."""
    script = tmp_path / "s.gdb"
    script.write_text("# a comment\x0cwith a form feed\u2028and a line separator\nbogus\n")
    p = debug(random_model, "-x", script)
    assert p.returncode == 1
    assert f"{script}:2: error: unknown command 'bogus'" in p.stdout, p.stdout


def limited_memory():
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a regression fails, not the box


@pytest.mark.parametrize("how", ["script", "stdin"])
def test_debug_script_from_an_endless_device_is_refused(random_model, how):
    args = ["debug", random_model, "--tokens", "1", "-n", "1", "--engine", "interp"]
    with open("/dev/zero", "rb") as zero:
        p = subprocess.run([sys.executable, "-m", "firscope", *map(str, args),
                            *(["-x", "/dev/zero"] if how == "script" else [])],
                           stdin=zero, capture_output=True, text=True, timeout=120,
                           preexec_fn=limited_memory)
    where = "/dev/zero" if how == "script" else "<stdin>"
    assert p.returncode == 1, p.stderr
    assert f"firscope: {where}:1: a line of more than 65536 bytes: not a command script" \
        in p.stderr
    assert "Traceback" not in p.stderr


def test_debug_script_errors_name_the_file(random_model, tmp_path):
    p = debug(random_model, "-x", tmp_path / "missing.gdb")
    assert p.returncode == 1 and "missing.gdb: no such file" in p.stderr
    p = debug(random_model, "-x", tmp_path)
    assert p.returncode == 1 and "is a folder, expected a command script" in p.stderr
    bad = tmp_path / "bad.gdb"
    bad.write_bytes(b"print 1\nprint \xff\n")
    p = debug(random_model, "-x", bad)
    assert p.returncode == 1 and f"{bad}:2:7: not UTF-8 text" in p.stderr


# --- output paths (issue 10.7) ----------------------------------------------------------------------
def test_logits_out_writes_exactly_the_path_given(random_model, tmp_path):
    out = tmp_path / "logits"  # no .npy: np.save used to write logits.npy instead
    p = fs("run", random_model, "--tokens", "1,2", "-n", "2", "--engine", "interp",
           "--logits-out", out)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "logits.npy").exists()
    assert np.load(out).shape == (3, 256)


def test_logits_out_to_a_full_device_is_an_error_and_creates_nothing(random_model):
    made = Path("/dev/full.npy")
    assert not made.exists()
    try:
        p = fs("run", random_model, "--tokens", "1", "-n", "1", "--engine", "interp",
               "--logits-out", "/dev/full")
        assert p.returncode == 1, p.stderr
        # refused before the run: a device is not a file (issue 23.3)
        assert "/dev/full: cannot write --logits-out there: is not a regular file" in p.stderr
        assert not made.exists()
    finally:
        if made.exists() and made.is_file():
            made.unlink()


def test_output_paths_are_checked_before_anything_runs(random_model, tmp_path):
    # the model does not exist either: the output path is checked first
    p = fs("run", tmp_path / "none.fir", "--tokens", "1",
           "--logits-out", tmp_path / "no" / "such" / "dir" / "l.npy")
    assert p.returncode == 1 and "cannot write there: folder" in p.stderr, p.stderr
    p = fs("run", random_model, "--tokens", "1", "--logits-out", tmp_path)
    assert p.returncode == 1 and "is a folder; --logits-out needs a file name" in p.stderr
    # /proc exists and is a folder of files firscope did not write: refused (issue 23.15)
    p = fs("profile", random_model, "--tokens", "1", "-n", "1", "--engine", "interp",
           "-o", "/proc")
    assert p.returncode == 1 and "/proc: holds files and no firscope report" in p.stderr
    assert "timed run" not in p.stderr and "loading the model" not in p.stderr


def test_profile_output_folder_empty_path_is_refused(random_model, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    p = fs("profile", random_model, "--tokens", "1", "-n", "1", "--engine", "interp", "-o", "",
           cwd=cwd)
    assert p.returncode == 2 and "argument -o: the path is empty" in p.stderr
    assert list(cwd.iterdir()) == []  # nothing written into the current folder


def test_profile_replaces_links_in_the_report_folder_instead_of_following_them(random_model,
                                                                               tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "rep"
    out.mkdir()
    (out / "report.json").write_text('{"format": "firscope-profile"}')  # a previous report
    for name in ("report.html", "logits.npz", "node_timing.csv"):
        (out / name).symlink_to(victim)
    (out / "trace.json").symlink_to(tmp_path / "dangling")
    p = fs("profile", random_model, "--tokens", "1", "-n", "1", "--engine", "interp",
           "-o", out, timeout=300)
    assert p.returncode == 0, p.stderr
    assert victim.read_text() == "precious" and not (tmp_path / "dangling").exists()
    for name in ("report.html", "report.json", "logits.npz", "node_timing.csv", "trace.json"):
        assert (out / name).is_file() and not (out / name).is_symlink(), name
    assert json.loads((out / "report.json").read_text())["format"] == "firscope-profile"
    assert not [f for f in out.iterdir() if f.name.startswith(".")]  # no temporary files left


# --- terminal escapes from files (issue 10.6) ------------------------------------------------------
TITLE = "\x1b]0;PWNED\x07"  # sets the terminal's title
CLIPBOARD = "\x1b]52;c;SGVsbG8=\x07"  # writes the clipboard
CSI8 = "\x9b2J"  # 8-bit CSI: clears the screen on terminals that read C1 controls
RAW = ("\x1b", "\x07", "\x9b")


def no_raw_controls(text: str) -> None:
    for c in RAW:
        assert c not in text, repr(text[max(text.find(c) - 40, 0): text.find(c) + 40])


def hostile_model(make_model, name="hostile"):
    text = SEED_FIR.read_text()
    text = text.replace("model gpt2", f"model gpt2{TITLE}{CSI8}", 1)
    text = text.replace("\nrtou 0 0\n", f"\nrtou 0 0  # {CLIPBOARD}\n", 1)  # g2.add's first line
    return make_model(name, fir_text=text)


def test_error_messages_escape_the_source_line_and_keep_the_caret(make_model):
    text = SEED_FIR.read_text().replace("sym mlp = 4*hidden", f"sym mlp = 4*hidden {TITLE}+", 1)
    p = fs("check", make_model("e", fir_text=text))
    assert p.returncode == 1
    no_raw_controls(p.stderr)
    first, src, caret = p.stderr.splitlines()[:3]
    assert "\\x1b]0;PWNED\\x07" in src
    # the caret is under the character the column names, counted in the escaped line
    col = int(first.split(":")[2])
    line = text.splitlines()[int(first.split(":")[1]) - 1]
    from firscope.text import printable
    assert caret.index("^") - 4 == len(printable(line[:col - 1]))


def test_firerror_rendering_is_escaped():
    from firscope.errors import FirError, Loc
    e = FirError("bad 'x\x1b[2J' here\nsecond line", Loc("m\x9b.fir", 3, 4, "ab\x1bcd"),
                 hint="see \x07")
    assert str(e) == ("m\\x9b.fir:3:4: bad 'x\\x1b[2J' here\nsecond line\n"
                      "    ab\\x1bcd\n"
                      "          ^\n"
                      "  hint: see \\x07")


def test_check_summary_escapes_names_from_the_files(make_model):
    p = fs("check", hostile_model(make_model))
    assert p.returncode == 0, p.stderr
    no_raw_controls(p.stdout)
    assert "model 'gpt2\\x1b]0;PWNED\\x07\\x9b2J'" in p.stdout


def test_run_escapes_the_decoded_text(random_model):
    # byte-level model: ids 27 91 50 74 are ESC [ 2 J, the clear-screen sequence
    p = fs("run", random_model, "--tokens", "27,91,50,74,10,65", "-n", "0", "--engine", "interp")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "\\x1b[2J\nA\n"  # newlines stay newlines


def test_batch_output_escapes_script_and_model_text(make_model, tmp_path):
    path = hostile_model(make_model)
    script = tmp_path / "s.gdb"
    script.write_text(f"next\nnext\nstepi\nlist\nprint 1 {TITLE}\n")
    p = debug(path, "-x", script)
    assert p.returncode == 1
    no_raw_controls(p.stdout)
    assert "62  rtou 0 0  # \\x1b]52;c;SGVsbG8=\\x07\n" in p.stdout  # `list` shows the kernel
    assert "(firscope) print 1 \\x1b]0;PWNED\\x07" in p.stdout  # the script's line echoed
    assert f"{script}:5: error:" in p.stdout


def test_report_files_have_no_raw_control_characters(make_model, tmp_path):
    import csv
    path = hostile_model(make_model)
    out = tmp_path / "rep"
    p = fs("profile", path, "--tokens", "1", "-n", "1", "--engine", "interp", "-o", out,
           timeout=300)
    assert p.returncode == 0, p.stderr
    for f in out.iterdir():
        if f.suffix in (".html", ".json", ".csv"):
            no_raw_controls(f.read_text())
    html = (out / "report.html").read_text()
    assert "gpt2\\x1b]0;PWNED\\x07\\x9b2J" in html
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["family"] == f"gpt2{TITLE}{CSI8}"  # the data stays exact
    with open(out / "line_counts.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["instruction"] for r in rows)


def test_ctrl_c_lost_in_an_ignored_callback_is_delivered_again():
    """A KeyboardInterrupt raised inside a callback Python ignores (the import system's
    weakref callbacks) used to print 'Exception ignored' and vanish; it comes back."""
    code = """
import signal, sys, time, weakref
from firscope import cli
from firscope.cli import _CtrlC
sys.unraisablehook = _CtrlC.unraisable_hook(lambda info: print("other", info))
signal.signal(signal.SIGINT, _CtrlC())
cli._ACTIVE[0] = 1  # as inside main()
class A: pass
def callback(ref):
    raise KeyboardInterrupt  # as if ctrl+c arrived while the callback ran
try:
    a = A(); r = weakref.ref(a, callback); del a
    time.sleep(5)
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout == "interrupted\n" and p.stderr == "", p.stderr


def test_a_lost_ctrl_c_is_not_sent_again_once_main_has_returned():
    """The re-sent ctrl+c is for main(); after it returned, the caller (a program, a test
    runner with its own handler) must not receive a stray SIGINT."""
    code = """
import signal, sys, time, weakref
from firscope.cli import _CtrlC
got = []
signal.signal(signal.SIGINT, lambda *a: got.append("sigint"))  # the caller's own handler
hook = _CtrlC.unraisable_hook(lambda info: None)
class Info: exc_value = KeyboardInterrupt()
hook(Info())  # a ctrl+c lost just as main() returned
time.sleep(0.3)
print(got)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout == "[]\n" and p.stderr == "", p.stdout + p.stderr
