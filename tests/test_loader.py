"""Loading: config, requires, symbols, weights, Q4, node checks, and every load-time error."""
import json

import numpy as np
import pytest

from firscope.errors import FirError, FirFault
from firscope.runtime import Machine, load_model
from conftest import SEED_FIR
from model_util import line_of, load_err

SEED = SEED_FIR.read_text()


def with_fir(make_model, text, name="m", **kw):
    return make_model(name, fir_text=text, **kw)


def test_loads_seed_and_lays_out_arena(random_model):
    m = load_model(random_model)
    assert m.layers == 2 and m.vocab == 256 and m.family == "gpt2"
    assert int(m.symbols["headdim"]) == 16 and float(m.symbols["eps"]) == 1e-5
    assert len(m.nodes) == 3 + 14 * 2 + 2
    assert [n.full_name for n in m.nodes[:5]] == ["token", "positional", "embeddings", "ln1@0",
                                                   "qkv_linear@0"]
    kc0, kc1 = m.regions["key_cache@0"], m.regions["key_cache@1"]
    assert kc0.size == kc1.size == 32 * 64 and kc1.base == kc0.base + kc0.size
    att = m.nodes[m.node_index("attention@1")]
    assert att.args[2].display == "key_cache@1" and att.program.threads == 4
    # f32 weights live in the arena with the checkpoint's values
    from safetensors.numpy import load_file
    t = load_file(str(random_model.parent / "model.safetensors"))
    assert np.array_equal(m.view(m.weights["ln1w@1"].region), t["transformer.h.1.ln_1.weight"])
    # q4 weights: transposed to [out, in], quantized; no f32 copy until one is asked for
    q = m.weights["qkvw@0"]
    assert q.q4.rows == 192 and q.q4.cols == 64 and q.matrix is None
    src = t["transformer.h.0.attn.c_attn.weight"].T
    assert np.abs(q.dense() - src).max() <= q.q4.scale.max() / 2 + 1e-6


def test_fir_f32_keeps_exact_transposed_weights(random_model):
    m = load_model(random_model, fir_f32=True)
    from safetensors.numpy import load_file
    t = load_file(str(random_model.parent / "model.safetensors"))
    w = m.weights["fcw@1"]
    assert w.q4 is None and np.array_equal(w.matrix, t["transformer.h.1.mlp.c_fc.weight"].T)


def test_prefix_fallback_and_plain_names(make_model):
    with_prefix = load_model(make_model("a", prefix="transformer."))
    without = load_model(make_model("b", prefix=""))
    assert with_prefix.weights["wte"].tensor == "transformer.wte.weight"
    assert without.weights["wte"].tensor == "wte.weight"
    assert np.array_equal(with_prefix.arena, without.arena)


