"""firscope.runtime.opening (a model, its tokenizer, the prompt, output paths) and
firscope.text (file text made safe for a terminal), used by every front end."""
import io
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firscope.errors import FirError
from firscope.runtime import opening as O
from firscope.text import json_text, printable, undecodable


# --- text ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw,shown", [
    ("plain é ü 中 \t tab", "plain é ü 中 \t tab"),
    ("\x1b]0;t\x07", "\\x1b]0;t\\x07"),
    ("a\rb\nc", "a\\rb\\nc"),
    ("\x9b2J\x7f\x00", "\\x9b2J\\x7f\\x00"),
    ("abc\u202edcba", "abc\\u202edcba"),  # bidi override ("Trojan Source")
    ("line\u2028sep", "line\\u2028sep"),
    ("bad\udcffbyte", "bad\\udcffbyte"),  # a non-UTF-8 byte of a file name
])
def test_printable(raw, shown):
    assert printable(raw) == shown
    assert printable(shown) == shown  # escaping twice changes nothing
    shown.encode("utf-8")  # always encodable


def test_printable_keeps_newlines_when_asked():
    assert printable("a\nb\x1b", newlines=True) == "a\nb\\x1b"
    assert printable(3) == "3"


@settings(max_examples=300, derandomize=True)
@given(st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x2100)
               | st.sampled_from(["\x1b", "\x9b", "\u202e", "\u2028", "\udc80", "\n"])))
def test_printable_leaves_nothing_a_terminal_acts_on(s):
    out = printable(s)
    assert not any(ord(c) < 0x20 and c != "\t" or 0x7f <= ord(c) <= 0x9f for c in out)
    assert not any(c in out for c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
    out.encode("utf-8")
    # JSON keeps the data exact and the document free of raw controls
    doc = json_text(json.dumps({"k": s}, ensure_ascii=False))
    assert json.loads(doc) == {"k": s}
    assert printable(doc) == doc


def test_undecodable():
    assert undecodable("fine é") is None
    assert undecodable("ab\udcffc") == "byte 0xff at character 3 is not UTF-8 text"
    assert undecodable("\ud800") == "U+D800 at character 1 is not UTF-8 text"


# --- opening a model ------------------------------------------------------------------------------
def test_resolve_model(tmp_path):
    assert O.resolve_model(None).name == "gpt2.fir" and O.resolve_model(None).is_file()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "gpt2.fir").write_text("")
    (tmp_path / "a" / "other.fir").write_text("")
    assert O.resolve_model(tmp_path / "a") == tmp_path / "a" / "gpt2.fir"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "only.fir").write_text("")
    assert O.resolve_model(str(tmp_path / "b")) == tmp_path / "b" / "only.fir"
    (tmp_path / "b" / "two.fir").write_text("")
    with pytest.raises(FirError, match="a folder; give the .fir file inside it"):
        O.resolve_model(tmp_path / "b")
    assert O.resolve_model("x/y.fir") == O.Path("x/y.fir")


@pytest.mark.parametrize("group", [0, -3, (1 << 20) + 1])
def test_open_model_checks_the_group_first(group):
    with pytest.raises(FirError, match=f"--group {group}: must be a positive group size"):
        O.open_model("/nonexistent.fir", group=group)


def test_prompt_ids(random_model):
    model = O.open_model(random_model, fir_f32=True)
    assert O.prompt_ids(model, tokens="3, 4,5")[0] == [3, 4, 5]
    assert O.prompt_ids(model, tokens=(7, 8), prompt="ignored")[0] == [7, 8]
    assert O.prompt_ids(model, prompt="hi")[0] == [104, 105]  # byte-level: 256 tokens
    ids, tok = O.prompt_ids(model)
    assert ids == list(O.DEFAULT_PROMPT.encode()) and tok.kind == "bytes"
    for kw, msg in [({"prompt": ""}, "--prompt: the prompt encodes to no tokens"),
                    ({"tokens": ""}, "--tokens: no token ids given"),  # not the default prompt
                    ({"tokens": []}, "--tokens: no token ids given"),
                    ({"tokens": "1,256"}, "token id 256 is outside the vocabulary 0..255"),
                    ({"tokens": [-1]}, "token id -1 is outside the vocabulary"),
                    ({"prompt": "a\udcffb"}, "--prompt: byte 0xff at character 2 is not UTF-8")]:
        with pytest.raises(FirError, match=msg.replace("(", r"\(")):
            O.prompt_ids(model, **kw)


def test_run_input_opens_model_and_prompt(random_model):
    opened = O.RunInput(model=str(random_model.parent), tokens="1,2", fir_f32=True).open()
    assert opened.ids == (1, 2) and opened.model.path == random_model and opened.model.fir_f32
    assert opened.tokenizer.kind == "bytes"


def test_check_steps():
    assert O.check_steps(0) == 0
    with pytest.raises(FirError, match="-n must be 0 or more"):
        O.check_steps(-1)


