"""llama.cpp as a peer for the decode benchmark (optional: only when ``llama_cpp`` imports).

Writes a GPT-2 HF safetensors checkpoint as an f32 GGUF with the ``gguf``
package (the layout of llama.cpp's own GPT-2 converter: Conv1D weights
transposed to [out, in], tied head), then quantizes it with
``llama_cpp.llama_model_quantize`` to Q4_0 / Q4_1 keeping the token embedding
(= the tied head) in f32, as the seed's gpt2.fir declares ``wte`` f32.

The GGUF carries a synthetic vocabulary (``t0``, ``t1``, ... and one merge):
the benchmark feeds token ids with ``Llama.eval``, so the tokenizer plays no
part in the timing; llama.cpp only needs one entry per id.

A library for these machines: the shared wheel
(/work/shared/peers/llama_cpp_python-0.3.36-...whl) was built with
GGML_NATIVE on a CPU with AMX and dies with SIGILL here. Its Python code is
fine; build the same llama.cpp for this CPU and point the wheel at it
(``decode.py --llama-lib``, which sets LLAMA_CPP_LIB_PATH)::

    pip download llama_cpp_python==0.3.36 --no-binary :all: --no-deps -d /tmp/sdist
    tar xzf /tmp/sdist/llama_cpp_python-0.3.36.tar.gz -C /tmp
    cd /tmp/llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF
    cmake --build build --target llama -j 2     # 5-15 minutes on 2 cores
    python benchmarks/decode.py --llama-lib build/bin

Never a dependency of firscope or its tests; nothing here is imported by them.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

QUANTS = {"Q4_0": 2, "Q4_1": 3}  # llama_ftype values (LLAMA_FTYPE_MOSTLY_Q4_0 / _1)
GGML_TYPE_F32 = 0
CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
NAMES = {  # HF GPT-2 name (without "transformer.") -> GGUF name; {i} = layer
    "wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
    "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias",
    "h.{i}.ln_1.weight": "blk.{i}.attn_norm.weight", "h.{i}.ln_1.bias": "blk.{i}.attn_norm.bias",
    "h.{i}.attn.c_attn.weight": "blk.{i}.attn_qkv.weight",
    "h.{i}.attn.c_attn.bias": "blk.{i}.attn_qkv.bias",
    "h.{i}.attn.c_proj.weight": "blk.{i}.attn_output.weight",
    "h.{i}.attn.c_proj.bias": "blk.{i}.attn_output.bias",
    "h.{i}.ln_2.weight": "blk.{i}.ffn_norm.weight", "h.{i}.ln_2.bias": "blk.{i}.ffn_norm.bias",
    "h.{i}.mlp.c_fc.weight": "blk.{i}.ffn_up.weight", "h.{i}.mlp.c_fc.bias": "blk.{i}.ffn_up.bias",
    "h.{i}.mlp.c_proj.weight": "blk.{i}.ffn_down.weight",
    "h.{i}.mlp.c_proj.bias": "blk.{i}.ffn_down.bias",
}


def available() -> str | None:
    """None when llama.cpp can be timed, else why not."""
    try:
        import gguf  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return f"llama_cpp / gguf not importable ({e.name}): llama.cpp rows skipped"
    return None


def _gguf_name(hf: str) -> str | None:
    hf = hf.removeprefix("transformer.")
    parts = hf.split(".")
    if parts[0] == "h":
        key = "h.{i}." + ".".join(parts[2:])
        target = NAMES.get(key)
        return target.replace("{i}", parts[1]) if target else None
    return NAMES.get(hf)


def write_f32_gguf(folder: Path, out: Path) -> Path:
    import gguf
    from safetensors.numpy import load_file
    cfg = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    w = gguf.GGUFWriter(str(out), "gpt2")
    w.add_name("firscope-bench-gpt2")
    w.add_context_length(cfg["n_positions"])
    w.add_embedding_length(cfg["n_embd"])
    w.add_feed_forward_length(cfg.get("n_inner") or 4 * cfg["n_embd"])
    w.add_block_count(cfg["n_layer"])
    w.add_head_count(cfg["n_head"])
    w.add_layer_norm_eps(cfg.get("layer_norm_epsilon", 1e-5))
    w.add_file_type(0)  # all f32
    vocab = cfg["vocab_size"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_token_types([1] * vocab)
    w.add_token_merges(["t 0"])  # llama.cpp requires the key; one merge is enough
    w.add_bos_token_id(vocab - 1)
    w.add_eos_token_id(vocab - 1)
    for name, t in tensors.items():
        target = _gguf_name(name)
        if target is None:
            continue  # attn.bias masks and the like
        t = np.asarray(t, dtype=np.float32)
        if name.endswith(CONV1D):
            t = np.ascontiguousarray(t.T)  # Conv1D [in, out] -> [out, in]
        w.add_tensor(target, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def quantize(src: Path, dst: Path, kind: str) -> Path:
    import llama_cpp
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = QUANTS[kind]
    p.token_embedding_type = GGML_TYPE_F32  # the tied head stays f32, like gpt2.fir's wte
    p.output_tensor_type = GGML_TYPE_F32
    p.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), p)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {kind} failed ({rc})")
    return dst


def prepare(folder: Path) -> dict[str, Path]:
    """GGUF files for every quantization in QUANTS, made once beside the checkpoint."""
    f32 = folder / "gguf-f32.gguf"
    if not f32.exists():
        write_f32_gguf(folder, f32)
    out = {}
    for kind in QUANTS:
        dst = folder / f"gguf-{kind.lower()}-f32head.gguf"
        if not dst.exists():
            quantize(f32, dst, kind)
        out[kind] = dst
    return out


def engine(path: Path, threads: int, n_ctx: int, n_batch: int = 1):
    """step(token) -> logits, warmed up, at position 0 (one Llama per process); ``n_batch``:
    tokens per batch of a prefill (decode.py's --position)."""
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                n_batch=n_batch, logits_all=False, verbose=False, use_mmap=True)

    vocab = llm.n_vocab()

    def step(tok):
        llm.eval([tok])  # logits_all=False: llama.cpp keeps the last row only
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,)).copy()

    step(0)
    llm.reset()
    return step, llm
