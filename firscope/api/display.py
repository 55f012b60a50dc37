"""What Jupyter shows for the Python API's objects, and matplotlib figures on request.

``_repr_html_`` of a :class:`~firscope.api.model.Model`, a
:class:`~firscope.api.run.Run`, an :class:`Attention` pattern, a :class:`Lens` table
and a :class:`Weight`: plain HTML tables, with heatmaps as inline SVG drawn by
profile/svgplot (no matplotlib needed to look). ``.figure()`` returns a
matplotlib ``Figure`` to keep, save or restyle (matplotlib is imported then:
``pip install 'firscope[notebook]'``). Every text from the model or its
tokenizer is escaped.
"""
from __future__ import annotations

import html

import numpy as np

from ..errors import FirError
from ..model.ref import every_layer

__all__ = ["Attention", "Lens", "Weight", "attention_of", "lens_of", "model_html", "run_html",
           "pyplot", "heatmap_svg", "figure_label"]

MAX_ROWS = 64  # rows of a step table before "... N more"


def pyplot():
    """matplotlib's pyplot, or a FirError saying how to install it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise FirError("figures need matplotlib: pip install 'firscope[notebook]' (or "
                       "matplotlib); the HTML tables and heatmaps work without it") from None
    return plt


def figure_label(text: str, width: int = 8) -> str:
    """A token's text for a matplotlib label: the control pictures the tokenizer shows for
    control bytes (U+2400...) are written as ``\\xNN`` (matplotlib's default font has none
    of them; U+2420, the space, becomes U+2423, which it has), and long text is cut."""
    out = []
    for ch in text:
        code = ord(ch)
        if code == 0x2420:
            out.append("\u2423")
        elif 0x2400 <= code < 0x2420:
            out.append(f"\\x{code - 0x2400:02x}")
        elif code == 0x2421:
            out.append("\\x7f")
        else:
            out.append(ch)
    label = "".join(out)
    return label if len(label) <= width else label[: width - 1] + "\u2026"


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _piece(model, token: int) -> str:
    return repr(model.tokenizer.piece(int(token)))


def _table(head: list[str], rows: list[list[str]], caption: str = "") -> str:
    cap = f"<caption style='text-align:left'>{caption}</caption>" if caption else ""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table>{cap}<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


# -------------------------------------------------------------------------------- model, run
def model_html(model) -> str:
    precision = "f32 (--fir-f32)" if model.fir_f32 else f"q4, group {model.group}"
    rows = [["file", _e(model.path)], ["layers", str(model.n_layers)],
            ["nodes per token", str(len(model.nodes))], ["weights", precision],
            ["vocabulary", str(model.vocab)], ["positions", str(model.n_positions)],
            ["engine", _e(model.engine)]]
    return _table(["firscope.Model", ""], rows)


def run_html(run) -> str:
    m = run.model
    top = np.argmax(run.logits, axis=1)
    z = run.logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    p_top = 1.0 / np.exp(z).sum(axis=1)  # the top token's probability: exp(0) / sum
    rows = []
    for s in range(min(run.steps, MAX_ROWS)):
        fed = run.tokens[s]
        kind = "prompt" if s < len(run.prompt) else "generated"
        rows.append([str(s), f"{fed} {_e(_piece(m, fed))}", kind,
                     f"{int(top[s])} {_e(_piece(m, top[s]))}", f"{p_top[s]:.3f}"])
    if run.steps > MAX_ROWS:
        rows.append(["…", f"{run.steps - MAX_ROWS} more steps", "", "", ""])
    extra = []
    if run.recorded:
        names = sorted(f"{n}/{b}" for n, b in run.recorded)
        extra.append(f"recorded: {_e(', '.join(names[:12]))}"
                     + (f" and {len(names) - 12} more" if len(names) > 12 else ""))
    if run.patched:
        extra.append(f"patched: {_e(', '.join(run.patched))}")
    caption = (f"<b>firscope.Run</b> · {run.steps} steps · {len(run.prompt)} prompt + "
               f"{len(run.generated)} generated · {_e(repr(run.text))}"
               + "".join(f"<br>{x}" for x in extra))
    return _table(["step", "fed token", "", "top next token", "p"], rows, caption)


# -------------------------------------------------------------------------------- attention
class Attention:
    """One layer's attention probabilities over a run: ``probs[head, query, key]`` (keys
    after the query are 0), ``tokens`` (the fed tokens' text)."""

    def __init__(self, layer: int, node: str, probs: np.ndarray, tokens: list[str]):
        self.layer = layer
        self.node = node
        self.probs = probs
        self.tokens = tokens

    def __repr__(self) -> str:
        h, q, _ = self.probs.shape
        return f"<firscope Attention of {self.node}: {h} heads x {q} positions>"

    def _repr_html_(self) -> str:
        return (f"<div><b>{_e(self.node)}</b>: attention per head (rows: query position, "
                f"columns: key position)</div>" + heatmap_svg(self.probs, "head"))

    def figure(self, heads=None):
        """A matplotlib figure: one heatmap per head (``heads``: which; default all)."""
        plt = pyplot()
        heads = list(range(self.probs.shape[0])) if heads is None else list(heads)
        fig, axes = plt.subplots(1, len(heads), figsize=(2.6 * len(heads) + 0.6, 2.8),
                                 squeeze=False)
        labels = [figure_label(t) for t in self.tokens]
        image = None
        for ax, h in zip(axes[0], heads):
            masked = np.ma.masked_where(np.triu(np.ones_like(self.probs[h]), 1) > 0,
                                        self.probs[h])
            image = ax.imshow(masked, vmin=0.0, vmax=1.0, cmap="viridis")
            ax.set_title(f"head {h}", fontsize=9)
            ax.set_xlabel("key position")
            ticks = range(len(labels))
            ax.set_xticks(ticks, labels, rotation=90, fontsize=6)
            ax.set_yticks(ticks, labels, fontsize=6)
        axes[0][0].set_ylabel("query position")
        if image is not None:
            fig.colorbar(image, ax=list(axes[0]), label="probability", shrink=0.8)
        fig.suptitle(f"{self.node}: attention probabilities", fontsize=10)
        return fig


def heatmap_svg(cells: np.ndarray, label: str) -> str:
    """Inline SVG: one heatmap per ``cells[i]`` side by side (NaN blank), viridis 0..1."""
    from ..profile.svgplot import Figure, png_rgb, viridis
    n, rows, cols = cells.shape
    gap = max(1, cols // 10)
    mosaic = np.full((rows, n * (cols + gap) - gap), np.nan)
    for i in range(n):
        block = np.array(cells[i], dtype=np.float64)
        block[np.triu(np.ones_like(block, dtype=bool), 1)] = np.nan
        mosaic[:, i * (cols + gap): i * (cols + gap) + cols] = block
    width = min(900.0, 120.0 + 160.0 * n)
    fig = Figure(width, 60.0 + (width - 120.0) * rows / max(mosaic.shape[1], 1))
    (ax,) = fig.subplots()
    ax.image(png_rgb(viridis(mosaic)), mosaic.shape)
    ax.frame = False
    ax.set_ticks("x", [i * (cols + gap) + (cols - 1) / 2 for i in range(n)],
                 [f"{label} {i}" for i in range(n)], size=8)
    ax.set_ticks("y", [], [])
    ax.add_colorbar("probability")
    return fig.svg().decode("utf-8")


def attention_of(run, layer: int) -> Attention:
    from ..profile.collect import find_attention_sites
    m = run.model.names.model
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) \
            or not 0 <= layer < m.layers:
        raise FirError(f"layer must be 0..{m.layers - 1}, not {layer!r}")
    sites = [s for s in find_attention_sites(m) if s.layer == layer]
    if not sites:
        raise FirError(f"no node of layer {layer} leaves attention probabilities (a buffer of "
                       "n_head * n_positions elements)")
    site = sites[0]
    node = m.nodes[site.node]
    # the output's name as the .fir binds it (a dump's key), not the region's instance name
    buffer = next((o.name for o in node.outs if o.region.base == site.base), None)
    rows = []
    for s in range(run.steps):
        got = run._values.get((s, site.full_name, buffer))
        if got is None:
            raise FirError(f"the attention of layer {layer} needs {site.full_name}/{buffer} "
                           f"at every step: run with record='{every_layer(node.name)}/"
                           f"{buffer}'")
        rows.append(got)
    steps, n_pos = run.steps, site.n_positions
    probs = np.zeros((site.n_head, steps, steps), dtype=np.float32)
    for s, row in enumerate(rows):
        for h in range(site.n_head):
            probs[h, s, : s + 1] = row[h * n_pos: h * n_pos + s + 1]
    return Attention(layer, site.full_name, probs, [run.model.tokenizer.piece(t)
                                                    for t in run.fed])


# -------------------------------------------------------------------------------- logit lens
class Lens:
    """The logit lens at one step: per row (``embed``, ``layer 0`` ...) the top-k next tokens
    as (id, text, probability)."""

    def __init__(self, step: int, rows: list[tuple[str, list[tuple[int, str, float]]]]):
        self.step = step
        self.rows = rows

    def __repr__(self) -> str:
        lines = [f"logit lens at step {self.step}:"]
        for label, top in self.rows:
            lines.append(f"  {label:<9} " + "  ".join(f"{t!r} {p:.3f}" for _, t, p in top))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        k = max((len(top) for _, top in self.rows), default=0)
        rows = [[_e(label)] + [f"{_e(repr(t))} <small>{p:.3f}</small>" for _, t, p in top]
                for label, top in self.rows]
        return _table(["after"] + [f"#{i + 1}" for i in range(k)], rows,
                      f"<b>logit lens</b> at step {self.step}: the residual read through the "
                      "final norm and head")


def lens_of(run, step: int, k: int) -> Lens:
    from ..debug.lens import find_path, project_on, residual_writers, top_k
    api = run.model
    m = api.names.model
    s = api.names.step(step, run.steps)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise FirError(f"k must be an integer >= 1, not {k!r}")
    path = find_path(m)
    writers = residual_writers(m, path)
    sites = []  # (label, node)
    before = [n for n in writers if n.layer is None]
    if before:
        sites.append(("embed", before[-1]))
    for layer in range(m.layers):
        mine = [n for n in writers if n.layer == layer]
        if mine:
            sites.append((f"layer {layer}", mine[-1]))
    missing = [n for _, n in sites if (s, n.full_name, path.residual) not in run._values]
    if missing:
        names = dict.fromkeys(every_layer(n.name) if n.layer is not None else n.full_name
                              for _, n in sites)
        want = ",".join(f"{name}/{path.residual}" for name in names)
        raise FirError(f"the logit lens reads '{path.residual}' after {missing[0].full_name} "
                       f"and {len(sites) - 1} other nodes: run with record='{want}'")
    machine = api._machine_for_run()
    rows = []
    for label, node in sites:
        logits = project_on(machine, path, run._values[(s, node.full_name, path.residual)])
        rows.append((label, [(t, api.tokenizer.piece(t), p) for t, p in top_k(logits, int(k))]))
    return Lens(s, rows)


# -------------------------------------------------------------------------------- weights
class Weight:
    """One weight instance: ``name``, ``dtype`` (as declared: q4 or f32), ``shape`` (as the
    checkpoint stores it), ``values()`` (the [out, in] matrix the model multiplies by, or the
    arena values of an f32 weight) and, for a q4 weight, ``error()``: its quantization error
    against the checkpoint (rmse, max, percentiles, as llama.cpp's quantize-stats)."""

    def __init__(self, api_model, entry):
        self._api = api_model
        self._entry = entry
        self.name = entry.name
        self.dtype = "q4" if entry.q4 is not None else "f32"
        self.declared = entry.dtype
        self.shape = tuple(entry.shape)
        self.tensor = entry.tensor
        self._stats = None

    def values(self) -> np.ndarray:
        """A copy of the values the model computes with: a weight kept in the arena in its
        declared shape (``wte``: [vocab, n_embd]); a linear's matrix as [out, in] (the
        loader transposes Conv1D's [in, out]), a q4 one dequantized."""
        e = self._entry
        if e.region is not None:
            return self._api.names.model.view(e.region).reshape(self.shape).copy()
        return np.array(e.dense(), copy=True)

    def error(self):
        """The q4 error stats (:class:`firscope.profile.data.WeightStats`); a FirError for a
        weight that is not q4 here."""
        if self._stats is None:
            e = self._entry
            if e.q4 is None:
                why = " (the model was opened with fir_f32=True)" if e.dtype == "q4" else ""
                raise FirError(f"{self.name} is f32 here{why}: it has no quantization error")
            from ..model.checkpoint import Checkpoint
            from ..profile.quant import error_stats
            ckpt = Checkpoint(self._api.names.model.config_path.parent)
            original = np.ascontiguousarray(ckpt.read(e.tensor).T)  # [in, out] -> [out, in]
            self._stats = error_stats(e.name, e.decl, e.layer, e.tensor, original, e.q4)
        return self._stats

    def __repr__(self) -> str:
        return f"<firscope Weight {self.name} {self.dtype} {list(self.shape)} from {self.tensor}>"

    def _repr_html_(self) -> str:
        head = (f"<b>{_e(self.name)}</b> · {self.dtype} · shape {list(self.shape)} · "
                f"tensor {_e(self.tensor)}")
        if self.dtype != "q4":
            return f"<div>{head} (no quantization error: stored as f32)</div>"
        st = self.error()
        rows = [["rmse", f"{st.rmse:.3e}"], ["max |error|", f"{st.max_abs:.3e}"],
                ["mean |error|", f"{st.mean_abs:.3e}"], ["p95 |error|", f"{st.p95_abs:.3e}"],
                ["median |error|", f"{st.median_abs:.3e}"],
                ["weight rms", f"{st.weight_rms:.3e}"],
                ["rmse / weight rms", f"{st.rmse / st.weight_rms:.3%}" if st.weight_rms
                 else "-"],
                ["group size", str(st.group)],
                ["scale range", f"{st.scale_min:.3e} .. {st.scale_max:.3e}"],
                ["flat groups (max = min)", f"{st.flat_groups} of {st.groups}"]]
        return _table(["quantization error", ""], rows, head)

