"""Model-file trust fixes (issue 10.5, 10.14, 10.16).

A model file names paths, and config.json can be any file: nothing read from
a config, tokenizer or checkpoint is echoed beyond a short, escaped value;
kernel pseudo-files (/proc, /sys) are refused for every input. A required
float is compared as the float the config holds; a config key that a file
uses as a symbol but whose value is not an integer says so. Each test fails
on the commit before the fix.
"""
from __future__ import annotations

import json

import pytest

from firscope.errors import FirError
from firscope.model.tokens import load_tokenizer
from firscope.runtime import load_model
from conftest import SEED_FIR
from model_util import firscope, line_of, load_err

SEED = SEED_FIR.read_text()
SECRET = "hunter2-do-not-print"


# -- 10.5: a model file cannot make firscope print a file --------------------------------
def test_config_naming_the_process_environment_is_refused_unread(make_model):
    path = make_model("env")
    text = SEED.replace("config config.json", "config /proc/self/environ")
    path.write_text(text)
    p = firscope("check", path, env={"FIRSCOPE_TEST_SECRET": SECRET})
    assert p.returncode == 1 and SECRET not in p.stderr + p.stdout
    assert "/proc/self/environ: is not a regular file" in p.stderr
    assert f"gpt2.fir:{line_of(text, 'config /proc')}:8:" in p.stderr


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors",
                                  "model.safetensors.index.json"])
def test_every_input_refuses_kernel_pseudo_files(make_model, name):
    path = make_model("proc")
    target = path.parent / name
    if name == "model.safetensors.index.json":
        (path.parent / "model.safetensors").unlink()
    if target.exists():
        target.unlink()
    target.symlink_to("/proc/self/status")
    with pytest.raises(FirError) as e:
        if name == "tokenizer.json":
            load_tokenizer(path.parent, 256)
        else:
            load_model(path)
    assert "is not a regular file" in str(e.value) and name in str(e.value), str(e.value)
    assert "VmPeak" not in str(e.value) and "Name:" not in str(e.value)


def test_a_config_that_is_not_json_is_located_not_echoed(make_model):
    path = make_model("cfg")
    (path.parent / "config.json").write_text(f'{{"n_layer": 2,\n TOKEN={SECRET}\n}}')
    e = load_err(path)
    assert str(e).startswith(f"{path.parent / 'config.json'}:2:2: config is not valid JSON")
    assert SECRET not in str(e)


def test_config_values_shown_in_errors_are_short(make_model):
    path = make_model("long")
    cfg = json.loads((path.parent / "config.json").read_text())
    cfg["model_type"] = SECRET * 3
    cfg["activation_function"] = {"token": SECRET}
    (path.parent / "config.json").write_text(json.dumps(cfg))
    e = load_err(path)
    assert "model_type must be gpt2, config.json has a string of 60 characters" in str(e)
    assert SECRET not in str(e)
    text = SEED.replace("require config model_type gpt2\n", "")
    e = load_err(make_model("long2", fir_text=text, config_extra=cfg))
    assert "activation_function must be gelu_new, config.json has an object with 1 key" in str(e)
    assert SECRET not in str(e)


@pytest.mark.parametrize("content", [
    '{"model": {"type": "BPE", "vocab": "SECRET"}}',  # JSON, but not a tokenizer
    '{"version": "1.0", "added_tokens": "SECRET"}',
    "SECRET",  # not JSON
    '{"a": 1,\n "b": SECRET}',
])
def test_tokenizer_errors_name_the_position_not_the_content(tmp_path, content):
    content = content.replace("SECRET", SECRET)
    (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(FirError) as e:
        load_tokenizer(tmp_path, 300)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'tokenizer.json'}: cannot read tokenizer") and \
        SECRET not in msg and "hunter" not in msg, msg
    assert "(line " in msg and ", column " in msg


