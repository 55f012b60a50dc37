"""Activation patching on the quantized model, as TransformerLens's ``patching`` module does.

Run a clean prompt and a corrupted one of the same length; then, for each chosen
(node, buffer) and each position, run the corrupted prompt again with that one buffer,
right after that node at that position, replaced by its value in the clean run, and
score the run with a metric (by default the logit difference of two tokens at the last
step). A cell near the clean metric marks a place that carries what the corruption
took away::

    result = firscope.patching.sweep(model, clean="def f(x):", corrupted="def g(x):",
                                     metric=firscope.patching.logit_diff(good, bad))
    result.values        # [targets, positions]
    result.normalized()  # 0 = the corrupted metric, 1 = the clean one
    result.figure()      # a matplotlib heatmap

The targets default to every node that writes the residual stream (the buffer the
final norm reads): the embeddings, and after each layer's attention and MLP, which
is TransformerLens's ``resid_pre``/``resid_mid`` sweep.
"""
from __future__ import annotations

import html
from typing import Callable, Sequence

import numpy as np

from ..errors import FirError

__all__ = ["sweep", "logit_diff", "PatchingResult", "residual_targets"]

Metric = Callable[[object], float]


def logit_diff(good: int, bad: int, step: int = -1) -> Metric:
    """A metric: ``logits[step, good] - logits[step, bad]`` of a run (f64)."""
    def metric(run) -> float:
        row = run.logits[step]
        return float(np.float64(row[good]) - np.float64(row[bad]))
    metric.__name__ = f"logit_diff({good}, {bad})"
    return metric


def residual_targets(model) -> list[tuple[str, str]]:
    """(node, buffer) for every node that writes the residual stream before the final norm."""
    from ..debug.lens import find_path, residual_writers
    m = model.names.model
    path = find_path(m)
    return [(n.full_name, path.residual) for n in residual_writers(m, path)]


