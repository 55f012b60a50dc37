from pathlib import Path

import pytest

from firscope.errors import FirError
from firscope.fir import parse_file, parse_text
from firscope.fir import syntax as S


def test_seed_file_parses_with_positions(sample_fir):
    fir = parse_file(sample_fir)
    kinds = {type(d).__name__ for d in fir.directives}
    assert {"Version", "ModelName", "ConfigPath", "RuntimeKind", "Epsilon", "Prefix",
            "RequireConfig", "Sym", "RequireSym", "Buf", "Weight", "Kernel", "Node",
            "Repeat"} <= kinds
    kernels = {k.name.text: k for k in fir.of(S.Kernel)}
    assert set(kernels) == {"g2.add", "g2.gelu_new", "g2.layernorm", "g2.attn_decode"}
    attn = kernels["g2.attn_decode"]
    assert len(attn.body) == 75
    lines = fir.lines
    # every instruction knows the line and column it came from
    for ins in attn.body:
        assert lines[ins.loc.line - 1].split("#")[0].split()[0] == ins.mnemonic.text
        assert ins.loc.col == 1
    rep = fir.of(S.Repeat)[0]
    assert len(rep.body) == 14 and rep.body[0].name.text == "ln1"
    w = [d for d in fir.of(S.Weight) if d.name.text == "qkvw"][0]
    assert w.per_layer and w.dtype.text == "q4" and len(w.shape) == 2
    assert w.shape[1].loc.col == lines[w.loc.line - 1].index("*n_embd]") + 1  # the operator


def err(text):
    with pytest.raises(FirError) as e:
        parse_text(text, "bad.fir")
    return e.value


@pytest.mark.parametrize("text,msg,line,col", [
    ("fir 1\nmodle gpt2\n", "unknown directive 'modle'", 2, 1),
    ("fir 2\n", "unsupported format version", 1, 5),
    ("model gpt2\n", "missing 'fir 1' header", 1, 1),
    ("fir 1\nsym x 3\n", "expected 'sym NAME = EXPR'", 2, 7),
    ("fir 1\nbuf x f32\n", "missing operands for 'buf'", 2, 10),
    ("fir 1\nbuf x f16 4\n", "unsupported buffer dtype", 2, 7),
    ("fir 1\nbuf x f32 4 per_lyer\n", "unknown or repeated buffer flag", 2, 13),
    ("fir 1\nweight w q8 a tensor [1]\n", "unknown weight dtype", 2, 10),
    ("fir 1\nweight w f32 a tensor 1,2\n", "shape must be written", 2, 23),
    ("fir 1\nkernel k in=1 out=1 threads=1 tg=1\nendkernel\n", "lacks 'tgbytes='", 2, 35),
    ("fir 1\nkernel k in=1 out=1 threads=1 tg=1 tgbytes=4 color=3\nendkernel\n",
     "unknown kernel field 'color'", 2, 46),
    ("fir 1\nkernel k in=1 out=1 threads=1 tg=1 tgbytes=4\nrtou 0 0\n",
     "has no 'endkernel'", 2, 1),
    ("fir 1\nkernel k in=1 out=1 threads=1 tg=1 tgbytes=4\nrtou 0 0\nnode a ext x y -> z\n",
     "missing 'endkernel'", 4, 1),
    ("fir 1\nendkernel\n", "'endkernel' without a matching", 2, 1),
    ("fir 1\nrepeat 2\nnode a ext fir.linear x w -> y\n", "'repeat' has no 'endrepeat'", 2, 1),
    ("fir 1\nendrepeat\n", "'endrepeat' without a matching", 2, 1),
    ("fir 1\nrepeat 2\nrepeat 3\nendrepeat\nendrepeat\n", "nested 'repeat'", 3, 1),
    ("fir 1\nnode a ext fir.linear x w y\n", "exactly one '->'", 2, 28),
    ("fir 1\nnode a ext fir.linear x w ->\n", "at least one output", 2, 29),
    ("fir 1\nnode a gpu fir.linear x w -> y\n", "node kind must be", 2, 8),
    ("fir 1\nrequire config a\n", "missing operands", 2, 17),
    ("fir 1\nrequire sym a == b\n", "one '='", 2, 13),
])
def test_syntax_errors_name_file_line_col(text, msg, line, col):
    e = err(text)
    assert msg in e.message
    assert (e.loc.line, e.loc.col) == (line, col), str(e)
    out = str(e)
    assert out.startswith(f"bad.fir:{line}:{col}: ")
    src, caret = out.splitlines()[1:3]
    assert caret.index("^") - 4 == col - 1  # caret under the column


def test_comments_and_blank_lines_are_ignored():
    fir = parse_text("# head\n\nfir 1   # version\n  model   gpt2 # name\n", "c.fir")
    assert fir.of(S.ModelName)[0].name.text == "gpt2"
    assert fir.of(S.ModelName)[0].name.loc.col == 11


def test_flattened_file_gets_a_hint(tmp_path, sample_fir):
    flat = tmp_path / "flat.fir"
    flat.write_text(" ".join(Path(sample_fir).read_text().splitlines()))
    with pytest.raises(FirError) as e:
        parse_file(flat)
    assert "line breaks may have been lost" in str(e.value)


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(FirError, match="no such file"):
        parse_file(tmp_path / "nope.fir")
    bad = tmp_path / "bin.fir"
    bad.write_bytes(b"fir 1\nmodel \xff\xfe\n")
    with pytest.raises(FirError, match="not UTF-8") as e:
        parse_file(bad)
    assert (e.value.loc.line, e.value.loc.col) == (2, 7)
