"""The debugger's screen: the status line, the loading panel and the panes.

The app is small (as toolong's): it opens the session, runs jobs and starts on
this screen (:meth:`FirscopeApp.get_default_screen`). Every pane binds to the
screen's ``model``, ``view`` (the last frozen stop) and what else it shows with
``data_bind``, and the screen's are bound to the app's (Textual's
``world_clock03`` pattern): the app sets ``view`` once and each pane's
``watch_view`` renders it. No code hands a view to a pane.
"""
from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import var
from textual.screen import Screen
from textual.widgets import Footer, Static, TabbedContent, TabPane

from .attention_view import AttentionView
from .buffers_view import BuffersView
from .console_view import ConsoleView
from .diff_view import DiffView
from .graph_pane import GraphPane, NodeList
from .lens_view import LensView
from .loading import LoadingPanel
from .profile_view import ProfileView
from .registers_pane import RightColumn
from .source_pane import SourcePane

NARROW = 100  # below this many columns the registers become a tab


class Bottom(TabbedContent):
    ALLOW_MAXIMIZE = True


class KeysFooter(Footer):
    """Textual's Footer, composed again only when the keys it shows change: Textual's
    composes its ~20 keys anew at every change of the screen's bindings (three times before
    the first stop, ~15 ms each with their styles and layout, the same keys each time)."""

    _shown: tuple | None = None

    def bindings_changed(self, screen) -> None:
        shown = self._keys_of(screen)
        if shown == self._shown and self._bindings_ready:
            return
        super().bindings_changed(screen)
        if screen.app.app_focus and self.is_attached and screen is self.screen:
            self._shown = shown  # what the compose it asked for draws (else: not composed)

    @staticmethod
    def _keys_of(screen) -> tuple:
        """What compose draws from: every active binding (shown or not), as drawn."""
        return tuple((key, b.key, b.action, b.description, b.show, b.group, enabled, tooltip)
                     for key, (_, b, enabled, tooltip) in screen.active_bindings.items())


class DebugScreen(Screen):
    """Layout classes on the screen (see app.tcss): -narrow, -console. The loading panel or
    the panes: :meth:`show_loading`."""

    # always_update: a new model or view is always drawn (and never compared: they hold arrays)
    model = var(None, always_update=True)  # the loaded Model
    view = var(None, always_update=True, init=False)  # the last frozen StopView
    follow = var(True)  # the graph cursor and the source follow the view's stop
    time_of = var(None)  # node times as shown (tests: a deterministic function)

    def compose(self) -> ComposeResult:
        s = DebugScreen
        yield Static(id="status")
        yield LoadingPanel(id="loading")
        with Vertical(id="main"):
            with Horizontal(id="top"):
                yield GraphPane(id="graph").data_bind(s.model, s.follow, s.time_of, s.view)
                yield SourcePane(id="source").data_bind(s.model, s.follow, s.view)
                yield RightColumn(id="right").data_bind(s.model, s.view)
            with Bottom(id="bottom", initial="buffers"):
                with TabPane("Buffers", id="buffers"):
                    yield BuffersView(id="buffers-view").data_bind(s.model, s.view)
                with TabPane("Attention", id="attention"):
                    yield AttentionView(id="attention-view").data_bind(s.model, s.view)
                with TabPane("Profile", id="profile"):
                    yield ProfileView(id="profile-view").data_bind(s.model, s.time_of, s.view)
                with TabPane("Console", id="console"):
                    yield ConsoleView(id="console-view")
                with TabPane("Lens", id="lens"):
                    yield LensView(id="lens-view").data_bind(s.view)
                with TabPane("Registers", id="regs"):
                    yield RightColumn(id="right-tab", classes="-row").data_bind(s.model, s.view)
                with TabPane("Diff", id="diff"):
                    yield DiffView(id="diff-view").data_bind(s.view)
        yield KeysFooter(compact=True)

    @dataclass
    class Ready(Message):
        """The panes are mounted: the app may start (loading the model)."""

    def show_loading(self, loading: bool) -> None:
        """The loading panel (while a model loads, or when it cannot) or the panes. Set on
        the two widgets: a class on the screen (as -narrow is) would restyle every widget
        under it, ~30-50 ms at the first stop."""
        self.query_one("#loading").display = loading
        self.query_one("#main").display = not loading

    @property
    def loading(self) -> bool:
        return bool(self.query_one("#loading").display)

    def on_mount(self) -> None:
        self.layout_for(self.app.size.width)
        self.post_message(self.Ready())

    def on_resize(self, event) -> None:
        self.layout_for(event.size.width)

    def layout_for(self, width: int) -> None:
        narrow = width < NARROW
        self.set_class(narrow, "-narrow")
        bottom = self.query_one(Bottom)
        if narrow:
            bottom.show_tab("regs")
        else:
            if bottom.active == "regs":
                bottom.active = "buffers"
            bottom.hide_tab("regs")

    def on_option_list_option_highlighted(self, event) -> None:
        """The graph cursor moved: the source shows that node's kernel."""
        if isinstance(event.option_list, NodeList) and self.view is not None:
            idx = event.option_list.cursor_node()
            pane = self.query_one(SourcePane)
            if idx is None or (pane.view is self.view and pane.shown_node == idx):
                return  # the graph followed the stop the source already shows
            # the graph redrawn on the same node (F9, a refresh): the source cursor stays
            pane.show(self.model, self.view, idx, keep=pane.shown_node == idx)