class PatchingResult:
    """``values[row, col]``: the metric with ``rows[row]`` (``node/buffer``) patched from the
    clean run at position ``positions[col]``; ``clean`` and ``corrupted``: the metric of the
    unpatched runs; ``columns``: each position with its clean and corrupted token."""

    def __init__(self, values: np.ndarray, rows: list[str], positions: list[int],
                 columns: list[str], clean: float, corrupted: float, metric: str):
        self.values = values
        self.rows = rows
        self.positions = positions
        self.columns = columns
        self.clean = clean
        self.corrupted = corrupted
        self.metric = metric

    def normalized(self) -> np.ndarray:
        """(value - corrupted) / (clean - corrupted): 1 where patching recovers the clean
        metric, 0 where it does nothing (NaN when clean equals corrupted)."""
        span = self.clean - self.corrupted
        if span == 0:
            return np.full_like(self.values, np.nan)
        return (self.values - self.corrupted) / span

    def __repr__(self) -> str:
        return (f"<firscope PatchingResult {len(self.rows)} targets x {len(self.positions)} "
                f"positions, {self.metric}: clean {self.clean:.4g}, corrupted "
                f"{self.corrupted:.4g}>")

    def figure(self):
        """A matplotlib heatmap of :meth:`normalized` (targets down, positions across)."""
        from .display import figure_label, pyplot
        plt = pyplot()
        norm = self.normalized()
        fig, ax = plt.subplots(figsize=(1.2 + 0.55 * len(self.positions),
                                        1.2 + 0.3 * len(self.rows)))
        image = ax.imshow(norm, cmap="RdBu_r", vmin=-1.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(self.columns)), [figure_label(c, 24) for c in self.columns],
                      rotation=90, fontsize=7)
        ax.set_yticks(range(len(self.rows)), self.rows, fontsize=7)
        ax.set_xlabel("position patched (clean token / corrupted token)")
        ax.set_ylabel("buffer after node")
        fig.colorbar(image, ax=ax, label="recovered share of the clean metric")
        ax.set_title(f"activation patching: {self.metric}", fontsize=9)
        fig.tight_layout()
        return fig

    def _repr_html_(self) -> str:
        norm = self.normalized()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = []
        for r, label in enumerate(self.rows):
            cells = []
            for c in range(len(self.positions)):
                v, f = self.values[r, c], norm[r, c]
                shade = 0.0 if not np.isfinite(f) else max(-1.0, min(1.0, float(f)))
                red, blue = (255, int(255 * (1 - shade))) if shade >= 0 else \
                    (int(255 * (1 + shade)), 255)
                colour = f"rgb({red},{min(red, blue)},{blue})"
                cells.append(f"<td style='background:{colour}' title='{f:.3f}'>{v:.3g}</td>")
            body.append(f"<tr><th>{html.escape(label)}</th>{''.join(cells)}</tr>")
        caption = (f"<b>activation patching</b>: {html.escape(self.metric)}; clean "
                   f"{self.clean:.4g}, corrupted {self.corrupted:.4g} (red: towards clean)")
        return (f"<table><caption style='text-align:left'>{caption}</caption><thead><tr><th>"
                f"</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def sweep(model, clean: str | Sequence[int], corrupted: str | Sequence[int], metric: Metric,
          *, targets: Sequence[tuple[str, str]] | None = None,
          positions: Sequence[int] | None = None) -> PatchingResult:
    """Patch each target from the clean run into the corrupted one, one position at a time.

    ``clean``/``corrupted``: prompts (text) or token ids, of the same length. ``metric``:
    a function of a :class:`~firscope.api.run.Run` returning a number (see
    :func:`logit_diff`). ``targets``: (node, buffer) pairs, a node may be a glob
    (``("attention@*", "attn")``); default :func:`residual_targets`. ``positions``: the
    steps to patch at (default every one). Each cell is one run of the corrupted prompt."""
    clean_ids, bad_ids = _ids(model, clean), _ids(model, corrupted)
    if len(clean_ids) != len(bad_ids):
        raise FirError(f"clean and corrupted must have the same number of tokens: "
                       f"{len(clean_ids)} and {len(bad_ids)}")
    if not callable(metric):
        raise FirError("metric must be a function of a run, e.g. patching.logit_diff(a, b)")
    steps = len(clean_ids)
    cols = list(range(steps)) if positions is None else [model.names.step(p, steps)
                                                          for p in positions]
    rows = _expand(model, targets)
    kept: dict[tuple[str, str], dict[int, np.ndarray]] = {t: {} for t in rows}

    def keeper(target):
        def keep(value, step):
            kept[target][step] = value
        return keep

    clean_run = model.run(tokens=clean_ids, patch={t: keeper(t) for t in rows})
    bad_run = model.run(tokens=bad_ids)
    values = np.zeros((len(rows), len(cols)))
    for r, target in enumerate(rows):
        for c, pos in enumerate(cols):
            donor = kept[target][pos]
            run = model.run(tokens=bad_ids, patch={target: _at(pos, donor)})
            values[r, c] = _score(metric, run)
    tok = model.tokenizer
    columns = [f"{p} {tok.piece(clean_ids[p])!r}/{tok.piece(bad_ids[p])!r}" for p in cols]
    return PatchingResult(values, [f"{n}/{b}" for n, b in rows], cols, columns,
                          _score(metric, clean_run), _score(metric, bad_run),
                          getattr(metric, "__name__", "metric"))


def _ids(model, prompt) -> list[int]:
    if isinstance(prompt, str):
        return model._ids(prompt, None)
    return model._ids(None, prompt)


def _expand(model, targets) -> list[tuple[str, str]]:
    if targets is None:
        return residual_targets(model)
    out = []
    for t in targets:
        if not (isinstance(t, tuple) and len(t) == 2):
            raise FirError(f"targets are (node, buffer) pairs, found {t!r}")
        buffer = model.names.buffer(t[1])
        for node in model.names.nodes(t[0]):
            model.names.region(buffer, node)
            out.append((node.full_name, buffer))
    if not out:
        raise FirError("no targets to patch")
    return list(dict.fromkeys(out))


def _at(position: int, donor: np.ndarray):
    def patch(value, step):
        return donor if step == position else None
    return patch


def _score(metric: Metric, run) -> float:
    value = metric(run)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise FirError(f"the metric returned {type(value).__name__}, not a number") from None
