"""The Textual app: routes keys to the typed debugger API and shows each stop.

Every engine action is a job: a key, a click or a box calls one method of the
:class:`~firscope.debug.debugger.Debugger` (``cont``, ``goto``, ``set_lane``,
``toggle_break`` ...); a line typed in the console or chosen in the palette goes
through the text commands (:meth:`CommandInterpreter.run`). Jobs run in a thread
worker (one at a time; keys pressed meanwhile are queued, like typing ahead in
gdb: :class:`~.jobs.JobQueue`). The worker freezes what the panes show
(:func:`~firscope.tui.state.build_view`) and posts it as a :class:`JobDone` message; the
app puts it in its ``view`` reactive, which every pane of the DebugScreen (debug_screen)
is bound to, so no widget reads the live session while a worker runs. A
run never moves focus; escape interrupts it (or an export, which then leaves no files).
"""
from __future__ import annotations

import gc
from dataclasses import replace
from pathlib import Path
from typing import Callable

from rich.text import Text
from textual import work
from textual.app import App
from textual.reactive import var
from textual.widgets import Input, Label, ProgressBar, Static

from ..text import printable
from ..debug.commands import (Result, deleted_text, display_text, history_text, made_text,
                              parse_goto, parse_lane, patch_text)
from ..debug.snapshot import Snapshot
from ..errors import FirError, Interrupted
from .buffers_view import BuffersView
from .console_view import CommandInput, ConsoleView, completion_words
from .debug_screen import Bottom, DebugScreen
from .graph_pane import NodeList
from .jobs import RUNNING_AFTER, Job, JobQueue, execute
from .keys import bindings
from .loading import LoadingPanel, UiOptions, open_session, throttled, warm_job
from .messages import JobDone, LoadFailed, Loaded, LoadProgress
from .lens_view import LensView, end_of_layer
from .palette import DebuggerCommands
from .cost_actions import CostActions
from .corpus_actions import CorpusActions
from .kernel_editor import KernelEditActions
from .report_actions import ReportActions
from .save_actions import SaveActions
from .registers_pane import RegistersPane
from .safe_text import ControlCharacterFilter
from .reload import carry
from .screens import HelpScreen, HistoryScreen, PromptScreen
from .source_pane import SourceLines
from .state import StopView, Wants, build_view, status_bar
from ..runtime import NodeKind
from .paint import update


