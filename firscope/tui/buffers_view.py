"""Buffers: any buffer or weight, any layer: values with paging, shape, statistics,
a histogram and a sparkline; a q4 weight also shows codes, scale and min per group
and its dequantization error against the checkpoint's f32 values."""
from __future__ import annotations

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Static

from ..debug.session import Session
from ..errors import FirError
from ..model import Ref
from .heat import histogram, sparkline

PAGE = 64  # values per page (8 rows of 8)


class ValuesView(Static, can_focus=True):
    BINDINGS = [Binding("pagedown", "page(1)", "next page"), Binding("pageup", "page(-1)", "prev page"),
                Binding("home", "first", "first page", show=False),
                Binding("end", "last", "last page", show=False)]

    def on_resize(self) -> None:
        self.parent.parent.show()  # re-flow the values to the new width

    def action_page(self, delta: int) -> None:
        self.parent.parent.page(delta)

    def action_first(self) -> None:
        self.parent.parent.page(-10 ** 9)

    def action_last(self) -> None:
        self.parent.parent.page(10 ** 9)


class BuffersView(Vertical):
    DEFAULT_CSS = """
    BuffersView #buf-bar { height: 3; }
    BuffersView #buf-name { width: 32; }
    BuffersView #buf-hint { width: 1fr; padding: 1 1 0 1; color: $text-muted; }
    BuffersView #buf-stats { height: auto; padding: 0 1; }
    BuffersView #buf-body { height: 1fr; }
    BuffersView ValuesView { width: 1fr; padding: 0 1; }
    BuffersView #buf-q4 { width: 48; padding: 0 1; border-left: solid $primary-darken-2; }
    """

    def compose(self) -> ComposeResult:
        with Horizontal(id="buf-bar"):
            yield Input(value="x", placeholder="buffer or weight, e.g. key_cache@1 or qkvw@0",
                        id="buf-name")
            yield Static("enter a name · PgUp/PgDn pages · names: ", id="buf-hint")
        yield Static(id="buf-stats")
        with Horizontal(id="buf-body"):
            yield ValuesView(id="buf-values")
            yield Static(id="buf-q4")

    def on_mount(self) -> None:
        self.session: Session | None = None
        self.value_offset = 0
        self.name_shown = "x"
        self._q4_error_cache: dict[str, np.ndarray] = {}
        self._stats_cache: dict[str, Text] = {}

    def bind_session(self, session: Session) -> None:
        self.session = session
        self._stats_cache.clear()  # a reload may have changed the weights
        self._q4_error_cache.clear()
        names = list(session.model.buffers)[:6]
        self.query_one("#buf-hint", Static).update(
            "Enter shows it · PgUp/PgDn pages · e.g. " + ", ".join(names) + ", qkvw@0")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "buf-name":
            self.name_shown = event.value.strip()
            self.value_offset = 0
            self.show()
            self.query_one(ValuesView).focus()

    def page(self, delta: int) -> None:
        self.value_offset = max(0, self.value_offset + delta * PAGE)
        self.show()

    def show_name(self, name: str) -> None:
        self.name_shown = name
        self.value_offset = 0
        self.query_one("#buf-name", Input).value = name
        self.show()

    def show(self) -> None:
        s = self.session
        stats = self.query_one("#buf-stats", Static)
        values = self.query_one(ValuesView)
        q4 = self.query_one("#buf-q4", Static)
        if s is None:
            return
        text = self.name_shown
        try:
            ref = Ref.parse(text)
            arr = s.buffer_value(ref.name, ref.layer)
        except FirError as e:
            stats.update(Text(str(e), style="red"))
            values.update("")
            q4.display = False
            return
        name, layer = ref.name, "" if ref.layer is None else str(ref.layer)
        arr = np.asarray(arr)
        flat = arr.reshape(-1)
        n = flat.size
        self.value_offset = min(self.value_offset, max(0, (n - 1) // PAGE * PAGE))
        shown_layer = layer if layer else (str(s.layer) if s.layer is not None and
                                           _per_layer(s, name) else "")
        label = f"{name}{'@' + shown_layer if shown_layer else ''}"
        # Weights never change: their statistics (38M values for GPT-2's wte) are
        # computed once, not on every stop.
        t = self._stats_cache.get(label) if name not in s.model.buffers else None
        if t is None:
            t = _stats_text(label, arr)
            if name not in s.model.buffers:
                self._stats_cache[label] = t
        stats.update(t)
        v = Text(no_wrap=True)
        per_row = max(1, min(8, (values.size.width - 10) // 11)) if values.size.width else 8
        page = flat[self.value_offset: self.value_offset + PAGE]
        for row in range(0, page.size, per_row):
            v.append(f"[{self.value_offset + row:>7}] ", style="dim")
            for x in page[row: row + per_row]:
                style = "bold red" if not np.isfinite(x) else ""
                v.append(f"{float(x):>11.5g}", style=style)
            v.append("\n")
        v.append(f"{self.value_offset}..{min(self.value_offset + PAGE, n) - 1} of {n}", style="dim")
        values.update(v)
        self._show_q4(name, layer)

    def _show_q4(self, name: str, layer: str) -> None:
        s = self.session
        q4 = self.query_one("#buf-q4", Static)
        disp = name if name in s.model.weights else f"{name}@{layer or s.layer}"
        w = s.model.weights.get(disp)
        if w is None or w.q4 is None:
            q4.display = False
            return
        q4.display = True
        q = w.q4
        row = self.value_offset // q.cols
        col0 = self.value_offset % q.cols
        g0 = col0 // q.group
        t = Text()
        t.append(f"q4 {disp}: [{q.rows} out, {q.cols} in], group {q.group}\n", style="bold")
        t.append(f"row {row}, groups {g0}..{min(g0 + 3, q.ngroups - 1)}\n")
        codes = q.codes()[row]
        for g in range(g0, min(g0 + 4, q.ngroups)):
            t.append(f"g{g:<4} scale {float(q.scale[row, g]):.4g} min {float(q.minimum[row, g]):.4g}\n",
                     style="cyan")
            c = codes[g * q.group:(g + 1) * q.group]
            t.append("  " + "".join(f"{int(x):x}" for x in c) + "\n", style="dim")
        err = self._q4_error(w)
        if err is not None:
            ae = np.abs(err)
            t.append(f"\nerror vs f32: rmse {np.sqrt((err ** 2).mean()):.3g}  max {ae.max():.3g}\n"
                     f"p95 {np.percentile(ae, 95):.3g}  median {np.median(ae):.3g}\n")
            rel = ae / np.repeat(q.scale, q.group, axis=1)[:, : q.cols]
            t.append(f"|err|/scale max {rel.max():.3f} (≤ 0.5 + rounding)\n", style="dim")
        t.append(f"scales {q.scale.min():.3g}..{q.scale.max():.3g}  mins {q.minimum.min():.3g}.."
                 f"{q.minimum.max():.3g}", style="dim")
        q4.update(t)

    def _q4_error(self, w) -> np.ndarray | None:
        if w.name in self._q4_error_cache:
            return self._q4_error_cache[w.name]
        try:
            from ..model.checkpoint import Checkpoint
            ck = Checkpoint(self.session.model.config_path.parent)
            original = np.ascontiguousarray(ck.read(w.tensor).T)
        except FirError:
            return None
        err = original.astype(np.float64) - w.q4.dequantize()
        self._q4_error_cache[w.name] = err
        return err


def _stats_text(label: str, arr: np.ndarray) -> Text:
    flat = arr.reshape(-1)
    a64 = flat.astype(np.float64)
    finite = a64[np.isfinite(a64)]
    nan = int(np.isnan(a64).sum())
    inf = int(np.isinf(a64).sum())
    t = Text()
    t.append(label, style="bold")
    t.append(f"   shape {list(arr.shape)}  {flat.size} f32")
    if finite.size:
        t.append(f"\nmin {finite.min():.6g}  max {finite.max():.6g}  mean {finite.mean():.6g}"
                 f"  std {finite.std():.6g}")
    t.append("  NaN ")
    t.append(str(nan), style="bold red" if nan else "")
    t.append("  Inf ")
    t.append(str(inf), style="bold red" if inf else "")
    hist, lo, hi = histogram(flat)
    t.append(f"\nhist {lo:.3g} ")
    t.append(hist, style="cyan")
    t.append(f" {hi:.3g}   spark ")
    t.append(sparkline(flat, 40), style="green")
    return t


def _per_layer(session: Session, name: str) -> bool:
    m = session.model
    if name in m.buffers:
        return m.buffers[name].per_layer
    return any(w.decl == name and w.layer is not None for w in m.weights.values())
