"""The Textual app: routes keys to the debugger's command interpreter and shows each stop.

Every engine action is one command line through
:meth:`CommandInterpreter.run`, run in a thread worker (one at a time; keys
pressed meanwhile are queued, like typing ahead in gdb). The worker freezes
what the panes show (:func:`~firscope.tui.state.build_view`) and posts it as a
:class:`JobDone` message; the UI thread only renders those frozen views, so no
widget reads the live session while a worker runs. A run never moves focus;
escape interrupts it (or an export, which then leaves no files).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.reactive import reactive
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Input, Label, ProgressBar, Static, TabbedContent, TabPane

from ..text import printable
from ..debug.commands import Result
from ..errors import FirError
from .attention_view import AttentionView
from .buffers_view import BuffersView
from .console_view import CommandInput, ConsoleView, completion_words
from .graph_pane import GraphPane, NodeList
from .jobs import Interrupted, Probe
from .keys import bindings
from .loading import LoadingPanel, UiOptions, open_session
from .messages import Job, JobDone, LoadFailed, Loaded, LoadProgress
from .diff_view import DiffView
from .lens_view import LensView, end_of_layer
from .palette import DebuggerCommands
from .cost_actions import CostActions
from .report_actions import ReportActions
from .save_actions import SaveActions
from .profile_view import ProfileView
from .registers_pane import RegistersPane, RightColumn
from .safe_text import ControlCharacterFilter
from .reload import carry
from .screens import HelpScreen, HistoryScreen, PromptScreen
from .source_pane import SourceLines, SourcePane
from .state import StopView, Wants, build_view, status_bar
from ..runtime import NodeKind

MAX_PENDING = 32
NARROW = 100  # below this many columns the registers become a tab


class Bottom(TabbedContent):
    ALLOW_MAXIMIZE = True


class FirscopeApp(CostActions, ReportActions, SaveActions, App):
    CSS_PATH = "app.tcss"
    ALLOW_IN_MAXIMIZED_VIEW = "Footer, #status"  # a maximized pane keeps the header
    TITLE = "firscope"
    COMMANDS = App.COMMANDS | {DebuggerCommands}
    BINDINGS = bindings()
    # The last frozen stop: every JobDone / Loaded message sets it, watch_view renders it.
    view: reactive[StopView | None] = reactive(None, always_update=True, init=False)

    def __init__(self, model_path: Path, options: UiOptions | None = None, **fields):
        """``options``, or its fields as keywords (``FirscopeApp(path, n=4)``)."""
        super().__init__()
        if options is not None and fields:
            raise TypeError("give the UiOptions or its fields, not both")
        self.options = options = options if options is not None else UiOptions(**fields)
        # --device: the Profile tab shows GPU predictions (firscope/cost), kept current
        self.device_name = options.device
        self._cost_key = None  # the step the last prediction was asked for
        # every line of every widget: no control character from a file reaches the terminal
        self.control_filter = ControlCharacterFilter()
        self.model_path = Path(model_path)
        self.show_times = options.show_times
        # node times as shown: tests pass a deterministic function of the real ones
        self.time_of = options.time_of if options.time_of is not None else (
            None if options.show_times else (lambda times: {}))
        self.session = self.ci = self.tokenizer = self.recorder = None
        self.model = None
        self._follow = True  # the graph cursor follows the next view's stop
        self.wants = Wants()
        self.probe = Probe()
        self.busy = False
        self.job: Job | None = None
        self.pending: list[Job] = []
        self.status_text = "loading"
        self.status_error = False
        self.load_error: FirError | None = None
        self._pane_focus = None  # the pane focus returns to when an input is left
        self._carried = None  # what F2 carries into the reloaded session

    # -- layout -----------------------------------------------------------------------
    def get_line_filters(self):
        return [*super().get_line_filters(), self.control_filter]

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield LoadingPanel(id="loading")
        with Vertical(id="main"):
            with Horizontal(id="top"):
                yield GraphPane(id="graph")
                yield SourcePane(id="source")
                yield RightColumn(id="right")
            with Bottom(id="bottom", initial="buffers"):
                with TabPane("Buffers", id="buffers"):
                    yield BuffersView(id="buffers-view")
                with TabPane("Attention", id="attention"):
                    yield AttentionView(id="attention-view")
                with TabPane("Profile", id="profile"):
                    yield ProfileView(id="profile-view")
                with TabPane("Console", id="console"):
                    yield ConsoleView(id="console-view")
                with TabPane("Lens", id="lens"):
                    yield LensView(id="lens-view")
                with TabPane("Registers", id="regs"):
                    yield RightColumn(id="right-tab", classes="-row")
                with TabPane("Diff", id="diff"):
                    yield DiffView(id="diff-view")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.screen.add_class("-loading")
        self.query_one(GraphPane).time_of = self.time_of
        self.query_one(ProfileView).time_of = self.time_of
        self._layout_for(self.size.width)
        self.set_interval(0.25, self._show_progress)
        self.set_status()
        self.load(None)

    def on_resize(self, event) -> None:
        self._layout_for(event.size.width)

    def _layout_for(self, width: int) -> None:
        narrow = width < NARROW
        self.screen.set_class(narrow, "-narrow")
        bottom = self.query_one(Bottom)
        if narrow:
            bottom.show_tab("regs")
        else:
            if bottom.active == "regs":
                bottom.active = "buffers"
            bottom.hide_tab("regs")

    # -- loading ------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load")
    def load(self, carried) -> None:
        try:
            parts = open_session(self.model_path, self.options, carried, self.probe, self.wants,
                                 lambda what, frac: self.post_message(LoadProgress(what, frac)))
        except FirError as e:
            self.post_message(LoadFailed(e))
            return
        except Exception as e:  # a bug: keep the app alive and say so
            self.post_message(LoadFailed(FirError(
                f"internal error while loading: {type(e).__name__}: {e}")))
            return
        self.post_message(Loaded(parts))

    def on_load_progress(self, message: LoadProgress) -> None:
        self.query_one("#load-label", Label).update(
            f"{printable(self.model_path.name)}: {message.what}")
        self.query_one("#load-bar", ProgressBar).update(progress=message.frac * 100)

    def on_load_failed(self, message: LoadFailed) -> None:
        e = message.error
        self.load_error = e
        self.query_one(LoadingPanel).add_class("-error")
        self.query_one("#load-error", Static).update(
            Text(str(e) + "\n\nfix the file and press F2 to reload, or q to quit", style="bold"))
        self.query_one("#load-label", Label).update(f"{printable(self.model_path)}: cannot load")
        self.screen.add_class("-loading")
        self.set_status("error: " + e.message.splitlines()[0], error=True)

    def on_loaded(self, message: Loaded) -> None:
        p = message.parts
        first = self.session is None and self.model is None
        self.session, self.ci, self.tokenizer = p["session"], p["ci"], p["tok"]
        self.recorder, self.model = p["recorder"], p["session"].model
        self.load_error = None
        self.query_one(LoadingPanel).remove_class("-error")
        self.screen.remove_class("-loading")
        self.query_one(BuffersView).bind_model(self.model)
        self.query_one(AttentionView).bind_model(self.model)
        console = self.query_one(ConsoleView)
        console.set_words(completion_words(self.ci, self.model))
        s = self.session
        console.write(f"firscope: {self.model.path} · {len(self.model.nodes)} nodes · engine "
                      f"{s.machine.engine} · prompt {len(s.prompt)} tokens, {s.n_generate} to "
                      f"generate" + (f" · loaded in {p['seconds']:.2f} s" if self.show_times
                                     else ""))
        for note in p["notes"]:
            console.write(note, "yellow" if note.startswith("not restored") else None)
        if any(n.startswith("not restored") for n in p["notes"]):
            self.notify("some breakpoints did not survive the reload: see the console",
                        severity="warning", timeout=8)
        if not first and (note := self._save_note(self._carried)):
            console.write(note)
        console.write(self.ci.where_line())
        self.show_view(p["view"])
        self.set_status(p["view"].status)
        if first or self.focused is None:
            self.query_one(NodeList).focus()

    # -- status and views --------------------------------------------------------------------
    def set_status(self, text: str | None = None, *, error: bool = False) -> None:
        if text is not None:
            self.status_text, self.status_error = text, error
        self.query_one("#status", Static).update(status_bar(
            self.status_text, self.view, max(self.size.width, 20), busy=self.busy,
            error=self.status_error))

    def _show_progress(self) -> None:
        if not self.busy:
            return
        line = self.probe.line()
        if line is not None:
            self.set_status(line)

    def show_view(self, view: StopView, follow: bool = True) -> None:
        """Put a frozen stop into the ``view`` reactive (``watch_view`` renders it)."""
        self._follow = follow
        self.view = view

    def watch_view(self, view: StopView | None) -> None:
        """Render one frozen stop in every pane."""
        if view is None or self.model is None:
            return
        m = self.model
        self.query_one(GraphPane).show(m, view, follow=self._follow)
        if self._follow:
            self.query_one(SourcePane).show(m, view)
        else:  # nothing moved (F9 on a line, display, set): the source stays where it was
            self.query_one(SourcePane).show(m, view, self.query_one(NodeList).cursor_node(),
                                            keep=True)
        for col in self.query(RightColumn):
            col.show(m, view)
        self.query_one(BuffersView).show(view)
        idx = view.node_index
        self.query_one(AttentionView).show(view, m.nodes[idx].layer if idx is not None else None)
        self.query_one(LensView).show(view)
        self.query_one(DiffView).show(view)
        self.query_one(ProfileView).show(m, view)

    def on_option_list_option_highlighted(self, event) -> None:
        if isinstance(event.option_list, NodeList) and self.view is not None:
            idx = event.option_list.cursor_node()
            if idx is not None:
                pane = self.query_one(SourcePane)
                # the graph redrawn on the same node (F9, a refresh): the source cursor stays
                pane.show(self.model, self.view, idx, keep=pane.shown_node == idx)

    # -- running commands --------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        if self.session is None:
            self.notify("no model loaded", severity="warning")
            return
        if self.busy:
            if len(self.pending) >= MAX_PENDING:
                self.notify("still running — press escape to interrupt", severity="warning")
            else:
                self.pending.append(job)
            return
        self.busy, self.job = True, job
        # An escape meant for an earlier job must not stop this one; cleared here, before the
        # worker starts, so that an escape pressed from now on is never lost (the engine
        # only reads the flag).
        self._cancel_flag().clear()
        self.probe.reset(job.label)
        if job.moves:
            self.set_status(f"running: {job.label} (escape interrupts)")
        self._run_job(job, self.wants)

    @work(thread=True, group="engine")
    def _run_job(self, job: Job, wants: Wants) -> None:
        out = error = None
        try:
            out = job.fn() if job.fn is not None else None
        except Interrupted as e:
            error = e
        except FirError as e:
            error = e
        except Exception as e:  # keep the UI alive; say it is a bug
            error = FirError(f"internal error: {type(e).__name__}: {e}")
        try:
            view = build_view(self.session, self.ci, self.tokenizer, self.recorder, wants)
        except Exception as e:  # a bug in a view: keep the last picture, say so
            view, error = None, error or FirError(f"internal error: {type(e).__name__}: {e}")
        self.post_message(JobDone(job, out, error, view))

    def on_job_done(self, message: JobDone) -> None:
        job, out, error = message.job, message.out, message.error
        self.busy, self.job = False, None
        console = self.query_one(ConsoleView)
        moved = isinstance(out, Result) and out.snapshot is not None
        if message.view is not None:
            self.show_view(message.view, follow=moved or job.moves)
        if isinstance(error, Interrupted):
            self.pending.clear()
            console.write(f"interrupted: {job.label}; nothing was written", "yellow")
            self.set_status(f"interrupted: {job.label}; nothing was written")
        elif error is not None:
            self.pending.clear()
            console.write(f"error: {error}", "red")
            self.set_status(f"error: {error.message.splitlines()[0][:200]}", error=True)
        else:
            self._report(job, out, console)
            if job.then is not None:
                job.then(out)
        if moved and out.snapshot.reason.wants_attention:
            self.pending = [j for j in self.pending if not j.moves]  # look before moving on
        if self.pending and not self.busy:
            self.submit(self.pending.pop(0))
        self._refresh_cost()

    def _report(self, job: Job, out, console: ConsoleView) -> None:
        text = out.text if isinstance(out, Result) else (out if isinstance(out, str) else "")
        snap = out.snapshot if isinstance(out, Result) else None
        if text and not job.quiet:
            console.write(text, "red" if snap is not None and snap.reason.is_error else None)
        if snap is not None and snap.reason.is_error:
            self.notify(snap.stop.message.splitlines()[0][:200], severity="error", timeout=8)
        if self.view is not None:
            self.set_status(self.view.status, error=snap is not None and snap.reason.is_error)

    def run_command(self, text: str) -> None:
        """One command line from a key, the console or the palette."""
        text = text.strip()
        if self.ci is None or not text:
            return
        if text.split()[0] in ("quit", "q"):
            self.action_quit()
            return
        self.submit(Job(text, lambda: self.ci.run(text), moves=self.ci.resumes(text)))

    def refresh_view(self) -> None:
        """Rebuild the frozen view (another buffer name, the Lens tab shown)."""
        if self.session is not None:
            self.submit(Job("refresh", None, quiet=True))

    # -- actions ------------------------------------------------------------------------------
    def action_command(self, line: str) -> None:
        """A key bound to one debugger command (continue, next, stepi, ...)."""
        self.run_command(line)

    def _cancel_flag(self):
        return self.job.cancel if self.job is not None and self.job.cancel is not None \
            else self.session.cancel

    def action_interrupt(self) -> None:
        if self.busy:
            self.pending.clear()
            self._cancel_flag().set()
            self.set_status("interrupting…")
        elif isinstance(self.focused, Input):
            self._leave_input()
        elif self.screen.maximized is not None:
            self.screen.minimize()

    def _leave_input(self) -> None:
        target = self._pane_focus
        if target is None or not target.is_attached:
            target = self.query_one(NodeList)
        target.focus()

    def on_descendant_focus(self, event) -> None:
        w = event.widget
        if not isinstance(w, Input):
            self._pane_focus = w
        self.screen.set_class(isinstance(w, CommandInput), "-console")

    def _cursor_spec(self) -> str | None:
        """The breakpoint location under the cursor (kernel line, node, or the current node)."""
        focused, m, view = self.focused, self.model, self.view
        if isinstance(focused, SourceLines):
            line = focused.cursor_line()
            node_idx = self.query_one(NodeList).cursor_node()
            node = m.nodes[node_idx if node_idx is not None else view.node_index]
            if line is None or node.kind != NodeKind.MICRO:
                return None
            return f"{node.target}:{line}"
        if isinstance(focused, NodeList):
            idx = focused.cursor_node()
            return m.nodes[idx].full_name if idx is not None else None
        idx = view.node_index if view is not None else None
        return m.nodes[idx].full_name if idx is not None else None

    def action_toggle_break(self) -> None:
        spec = self._cursor_spec() if self.model is not None else None
        if spec is None:
            return
        ci = self.ci

        def toggle():
            same = [bp.number for bp in ci.s.breakpoints if bp.spec == spec]
            return ci.run(f"delete {' '.join(map(str, same))}" if same else f"break {spec}")

        self.submit(Job(f"break {spec}", toggle))

    def _ask(self, question: str, value: str, then: Callable[[str], None]) -> None:
        self.push_screen(PromptScreen(question, value), lambda v: then(v) if v else None)

    def action_lane(self) -> None:
        lanes = self.view.snapshot.node_lanes if self.view is not None else None
        if lanes is None:
            self.notify("no kernel at this node: lanes exist inside micro nodes",
                        severity="warning")
            return
        self._ask(f"focus lane (0..{lanes - 1}):", str(self.ci.lane),
                  lambda v: self.run_command(f"lane {v}"))

    def action_lane_step(self, delta: int) -> None:
        regs = self.view.snapshot.lane if self.view is not None else None
        if regs is None or not regs.lanes:
            return
        self.run_command(f"lane {(self.view.lane + delta) % regs.lanes}")

    def action_goto(self) -> None:
        if self.model is None:
            return
        nodes = self.query_one(NodeList)
        if self.focused is nodes and nodes.cursor_node() is not None:
            self.run_command(f"goto {self.model.nodes[nodes.cursor_node()].full_name}")
            return
        self._ask("go to node (e.g. attention@1, or attention@1 token 3):", "",
                  lambda v: self.run_command(f"goto {v}"))

    def action_display(self) -> None:
        if self.ci is not None:
            self._ask("display (shown at every stop), e.g. max(abs(x)):", "",
                      lambda v: self.run_command(f"display {v}"))

    def action_help(self) -> None:
        rows = [(c.usage, c.help) for c in self.ci.table] if self.ci is not None else []
        self.push_screen(HelpScreen(rows))

    def action_tab(self, name: str) -> None:
        bottom = self.query_one(Bottom)
        if name == "regs" and not self.screen.has_class("-narrow"):
            self.query_one("#right RegistersPane").focus()  # beside the source when wide
            return
        bottom.active = name
        if name == "console":
            self.query_one(CommandInput).focus()

    def on_tabbed_content_tab_activated(self, event) -> None:
        if event.pane.id == "profile":
            self._refresh_cost()
        lens = event.pane.id == "lens"
        if lens != self.wants.lens:
            self.wants = replace(self.wants, lens=lens)
            if lens:
                self.refresh_view()

    def action_maximize_focused(self) -> None:
        if self.screen.maximized is not None:
            self.screen.minimize()
        elif self.focused is not None:
            self.screen.maximize(self.focused)

    def _quit(self, message: str | None = None) -> None:
        if self.busy:  # a thread cannot be killed: ask the run to stop, then leave
            self.pending.clear()
            self._cancel_flag().set()
        self.exit(message=message or None)

    def action_reload(self) -> None:
        if self.busy:
            return
        # A reload that fails keeps what the last good session had for the next F2.
        if self.session is not None:
            self._carried = carry(self.session, self.ci)
        self.session = self.ci = None
        self.query_one(LoadingPanel).remove_class("-error")
        self.screen.add_class("-loading")
        self.set_status("reloading")
        self.load(self._carried)

    # -- messages from the panes ---------------------------------------------------------------
    def on_console_view_command(self, message: ConsoleView.Command) -> None:
        self.run_command(message.text)

    def on_buffers_view_name_changed(self, message: BuffersView.NameChanged) -> None:
        self.wants = replace(self.wants, buffer=message.name)
        self.refresh_view()

    def on_buffers_view_edit(self, message) -> None:
        self._ask(f"set {message.target} =", message.value,
                  lambda v: self.run_command(f"set {message.target} = {v}"))

    def on_registers_pane_edit(self, message: RegistersPane.Edit) -> None:
        self.on_buffers_view_edit(message)

    def on_registers_pane_chosen(self, message: RegistersPane.Chosen) -> None:
        ci = self.ci
        self.submit(Job(f"{message.file}{message.reg} over lanes",
                        lambda: ci.set_register(message.file, message.reg), quiet=True))

    def on_buffers_view_history(self, message: BuffersView.History) -> None:
        ci, target = self.ci, message.target

        def writes():
            out = ci.run(f"history {target}")
            return out.text.splitlines()[0], list(out.data)

        def shown(out) -> None:
            self.push_screen(HistoryScreen(*out), self._history_chosen)

        self.submit(Job(f"history {target}", writes, then=shown))

    def _history_chosen(self, write) -> None:
        if write is None:
            return
        try:
            self.model.node_index(write.node)
        except KeyError:
            self.notify(f"{write.node}: not a node to go to", severity="warning")
            return
        self.run_command(f"goto {write.node} token {write.step}")

    def on_lens_view_jump(self, message: LensView.Jump) -> None:
        node = end_of_layer(self.model, message.layer)
        if node is None:
            self.notify(f"layer {message.layer} is the model's end", severity="warning")
            return
        self.run_command(f"goto {node} token {self.view.snapshot.step}")

    def prefill_console(self, text: str) -> None:
        self.query_one(Bottom).active = "console"
        inp = self.query_one(CommandInput)
        inp.value = text
        inp.focus()
        inp.cursor_position = len(text)
