"""A plain NumPy GPT-2 (picoGPT-style): the oracle firscope is checked against.

Tiny pure functions with shape comments; f32 throughout; one token per call
with a KV cache, the way the .fir decode graph works.
"""
from __future__ import annotations

import numpy as np


def gelu_new(x):  # [n] -> [n]
    return 0.5 * x * (1 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715) * x**3)))


def layer_norm(x, g, b, eps):  # [n] -> [n]
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + np.float32(eps)) * g + b


def softmax(x):  # [..., n] -> [..., n]
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class NumpyGPT2:
    """Weights as HF GPT2 stores them (Conv1D [in, out]); decode with a KV cache."""

    def __init__(self, tensors: dict, config: dict, prefix: str = "transformer."):
        def get(name):
            if name in tensors:
                return np.asarray(tensors[name], dtype=np.float32)
            return np.asarray(tensors[prefix + name], dtype=np.float32)
        self.get = get
        self.n_layer = config["n_layer"]
        self.n_head = config["n_head"]
        self.n_embd = config["n_embd"]
        self.eps = config.get("layer_norm_epsilon", 1e-5)
        self.wte = get("wte.weight")  # [vocab, n_embd]
        self.wpe = get("wpe.weight")  # [n_positions, n_embd]
        self.layers = [{k: get(f"h.{i}.{k}") for k in (
            "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
            "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
            "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")}
            for i in range(self.n_layer)]
        self.lnf_g, self.lnf_b = get("ln_f.weight"), get("ln_f.bias")
        self.reset()

    def reset(self):
        self.k = [[] for _ in range(self.n_layer)]  # per layer: list of [n_embd]
        self.v = [[] for _ in range(self.n_layer)]

    def step(self, token: int, patch=None) -> np.ndarray:  # token -> logits [vocab]
        """``patch(layer, x) -> x`` is called in each layer after q, k, v are computed and
        before the attention output is added to the residual stream (activation patching)."""
        pos = len(self.k[0])
        x = self.wte[token] + self.wpe[pos]  # [n_embd]
        hd = self.n_embd // self.n_head
        for i, p in enumerate(self.layers):
            h = layer_norm(x, p["ln_1.weight"], p["ln_1.bias"], self.eps)
            qkv = h @ p["attn.c_attn.weight"] + p["attn.c_attn.bias"]  # [3*n_embd]
            q, k, v = np.split(qkv, 3)
            self.k[i].append(k)
            self.v[i].append(v)
            K = np.stack(self.k[i]).reshape(pos + 1, self.n_head, hd)  # [T, H, hd]
            V = np.stack(self.v[i]).reshape(pos + 1, self.n_head, hd)
            qh = q.reshape(self.n_head, hd)  # [H, hd]
            att = softmax(np.einsum("hd,thd->ht", qh, K) / np.float32(np.sqrt(hd)))  # [H, T]
            a = np.einsum("ht,thd->hd", att, V).reshape(-1)  # [n_embd]
            if patch is not None:
                x = patch(i, x)
            x = x + a @ p["attn.c_proj.weight"] + p["attn.c_proj.bias"]
            h = layer_norm(x, p["ln_2.weight"], p["ln_2.bias"], self.eps)
            f = gelu_new(h @ p["mlp.c_fc.weight"] + p["mlp.c_fc.bias"])  # [4*n_embd]
            x = x + f @ p["mlp.c_proj.weight"] + p["mlp.c_proj.bias"]
        x = layer_norm(x, self.lnf_g, self.lnf_b, self.eps)
        return self.wte @ x  # [vocab]