# --- output paths --------------------------------------------------------------------------------
def test_check_output_folder(tmp_path):
    assert O.check_output_folder(tmp_path / "a" / "b").is_dir()
    assert list((tmp_path / "a" / "b").iterdir()) == []  # the probe file is gone
    (tmp_path / "f").write_text("")
    with pytest.raises(FirError, match="it exists and is not a folder"):
        O.check_output_folder(tmp_path / "f")
    with pytest.raises(FirError, match="cannot create the report folder"):
        O.check_output_folder(tmp_path / "f" / "sub")
    with pytest.raises(FirError, match="-o: the path is empty"):
        O.check_output_folder("")
    with pytest.raises(FirError, match="/proc: cannot write into the report folder"):
        O.check_output_folder("/proc")


def test_check_output_file(tmp_path):
    assert O.check_output_file(tmp_path / "x", "--out") == tmp_path / "x"
    assert not (tmp_path / "x").exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(FirError, match="/dev/null: cannot write --out there: is not a regular"):
        O.check_output_file("/dev/null", "--out")  # devices are refused (issue 23.3)
    with pytest.raises(FirError, match="is a folder; --out needs a file name"):
        O.check_output_file(tmp_path, "--out")
    with pytest.raises(FirError, match="cannot write there: folder .* does not exist"):
        O.check_output_file(tmp_path / "no" / "x", "--out")
    with pytest.raises(FirError, match="--out: the path is empty"):
        O.check_output_file("", "--out")


def test_write_output_refuses_links_and_devices_and_replaces_regular_files(tmp_path):
    target = tmp_path / "target.npy"
    target.write_bytes(b"old")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(FirError, match="link: cannot write the logits there: is a symbolic link"):
        O.write_output(link, b"new", "the logits")
    assert link.is_symlink() and target.read_bytes() == b"old"
    O.write_output(tmp_path / "plain", b"data", "the logits")
    assert (tmp_path / "plain").read_bytes() == b"data"
    O.write_output(target, b"new", "the logits")
    assert target.read_bytes() == b"new"
    for device in ("/dev/null", "/dev/full", "/dev/stdout"):
        with pytest.raises(FirError, match="cannot write the logits there: is "):
            O.write_output(device, b"x" * 10, "the logits")
    assert not os.path.exists("/dev/full.npy")


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "l.npy"
    target.write_bytes(b"old")

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(O.os, "replace", fail)
    with pytest.raises(FirError, match="l.npy: cannot write the logits: No space left"):
        O.write_output(target, b"new", "the logits")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["l.npy"]


def test_write_into_folder_replaces_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").symlink_to(victim)
    path = O.write_into_folder(out, "report.html", "<html>\x1b</html>")
    assert victim.read_text() == "precious"
    assert path.read_text() == "<html>\x1b</html>" and not path.is_symlink()
    assert sorted(p.name for p in out.iterdir()) == ["report.html"]


# --- batch mode through the API -----------------------------------------------------------------
def test_run_batch_returns_1_when_a_command_failed(random_model):
    from firscope.debug.batch import run_batch
    src = O.RunInput(model=str(random_model), tokens="1")
    out = io.StringIO()
    assert run_batch(src, n=1, engine="interp", stdin=io.StringIO("print 2*3\n"), out=out) == 0
    assert "$ = 6" in out.getvalue()
    out = io.StringIO()
    code = run_batch(src, n=1, engine="interp", out=out,
                     stdin=io.BytesIO(b"nope\r\nprint 2*3\r\n"), keep_going=True)
    assert code == 1 and "<stdin>:1: error: unknown command 'nope'" in out.getvalue()
    assert "$ = 6" in out.getvalue()


def test_script_lines_split_at_newline_only_and_are_bounded():
    from firscope.debug.batch import script_lines
    lines = list(script_lines(io.BytesIO(b"a\x0cb\r\n\xc3\xa9\xc2\x85x\n\nlast"), "s"))
    assert lines == [(1, "a\x0cb"), (2, "é\x85x"), (3, ""), (4, "last")]
    with pytest.raises(FirError, match="s:2: a line of more than 8 bytes"):
        list(script_lines(io.BytesIO(b"ok\n" + b"x" * 9), "s", max_line=8))
    with pytest.raises(FirError, match="s:3: more than 10 bytes of commands"):
        list(script_lines(io.BytesIO(b"abcd\nabcd\nabcd\n"), "s", max_total=10))
    with pytest.raises(FirError, match="s:1:3: not UTF-8 text"):
        list(script_lines(io.BytesIO(b"ab\xff\n"), "s"))


def test_profile_model_shares_the_n_rule(random_model):
    from firscope.runtime import load_model
    from firscope.profile.report import profile_model
    with pytest.raises(FirError, match="-n must be 0 or more"):
        profile_model(load_model(random_model), [1], -1, engine="interp")
