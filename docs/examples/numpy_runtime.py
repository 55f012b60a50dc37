"""A "foreign runtime" writing a firscope dump: GPT-2 decode in plain NumPy, f32 weights.

    python docs/examples/numpy_runtime.py OUT.safetensors [--model-dir DIR] [--tokens 1,2,3]
                                          [--bug scale|lasthead]

Stands for your wgpu/CUDA/Metal runtime: it knows nothing of firscope except
the dump format (docs/dump-format.md) and firscope/dump.py's DumpWriter (a
NumPy-only module: copy it next to your code if you like). After each of its
kernels it stores the output under the node instance the .fir file names
(``attention@3``) and the buffer the .fir declares (``attn``), in the
buffer's layout. Only a few nodes are dumped here; dump more where you look
for a bug. ``--bug`` plants a realistic mistake: ``scale`` scales the attention
scores by 1/sqrt(n_embd) instead of 1/sqrt(head_dim); ``lasthead`` computes
attention for n_head - 1 heads only (a launch grid one short), so the last
head's output stays zero.

Its products, exp and tanh are computed in f64 and rounded to f32: f32 BLAS
and NumPy's f32 SIMD loops give other last bits on other CPUs, and the
README quotes this runtime's figures (a runtime of your own need not).

Then:  firscope diff --fir-f32 --against OUT.safetensors
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout: firscope/dump.py
from firscope.dump import DumpWriter  # noqa: E402  (NumPy only, no other firscope import)

SAMPLE = Path(__file__).resolve().parents[2] / "sample_models" / "tiny-gpt2"


def f32(a):  # f64 work -> the f32 value this runtime stores
    return np.asarray(a).astype(np.float32)


def mm(a, b):  # a @ b, accumulated in f64
    return f32(np.asarray(a, np.float64) @ np.asarray(b, np.float64))


def layer_norm(x, g, b, eps):  # [n] -> [n]
    mean = x.mean()
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean() + np.float32(eps)) * g + b


def gelu(x):  # [n] -> [n]
    inner = np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715) * (x * x * x))
    return 0.5 * x * (1 + f32(np.tanh(inner.astype(np.float64))))


def run(folder: Path, tokens: list[int], out: Path, bug: str | None) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    t = load_file(str(folder / "model.safetensors"))
    w = lambda name: t.get(name, t.get("transformer." + name))  # noqa: E731  HF's two layouts
    E, H, P = cfg["n_embd"], cfg["n_head"], cfg["n_positions"]
    hd = E // H
    scale = np.float32(1 / np.sqrt(E if bug == "scale" else hd))
    K = np.zeros((cfg["n_layer"], P, E), np.float32)  # key_cache@i: [positions, n_embd]
    V = np.zeros_like(K)
    with DumpWriter(out, tokens=tokens, producer="docs/examples/numpy_runtime.py") as dump:
        for pos, tok in enumerate(tokens):  # one decode step per token
            x = w("wte.weight")[tok] + w("wpe.weight")[pos]
            dump.add(pos, "embeddings", "x", x)
            for i in range(cfg["n_layer"]):
                p = lambda n: w(f"h.{i}.{n}")  # noqa: E731
                h = layer_norm(x, p("ln_1.weight"), p("ln_1.bias"), cfg["layer_norm_epsilon"])
                q, k, v = np.split(mm(h, p("attn.c_attn.weight")) + p("attn.c_attn.bias"), 3)
                K[i, pos], V[i, pos] = k, v
                s = f32(np.einsum("hd,thd->ht", q.reshape(H, hd).astype(np.float64),
                                  K[i, :pos + 1].reshape(-1, H, hd))) * scale  # [H, T]
                s = f32(np.exp((s - s.max(-1, keepdims=True)).astype(np.float64)))
                s /= s.sum(-1, keepdims=True)
                a = f32(np.einsum("ht,thd->hd", s.astype(np.float64),
                                  V[i, :pos + 1].reshape(-1, H, hd))).reshape(E)
                if bug == "lasthead":
                    a[(H - 1) * hd:] = 0
                dump.add(pos, f"attention@{i}", "attn", a)  # the kernel's output buffer
                dump.add(pos, f"attention@{i}", "key_cache", K[i])  # the whole cache, as laid out
                x = x + mm(a, p("attn.c_proj.weight")) + p("attn.c_proj.bias")
                dump.add(pos, f"attention_residual@{i}", "x", x)
                h = layer_norm(x, p("ln_2.weight"), p("ln_2.bias"), cfg["layer_norm_epsilon"])
                x = x + mm(gelu(mm(h, p("mlp.c_fc.weight")) + p("mlp.c_fc.bias")),
                           p("mlp.c_proj.weight")) + p("mlp.c_proj.bias")
                dump.add(pos, f"mlp_residual@{i}", "x", x)
            h = layer_norm(x, w("ln_f.weight"), w("ln_f.bias"), cfg["layer_norm_epsilon"])
            dump.add(pos, "head", "logits", mm(w("wte.weight"), h))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model-dir", type=Path, default=SAMPLE)
    ap.add_argument("--tokens", default="32,32,32,32,105,102,32")  # "    if "
    ap.add_argument("--bug", choices=["scale", "lasthead"])
    args = ap.parse_args()
    run(args.model_dir, [int(x) for x in args.tokens.split(",")], args.out, args.bug)
    return 0


if __name__ == "__main__":
    sys.exit(main())
