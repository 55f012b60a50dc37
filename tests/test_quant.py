"""The quantization workbench (issue 42): eval, sensitivity and plan, each figure checked
against an independent computation (HF transformers on the f32 checkpoint, and the same
checkpoint dequantized by the format's Q4 rule written out here, in float64 torch)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import REPO, SAMPLE, Lazy, write_random_gpt2
from model_util import firscope

torch = Lazy("torch")
transformers = Lazy("transformers")

CORPUS = REPO / "tests" / "data" / "corpus_json_decoder.txt"  # CPython's json/decoder.py:
# not among the top-level stdlib files the sample was trained on (sample_models/.../train.py)
CTX, CHUNKS = 96, 3
LINEARS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
DECL = {"attn.c_attn": "qkvw", "attn.c_proj": "attnw", "mlp.c_fc": "fcw", "mlp.c_proj": "projw"}


def q4_rule(w_in_out: np.ndarray, group: int = 32) -> np.ndarray:
    """docs/fir-format.md's Q4, independently: transpose to [out, in], groups of G along the
    input, scale = (max-min)/15, q = clip(round((w-min)/scale), 0, 15), w' = q*scale + min in
    f32 (scale 1 and q 0 where max == min); back to Conv1D's [in, out]."""
    w = np.ascontiguousarray(w_in_out.T.astype(np.float32))
    out = np.empty_like(w)
    for g0 in range(0, w.shape[1], group):
        blk = w[:, g0:g0 + group]
        lo, hi = blk.min(axis=1, keepdims=True), blk.max(axis=1, keepdims=True)
        scale = ((hi - lo) / np.float32(15)).astype(np.float32)
        flat = hi == lo
        scale = np.where(flat, np.float32(1), scale)
        q = np.clip(np.round((blk - lo) / scale), 0, 15).astype(np.float32)
        q = np.where(flat, np.float32(0), q)
        out[:, g0:g0 + group] = q * scale + lo
    return out.T


def hf_model(folder, quantized=()):
    """GPT2LMHeadModel on the checkpoint, the Conv1D weights named in ``quantized`` (layer,
    linear) replaced by their Q4 dequantization."""
    m = transformers.GPT2LMHeadModel.from_pretrained(str(folder), torch_dtype=torch.float32)
    m.eval()
    with torch.no_grad():
        for layer, lin in quantized:
            mod = m.transformer.h[layer]
            for part in lin.split("."):
                mod = getattr(mod, part)
            mod.weight.copy_(torch.from_numpy(q4_rule(mod.weight.numpy())))
    return m


def hf_chunk_logits(m, chunks) -> list[np.ndarray]:
    with torch.no_grad():
        return [m(torch.tensor([list(map(int, c))]), use_cache=False).logits[0, :-1].numpy()
                for c in chunks]


def chunks_of(ids, ctx=CTX, n=CHUNKS):
    return [ids[i * ctx:(i + 1) * ctx] for i in range(n)]


def independent(q_logits, f_logits, chunks, first=1) -> dict:
    """PPLs, mean KLD(f32 || q4), same top-1 and RMS Δp from two lists of logits, float64."""
    lq = torch.cat([torch.log_softmax(torch.from_numpy(x[first - 1:]).double(), -1)
                    for x in q_logits])
    lf = torch.cat([torch.log_softmax(torch.from_numpy(x[first - 1:]).double(), -1)
                    for x in f_logits])
    t = torch.tensor(np.concatenate([c[first:] for c in chunks]).astype(np.int64))
    nq = -lq[torch.arange(len(t)), t]
    nf = -lf[torch.arange(len(t)), t]
    kld = torch.nn.functional.kl_div(lq, lf, log_target=True, reduction="none").sum(-1)
    dp = torch.exp(-nq) - torch.exp(-nf)
    return {"ppl_q": float(torch.exp(nq.mean())), "ppl_base": float(torch.exp(nf.mean())),
            "kld_mean": float(kld.mean()), "tokens": len(t),
            "same_top": float((lq.argmax(-1) == lf.argmax(-1)).double().mean()),
            "dp_rms": float(torch.sqrt((dp ** 2).mean())), "kld_max": float(kld.max())}


@pytest.fixture(scope="module")
def corpus_ids():
    return np.frombuffer(CORPUS.read_bytes(), dtype=np.uint8).astype(np.int64)


@pytest.fixture(scope="module")
def hf_sides(corpus_ids):
    chunks = chunks_of(corpus_ids)
    f = hf_chunk_logits(hf_model(SAMPLE), chunks)
    q = hf_chunk_logits(hf_model(SAMPLE, [(i, lin) for i in range(4) for lin in LINEARS]),
                        chunks)
    return chunks, q, f


