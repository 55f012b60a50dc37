"""The command line as a user meets it: exit codes, messages, no tracebacks."""
import subprocess
import sys

import numpy as np
import pytest

from firscope.runtime import load_model
from firscope.runtime import Machine
from conftest import SEED_FIR


def fs(*args, cwd=None):
    p = subprocess.run([sys.executable, "-m", "firscope", *map(str, args)], capture_output=True,
                       text=True, cwd=cwd, timeout=300)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_check_prints_summary(random_model):
    p = fs("check", random_model)
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


@pytest.mark.parametrize("args,msg", [
    (["--tokens", "1,999"], "token id 999 is outside the vocabulary 0..255"),
    (["--tokens", "1,x"], "--tokens: item 2 ('x') is not an integer"),
    (["--tokens", "1", "-n", "40"], "past n_positions 32"),
])
def test_run_input_errors(random_model, args, msg):
    p = fs("run", random_model, "--engine", "interp", *args)
    assert p.returncode == 1 and msg in p.stderr, p.stderr


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
    p = fs("check", "/nonexistent/model.fir")
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
