"""Attention: per layer and head, the softmax row of the current token over positions
0..position, and a tokens-by-positions map across the decoded tokens, with a legend."""
from __future__ import annotations

import numpy as np
from rich.text import Text
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..debug.session import Session
from ..profile.collect import find_attention_sites
from .heat import half_block_rows, legend


class AttentionRecorder:
    """Copies each attention node's probabilities as it completes: (step, layer) -> [H, pos+1]."""

    def __init__(self, session: Session):
        self.sites = {s.node: s for s in find_attention_sites(session.model)}
        self.maps: dict[tuple[int, int | None], np.ndarray] = {}
        session.node_observers.append(self)

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


class AttentionView(VerticalScroll, can_focus=True):
    BINDINGS = [Binding("left", "layer(-1)", "layer-"), Binding("right", "layer(1)", "layer+"),
                Binding("up", "head(-1)", "head-"), Binding("down", "head(1)", "head+")]
    DEFAULT_CSS = """
    AttentionView { padding: 0 1; }
    """

    def compose(self):
        yield Static(id="att-body")

    def on_mount(self) -> None:
        self.session: Session | None = None
        self.recorder: AttentionRecorder | None = None
        self.layer_i = 0
        self.head = 0
        self.tokenizer = None

    def bind_session(self, session: Session, recorder: AttentionRecorder, tokenizer) -> None:
        self.session, self.recorder, self.tokenizer = session, recorder, tokenizer

    def action_layer(self, delta: int) -> None:
        if self.recorder and self.recorder.layers:
            self.layer_i = (self.layer_i + delta) % len(self.recorder.layers)
            self.show()

    def action_head(self, delta: int) -> None:
        if self.recorder and self.recorder.sites:
            n = next(iter(self.recorder.sites.values())).n_head
            self.head = (self.head + delta) % n
            self.show()

    def follow_layer(self, layer) -> None:
        if self.recorder and layer in self.recorder.layers:
            self.layer_i = self.recorder.layers.index(layer)

    def show(self) -> None:
        body = self.query_one("#att-body", Static)
        s, rec = self.session, self.recorder
        if s is None or rec is None:
            return
        if not rec.sites:
            body.update(Text("no attention node found (a kernel storing into a buffer of "
                             "n_head × n_positions elements)", style="dim"))
            return
        layer = rec.layers[self.layer_i]
        n_head = next(iter(rec.sites.values())).n_head
        # the latest token whose attention for this layer has run
        steps = sorted(p for (p, l) in rec.maps if l == layer and p <= s.step)
        t = Text()
        if not steps:
            t.append(f"layer {layer}: attention has not run yet for this token; "
                     "step or continue past an attention node\n", style="dim")
            body.update(t)
            return
        cur = steps[-1]
        rows = rec.maps[(cur, layer)]
        tok = s.sequence[cur] if cur < len(s.sequence) else None
        t.append(f"scores · layer {layer} · query pos {cur}", style="bold")
        t.append(f" {self.tokenizer.piece(tok)!r}" if tok is not None else "")
        t.append("   ←/→ layer  ↑/↓ head   ")
        t.append_text(legend(0.0, 1.0))
        t.append("\n")
        width = max(self.size.width - 30, 20)
        cols = min(rows.shape[1], width)
        cell = max(1, min(4, width // max(cols, 1)))  # widen cells when there are few keys
        for h in range(n_head):
            r = np.repeat(rows[h, -cols:], cell)
            t.append(f"head {h:<3}" + (" ▶" if h == self.head else "  "),
                     style="bold" if h == self.head else "")
            t.append_text(half_block_rows(np.vstack([r, r]), 0.0, 1.0)[0])
            top = int(np.argmax(rows[h]))
            t.append(f"  max {rows[h].max():.2f}@{top}\n", style="dim")
        pieces = [self.tokenizer.piece(x) for x in s.sequence[: cur + 1]][-cols:]
        t.append("keys     ", style="dim")
        t.append("".join((p[0] if p else "?").ljust(cell) for p in pieces) + "\n", style="cyan")
        # tokens-by-positions for the selected head: rows = query tokens, cols = key positions
        t.append(f"\nhead {self.head}, layer {layer}: query tokens (rows) × key positions (cols)\n",
                 style="bold")
        full = np.full((len(steps), cur + 1), np.nan)
        for i, p in enumerate(steps):
            full[i, : p + 1] = rec.maps[(p, layer)][self.head]
        shown = np.repeat(full[-2 * 12:, -cols:], cell, axis=1)
        masked = np.where(np.isnan(shown), 0.0, shown)
        for i, line in enumerate(half_block_rows(masked, 0.0, 1.0)):
            q0 = steps[-len(shown):][2 * i] if 2 * i < len(shown) else 0
            t.append(f"q{q0:<4}    ", style="dim")
            t.append_text(line)
            t.append("\n")
        body.update(t)
