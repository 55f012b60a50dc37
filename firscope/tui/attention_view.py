"""Attention: per layer and head, the softmax row of the current token over positions
0..position, and a tokens-by-positions map across the decoded tokens, with a legend."""
from __future__ import annotations

import numpy as np
from rich.text import Text
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.reactive import var
from textual.widgets import Static

from ..debug.session import Session
from ..profile.sites import find_attention_sites
from .heat import half_block_rows, legend
from .state import StopView
from .paint import update


class AttentionRecorder:
    """Copies each attention node's probabilities as it completes: (step, layer) -> [H, pos+1]."""

    def __init__(self, session: Session):
        self.sites = {s.node: s for s in find_attention_sites(session.model)}
        self.maps: dict[tuple[int, int | None], np.ndarray] = {}
        session.observe_nodes(self)

    def __call__(self, session: Session, node) -> None:
        site = self.sites.get(node.index)
        if site is None:
            return
        pos = session.step
        rows = session.arena[site.base: site.base + site.n_head * site.n_positions].reshape(
            site.n_head, site.n_positions)[:, : pos + 1].copy()
        self.maps[(pos, node.layer)] = rows

    @property
    def layers(self) -> list:
        return sorted({s.layer for s in self.sites.values()}, key=lambda x: -1 if x is None else x)


def attention_text(view: StopView, sites: dict, layer, head: int, width: int) -> Text:
    """Softmax rows of the latest token whose attention ran in ``layer``, per head, and
    the tokens-by-positions map of ``head`` (pure: frozen maps in, text out)."""
    if not sites:
        return Text("no attention node found (a kernel storing into a buffer of "
                    "n_head × n_positions elements)", style="dim")
    maps = view.attention
    n_head = next(iter(sites.values())).n_head
    steps = sorted(p for (p, l) in maps if l == layer and p <= view.snapshot.step)
    t = Text()
    if not steps:
        t.append(f"layer {layer}: attention has not run yet for this token; "
                 "step or continue past an attention node\n", style="dim")
        return t
    cur = steps[-1]
    rows = maps[(cur, layer)]
    t.append(f"scores · layer {layer} · query pos {cur}", style="bold")
    if cur < len(view.pieces):
        t.append(f" {view.pieces[cur]!r}")
    t.append("   ←/→ layer  ↑/↓ head   ")
    t.append_text(legend(0.0, 1.0))
    t.append("\n")
    width = max(width - 30, 20)
    cols = min(rows.shape[1], width)
    cell = max(1, min(4, width // max(cols, 1)))  # widen cells when there are few keys
    for h in range(n_head):
        r = np.repeat(rows[h, -cols:], cell)
        chosen = h == head
        t.append(f"head {h:<3}" + (" ▶" if chosen else "  "), style="bold" if chosen else "")
        t.append_text(half_block_rows(np.vstack([r, r]), 0.0, 1.0)[0])
        t.append(f"  max {rows[h].max():.2f}@{int(np.argmax(rows[h]))}\n", style="dim")
    pieces = list(view.pieces[: cur + 1])[-cols:]
    t.append("keys     ", style="dim")
    t.append("".join((p[0] if p else "?").ljust(cell) for p in pieces) + "\n", style="cyan")
    # tokens-by-positions for the selected head: rows = query tokens, cols = key positions
    t.append(f"\nhead {head}, layer {layer}: query tokens (rows) × key positions (cols)\n",
             style="bold")
    full = np.full((len(steps), cur + 1), np.nan)
    for i, p in enumerate(steps):
        full[i, : p + 1] = maps[(p, layer)][head]
    shown = np.repeat(full[-2 * 12:, -cols:], cell, axis=1)
    masked = np.where(np.isnan(shown), 0.0, shown)
    for i, line in enumerate(half_block_rows(masked, 0.0, 1.0)):
        q0 = steps[-len(shown):][2 * i] if 2 * i < len(shown) else 0
        t.append(f"q{q0:<4}    ", style="dim")
        t.append_text(line)
        t.append("\n")
    return t


class AttentionView(VerticalScroll, can_focus=True):
    BINDINGS = [Binding("left", "layer(-1)", "layer-"), Binding("right", "layer(1)", "layer+"),
                Binding("up", "head(-1)", "head-"), Binding("down", "head(1)", "head+")]
    DEFAULT_CSS = """
    AttentionView { padding: 0 1; }
    """

    # bound to the screen's (data_bind): the model and the frozen stop
    model = var(None, always_update=True)
    view: var[StopView | None] = var(None, always_update=True, init=False)
    # the cursors: which attention layer (an index into att_layers) and head; they wrap
    layer_i = var(0, init=False)
    head = var(0, init=False)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.sites: dict = {}
        self.att_layers: list = []

    def compose(self):
        yield Static(id="att-body")

    def watch_model(self, model) -> None:
        if model is None:
            return
        self.sites = {s.node: s for s in find_attention_sites(model)}
        self.att_layers = sorted({s.layer for s in self.sites.values()},
                                 key=lambda x: -1 if x is None else x)
        self.set_reactive(AttentionView.layer_i,
                          min(self.layer_i, max(len(self.att_layers) - 1, 0)))

    def validate_layer_i(self, value: int) -> int:
        return value % len(self.att_layers) if self.att_layers else 0

    def validate_head(self, value: int) -> int:
        return value % next(iter(self.sites.values())).n_head if self.sites else 0

    def watch_layer_i(self) -> None:
        self.render_view()

    def watch_head(self) -> None:
        self.render_view()

    def action_layer(self, delta: int) -> None:
        self.layer_i += delta

    def action_head(self, delta: int) -> None:
        self.head += delta

    def watch_view(self, view: StopView | None) -> None:
        if view is None or self.model is None:
            return
        idx = view.node_index
        self.show(view, self.model.nodes[idx].layer if idx is not None else None)

    def show(self, view: StopView, layer) -> None:
        """Follow the stop's layer (the user's ←/→ choice holds until the layer changes)."""
        self.set_reactive(AttentionView.view, view)
        if layer in self.att_layers:
            self.set_reactive(AttentionView.layer_i, self.att_layers.index(layer))
        self.render_view()

    def render_view(self) -> None:
        if self.view is None:
            return
        layer = self.att_layers[self.layer_i] if self.att_layers else None
        if self.size.width <= 0:
            return  # hidden (another tab): drawn when shown, at its width
        update(self.query_one("#att-body", Static),
               attention_text(self.view, self.sites, layer, self.head, self.size.width))

    def on_resize(self) -> None:
        self.render_view()