def test_checkpoint_header_errors_quote_no_bytes_or_values(make_model):
    path = make_model("st")
    st = path.parent / "model.safetensors"
    header = b'{"\xff' + SECRET.encode() + b'": 1}'
    st.write_bytes(len(header).to_bytes(8, "little") + header)
    e = load_err(path)
    assert "corrupt safetensors header (not JSON: not UTF-8 text at byte 10)" in str(e)
    assert "0xff" not in str(e) and SECRET not in str(e)
    st.unlink()
    (path.parent / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"wte.weight": {"token": SECRET}}}))
    e = load_err(path)
    assert "shard for 'wte.weight' must be a file name, found JSON type dict" in str(e)
    assert SECRET not in str(e)


# -- 10.14 and 10.16: config values as the file holds them ---------------------------------
def test_require_config_compares_a_float_as_the_float_the_config_holds(make_model):
    text = SEED.replace("require config model_type gpt2",
                        "require config model_type gpt2\nrequire config layer_norm_epsilon 1e-05")
    m = load_model(make_model("eps", fir_text=text))
    assert float(m.symbols["eps"]) == 1e-5
    e = load_err(make_model("eps2", fir_text=text.replace("epsilon 1e-05", "epsilon 1e-06")))
    assert "config check failed: layer_norm_epsilon must be 1e-06, config.json has 1e-05" in str(e)
    ok = text.replace("epsilon 1e-05", "epsilon 0.00001")  # the same float, written otherwise
    assert load_model(make_model("eps3", fir_text=ok)).layers == 2


@pytest.mark.parametrize("value,shown", [("true", "true"), ("2.0", "2.0"), ('"2"', '"2"')])
def test_a_config_key_used_as_a_symbol_must_hold_an_integer(make_model, value, shown):
    path = make_model("b")
    cfg = path.parent / "config.json"
    cfg.write_text(cfg.read_text().replace('"n_layer": 2', f'"n_layer": {value}'))
    e = load_err(path)
    assert (f"config key 'n_layer' is used as a symbol, so its value must be an integer; "
            f"config.json has {shown}") in str(e)
    line = line_of(SEED, "sym layers = n_layer")
    assert (e.loc.line, e.loc.col) == (line, SEED.split("\n")[line - 1].index("n_layer") + 1)


def test_kernel_operand_names_are_written_as_bound(make_model):
    """`size=in00,...` passed the check and then crashed the plan with a KeyError."""
    text = SEED.replace("size=in0,in1,out0 threads=out0.size", "size=in00,in1,out0 "
                        "threads=out0.size", 1)
    e = load_err(make_model("op", fir_text=text))
    assert "'in00' is not an operand of kernel 'g2.add'" in str(e)
    assert e.loc.line == line_of(text, "size=in00")


@pytest.mark.parametrize("secret", [
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",  # an AWS secret access key: 40 characters
    "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",  # a GitHub classic token
    "a8Fh3kLm9QzX2pR7",  # 16 random characters: short, but not a plain word
    "AKIAIOSFODNN7EXAMPLE",
])
def test_a_secret_looking_config_string_is_never_echoed(make_model, secret):
    """Issue 23.8: `require config KEY x` against a file whose value is a secret."""
    text = SEED.replace("require config model_type gpt2",
                        "require config aws_secret_access_key x")
    e = load_err(make_model("secret", fir_text=text,
                            config_extra={"aws_secret_access_key": secret}))
    assert secret not in str(e) and secret[:8] not in str(e)
    assert f"config.json has a string of {len(secret)} characters" in str(e)


@pytest.mark.parametrize("word", ["gelu_new", "float32", "GPT2LMHeadModel", "gpt2-medium"])
def test_a_plain_config_word_is_still_shown(make_model, word):
    text = SEED.replace("require config model_type gpt2", "require config model_type x")
    e = load_err(make_model("word", fir_text=text, config_extra={"model_type": word}))
    assert f'config.json has "{word}"' in str(e)
