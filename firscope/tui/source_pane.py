"""Kernel source: lines with .fir line numbers, pc, breakpoint gutter, nesting, heat."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from ..debug.session import Session
from ..text import printable
from .heat import ramp


class SourceLines(OptionList):
    """One option per source line of the kernel (id = line number)."""

    def cursor_line(self) -> int | None:
        opt = self.highlighted_option
        if opt is None or opt.id is None:
            return None
        return int(opt.id)


class SourcePane(Vertical):
    DEFAULT_CSS = """
    SourcePane { border: round $primary-darken-2; }
    SourcePane:focus-within { border: round $accent; }
    SourcePane SourceLines, SourcePane SourceLines:focus { height: 1fr; border: none; padding: 0;
                                                           scrollbar-size-vertical: 1; }
    SourcePane #ext-info { height: 1fr; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield SourceLines(id="source-lines")
        yield Static(id="ext-info")

    def on_mount(self) -> None:
        self.border_title = "Kernel"
        self.query_one("#ext-info").display = False
        self._shown_kernel = None

    def show(self, session: Session, node_index: int | None = None) -> None:
        """Show the kernel of the current node (or of ``node_index``, e.g. the graph cursor)."""
        model = session.model
        if session.finished and node_index is None:
            self._show_text("end of generation", "")
            return
        idx = session.node_index if node_index is None else node_index
        node = model.nodes[idx]
        live = idx == session.node_index and not session.finished
        if node.kind == "ext":
            self._show_ext(session, node)
            return
        lines_view = self.query_one(SourceLines)
        info = self.query_one("#ext-info", Static)
        info.display = False
        lines_view.display = True
        prog = node.program
        k = prog.kernel.syntax
        fir_lines = model.fir.lines
        d = session.dispatch if live else None
        pc_line = d.ops[d.pc].loc.line if d is not None and not d.done else None
        next_line = prog.ops[0].loc.line if live and d is None and prog.ops else None
        bps = session.breakpoints.lines(node.target)
        counts = session.line_counts.get(node.target)
        if d is not None:
            counts = d.line_counts
        per_line: dict[int, int] = {}
        depth: dict[int, int] = {}
        for op in prog.ops:
            depth[op.loc.line] = op.depth
            if counts is not None:
                per_line[op.loc.line] = per_line.get(op.loc.line, 0) + int(counts[op.pc])
        top = max(per_line.values()) if per_line else 0
        options = []
        for ln in range(k.loc.line, k.end.line + 1):
            text = fir_lines[ln - 1] if ln - 1 < len(fir_lines) else ""
            t = Text(no_wrap=True, overflow="ellipsis")
            t.append("●" if ln in bps else " ", style="red bold")
            here = ln == pc_line or ln == next_line
            t.append("▶" if ln == pc_line else ("▷" if ln == next_line else " "),
                     style="yellow bold")
            t.append(f"{ln:5d} ", style="dim")
            if top:
                n = per_line.get(ln)
                t.append(f"×{n:<6}" if n is not None else " " * 7,
                         style=(f"bold {ramp(0.35 + 0.65 * n / top).name}" if n else "dim") if n is not None
                         else "")
            body = printable(text.strip())  # the user sees \x1b, the terminal never gets it
            style = "bold yellow" if here else ("dim" if body.startswith("#") else "")
            t.append("  " * depth.get(ln, 0) + body, style=style)
            width = lines_view.size.width - 2
            if width > 10:
                t.truncate(width, overflow="ellipsis")
            options.append(Option(t, id=str(ln)))
        old = lines_view.highlighted
        lines_view.clear_options()
        lines_view.add_options(options)
        focus_line = pc_line or next_line
        if focus_line is not None:
            lines_view.highlighted = focus_line - k.loc.line
        elif old is not None and self._shown_kernel == node.target:
            lines_view.highlighted = min(old, len(options) - 1)
        self._shown_kernel = node.target
        where = f"{node.target} · {printable(model.path.name)}:{pc_line or k.loc.line}"
        self.border_title = where
        lanes = prog.threads
        self.border_subtitle = (f"{node.full_name} · {lanes} lanes"
                                + (f" · pc {d.pc}" if d is not None and not d.done else ""))

    def _show_text(self, title: str, body: str) -> None:
        self.query_one(SourceLines).display = False
        info = self.query_one("#ext-info", Static)
        info.display = True
        info.update(body)
        self.border_title = title
        self.border_subtitle = ""

    def _show_ext(self, session: Session, node) -> None:
        t = Text()
        t.append(f"{node.full_name}: ext {node.target}\n", style="bold")
        t.append(printable(session.model.fir.lines[node.loc.line - 1].strip()) + "\n\n",
                 style="dim")
        for label, ops in (("in", node.args), ("out", node.outs)):
            for i, o in enumerate(ops):
                t.append(f"{label}{i} ", style="cyan")
                t.append(f"{o.display}", style="bold")
                t.append(f"  {o.kind}, {o.size:,} elements\n")
                w = o.weight
                if w is not None:
                    t.append(f"     {w.dtype} declared {list(w.shape)}, {w.stored}\n")
                    if w.q4 is not None:
                        t.append(f"     q4 group {w.q4.group}, {w.q4.ngroups} groups/row, "
                                 f"{w.q4.nbytes:,} bytes\n")
        if node.target == "fir.linear":
            t.append("\ny = x · W  (W declared [in, out])\n", style="dim")
        elif node.target == "fir.linear_t":
            t.append("\ny = W · x  (W declared [out, in])\n", style="dim")
        else:
            t.append("\nout = table[int(ids[0])]\n", style="dim")
        last = session.node_times.get(node.index)
        if last is not None:
            t.append(f"\nlast run: {last * 1e3:.3f} ms\n")
        self._show_text(f"{node.target} · {printable(session.model.path.name)}:{node.loc.line}",
                        t)
        self.border_subtitle = node.full_name
