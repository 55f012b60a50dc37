"""Profile: per-node time (by node, by name, by layer) and quantization error once computed."""
from __future__ import annotations

from collections import defaultdict

from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..debug.session import Session


class ProfileView(VerticalScroll, can_focus=True):
    DEFAULT_CSS = """
    ProfileView { padding: 0 1; }
    ProfileView > Static { width: 100%; }
    """

    def compose(self):
        yield Static(id="prof-time")
        yield Static(id="prof-quant")

    def on_mount(self) -> None:
        self.quant = None  # QuantComparison from the profiler, when computed
        self.weights = None  # [WeightStats]

    def show(self, session: Session) -> None:
        times = session.node_times
        body = self.query_one("#prof-time", Static)
        if not times:
            body.update(Text("no timings yet: run some nodes (c, n, t)", style="dim"))
        else:
            nodes = session.model.nodes
            by_name: dict[str, list[float]] = defaultdict(list)
            by_layer: dict = defaultdict(float)
            for i, t in times.items():
                by_name[nodes[i].name].append(t)
                by_layer[nodes[i].layer] += t
            total = sum(times.values())
            grid = Table(title="time per node name (last run of each node)", title_justify="left",
                         expand=False, box=None, padding=(0, 1))
            for col in ("node", "kind", "runs", "total ms", "mean ms", "share"):
                grid.add_column(col, justify="right" if col not in ("node", "kind") else "left")
            for name, ts in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
                kind = next(n for n in nodes if n.name == name)
                share = sum(ts) / total if total else 0
                grid.add_row(name, f"{kind.kind} {kind.target}"[:22], str(len(ts)),
                             f"{sum(ts) * 1e3:.3f}", f"{sum(ts) / len(ts) * 1e3:.3f}",
                             Text("█" * int(share * 20) + f" {share:.0%}", style="cyan"))
            layers = Table(title="time per layer", title_justify="left", box=None, padding=(0, 1))
            layers.add_column("layer")
            layers.add_column("ms", justify="right")
            for layer, t in sorted(by_layer.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
                layers.add_row("-" if layer is None else str(layer), f"{t * 1e3:.3f}")
            outer = Table.grid(padding=(0, 4))
            outer.add_row(grid, layers)
            body.update(outer)
        self._show_quant(session)

    def _show_quant(self, session: Session) -> None:
        out = self.query_one("#prof-quant", Static)
        if session.model.fir_f32:
            out.update(Text("\nloaded with --fir-f32: no quantization to measure", style="dim"))
            return
        if self.quant is None and self.weights is None:
            out.update(Text("\npress p to measure quantization error (q4 vs an f32 shadow run of "
                            "the tokens so far)", style="dim"))
            return
        t = Table(title="quantization error per node output (mean over tokens)",
                  title_justify="left", box=None, padding=(0, 1))
        for col in ("node", "rel L2", "max abs", "cosine", "SQNR dB"):
            t.add_column(col, justify="left" if col == "node" else "right")
        if self.quant is not None:
            acc: dict[str, list] = defaultdict(list)
            for a in self.quant.activations:
                if a.primary:
                    acc[a.full_name].append(a)
            for node, rows in list(acc.items()):
                n = len(rows)
                t.add_row(node, f"{sum(r.rel_l2 for r in rows) / n:.4f}",
                          f"{max(r.max_abs for r in rows):.4g}",
                          f"{sum(r.cosine for r in rows) / n:.5f}",
                          f"{sum(r.sqnr_db for r in rows) / n:.1f}")
        w = Table(title="q4 weights", title_justify="left", box=None, padding=(0, 1))
        for col in ("weight", "rmse", "max", "p95", "median"):
            w.add_column(col, justify="left" if col == "weight" else "right")
        for ws in (self.weights or [])[:48]:
            w.add_row(ws.name, f"{ws.rmse:.3g}", f"{ws.max_abs:.3g}", f"{ws.p95_abs:.3g}",
                      f"{ws.median_abs:.3g}")
        logits = Text()
        if self.quant is not None and self.quant.logits:
            ls = self.quant.logits
            same = sum(1 for s in ls if s.same_top)
            logits.append(f"\nlogits over {len(ls)} tokens: mean KL(f32‖q4) "
                          f"{sum(s.kl for s in ls) / len(ls):.4g}, same top-1 {same}/{len(ls)}\n")
        grid = Table.grid(padding=(0, 4))
        grid.add_row(t, w)
        from rich.console import Group
        out.update(Group(Text(""), grid, logits))
