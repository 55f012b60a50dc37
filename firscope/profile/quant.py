"""What int4 costs: weight error, activation error, and logit divergence.

* :func:`weight_stats` compares every q4 weight with its original f32
  values from the checkpoint, as llama.cpp's ``quantize-stats`` does (rmse,
  max error, 95th percentile and median of ``|error|``, a histogram of
  ``|error|`` in 150 buckets over [0, 0.03)), plus the range of the group
  scales and minimums.
* :func:`compare_run` feeds the same tokens to the q4 model and to a shadow
  model loaded with ``fir_f32=True``, node by node in lockstep, and compares
  every node output (relative L2, max abs, cosine, SQNR) and the logits of
  every step (KL(P_f32 || P_q4), same top-1, change in the probability of
  the f32 top token, as ``llama-perplexity --kl-divergence`` reports them).

All arithmetic here is f64 on f32 data, so the numbers do not depend on
summation order in f32.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import FirError
from ..model.checkpoint import Checkpoint
from ..runtime import Model, load_model
from .collect import make_machine, preserved_state
from .data import ActivationError, LogitStats, QuantComparison, WeightStats
from .progress import Progress, Silent

HIST_BUCKETS = 150  # llama.cpp quantize-stats: HISTOGRAM_BUCKETS
HIST_RANGE = 0.03  # llama.cpp quantize-stats: HISTOGRAM_RANGE (of |error|)


# -- weights ---------------------------------------------------------------------------
def error_histogram(abs_err: np.ndarray, buckets: int = HIST_BUCKETS,
                    hist_range: float = HIST_RANGE) -> np.ndarray:
    """Counts of ``|error|`` per bucket of width range/buckets; the last bucket takes the rest."""
    idx = np.floor(abs_err / hist_range * buckets)
    idx = np.clip(idx, 0, buckets - 1).astype(np.int64)
    return np.bincount(idx.ravel(), minlength=buckets).astype(np.int64)


def bucket_quantile(hist: np.ndarray, q: float, hist_range: float = HIST_RANGE) -> float:
    """llama.cpp's ``find_quantile``: the upper edge of the first bucket reaching ``q``."""
    total = float(hist.sum())
    acc = 0.0
    for i, c in enumerate(hist):
        acc += float(c)
        if acc >= total * q:
            return (i + 1) * hist_range / len(hist)
    return math.inf


def flat_group_mask(codes: np.ndarray, group: int, ngroups: int) -> np.ndarray:
    """bool [rows, ngroups]: groups whose max equalled their min (every code 0).

    Any other group maps its maximum to code 15, so "all codes 0" is exact.
    """
    rows, cols = codes.shape
    pad = ngroups * group - cols
    if pad:
        codes = np.pad(codes, ((0, 0), (0, pad)))
    return ~codes.reshape(rows, ngroups, group).any(axis=2)


def error_stats(name: str, decl: str, layer: int | None, tensor: str, original: np.ndarray,
                q4, *, buckets: int = HIST_BUCKETS, hist_range: float = HIST_RANGE) -> WeightStats:
    """Stats of ``original - q4.dequantize()``; ``original`` is f32 [out, in]."""
    deq = q4.dequantize()
    if deq.shape != original.shape:
        raise ValueError(f"{name}: original {original.shape} vs dequantized {deq.shape}")
    err = original.astype(np.float64) - deq.astype(np.float64)
    abs_err = np.abs(err).ravel()
    hist = error_histogram(abs_err, buckets, hist_range)
    flat = flat_group_mask(q4.codes(), q4.group, q4.ngroups)
    real = ~flat
    scale = q4.scale.astype(np.float64)[real]
    mins = q4.minimum.astype(np.float64)
    nan = float("nan")
    return WeightStats(
        name=name, decl=decl, layer=layer, tensor=tensor, shape=tuple(original.shape),
        group=q4.group, count=int(err.size),
        rmse=float(np.sqrt(np.mean(err * err))),
        max_abs=float(abs_err.max()) if abs_err.size else 0.0,
        mean_abs=float(abs_err.mean()) if abs_err.size else 0.0,
        p95_abs=float(np.percentile(abs_err, 95)) if abs_err.size else 0.0,
        median_abs=float(np.median(abs_err)) if abs_err.size else 0.0,
        p95_bucket=bucket_quantile(hist, 0.95, hist_range),
        median_bucket=bucket_quantile(hist, 0.5, hist_range),
        weight_rms=float(np.sqrt(np.mean(original.astype(np.float64) ** 2))),
        hist=hist, hist_range=hist_range,
        scale_min=float(scale.min()) if scale.size else nan,
        scale_max=float(scale.max()) if scale.size else nan,
        scale_mean=float(scale.mean()) if scale.size else nan,
        min_min=float(mins.min()), min_max=float(mins.max()),
        groups=int(flat.size), flat_groups=int(flat.sum()))