def test_sharded_checkpoint(make_model):
    path = make_model("s")
    folder = path.parent
    from safetensors.numpy import load_file, save_file
    t = load_file(str(folder / "model.safetensors"))
    names = sorted(t)
    half = len(names) // 2
    save_file({k: t[k] for k in names[:half]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({k: t[k] for k in names[half:]}, str(folder / "model-00002-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {k: f"model-0000{1 if i < half else 2}-of-00002.safetensors"
                                            for i, k in enumerate(names)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    ref = load_model(path).arena.copy()
    (folder / "model.safetensors").unlink()
    assert np.array_equal(load_model(path).arena, ref)


@pytest.mark.parametrize("old,new,msg,needle", [
    ("sym headdim = hidden/nheads", "sym headdim = hidden/nhead", "undefined symbol 'nhead'",
     "sym headdim"),
    ("buf x f32 n_embd", "buf x f32 n_embd/3", "must be an integer", "buf x f32"),
    ("require config activation_function gelu_new", "require config activation_function relu",
     "config check failed: activation_function must be relu", "require config activation"),
    ("require sym hidden = nheads*headdim", "require sym hidden = nheads*headdim+1",
     "require failed", "require sym"),
    ("node qkv_bias micro g2.add qkv qkvb -> qkv", "node qkv_bias micro g2.add qkv qkvbias -> qkv",
     "undefined buffer or weight 'qkvbias'", "node qkv_bias"),
    ("node gelu micro g2.gelu_new fc -> activated", "node gelu micro g2.gelu fc -> activated",
     "undefined kernel 'g2.gelu'", "node gelu"),
    ("weight lnfw f32 ln_f.weight tensor [n_embd]", "weight lnfw f32 ln_f.weights tensor [n_embd]",
     "tensor 'ln_f.weights' not found", "weight lnfw"),
    ("weight lnfw f32 ln_f.weight tensor [n_embd]", "weight lnfw f32 ln_f.weight tensor [n_embd,1]",
     "has shape [64], the model file declares [64, 1]", "weight lnfw"),
    ("node qkv_bias micro g2.add qkv qkvb -> qkv", "node qkv_bias micro g2.add qkv attnb -> qkv",
     "node qkv_bias@0 (layer 0): kernel 'g2.add' needs size in0 = in1, but in0 is 'qkv' (192) and "
     "in1 is 'attnb@0' (64)", "node qkv_bias"),
    ("node attention micro g2.attn_decode qkv position", "node attention micro g2.attn_decode norm position",
     "node attention@0 (layer 0): kernel 'g2.attn_decode' expects in0 to have 192 elements, 'norm' has 64",
     "node attention micro"),
    ("node fc_linear ext fir.linear norm fcw -> fc", "node fc_linear ext fir.linear norm fcw -> mix",
     "output 'mix' has 64 elements, weight 'fcw@0' [64, 256] gives 256", "node fc_linear"),
    ("node head ext fir.linear_t norm wte -> logits", "node head ext fir.matmul norm wte -> logits",
     "unknown ext op 'fir.matmul'", "node head"),
    ("uaddk 4 4 hidden-headdim", "uaddk 4 4 hidden-headdims", "undefined symbol 'headdims'",
     "uaddk 4 4 hidden"),
    ("mulconst 3 3 1/sqrt(headdim)", "mulconst 3 3 1/sqrt(headdim", "missing ')'",
     "mulconst 3 3 1/sqrt"),
    ("config config.json", "config cfg.json", "config file not found", "config cfg"),
    ("epsilon layer_norm_epsilon", "epsilon layer_norm_eps", "must be a number", "epsilon"),
])
def test_load_errors_point_at_the_directive(make_model, old, new, msg, needle):
    assert old in SEED
    text = SEED.replace(old, new, 1)
    path = with_fir(make_model, text)
    e = load_err(path)
    assert msg in str(e), str(e)
    if e.loc is not None and needle != "config cfg":
        assert e.loc.line == line_of(text, needle), str(e)
        assert str(e).startswith(f"{path}:{e.loc.line}:{e.loc.col}: ")


def test_non_integral_headdim_is_reported(make_model):
    # hidden=770, nheads=14 -> 55: fine; nheads=12 -> 64.17: error at the sym line
    path = make_model("odd", n_embd=770, n_head=12)
    e = load_err(path)
    assert "sym headdim must be an integer" in str(e) and e.loc.line == line_of(SEED, "sym headdim")


def test_missing_files_and_tensors(make_model):
    path = make_model("m")
    (path.parent / "model.safetensors").unlink()
    assert "model.safetensors: no such file" in str(load_err(path))
    path2 = make_model("m2")
    (path2.parent / "config.json").unlink()
    assert "config file not found" in str(load_err(path2))


def test_pickled_checkpoints_are_refused(make_model):
    path = make_model("p")
    (path.parent / "model.safetensors").rename(path.parent / "pytorch_model.bin")
    e = load_err(path)
    assert "pickled checkpoints are refused" in str(e)


def test_config_that_is_not_json(make_model):
    path = make_model("j")
    (path.parent / "config.json").write_text('{"n_layer": 2,\n "n_embd": 64 "x": 1}')
    e = load_err(path)
    assert "config.json:2:15: config is not valid JSON" in str(e)


@pytest.mark.parametrize("damage,msg", [
    (lambda b: b[:100], "truncated safetensors file"),
    (lambda b: b[:5], "no header"),
    (lambda b: b[:8] + b"{not json" + b[17:], "not JSON"),
    (lambda b: (10**12).to_bytes(8, "little") + b[8:], "corrupt or truncated"),
])
def test_truncated_or_corrupt_safetensors(make_model, damage, msg):
    path = make_model("c")
    st = path.parent / "model.safetensors"
    st.write_bytes(damage(st.read_bytes()))
    e = load_err(path)
    assert msg in str(e) and "model.safetensors" in str(e)


def test_memory_is_sized_before_allocating(make_model):
    text = SEED.replace("buf scores f32 n_head*n_positions", "buf scores f32 n_head*n_positions*10**9"
                        .replace("10**9", "1000000000"))
    path = with_fir(make_model, text)
    e = load_err(path)
    assert "model needs" in str(e) and "available" in str(e)


def test_runtime_errors_token_position_and_out_of_bounds(make_model):
    m = Machine(load_model(make_model("r", n_positions=4)))
    with pytest.raises(FirError, match="token id 256 is outside the vocabulary 0..255"):
        m.step(256)
    for t in (1, 2, 3, 4):
        m.step(t)
    with pytest.raises(FirError, match="past n_positions 4"):
        m.step(5)
    # a kernel that reads one element past its buffer faults, naming everything
    text = SEED.replace("uloadf32 2 0 @in1\nadd 1 1 2", "uaddk 5 0 1\nuloadf32 2 5 @in1\nadd 1 1 2")
    m2 = Machine(load_model(with_fir(make_model, text, "oob")))
    with pytest.raises(FirFault) as e:
        m2.step(1)
    f = e.value
    assert f.kernel == "g2.add" and f.node == "embeddings" and f.lane == 63
    assert "outside pos_embed[0:64]" in str(f) and f.loc.line == line_of(text, "uloadf32 2 5 @in1")
