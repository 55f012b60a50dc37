"""Per-token figures of a quantized model against its f32 base, and their summary.

Defined as llama.cpp's ``llama-perplexity --kl-divergence-base`` defines them (its
``kl_divergence``: tools/perplexity/perplexity.cpp), computed in float64 from the two
models' f32 logits; docs/quant.md lists every figure. Each scored token t (predicted from
the logits at the position before it):

- ``nll`` = -ln softmax(q)[t], ``nll_base`` the same for the base (f32) model;
- ``kld`` = sum_i p_i (ln p_i - ln q_i), p the base's distribution, q the quantized one's
  (llama.cpp stores the base's log-probabilities as uint16 steps and skips terms with
  ln p_i <= -16; here every term is exact, so figures agree with its to about 1e-4);
- ``p_diff`` = q[t] - p[t] (Δp), and whether both argmaxes are the same token.

The summary's uncertainties are llama.cpp's: the standard error of a mean is
sqrt((E[x^2] - E[x]^2) / (n - 1)) (0 for n <= 10), the ratio's uses the covariance of the
two NLLs, RMS Δp's comes from the MSE's by the derivative of the square root, same-top's is
binomial. Sums run in float64 in token order, so a summary is the same bit for bit however
the chunks were spread over processes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FIELDS = ("nll", "nll_base", "kld", "p_diff", "same_top")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Rows of float32 logits -> float64 log-probabilities (max subtracted first)."""
    return _log_softmax(logits)[0]


def _log_softmax(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log-probabilities, probabilities), float64, in as few passes as NumPy allows."""
    z = np.array(logits, dtype=np.float64)
    z -= z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    total = e.sum(axis=-1, keepdims=True)
    z -= np.log(total)
    e /= total
    return z, e


@dataclass(frozen=True)
class TokenStats:
    """One value per scored token, in order (arrays of equal length)."""

    nll: np.ndarray
    nll_base: np.ndarray
    kld: np.ndarray
    p_diff: np.ndarray
    same_top: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.kld)

    @staticmethod
    def concat(parts: list["TokenStats"]) -> "TokenStats":
        return TokenStats(*(np.concatenate([getattr(p, f) for p in parts]) for f in FIELDS))


def token_stats(quant: np.ndarray, base: np.ndarray, targets: np.ndarray) -> TokenStats:
    """``quant`` and ``base``: f32 logits [n, vocab] (row j predicts ``targets[j]``)."""
    targets = np.asarray(targets, dtype=np.int64)
    rows = np.arange(len(targets))
    lq = _log_softmax(quant)[0]
    lp, p = _log_softmax(base)
    nll, nll_base = -lq[rows, targets], -lp[rows, targets]
    lp -= lq  # ln p - ln q
    kld = np.einsum("ij,ij->i", p, lp)
    p_diff = np.exp(-nll) - np.exp(-nll_base)
    same = np.argmax(quant, axis=-1) == np.argmax(base, axis=-1)
    return TokenStats(nll, nll_base, kld, p_diff, same)


def base_stats(base: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The base model's NLL per token (what PPL(base) rests on)."""
    targets = np.asarray(targets, dtype=np.int64)
    return -log_softmax(base)[np.arange(len(targets)), targets]


def mean_and_error(x: np.ndarray) -> tuple[float, float]:
    """llama.cpp's mean_and_uncertainty: the mean and sqrt(var / (n - 1)) (0 for n <= 10)."""
    n = len(x)
    if n < 1:
        return 0.0, 0.0
    s, s2 = float(np.sum(x, dtype=np.float64)), float(np.sum(np.square(x, dtype=np.float64)))
    f = s / n
    df = s2 / n - f * f
    return f, (math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)


def covariance(a: np.ndarray, b: np.ndarray) -> float:
    n = len(a)
    if n < 10:
        return 0.0
    sa, sb = float(np.sum(a, dtype=np.float64)), float(np.sum(b, dtype=np.float64))
    sab = float(np.sum(np.asarray(a, np.float64) * b))
    return (sab / n - (sa / n) * (sb / n)) / (n - 1)


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama.cpp's: linear between the two values around fraction * (n - 1)."""
    v = sorted_values
    if fraction <= 0:
        return float(v[0])
    if fraction >= 1:
        return float(v[-1])
    p = fraction * (len(v) - 1)
    i = int(p)
    p -= i
    return float((1 - p) * v[i] + p * v[min(i + 1, len(v) - 1)])


def median(sorted_values: np.ndarray) -> float:
    n = len(sorted_values)
    if n % 2 == 0:
        return float(0.5 * (sorted_values[n // 2] + sorted_values[n // 2 - 1]))
    return float(sorted_values[n // 2])


PERCENTILES = (("max", 1.0), ("p99.9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.9),
               ("median", None), ("p10", 0.1), ("p5", 0.05), ("p1", 0.01), ("min", 0.0))


def summarize(s: TokenStats) -> dict:
    """Every figure llama-perplexity prints, as a dict of floats (``_err``: uncertainty)."""
    n = len(s)
    out: dict = {"tokens": n}
    lq, lq_err = mean_and_error(s.nll)
    lb, lb_err = mean_and_error(s.nll_base)
    cov = covariance(s.nll, s.nll_base)
    ppl_q, ppl_b = math.exp(lq), math.exp(lb)
    out["ppl_q"], out["ppl_q_err"] = ppl_q, ppl_q * lq_err
    out["ppl_base"], out["ppl_base_err"] = ppl_b, ppl_b * lb_err
    out["cor_ln_ppl"] = cov / (lq_err * lb_err) if lq_err > 0 and lb_err > 0 else None
    ratio_err = math.sqrt(max(lq_err ** 2 + lb_err ** 2 - 2 * cov, 0.0))
    out["ln_ppl_ratio"], out["ln_ppl_ratio_err"] = lq - lb, ratio_err
    out["ppl_ratio"], out["ppl_ratio_err"] = math.exp(lq - lb), math.exp(lq - lb) * ratio_err
    out["ppl_diff"] = ppl_q - ppl_b
    out["ppl_diff_err"] = math.sqrt(max((ppl_q * lq_err) ** 2 + (ppl_b * lb_err) ** 2
                                        - 2 * ppl_q * ppl_b * cov, 0.0))
    out["kld_mean"], out["kld_mean_err"] = mean_and_error(s.kld)
    kld_sorted = np.sort(s.kld.astype(np.float64))
    dp_sorted = np.sort(s.p_diff.astype(np.float64))
    for name, frac in PERCENTILES:
        out[f"kld_{name}"] = median(kld_sorted) if frac is None else percentile(kld_sorted, frac)
        out[f"dp_{name}"] = median(dp_sorted) if frac is None else percentile(dp_sorted, frac)
    out["dp_mean"], out["dp_mean_err"] = mean_and_error(s.p_diff)
    mse, mse_err = mean_and_error(np.square(s.p_diff.astype(np.float64)))
    rms = math.sqrt(mse)
    out["dp_rms"], out["dp_rms_err"] = rms, (0.5 / rms * mse_err if rms > 0 else 0.0)
    top = float(np.mean(s.same_top)) if n else 0.0
    out["same_top"] = top
    out["same_top_err"] = math.sqrt(top * (1 - top) / (n - 1)) if n > 1 else 0.0
    return out
