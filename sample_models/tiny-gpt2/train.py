#!/usr/bin/env python
"""Train the bundled tiny byte-level GPT-2 sample model (dev-only).

This script is NOT part of the firscope product (the product never imports
torch). It exists so the sample model in this folder can be rebuilt:

    pip install torch==2.13.0 transformers safetensors
    python sample_models/tiny-gpt2/train.py            # writes next to itself
    python sample_models/tiny-gpt2/train.py --out /tmp/tiny --steps 200

Model: HF GPT2LMHeadModel, byte-level (token id == byte value, vocab 256,
no tokenizer files), n_embd=128, n_layer=4, n_head=4, n_positions=256.

Data: the top-level ``*.py`` files of the running interpreter's standard
library (``sysconfig.get_paths()["stdlib"]``), PSF-licensed. Files are taken
in sorted order; every 10th file is held out for validation. Documents are
separated by a NUL byte (token 0, also used as bos/eos).

Training is reproducible for a given interpreter stdlib, torch version and
step count: all randomness comes from fixed seeds and the run stops by step
count, never by wall clock.
"""

import argparse
import glob
import math
import os
import sysconfig
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

SEED = 1234
SEP = 0  # document separator / bos / eos byte


def load_corpus():
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))
    train_parts, val_parts = [], []
    for i, path in enumerate(files):
        with open(path, "rb") as f:
            data = f.read() + bytes([SEP])
        (val_parts if i % 10 == 9 else train_parts).append(data)
    train = torch.frombuffer(bytearray(b"".join(train_parts)), dtype=torch.uint8)
    val = torch.frombuffer(bytearray(b"".join(val_parts)), dtype=torch.uint8)
    return stdlib, len(files), train.long(), val.long()


def get_batch(data, batch_size, seq_len, gen):
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=gen)
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    chunk = data[idx]
    return chunk[:, :-1], chunk[:, 1:]


def loss_on(model, x, y):
    logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), y.reshape(-1)
    )


@torch.no_grad()
def evaluate(model, data, batches, batch_size, seq_len, seed):
    """Mean loss (nats/byte) on fixed, seed-determined windows."""
    gen = torch.Generator().manual_seed(seed)
    model.eval()
    total = 0.0
    for _ in range(batches):
        x, y = get_batch(data, batch_size, seq_len, gen)
        total += loss_on(model, x, y).item()
    model.train()
    return total / batches


def make_config():
    return GPT2Config(
        vocab_size=256,
        n_positions=256,
        n_embd=128,
        n_layer=4,
        n_head=4,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
        bos_token_id=SEP,
        eos_token_id=SEP,
        pad_token_id=SEP,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False,
        add_cross_attention=False,
        tie_word_embeddings=True,
    )


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=here, help="output folder (default: this script's folder)")
    ap.add_argument("--steps", type=int, default=3000, help="optimizer steps (default 3000)")
    ap.add_argument("--batch", type=int, default=8, help="windows per step (default 8)")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    ap.add_argument("--eval-every", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)

    stdlib, nfiles, train, val = load_corpus()
    print(f"stdlib: {stdlib} ({nfiles} files)")
    print(f"train bytes: {train.numel():,}  val bytes: {val.numel():,}")
    counts = torch.bincount(train, minlength=256).double()
    p = counts / counts.sum()
    unigram = -(p[p > 0] * p[p > 0].log()).sum().item()
    print(f"unigram entropy baseline: {unigram:.3f} nats/byte "
          f"(uniform: {math.log(256):.3f})")

    config = make_config()
    model = GPT2LMHeadModel(config)
    model.train()
    nparams = sum(t.numel() for t in model.parameters())
    print(f"parameters: {nparams:,}")

    decay, no_decay = [], []
    for name, t in model.named_parameters():
        (decay if t.dim() >= 2 else no_decay).append(t)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    warmup = max(1, min(100, args.steps // 10))

    def lr_at(step):  # linear warmup, cosine decay to 10% of peak
        if step < warmup:
            return args.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    gen = torch.Generator().manual_seed(SEED)
    t0 = time.perf_counter()
    running = None
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        seq_len = int(torch.randint(128, 257, (1,), generator=gen))
        x, y = get_batch(train, args.batch, seq_len, gen)
        loss = loss_on(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        last = step + 1 == args.steps
        if (step + 1) % args.eval_every == 0 or last:
            v = evaluate(model, val, 8, 16, 256, seed=SEED + 1)
            el = time.perf_counter() - t0
            print(f"step {step + 1:5d}  lr {lr_at(step):.2e}  train {running:.3f} nats "
                  f"({running / math.log(2):.3f} bpb)  val {v:.3f} nats "
                  f"({v / math.log(2):.3f} bpb)  {el:6.1f}s", flush=True)

    wall = time.perf_counter() - t0
    tr = evaluate(model, train, 16, 16, 256, seed=SEED + 2)
    v = evaluate(model, val, 16, 16, 256, seed=SEED + 3)
    print(f"done: {args.steps} steps in {wall:.1f}s")
    print(f"final train loss {tr:.3f} nats/byte ({tr / math.log(2):.3f} bpb), "
          f"val loss {v:.3f} nats/byte ({v / math.log(2):.3f} bpb)")

    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    print(f"saved to {args.out}:")
    for name in sorted(os.listdir(args.out)):
        print(f"  {name}  {os.path.getsize(os.path.join(args.out, name)):,} bytes")


if __name__ == "__main__":
    main()