def weight_stats(model: Model, *, progress: Progress | None = None) -> list[WeightStats]:
    """Quantization error of every q4 weight of ``model`` (empty under --fir-f32)."""
    progress = progress or Silent()
    entries = [w for w in model.weights.values() if w.q4 is not None]
    if not entries:
        return []
    ckpt = Checkpoint(model.config_path.parent)
    out = []
    progress.phase("weight quantization error", len(entries))
    for i, w in enumerate(entries):
        original = np.ascontiguousarray(ckpt.read(w.tensor).T)  # Conv1D [in, out] -> [out, in]
        out.append(error_stats(w.name, w.decl, w.layer, w.tensor, original, w.q4))
        progress.tick(i + 1)
    progress.end()
    return out


def total_stats(stats: list[WeightStats]) -> dict | None:
    """All weights together (llama.cpp's whole-model line), from the per-weight numbers."""
    if not stats:
        return None
    count = sum(s.count for s in stats)
    sq = sum(s.rmse ** 2 * s.count for s in stats)
    hist = np.sum([s.hist for s in stats], axis=0)
    hist_range = stats[0].hist_range
    return {"weights": len(stats), "count": count, "rmse": math.sqrt(sq / count),
            "max_abs": max(s.max_abs for s in stats),
            "mean_abs": sum(s.mean_abs * s.count for s in stats) / count,
            "p95_bucket": bucket_quantile(hist, 0.95, hist_range),
            "median_bucket": bucket_quantile(hist, 0.5, hist_range),
            "hist": hist, "hist_range": hist_range}


# -- activations and logits ------------------------------------------------------------
def compare_vectors(q: np.ndarray, f: np.ndarray) -> tuple[float, float, float, float, float,
                                                             float]:
    """(rel_l2, max_abs, cosine, sqnr_db, signal, noise) of ``q`` against reference ``f``."""
    q = q.astype(np.float64).ravel()
    f = f.astype(np.float64).ravel()
    e = q - f
    signal = float(f @ f)
    noise = float(e @ e)
    qq = float(q @ q)
    if signal > 0:
        rel = math.sqrt(noise / signal)
    else:
        rel = 0.0 if noise == 0 else math.inf
    max_abs = float(np.abs(e).max()) if e.size else 0.0
    if signal > 0 and qq > 0:
        cos = float(q @ f) / math.sqrt(signal * qq)
    else:
        cos = 1.0 if signal == qq == 0 else 0.0
    if noise > 0:
        sqnr = 10 * math.log10(signal / noise) if signal > 0 else -math.inf
    else:
        sqnr = math.inf
    if not np.isfinite(e).all():
        rel = max_abs = cos = sqnr = math.nan
    return rel, max_abs, cos, sqnr, signal, noise


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    m = z.max()
    return z - (m + np.log(np.exp(z - m).sum()))


def logit_stats(step: int, position: int, token: int, logits_q4: np.ndarray,
                logits_f32: np.ndarray) -> LogitStats:
    """KL(P_f32 || P_q4) in nats, and what happens to the f32 top token."""
    lf = log_softmax(logits_f32)
    lq = log_softmax(logits_q4)
    pf = np.exp(lf)
    kl = float(np.sum(pf * (lf - lq)))
    top_f = int(np.argmax(logits_f32))
    top_q = int(np.argmax(logits_q4))
    return LogitStats(step, position, int(token), kl, top_f, top_q, float(pf[top_f]),
                      float(np.exp(lq[top_f])))


