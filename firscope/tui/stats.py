"""What the Buffers tab shows beside the values, computed in the worker with the frozen view:
statistics of the buffer shown (or a summary line per input) and a q4 weight's
dequantization error against the checkpoint's f32 values.

Reading the checkpoint and dequantizing a weight take seconds on GPT-2; here they run where
:func:`~.state.build_view` runs (the load or engine worker), never on the UI thread.
Weights never change within a load: their results are kept per loaded model.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import numpy as np
from rich.text import Text

from ..errors import FirError
from ..model.q4 import count_nonfinite
from .heat import CHUNK, histogram, sparkline


def _in_place(flat: np.ndarray) -> tuple[float, float, float] | None:
    """(min, max, mean) of a 1-D all-finite f32 array (nearly every one), read in place
    with the mean summed in f64; None for any other array (the callers' f64 copy path)."""
    if flat.dtype != np.float32 or not flat.size or count_nonfinite(flat) != 0:
        return None
    return (float(flat.min()), float(flat.max()),
            float(np.add.reduce(flat, dtype=np.float64) / flat.size))


def summary(arr: np.ndarray) -> tuple[float, float, float, int] | None:
    """(min, max, mean, non-finite count) of an array, or None when nothing is finite.
    An all-finite f32 array is read in place (_in_place): the first stop's inputs include
    GPT-2 small's 154 MB ``wte``, whose f64 copy took 1.5 s of the first stop (its pages
    new to the process)."""
    got = _in_place(arr.reshape(-1))
    if got is not None:
        return (*got, 0)
    flat = arr.reshape(-1).astype(np.float64)
    finite = flat[np.isfinite(flat)]
    if not finite.size:
        return None
    return float(finite.min()), float(finite.max()), float(finite.mean()), flat.size - finite.size


def stats_text(label: str, arr: np.ndarray) -> Text:
    """The Buffers tab's statistics of one buffer or weight. An all-finite f32 array (nearly
    every one) is read in place and in f64 chunks: GPT-2 small's ``wte`` went through
    several f64 copies of its 154 MB (1.5 s the first time it was shown)."""
    flat = arr.reshape(-1)
    got = _in_place(flat)
    if got is not None:
        lo, hi, mean = got
        squares = sum(float(np.square(flat[s: s + CHUNK].astype(np.float64) - mean).sum())
                      for s in range(0, flat.size, CHUNK))
        moments, nan, inf = (lo, hi, mean, (squares / flat.size) ** 0.5), 0, 0
        (hist, h_lo, h_hi), spark = histogram(flat, finite=(lo, hi)), sparkline(flat, 40, True)
    else:
        a64 = flat.astype(np.float64)
        finite = a64[np.isfinite(a64)]
        nan, inf = int(np.isnan(a64).sum()), int(np.isinf(a64).sum())
        moments = (finite.min(), finite.max(), finite.mean(), finite.std()) \
            if finite.size else None
        (hist, h_lo, h_hi), spark = histogram(flat), sparkline(flat, 40)
    t = Text()
    t.append(label, style="bold")
    t.append(f"   shape {list(arr.shape)}  {flat.size} f32")
    if moments is not None:
        t.append("\nmin {:.6g}  max {:.6g}  mean {:.6g}  std {:.6g}".format(*moments))
    t.append("  NaN ")
    t.append(str(nan), style="bold red" if nan else "")
    t.append("  Inf ")
    t.append(str(inf), style="bold red" if inf else "")
    t.append(f"\nhist {h_lo:.3g} ")
    t.append(hist, style="cyan")
    t.append(f" {h_hi:.3g}   spark ")
    t.append(spark, style="green")
    return t


@dataclass(frozen=True)
class Q4Error:
    """A q4 weight's dequantization error against the checkpoint's f32 values."""

    rmse: float
    max_abs: float
    p95: float
    median: float
    rel_max: float  # max |error| / the group's scale (≤ 0.5 + rounding)


def dense(w) -> np.ndarray:
    """A weight's f32 matrix; a resident q4 weight is dequantized on demand."""
    m = getattr(w, "matrix", None)
    return m if m is not None else w.q4.dequantize()


def q4_error(model, w) -> Q4Error | None:
    """Reads the checkpoint (None when it cannot be read)."""
    from ..model.checkpoint import Checkpoint
    try:
        original = np.ascontiguousarray(Checkpoint(model.config_path.parent).read(w.tensor).T)
    except FirError:
        return None
    error = original.astype(np.float64) - dense(w)
    ae = np.abs(error)
    q = w.q4
    rel = ae / np.repeat(q.scale, q.group, axis=1)[:, : q.cols]
    return Q4Error(float(np.sqrt((error ** 2).mean())), float(ae.max()),
                   float(np.percentile(ae, 95)), float(np.median(ae)), float(rel.max()))


_KEPT: dict[int, dict] = {}  # id(model) -> {(kind, name): result}, while the model lives


def _kept(model) -> dict:
    key = id(model)
    if key not in _KEPT:
        _KEPT[key] = {}
        weakref.finalize(model, _KEPT.pop, key, None)
    return _KEPT[key]


def _once(model, key: tuple, compute):
    kept = _kept(model)
    if key not in kept:
        kept[key] = compute()
    return kept[key]


def with_stats(model, peek):
    """``peek`` (a BufferPeek) with its statistics, summaries and q4 error filled in."""
    if peek.error is not None or not peek.arrays:
        return peek
    if len(peek.names) > 1 or peek.title.startswith("inputs of"):
        sums = tuple(_once(model, ("summary", n), lambda a=a: summary(a)) if weight
                     else summary(a) for n, a, weight in zip(peek.names, peek.arrays,
                                                             peek.weight))
        peek = replace(peek, summaries=sums)
    else:
        name, arr = peek.names[0], peek.arrays[0]
        stats = (_once(model, ("stats", name), lambda: stats_text(name, arr))
                 if peek.weight[0] else stats_text(name, arr))
        peek = replace(peek, stats=stats)
    w = model.weights.get(peek.names[0])
    if w is not None and w.q4 is not None:
        peek = replace(peek, q4_error=_once(model, ("q4", w.name), lambda: q4_error(model, w)))
    return peek
