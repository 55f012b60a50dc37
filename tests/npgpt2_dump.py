"""A foreign runtime's dumper: the plain NumPy GPT-2 (npgpt2.py) writing issue 13's format.

Independent of firscope's VM (BLAS matmuls, NumPy reductions, tanh GELU): it
knows only the dump format, the node instance names of gpt2.fir and each
buffer's declared layout, as a user's wgpu/CUDA dumper would. Every node of
gpt2.fir has a counterpart here.
"""
from __future__ import annotations

import numpy as np

from npgpt2 import NumpyGPT2, gelu_new, layer_norm, softmax


def dump_run(gpt: NumpyGPT2, tokens: list[int], n_positions: int, emit) -> list[np.ndarray]:
    """Decode ``tokens`` from position 0; ``emit(step, instance, buffer, values)`` per node
    output. Returns the logits of every step."""
    E, H = gpt.n_embd, gpt.n_head
    hd = E // H
    k_cache = np.zeros((gpt.n_layer, n_positions, E), np.float32)  # [L, P, E]: key_cache@i
    v_cache = np.zeros_like(k_cache)
    scores = np.zeros((H, n_positions), np.float32)  # [H, P], shared by all layers
    out = []
    for pos, tok in enumerate(tokens):
        e = lambda inst, buf, v: emit(pos, inst, buf, np.asarray(v, np.float32))  # noqa: E731
        x = gpt.wte[tok]
        e("token", "x", x)
        e("positional", "pos_embed", gpt.wpe[pos])
        x = x + gpt.wpe[pos]
        e("embeddings", "x", x)
        for i, p in enumerate(gpt.layers):
            h = layer_norm(x, p["ln_1.weight"], p["ln_1.bias"], gpt.eps)
            e(f"ln1@{i}", "norm", h)
            qkv = h @ p["attn.c_attn.weight"]  # [3E]
            e(f"qkv_linear@{i}", "qkv", qkv)
            qkv = qkv + p["attn.c_attn.bias"]
            e(f"qkv_bias@{i}", "qkv", qkv)
            q, k, v = np.split(qkv, 3)
            k_cache[i, pos], v_cache[i, pos] = k, v
            K = k_cache[i, :pos + 1].reshape(pos + 1, H, hd)  # [T, H, hd]
            V = v_cache[i, :pos + 1].reshape(pos + 1, H, hd)
            att = softmax(np.einsum("hd,thd->ht", q.reshape(H, hd), K)
                          / np.float32(np.sqrt(hd)))  # [H, T]
            scores[:, :pos + 1] = att
            a = np.einsum("ht,thd->hd", att, V).reshape(E)
            e(f"attention@{i}", "attn", a)
            e(f"attention@{i}", "key_cache", k_cache[i])
            e(f"attention@{i}", "value_cache", v_cache[i])
            e(f"attention@{i}", "scores", scores)
            m = a @ p["attn.c_proj.weight"]
            e(f"attention_linear@{i}", "mix", m)
            m = m + p["attn.c_proj.bias"]
            e(f"attention_bias@{i}", "mix", m)
            x = x + m
            e(f"attention_residual@{i}", "x", x)
            h = layer_norm(x, p["ln_2.weight"], p["ln_2.bias"], gpt.eps)
            e(f"ln2@{i}", "norm", h)
            f = h @ p["mlp.c_fc.weight"]
            e(f"fc_linear@{i}", "fc", f)
            f = f + p["mlp.c_fc.bias"]
            e(f"fc_bias@{i}", "fc", f)
            f = gelu_new(f)
            e(f"gelu@{i}", "activated", f)
            m = f @ p["mlp.c_proj.weight"]
            e(f"proj_linear@{i}", "mix", m)
            m = m + p["mlp.c_proj.bias"]
            e(f"proj_bias@{i}", "mix", m)
            x = x + m
            e(f"mlp_residual@{i}", "x", x)
        h = layer_norm(x, gpt.lnf_g, gpt.lnf_b, gpt.eps)
        e("final_norm", "norm", h)
        logits = gpt.wte @ h
        e("head", "logits", logits)
        out.append(logits)
    return out


def write_numpy_dump(folder, tokens: list[int], path, *, prefix: str = "transformer.",
                     fmt_writer=None):
    """The NumPy GPT-2 of the checkpoint in ``folder``, run on ``tokens``, dumped to ``path``."""
    import json
    from safetensors.numpy import load_file
    from firscope.dump import DumpWriter
    cfg = json.loads((folder / "config.json").read_text())
    gpt = NumpyGPT2(load_file(str(folder / "model.safetensors")), cfg, prefix)
    with DumpWriter(path, tokens=tokens, producer="tests/npgpt2_dump.py") as w:
        dump_run(gpt, tokens, cfg["n_positions"], w.add)
    return path
