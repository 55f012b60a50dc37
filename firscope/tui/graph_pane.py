"""The graph pane: the unrolled node list grouped by layer, and the token strip."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from ..debug.breakpoints import LineBreakpoint, NodeBreakpoint
from ..debug.session import Session


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    return f"{seconds * 1e3:.2f}ms"


class TokenStrip(Static):
    DEFAULT_CSS = """
    TokenStrip { height: auto; max-height: 3; padding: 0 1; }
    """

    def show(self, session: Session, tokenizer) -> None:
        t = Text()
        n_prompt = len(session.prompt)
        for i, tok in enumerate(session.sequence):
            piece = tokenizer.piece(tok)
            style = "bold reverse" if i == session.step and not session.finished else (
                "cyan" if i < n_prompt else "green")
            t.append(piece, style=style)
            t.append(" " if len(piece) > 1 else "")
        remaining = session.total_steps + 1 - len(session.sequence)
        if remaining > 0:
            t.append(f" +{remaining}", style="dim")
        self.update(t)


class NodeList(OptionList):
    """One option per node (id = node index); layer headers are disabled options."""


    def show(self, session: Session, keep_cursor: bool = True) -> None:
        model = session.model
        bp_nodes = {(bp.node, bp.layer) for bp in session.breakpoints.enabled(NodeBreakpoint)}
        line_kernels = {bp.kernel for bp in session.breakpoints.enabled(LineBreakpoint)}
        current = session.node_index if not session.finished else None
        old = self.highlighted
        options = []
        last_layer = "none"
        for node in model.nodes:
            if node.layer != last_layer and node.layer is not None:
                options.append(Option(Text(f"▾ layer {node.layer}", style="bold"),
                                      id=f"layer{node.layer}", disabled=True))
            last_layer = node.layer
            mark = "●" if (node.name, None) in bp_nodes or (node.name, node.layer) in bp_nodes \
                else ("○" if node.kind == "micro" and node.target in line_kernels else " ")
            here = "▶" if node.index == current else " "
            indent = "  " if node.layer is not None else ""
            t = Text(no_wrap=True, overflow="ellipsis")
            t.append(mark, style="red bold")
            t.append(here, style="yellow bold")
            t.append(f"{indent}{node.name:<18.18}", style="bold yellow" if node.index == current
                     else ("" if node.kind == "micro" else "italic"))
            t.append(f"{_ms(session.node_times.get(node.index)):>8}", style="dim")
            options.append(Option(t, id=str(node.index)))
        self.clear_options()
        self.add_options(options)
        if keep_cursor and old is not None and old < len(options):
            self.highlighted = old
        elif current is not None:
            self.highlighted = self.index_of_node(current)

    def index_of_node(self, node_index: int) -> int:
        for i in range(self.option_count):
            if self.get_option_at_index(i).id == str(node_index):
                return i
        return 0

    def follow(self, session: Session) -> None:
        if not session.finished:
            self.highlighted = self.index_of_node(session.node_index)

    def cursor_node(self) -> int | None:
        opt = self.highlighted_option
        if opt is None or opt.id is None or not opt.id.isdigit():
            return None
        return int(opt.id)


class GraphPane(Vertical):
    DEFAULT_CSS = """
    GraphPane { border: round $primary-darken-2; }
    GraphPane:focus-within { border: round $accent; }
    GraphPane NodeList, GraphPane NodeList:focus { height: 1fr; border: none; padding: 0;
                                                   scrollbar-size-vertical: 1; }
    """

    def compose(self) -> ComposeResult:
        yield TokenStrip(id="tokens")
        yield NodeList(id="nodes")

    def on_mount(self) -> None:
        self.border_title = "Graph"

    def show(self, session: Session, tokenizer, follow: bool = True) -> None:
        self.query_one(TokenStrip).show(session, tokenizer)
        nodes = self.query_one(NodeList)
        nodes.show(session)
        if follow:
            nodes.follow(session)
        self.border_subtitle = f"{len(session.model.nodes)} nodes"