class FirscopeApp(CostActions, CorpusActions, KernelEditActions, ReportActions, SaveActions,
                  App):
    CSS_PATH = "app.tcss"
    ALLOW_IN_MAXIMIZED_VIEW = "Footer, #status"  # a maximized pane keeps the header
    TITLE = "firscope"
    COMMANDS = App.COMMANDS | {DebuggerCommands}
    BINDINGS = bindings()
    # What the screen's panes are bound to (data_bind): the loaded model, the last frozen
    # stop (every JobDone / Loaded message sets it), whether the graph and source follow it,
    # and the node times as shown. always_update: never compared (they hold arrays). All
    # vars: a reactive repaints its owner, and the app's repaint is the whole screen's (a
    # full update of every line at every step, 8-16 ms a key; the panes redraw themselves).
    model = var(None, always_update=True)
    view: var[StopView | None] = var(None, always_update=True, init=False)
    follow = var(True)
    time_of = var(None)

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
        self.wants = Wants()
        self.jobs = JobQueue(lambda job: self._run_job(job, self.wants))
        self.status_text = "loading"
        self.status_error = False
        self.load_error: FirError | None = None
        self._pane_focus = None  # the pane focus returns to when an input is left
        self._carried = None  # what F2 carries into the reloaded session
        # the collector was turned off for the start (launch.run_app): on again once the
        # first stop is drawn, or the load failed
        self.gc_paused = False

    # the job queue's state, as the app has always shown it (tests wait on busy and pending)
    @property
    def busy(self) -> bool:
        return self.jobs.busy

    @property
    def job(self) -> Job | None:
        return self.jobs.job

    @property
    def pending(self) -> list[Job]:
        return self.jobs.pending

    @property
    def probe(self):
        return self.jobs.probe

    # -- layout -----------------------------------------------------------------------
    def get_line_filters(self):
        return [*super().get_line_filters(), self.control_filter]

    def get_default_screen(self) -> DebugScreen:
        """The app starts on the debugger's screen (as toolong's app pushes its one), bound to
        the app's reactives; it is the screen ``app.query_one`` looks in."""
        self.main_screen = DebugScreen().data_bind(
            FirscopeApp.model, FirscopeApp.follow, FirscopeApp.time_of, FirscopeApp.view)
        return self.main_screen

    def on_unmount(self) -> None:
        gc.unfreeze()  # what the session kept alive may be collected (an embedding process)

    def on_debug_screen_ready(self) -> None:
        """The screen has its panes: start loading."""
        self.set_interval(0.25, self._show_progress)
        self.set_status()
        self.load(None)

    # -- loading ------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load")
    def load(self, carried) -> None:
        gc.unfreeze()  # a reload: the session being replaced may be collected again
        try:
            parts = open_session(self.model_path, self.options, carried, self.probe, self.wants,
                                 throttled(lambda what, frac: self.post_message(
                                     LoadProgress(what, frac))))
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
        self.main_screen.show_loading(True)
        self.set_status("error: " + e.message.splitlines()[0], error=True)
        self._resume_gc()

    def on_loaded(self, message: Loaded) -> None:
        p = message.parts
        first = self.session is None and self.model is None
        self.session, self.ci, self.tokenizer = p["session"], p["ci"], p["tok"]
        self.recorder, self.model = p["recorder"], p["session"].model
        self.load_error = None
        self.query_one(LoadingPanel).remove_class("-error")
        self.main_screen.show_loading(False)
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
        # numba's import leaves ~10^5 objects of its own: frozen too, as the session is
        self.submit(warm_job(s, self.jobs.probe, then=lambda _: gc.freeze()))
        self.start_corpus()
        # The loaded model, session and UI are ~200k objects that live until a reload; each
        # full collection walked them all (pauses of 90-120 ms while stepping, measured with
        # a gc callback): frozen, collections walk only what the steps allocate.
        self.call_after_refresh(self._freeze)

    def _freeze(self) -> None:
        gc.freeze()
        self._resume_gc()

    def _resume_gc(self) -> None:
        if self.gc_paused:
            self.gc_paused = False
            gc.enable()

    # -- status and views --------------------------------------------------------------------
    def set_status(self, text: str | None = None, *, error: bool = False) -> None:
        if text is not None:
            self.status_text, self.status_error = text, error
        update(self.query_one("#status", Static), status_bar(
            self.status_text, self.view, max(self.size.width, 20), busy=self.busy,
            error=self.status_error))

    def _show_progress(self) -> None:
        if not self.busy:
            return
        line = self.probe.line()
        if line is not None:
            self.set_status(line)

    def show_view(self, view: StopView, follow: bool = True) -> None:
        """Put a frozen stop into the ``view`` reactive: every pane is bound to it.
        ``follow``: the graph cursor and the source go to the stop (else they stay: F9 on a
        line, display, set)."""
        self.follow = follow
        self.view = view

    # -- running commands --------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        if self.session is None:
            self.notify("no model loaded", severity="warning")
            return
        starts = not self.busy
        if starts:
            # An escape meant for an earlier job must not stop this one; cleared here, before
            # the worker starts, so that an escape pressed from now on is never lost (the
            # engine only reads the flag).
            (job.cancel if job.cancel is not None else self.session.cancel).clear()
        if not self.jobs.submit(job):
            self.notify("still running — press escape to interrupt", severity="warning")
        elif starts and job.moves:  # said once it has run for RUNNING_AFTER (jobs.py)
            self.set_timer(RUNNING_AFTER, lambda: self.jobs.job is job and self.set_status(
                f"running: {job.label} (escape interrupts)"))

    @work(thread=True, group="engine")
    def _run_job(self, job: Job, wants: Wants) -> None:
        s, ci, tok, rec = self.session, self.ci, self.tokenizer, self.recorder
        self.post_message(JobDone(job, *execute(job, lambda: build_view(s, ci, tok, rec, wants))))

    def on_job_done(self, message: JobDone) -> None:
        job, out, error = message.job, message.out, message.error
        self.jobs.done()
        console = self.query_one(ConsoleView)
        stop = _new_stop(out)
        moved = stop is not None
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
            if job.on_error is not None:
                job.on_error(error)
        else:
            self._report(job, out, console)
            if job.then is not None:
                job.then(out)
        if moved and stop.reason.wants_attention:
            self.jobs.drop_moves()  # look before moving on
        if (queued := self.jobs.take_next()) is not None:
            self.submit(queued)
        self._refresh_cost()

    def _report(self, job: Job, out, console: ConsoleView) -> None:
        snap = _new_stop(out)
        text = out.text if isinstance(out, Result) else out.description \
            if isinstance(out, Snapshot) else out if isinstance(out, str) else ""
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

    def call(self, label: str, fn: Callable[[], object], *, moves: bool = False,
             then: Callable[[object], None] | None = None) -> None:
        """A typed call of the debugger from a key, a click or a box (``label``: what the
        status line and the console call it). A movement returns its Snapshot; anything
        else returns the text the console shows."""
        if self.ci is not None:
            self.submit(Job(label, fn, moves=moves, then=then))

    def refresh_view(self) -> None:
        """Rebuild the frozen view (another buffer name, the Lens tab shown)."""
        if self.session is not None:
            self.submit(Job("refresh", None, quiet=True))

    # -- actions ------------------------------------------------------------------------------
    def action_move(self, name: str) -> None:
        """A key bound to a movement (continue, next, stepi, ...): one typed call."""
        d = self.ci
        if d is None:
            return
        moves = {"continue": d.cont, "next": d.next, "stepi": d.step, "finish": d.finish,
                 "token": d.next_token, "reverse-stepi": d.reverse_step,
                 "reverse-next": d.reverse_next}
        self.call(name, moves[name], moves=True)

    def _cancel_flag(self):
        return self.jobs.cancel_flag(self.session.cancel)

    def action_interrupt(self) -> None:
        if self.busy:
            self.jobs.interrupt(self.session.cancel)
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

        def toggle() -> str:
            made, deleted = ci.toggle_break(spec)
            return made_text(made) if made is not None else deleted_text(deleted)

        self.call(f"break {spec}", toggle)

    def _ask(self, question: str, value: str, then: Callable[[str], None]) -> None:
        self.push_screen(PromptScreen(question, value), lambda v: then(v) if v else None)

    def action_lane(self) -> None:
        lanes = self.view.snapshot.node_lanes if self.view is not None else None
        if lanes is None:
            self.notify("no kernel at this node: lanes exist inside micro nodes",
                        severity="warning")
            return
        self._ask(f"focus lane (0..{lanes - 1}):", str(self.ci.lane), self._focus_lane)

    def _focus_lane(self, typed: str | int) -> None:
        ci = self.ci
        try:
            lane = parse_lane(str(typed))
        except FirError as e:
            self.set_status(f"error: {e.message}", error=True)
            return

        def focus() -> str:
            ci.set_lane(lane)
            return f"[Switching to lane {lane}]"

        self.call(f"lane {lane}", focus)

    def action_lane_step(self, delta: int) -> None:
        regs = self.view.snapshot.lane if self.view is not None else None
        if regs is None or not regs.lanes:
            return
        self._focus_lane((self.view.lane + delta) % regs.lanes)

    def action_goto(self) -> None:
        if self.model is None:
            return
        nodes = self.query_one(NodeList)
        if self.focused is nodes and nodes.cursor_node() is not None:
            self._goto(self.model.nodes[nodes.cursor_node()].full_name)
            return
        self._ask("go to node (e.g. attention@1, or attention@1 token 3):", "",
                  self._goto_typed)

    def _goto_typed(self, text: str) -> None:
        try:
            where = parse_goto(text)
        except FirError as e:
            self.set_status(f"error: {e.message}", error=True)
            return
        self._goto(*where)

    def _goto(self, node: str, token: int | None = None) -> None:
        ci = self.ci
        label = f"goto {node}" + (f" token {token}" if token is not None else "")
        self.call(label, lambda: ci.goto(node, token), moves=True)

    def action_display(self) -> None:
        ci = self.ci
        if ci is not None:
            self._ask("display (shown at every stop), e.g. max(abs(x)):", "",
                      lambda v: self.call(f"display {v}", lambda: display_text(ci.display(v))))

    def action_help(self) -> None:
        rows = [(c.usage, c.help) for c in self.ci.table] if self.ci is not None else []
        self.push_screen(HelpScreen(rows))

    def action_tab(self, name: str) -> None:
        bottom = self.query_one(Bottom)
        if name == "regs" and not self.main_screen.has_class("-narrow"):
            self.query_one("#right RegistersPane").focus()  # beside the source when wide
            self.set_status("6: the registers are beside the source at this width (a tab "
                            "below 100 columns); focus moved there")
            return
        if name == "buffers" and bottom.active == "buffers":
            # 1 again: type a name (the first 1 only shows the tab, so that stepping keys
            # pressed after it still step)
            self.main_screen.set_focus(self.query_one("#buf-name"))
            return
        bottom.active = name
        if name == "buffers":
            self.set_status("1 again: type a buffer's name")
        if name == "console":
            # now, not after a refresh: the keys typed right after 4 are for the console
            self.main_screen.set_focus(self.query_one(CommandInput))

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
            return
        focused = self.focused
        if focused is None or not _shown(focused):
            self.set_status("m: no pane to maximize: the focus is on nothing shown (tab moves "
                            "it to a pane)", error=True)
            return
        if self.screen.maximize(focused) is False or self.screen.maximized is None:
            self.set_status(f"m: {type(focused).__name__} cannot be maximized", error=True)

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
        self.main_screen.show_loading(True)
        self.set_status("reloading")
        self.load(self._carried)

    # -- messages from the panes ---------------------------------------------------------------
    def on_console_view_command(self, message: ConsoleView.Command) -> None:
        self.run_command(message.text)

    def on_buffers_view_name_changed(self, message: BuffersView.NameChanged) -> None:
        self.wants = replace(self.wants, buffer=message.name)
        self.refresh_view()

    def on_buffers_view_edit(self, message) -> None:
        ci, target = self.ci, message.target

        def edit(value: str) -> None:
            self.call(f"set {target}", lambda: patch_text(ci.set(target, value)))

        self._ask(f"set {target} =", message.value, edit)

    def on_registers_pane_edit(self, message: RegistersPane.Edit) -> None:
        self.on_buffers_view_edit(message)

    def on_registers_pane_chosen(self, message: RegistersPane.Chosen) -> None:
        ci = self.ci
        self.submit(Job(f"{message.file}{message.reg} over lanes",
                        lambda: ci.set_register(message.file, message.reg), quiet=True))

    def on_buffers_view_history(self, message: BuffersView.History) -> None:
        ci, target = self.ci, message.target

        def writes():
            h = ci.history(target)
            return history_text(h).splitlines()[0], list(h.writes)

        def shown(out) -> None:
            self.push_screen(HistoryScreen(*out), self._history_chosen)

        self.call(f"history {target}", writes, then=shown)

    def _history_chosen(self, write) -> None:
        if write is None:
            return
        try:
            self.model.node_index(write.node)
        except KeyError:
            self.notify(f"{write.node}: not a node to go to", severity="warning")
            return
        self._goto(write.node, write.step)

    def on_lens_view_jump(self, message: LensView.Jump) -> None:
        node = end_of_layer(self.model, message.layer)
        if node is None:
            self.notify(f"layer {message.layer} is the model's end", severity="warning")
            return
        self._goto(node, self.view.snapshot.step)

    def _on_key(self, event) -> None:
        """A key no widget took reaches the app: before the app's own bindings (App._on_key,
        which Textual calls after this one unless the default is prevented), a key typed
        ahead (forwarded to the pane that had focus when it arrived, before the box or the
        console that a previous key opened took focus) goes where the user was typing."""
        if self._typed_ahead(event):
            event.stop()
            event.prevent_default()

    def _typed_ahead(self, event) -> bool:
        screen = self.screen
        if isinstance(screen, PromptScreen):
            return screen.type_ahead(event)
        focused = self.focused
        if isinstance(focused, Input) and event.is_printable and event.character:
            # an Input takes every printable key it is sent: this one was sent elsewhere
            focused.insert_text_at_cursor(event.character)
            return True
        return False

    def prefill_console(self, text: str) -> None:
        self.query_one(Bottom).active = "console"
        inp = self.query_one(CommandInput)
        inp.value = text
        inp.focus()
        inp.cursor_position = len(text)


def _shown(widget) -> bool:
    """Whether ``widget`` is on screen: it and every container above it displayed (a pane in
    a tab that is not active is not)."""
    from textual.widget import Widget
    return all(w.display for w in widget.ancestors_with_self if isinstance(w, Widget)) \
        and widget.region.area > 0


def _new_stop(out) -> Snapshot | None:
    """The stop a job moved to: a movement's Snapshot, or a text command's new one."""
    if isinstance(out, Snapshot):
        return out
    return out.snapshot if isinstance(out, Result) else None