def compare_run(model: Model, tokens: list[int], *, shadow: Model | None = None,
                engine: str = "interp", progress: Progress | None = None) -> QuantComparison:
    """Run ``tokens`` from position 0 on ``model`` and on an f32 shadow, node by node.

    Every output of every node is compared right after both machines ran it.
    ``model``'s buffers are restored afterwards (a debugging session may be
    using them); the shadow is loaded from ``model.path`` unless given.
    """
    progress = progress or Silent()
    if model.fir_f32:
        raise FirError("the model was loaded with --fir-f32: there is no quantization to compare")
    if shadow is None:
        progress.note("loading the f32 shadow model")
        shadow = load_model(model.path, fir_f32=True, group=model.group)
    if [n.full_name for n in shadow.nodes] != [n.full_name for n in model.nodes]:
        raise FirError(f"{shadow.path}: the shadow model's nodes differ from the model's")
    activations: list[ActivationError] = []
    logits: list[LogitStats] = []
    out_q, out_f = [], []
    with preserved_state(model), preserved_state(shadow):
        mq, _ = make_machine(model, engine)
        mf, _ = make_machine(shadow, engine)
        mq.reset()
        mf.reset()
        progress.phase("q4 vs f32 lockstep", len(tokens))
        for step, tok in enumerate(tokens):
            mq.begin_token(tok)
            mf.begin_token(tok)
            position = mq.position
            for nq, nf in zip(model.nodes, shadow.nodes):
                mq.run_node(nq)
                mf.run_node(nf)
                for i, (oq, of) in enumerate(zip(nq.outs, nf.outs)):
                    rel, mx, cos, sqnr, sig, noise = compare_vectors(model.view(oq.region),
                                                                      shadow.view(of.region))
                    activations.append(ActivationError(step, position, nq.index, nq.full_name,
                                                       oq.display, i == 0, rel, mx, cos, sqnr,
                                                       sig, noise))
            rq = mq.finish_token()
            rf = mf.finish_token()
            out_q.append(rq.logits)
            out_f.append(rf.logits)
            logits.append(logit_stats(step, position, tok, rq.logits, rf.logits))
            progress.tick(step + 1)
        progress.end()
    vocab = model.vocab
    return QuantComparison(list(tokens), activations, logits,
                           np.stack(out_q) if out_q else np.zeros((0, vocab), np.float32),
                           np.stack(out_f) if out_f else np.zeros((0, vocab), np.float32))


# -- summaries used by the report ---------------------------------------------------------
def _sqnr(signal: float, noise: float) -> float:
    if noise > 0:
        return 10 * math.log10(signal / noise) if signal > 0 else -math.inf
    return math.inf


def activation_summary(acts: list[ActivationError]) -> list[dict]:
    """Per (node, output) over all steps, in plan order."""
    groups: dict[tuple[int, str], list[ActivationError]] = {}
    for a in acts:
        groups.setdefault((a.node, a.output), []).append(a)
    out = []
    for (node, output), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], not
                                                                       kv[1][0].primary)):
        sig = sum(r.signal for r in rows)
        noise = sum(r.noise for r in rows)
        rels = [r.rel_l2 for r in rows]
        out.append({
            "node": node, "full_name": rows[0].full_name, "output": output,
            "primary": rows[0].primary, "steps": len(rows),
            "rel_l2_mean": float(np.mean(rels)), "rel_l2_max": float(np.max(rels)),
            "rel_l2_last": rels[-1],
            "max_abs": float(np.max([r.max_abs for r in rows])),
            "cosine_min": float(np.min([r.cosine for r in rows])),
            "sqnr_db": _sqnr(sig, noise),
        })
    return out


def logit_summary(stats: list[LogitStats]) -> dict | None:
    """The summary ``llama-perplexity --kl-divergence`` prints, over the compared steps."""
    if not stats:
        return None
    kl = np.array([s.kl for s in stats], dtype=np.float64)
    dp = np.array([s.delta_p for s in stats], dtype=np.float64)
    return {"steps": len(stats),
            "kl_mean": float(kl.mean()), "kl_median": float(np.median(kl)),
            "kl_max": float(kl.max()), "kl_min": float(kl.min()),
            "kl_p99": float(np.percentile(kl, 99)),
            "same_top": sum(s.same_top for s in stats), "same_top_ratio":
                sum(s.same_top for s in stats) / len(stats),
            "delta_p_mean": float(dp.mean()), "delta_p_rms": float(np.sqrt(np.mean(dp * dp))),
            "delta_p_min": float(dp.min()), "delta_p_max": float(dp.max())}