def eval_json(*args):
    r = firscope("eval", *args, "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_eval_matches_transformers_and_the_q4_rule(hf_sides):
    chunks, q, f = hf_sides
    doc = eval_json("--corpus", CORPUS, "--ctx", CTX, "--chunks", CHUNKS)
    s, ref = doc["summary"], independent(q, f, chunks)
    assert s["tokens"] == ref["tokens"] == CHUNKS * (CTX - 1)
    assert s["ppl_q"] == pytest.approx(ref["ppl_q"], rel=1e-4)
    assert s["ppl_base"] == pytest.approx(ref["ppl_base"], rel=1e-4)
    assert s["kld_mean"] == pytest.approx(ref["kld_mean"], rel=1e-3)
    assert s["kld_max"] == pytest.approx(ref["kld_max"], rel=1e-2)
    assert s["dp_rms"] == pytest.approx(ref["dp_rms"], rel=1e-3)
    assert s["same_top"] == pytest.approx(ref["same_top"], abs=2 / ref["tokens"])
    assert s["ln_ppl_ratio"] == pytest.approx(np.log(ref["ppl_q"] / ref["ppl_base"]), abs=1e-5)
    assert s["kld_mean"] > 1e-4  # q4 changes the distribution: the comparison can fail


def test_second_half_scores_what_llama_perplexity_scores(hf_sides):
    chunks, q, f = hf_sides
    doc = eval_json("--corpus", CORPUS, "--ctx", CTX, "--chunks", CHUNKS, "--second-half")
    ref = independent(q, f, chunks, first=CTX // 2 + 1)
    assert doc["summary"]["tokens"] == CHUNKS * (CTX - 1 - CTX // 2) == ref["tokens"]
    assert doc["summary"]["kld_mean"] == pytest.approx(ref["kld_mean"], rel=1e-3)
    assert doc["summary"]["ppl_q"] == pytest.approx(ref["ppl_q"], rel=1e-4)


def test_figures_are_the_same_bits_in_one_process_and_in_workers(tmp_path):
    a = eval_json("--corpus", CORPUS, "--ctx", 48, "--chunks", 3, "--workers", 0)
    b = eval_json("--corpus", CORPUS, "--ctx", 48, "--chunks", 3, "--workers", 2)
    assert a["summary"] == b["summary"] and a["per_chunk"] == b["per_chunk"]


def test_eval_prints_chunks_and_the_summary_and_writes_every_token(tmp_path):
    r = firscope("eval", "--corpus", CORPUS, "--ctx", 64, "--chunks", 2, "-o", tmp_path / "ev")
    assert r.returncode == 0, r.stderr
    for needle in ("chunk", "Mean PPL(Q)", "Mean ln(PPL(Q)/PPL(base))", "Mean    KLD",
                   "99.0%   KLD", "Median  KLD", "RMS Δp", "Same top 1"):
        assert needle in r.stdout
    rows = (tmp_path / "ev" / "tokens.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 63
    doc = json.loads((tmp_path / "ev" / "eval.json").read_text())
    kld = np.array([float(x.split(",")[5]) for x in rows[1:]])
    assert doc["summary"]["kld_mean"] == pytest.approx(kld.mean(), rel=1e-7)


def test_sensitivity_alone_matches_an_independent_computation(corpus_ids, tmp_path):
    r = firscope("quant", "sensitivity", "--corpus", CORPUS, "--ctx", CTX, "--chunks", 2,
                 "--json", "-o", tmp_path / "s", timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = {w["name"]: w for w in doc["weights"]}
    assert len(rows) == 16 and (tmp_path / "s" / "sensitivity.svg").stat().st_size > 1000
    chunks = chunks_of(corpus_ids, n=2)
    f = hf_chunk_logits(hf_model(SAMPLE), chunks)
    for layer, lin in ((0, "attn.c_attn"), (2, "mlp.c_proj")):
        q = hf_chunk_logits(hf_model(SAMPLE, [(layer, lin)]), chunks)
        ref = independent(q, f, chunks)
        row = rows[f"{DECL[lin]}@{layer}"]
        assert row["alone"] == pytest.approx(ref["kld_mean"], rel=1e-3)
        assert row["q4_bytes"] == row["f32_bytes"] // 8 + row["f32_bytes"] // 4 // 32 * 8
    # recovered: all q4 but this one; it never costs more than all q4 by much
    assert all(w["recovered"] < doc["all_q4"]["kld_mean"] * 1.5 for w in rows.values())
    assert rows["qkvw@0"]["weighted_err"] > 0 and rows["qkvw@0"]["weight_err"] > 0


def test_suffix_replay_gives_the_figures_of_full_runs_bit_for_bit():
    """Variants run from the layer they change, from the base's records (verified per
    layer), or from position 0 of every layer (--full): the same figures to the last bit."""
    args = ("quant", "sensitivity", "--corpus", CORPUS, "--ctx", 64, "--chunks", 2, "--json")
    a, b = firscope(*args, timeout=600), firscope(*args, "--full", timeout=600)
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    da, db = json.loads(a.stdout), json.loads(b.stdout)
    assert da["weights"] == db["weights"] and da["all_q4"] == db["all_q4"]
    assert db["replayed_layers"] == [] and da["replayed_layers"] == [0, 1, 2, 3]
    assert da["runs_per_chunk"] < db["runs_per_chunk"]
    text = firscope(*args[:-1], timeout=600).stdout
    assert "variants of 4 of 4 layers ran from their layer on" in text


def test_plan_within_a_budget_beats_all_q4_and_size_alone(tmp_path):
    folder = tmp_path / "tiny"
    shutil.copytree(SAMPLE, folder)
    out = folder / "plan.fir"
    r = firscope("quant", "plan", folder, "--corpus", CORPUS, "--ctx", CTX, "--chunks", 2,
                 "--budget", "1.2MB", "--baseline", "-o", out, timeout=600)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    measured = float(text.split("measured ")[1].split()[0])
    all_q4 = float(text.split("all q4 ")[2].split(",")[0])
    by_size = float(text.split("by size alone")[1].split("measured KLD ")[1].split()[0])
    assert measured < all_q4 and measured < by_size
    # the file loads, stays within the budget, and computes what the plan measured
    from firscope.runtime import load_model
    m = load_model(out)
    q4_declared = [w for w in m.weights.values() if w.region is None]
    assert 589_824 < sum(w.nbytes for w in q4_declared) <= 1_200_000
    assert any(w.declared == "f32" for w in q4_declared)
    doc = eval_json(out, "--corpus", CORPUS, "--ctx", CTX, "--chunks", 2)
    assert doc["summary"]["kld_mean"] == pytest.approx(measured, abs=1e-6)
    # the written file differs from the original only in the marked lines
    old, new = (folder / "gpt2.fir").read_text().split("\n"), out.read_text().split("\n")
    assert len(old) == len(new)
    changed = [(a, b) for a, b in zip(old, new) if a != b]
    assert changed and all("# quant plan:" in b and b.startswith(a + " except ")
                           for a, b in changed)
    # a second plan may replace the first (firscope wrote it), never another file
    r = firscope("quant", "plan", folder, "--corpus", CORPUS, "--ctx", 32, "--chunks", 1,
                 "--kld", "0.005", "-o", folder / "config.json")
    assert r.returncode == 1 and "was not written by firscope quant plan" in r.stderr


def test_bad_input_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    one = tmp_path / "one.txt"
    one.write_bytes(b"x")
    cases = [
        (["eval", "--corpus", empty], 1, "the corpus is empty"),
        (["eval", "--corpus", one], 1, "needs at least 2 tokens"),
        (["eval", "--corpus", CORPUS, "--ctx", "257"], 2, "above the model's n_positions 256"),
        (["eval", "--corpus", CORPUS, "--ctx", "1"], 2, "at least 2 tokens"),
        (["eval", "--corpus", CORPUS, "--chunks", "0"], 2, "at least 1 chunk"),
        (["quant", "plan", "--corpus", CORPUS, "--budget", "1000", "-o",
          SAMPLE / "p.fir"], 2, "below the all-q4 size"),
        (["quant", "plan", "--corpus", CORPUS, "--kld", "-0.1", "-o", SAMPLE / "p.fir"], 2,
         "finite number >= 0"),
        (["quant", "plan", "--corpus", CORPUS, "--budget", "2MB", "-o", tmp_path / "p.fir"],
         1, "beside the model it changes"),
        (["quant", "plan", "--corpus", CORPUS, "--budget", "2MB", "--dtypes", "q4:g16,f32",
          "-o", SAMPLE / "p.fir"], 2, "'f32' is not a q4 group dtype"),
        (["quant", "sensitivity", "--corpus", CORPUS, "--dtypes", "q4:g1"], 2,
         "'q4:g1' is not a q4 group dtype"),
    ]
    for args, code, message in cases:
        r = firscope(*args)
        assert (r.returncode, message in r.stderr) == (code, True), (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert not (SAMPLE / "p.fir").exists()


def test_a_text_tokenizer_refuses_bytes_that_are_not_utf8(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    fir = write_random_gpt2(tmp_path / "m", vocab=64)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(63)} | {"[UNK]": 63},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(fir.parent / "tokenizer.json"))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"w1 w2\nw3 \xff w4\n")
    r = firscope("eval", fir, "--corpus", bad)
    assert r.returncode == 1 and f"{bad}:2:4: byte 0xff is not UTF-8" in r.stderr
    good = tmp_path / "good.txt"
    good.write_text(" ".join(f"w{i % 60}" for i in range(80)))
    doc = eval_json(fir, "--corpus", good)
    assert doc["summary"]["tokens"] == 62 and doc["ctx"] == 32  # n_positions 32: 2 chunks


def test_profile_report_carries_the_corpus_section(tmp_path):
    out = tmp_path / "rep"
    r = firscope("profile", "--tokens", "1,2", "-n", 1, "-o", out, "--corpus", CORPUS,
                 "--ctx", 32, "--chunks", 1, timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "report.json").read_text())
    c = report["corpus"]
    assert (c["ctx"], c["chunks"], len(c["weights"])) == (32, 1, 16)
    # the same figures as the command gives
    doc = json.loads(firscope("quant", "sensitivity", "--corpus", CORPUS, "--ctx", 32,
                              "--chunks", 1, "--json").stdout)
    assert c["weights"] == doc["weights"] and c["all_q4"] == doc["all_q4"]
    html = (out / "report.html").read_text()
    assert "Quantization over a corpus" in html and "href='#corpus'" in html
    assert "alone: only this weight q4" not in html  # the chart is an image, not text...
    assert html.count("data:image/svg+xml") >= 2  # ...drawn by matplotlib, embedded
    r = firscope("profile", "--tokens", "1", "-o", tmp_path / "r2", "--chunks", 2)
    assert r.returncode == 2 and "go with --corpus" in r.stderr


def test_plan_for_a_kld_target_measures_under_it_with_fewer_bytes_than_all_f32(tmp_path):
    folder = tmp_path / "tiny"
    shutil.copytree(SAMPLE, folder)
    args = ("--corpus", CORPUS, "--ctx", 64, "--chunks", 2)
    base = eval_json(folder, *args)["summary"]["kld_mean"]
    target = base / 2
    out = folder / "half.fir"
    r = firscope("quant", "plan", folder, *args, "--kld", f"{target:.6f}", "-o", out,
                 timeout=600)
    assert r.returncode == 0, r.stderr
    measured = float(r.stdout.split("measured ")[1].split()[0])
    nbytes = int(r.stdout.split("as loaded: ")[1].split()[0].replace(",", ""))
    assert measured <= target or "still above the target" in r.stdout
    assert 589_824 < nbytes < 3_145_728  # some f32, not all
    doc = eval_json(out, *args)
    assert doc["summary"]["kld_mean"] == pytest.approx(measured, abs=1e-6)


def test_a_plan_may_give_weights_another_q4_group(tmp_path):
    """--dtypes q4:g16: each instance also measured at g16; the plan picks per instance
    among q4 (g32), q4:g16 and f32, stays within the budget, and the file it writes (except
    clauses with q4:g16) loads and computes the KLD the plan measured."""
    folder = tmp_path / "tiny"
    shutil.copytree(SAMPLE, folder)
    out = folder / "plan.fir"
    r = firscope("quant", "plan", folder, "--corpus", CORPUS, "--ctx", 64, "--chunks", 2,
                 "--budget", "1.2MB", "--dtypes", "q4:g16", "-o", out, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "q4:g16: " in r.stdout and "f32: " in r.stdout
    measured = float(r.stdout.split("measured ")[1].split()[0])
    all_q4 = float(r.stdout.split("all q4 ")[2].split(",")[0])
    assert measured < all_q4
    from firscope.runtime import load_model
    m = load_model(out)
    q4_declared = [w for w in m.weights.values() if w.region is None]
    assert sum(w.nbytes for w in q4_declared) <= 1_200_000
    assert {w.declared for w in q4_declared} == {"q4", "q4:g16", "f32"}
    assert ":q4:g16" in out.read_text()
    doc = eval_json(out, "--corpus", CORPUS, "--ctx", 64, "--chunks", 2)
    assert doc["summary"]["kld_mean"] == pytest.approx(measured, abs=1e-6)


def test_an_instances_upgrades_are_the_upper_hull_of_its_options():
    from firscope.quant.planning import Row, chain
    r = Row("w@0", 0, "q4", 100, 400, gain=0.30,
            other={"q4:g16": {"bytes": 130, "gain": 0.20},   # on the hull: 0.20/30 B
                   "q4:g8": {"bytes": 190, "gain": 0.21},    # under the line g16 -> f32
                   "q4:g64": {"bytes": 90, "gain": 0.0}})    # fewer bytes, no gain
    steps = chain(r)
    assert [(u.before, u.after) for u in steps] == [("q4", "q4:g16"), ("q4:g16", "f32")]
    assert steps[0].per_byte > steps[1].per_byte
    assert steps[1].extra_bytes == 270 and steps[1].gain == pytest.approx(0.10)
