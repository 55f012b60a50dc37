"""Profile: per-node time (by node, by name, by layer) and quantization error once measured.

Pure renderers: node times from a :class:`StopView`'s snapshot, and the
quantization results the ``p`` job posts back (the worker never touches the
widget).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.reactive import var
from textual.widgets import Static

from ..text import printable
from .state import StopView
from .paint import update


def _predicted(cost) -> dict[str, tuple[float, str]]:
    """node name -> (mean predicted us per instance, the bound most of them have)."""
    acc: dict[str, list] = defaultdict(list)
    for n in cost.nodes:
        acc[n.name].append(n.prediction)
    out = {}
    for name, ps in acc.items():
        bounds = [p.bound for p in ps]
        out[name] = (sum(p.predicted_us for p in ps) / len(ps),
                     max(set(bounds), key=bounds.count))
    return out


def cost_header(cost) -> Text:
    return Text(f"GPU prediction on {cost.device.name} (step at position {cost.position}): "
                f"{cost.total_us:.1f} us/token, not measured — firscope cost for the detail",
                style="magenta")


STACK_BELOW = 150  # columns under which the layer table goes below the node table
NARROW_BELOW = 100  # columns under which the node table gives up its least needed columns


def time_tables(model, times: Mapping[int, float], cost=None, width: int | None = None):
    if not times and cost is None:
        return Text("no timings yet: run some nodes (c, n, t)", style="dim")
    nodes = model.nodes
    by_name: dict[str, list[float]] = defaultdict(list)
    by_layer: dict = defaultdict(float)
    for i, t in times.items():
        by_name[nodes[i].name].append(t)
        by_layer[nodes[i].layer] += t
    stacked = width is not None and width < STACK_BELOW
    narrow = width is not None and width < NARROW_BELOW
    grid = _node_table(nodes, by_name, sum(times.values()),
                       _predicted(cost) if cost is not None else None, narrow)
    layers = _layer_table(by_layer)
    head = [cost_header(cost)] if cost is not None else []
    # below the node table: its header stays in view at 80x24
    tail = [Text(""), *gpu_kernel_tables(cost)] if cost is not None else []
    if stacked:
        return Group(*head, grid, Text(""), layers, *tail)
    outer = Table.grid(padding=(0, 4))
    outer.add_row(grid, layers)
    return Group(*head, outer, *tail) if head else outer


ADVICE_SHOWN = 3  # the advice lines the Profile tab shows (firscope cost has every one)


def gpu_kernel_tables(cost) -> list:
    """Per micro kernel: registers live at once, allocated per lane, occupancy and its
    limiter; then the advice that would save the most per token, with its price."""
    t = Table(title="GPU occupancy per kernel (registers from a liveness analysis)",
              title_justify="left", box=None, padding=(0, 1))
    for col in ("kernel", "live R/U", "regs", "occ", "limiter"):
        t.add_column(col, justify="left" if col in ("kernel", "limiter") else "right",
                     no_wrap=True)
    kernels = cost.by_kernel()
    for name, k in kernels.items():
        occ = k.get("occupancy")
        if occ is not None:
            t.add_row(printable(name), f"{k['max_live_r']}/{k['max_live_u']}",
                      str(occ["registers_per_lane"]), f"{occ['theoretical_occupancy']:.0%}",
                      occ["limiter"])
    from ..cost.render import advice_text  # the cost model: not imported at the UI's start
    advice = Text("advice, ranked by the time it saves per token:", style="bold")
    for a in cost.advice()[:ADVICE_SHOWN]:
        advice.append(f"\n  {printable(a['kernel'])}: {printable(a['text'])}\n    "
                      f"{advice_text(a)}", style="")
    return [t, advice]


BOUND_SHORT = {"memory": "mem", "compute": "cmp", "latency": "lat", "launch": "lch"}


def _node_table(nodes, by_name: dict[str, list[float]], total: float, gpu, narrow: bool):
    """One row per node name: runs, CPU times, share; GPU prediction (per call) and bound
    when given. Narrow (below STACK_BELOW columns) with the GPU columns, the kind and runs
    columns give way and the bound is abbreviated, with a legend: every column stays whole
    at 80 columns."""
    bar = 6 if narrow else 20  # share bar cells
    lean = narrow and gpu is not None
    title = "time per node name (last run of each node)"
    if lean:
        title += "\nbound: mem cmp lat lch = memory compute latency launch"
    grid = Table(title=title, title_justify="left", expand=False, box=None, padding=(0, 1))
    for name in gpu or ():
        by_name.setdefault(name, [])  # predicted, not (yet) timed here
    cols = ("node",) + (() if lean else ("kind", "runs")) + ("total ms", "ms/run", "share") + \
        (("GPU µs/call", "bound") if gpu is not None else ())
    for col in cols:
        # names whole on one line: the kind gives way (cut with …) at a narrow width
        grid.add_column(col, justify="right" if col not in ("node", "kind", "bound") else "left",
                        no_wrap=True, overflow="ellipsis" if col == "kind" else "fold",
                        min_width=max(len(n.name) for n in nodes) if col == "node" else None,
                        max_width=14 if col == "kind" and narrow else None)
    kinds = {n.name: f"{n.kind} {n.target}"[:22] for n in nodes}
    for name, ts in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        share = sum(ts) / total if total else 0
        extra = ()
        if gpu is not None:
            us, bound = gpu.get(name, (None, ""))
            extra = ("-" if us is None else f"{us:.2f}",
                     BOUND_SHORT.get(bound, bound) if lean else bound)
        first = () if lean else (kinds[name], str(len(ts)))
        grid.add_row(name, *first, f"{sum(ts) * 1e3:.3f}" if ts else "-",
                     f"{sum(ts) / len(ts) * 1e3:.3f}" if ts else "-",
                     Text("█" * int(share * bar) + f" {share:.0%}", style="cyan"), *extra)
    return grid


def _layer_table(by_layer: dict) -> Table:
    layers = Table(title="time per layer", title_justify="left", box=None, padding=(0, 1))
    layers.add_column("layer")
    layers.add_column("ms", justify="right")
    for layer, t in sorted(by_layer.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        layers.add_row("-" if layer is None else str(layer), f"{t * 1e3:.3f}")
    return layers


def activation_table(quant) -> Table:
    t = Table(title="quantization error per node output (mean over tokens)",
              title_justify="left", box=None, padding=(0, 1))
    for col in ("node", "rel L2", "max abs", "cosine", "SQNR dB"):
        t.add_column(col, justify="left" if col == "node" else "right")
    if quant is None:
        return t
    acc: dict[str, list] = defaultdict(list)
    for a in quant.activations:
        if a.primary:
            acc[a.full_name].append(a)
    for node, rows in acc.items():
        n = len(rows)
        t.add_row(node, f"{sum(r.rel_l2 for r in rows) / n:.4f}",
                  f"{max(r.max_abs for r in rows):.4g}", f"{sum(r.cosine for r in rows) / n:.5f}",
                  f"{sum(r.sqnr_db for r in rows) / n:.1f}")
    return t


def weight_table(weights) -> Table:
    w = Table(title="q4 weights", title_justify="left", box=None, padding=(0, 1))
    for col in ("weight", "rmse", "max", "p95", "median"):
        w.add_column(col, justify="left" if col == "weight" else "right")
    for ws in (weights or [])[:48]:
        w.add_row(ws.name, f"{ws.rmse:.3g}", f"{ws.max_abs:.3g}", f"{ws.p95_abs:.3g}",
                  f"{ws.median_abs:.3g}")
    return w


def quant_renderable(fir_f32: bool, weights, quant):
    if fir_f32:
        return Text("\nloaded with --fir-f32: no quantization to measure", style="dim")
    if quant is None and weights is None:
        return Text("\npress p to measure quantization error (q4 vs an f32 shadow run of "
                    "the tokens so far)", style="dim")
    logits = Text()
    if quant is not None and quant.logits:
        ls = quant.logits
        same = sum(1 for s in ls if s.same_top)
        logits.append(f"\nlogits over {len(ls)} tokens: mean KL(f32‖q4) "
                      f"{sum(s.kl for s in ls) / len(ls):.4g}, same top-1 {same}/{len(ls)}\n")
    grid = Table.grid(padding=(0, 4))
    grid.add_row(activation_table(quant), weight_table(weights))
    return Group(Text(""), grid, logits)


CORPUS_ROWS = 12  # weights listed; the rest are in `firscope quant sensitivity`
BAR = 24  # cells of the longest per-layer bar


def corpus_renderable(doc: dict | None, note: str | None, width: int | None = None):
    """``ui --corpus``: the all-q4 figures, the weights ranked by the KLD each causes alone,
    and the per-layer total as bars (what the report's chart shows)."""
    if doc is None:
        return Text(f"\n{note}", style="dim") if note else Text("")
    s = doc["all_q4"]
    head = Text(f"\ncorpus {doc.get('corpus', '')}: {s['tokens']} tokens, mean KLD(f32‖q4) "
                f"{s['kld_mean']:.4g} ± {s['kld_mean_err']:.2g}, PPL q4 {s['ppl_q']:.4g} / f32 "
                f"{s['ppl_base']:.4g}, same top-1 {100 * s['same_top']:.1f}%", style="bold")
    narrow = width is not None and width < 100
    title = Text("weights by KLD alone (only it q4); gain: KLD saved keeping it f32")
    t = Table(box=None, padding=(0, 1))
    for col in ("weight", "alone", "gain") + (() if narrow else ("q4 B", "f32 B", "imp err")):
        t.add_column(col, justify="left" if col == "weight" else "right")
    for w in doc["weights"][:CORPUS_ROWS]:
        cells = [w["name"], f"{w['alone']:.3g}", f"{w['gain']:.3g}"]
        if not narrow:
            cells += [f"{w['q4_bytes']:,}", f"{w['f32_bytes']:,}", f"{w['weighted_err']:.3g}"]
        t.add_row(*cells)
    per_layer: dict = defaultdict(float)
    for w in doc["weights"]:
        per_layer[w["layer"]] += w["alone"]
    top = max(per_layer.values(), default=0.0) or 1.0
    bars = Text("\nKLD alone summed per layer\n")
    for layer in sorted(per_layer, key=lambda x: (x is None, x)):
        n = int(round(BAR * per_layer[layer] / top))
        bars.append(f"  layer {layer!s:>3} ")
        bars.append("█" * n, style="magenta")
        bars.append(f" {per_layer[layer]:.3g}\n")
    rest = len(doc["weights"]) - CORPUS_ROWS
    more = Text(f"... {rest} more: firscope quant sensitivity --corpus FILE" if rest > 0 else "",
                style="dim")
    return Group(head, title, t, more, bars)


class ProfileView(VerticalScroll, can_focus=True):
    DEFAULT_CSS = """
    ProfileView { padding: 0 1; }
    ProfileView > Static { width: 100%; }
    """

    # bound to the screen's (data_bind): the model, node times as shown (tests:
    # deterministic times), the frozen stop
    model = var(None, always_update=True)
    time_of = var(None)
    view: var[StopView | None] = var(None, always_update=True, init=False)
    cost = var(None, always_update=True, init=False)  # CostReport of the GPU prediction

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.quant = None  # QuantComparison, once measured
        self.weights = None  # [WeightStats]
        self.corpus: tuple[dict | None, str | None] = (None, None)  # ui --corpus: (doc, note)
        self._shown = None

    def watch_view(self, view: StopView | None) -> None:
        if view is not None and self.model is not None:
            self.show(self.model, view)

    def watch_cost(self) -> None:
        if self.view is not None and self.model is not None:
            self.show(self.model, self.view)

    def compose(self):
        yield Static(id="prof-time")
        yield Static(id="prof-quant")
        yield Static(id="prof-corpus")

    def on_resize(self) -> None:
        if self._shown is not None:
            self.show(*self._shown)

    def set_quant(self, weights, quant) -> None:
        self.weights, self.quant = weights, quant

    def set_corpus(self, doc: dict | None, note: str | None) -> None:
        self.corpus = (doc, note)
        update(self.query_one("#prof-corpus", Static), corpus_renderable(doc, note))

    def show(self, model, view: StopView) -> None:
        self._shown = (model, view)
        times = view.snapshot.node_times
        if self.time_of is not None:
            times = self.time_of(times)
        width = self.scrollable_content_region.width
        update(self.query_one("#prof-time", Static),
               time_tables(model, times, self.cost, width or None))
        update(self.query_one("#prof-quant", Static),
               quant_renderable(model.fir_f32, self.weights, self.quant))
        update(self.query_one("#prof-corpus", Static),
               corpus_renderable(*self.corpus, width or None))
