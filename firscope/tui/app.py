"""The Textual app: routes keys to the debugger engine and shows what it reports.

Long work (loading, compiling, running to a stop, exporting) runs in thread
workers that only hand results back with ``call_from_thread``; while one runs
the panes keep their last state and escape interrupts it. The app owns no
debugger logic: every action is one call on :class:`~firscope.debug.Session`
or one line through the batch command interpreter.
"""
from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import (Footer, Label, ProgressBar, Static, TabbedContent, TabPane)

from ..debug.commands import CommandInterpreter, Result
from ..debug.session import Session
from ..debug.snapshot import Stop
from ..errors import FirError
from ..text import printable
from .attention_view import AttentionRecorder, AttentionView
from .buffers_view import BuffersView
from .console_view import ConsoleView
from .graph_pane import GraphPane, NodeList
from .keys import bindings
from .palette import DebuggerCommands
from .profile_view import ProfileView
from .registers_pane import RegistersPane
from .safe_text import ControlCharacterFilter
from .screens import HelpScreen, PromptScreen
from .source_pane import SourceLines, SourcePane

DEFAULT_N = 12
MAX_PENDING = 32


class LoadingPanel(Vertical):
    DEFAULT_CSS = """
    LoadingPanel { align: center middle; height: 1fr; }
    LoadingPanel > * { width: 70; }
    LoadingPanel #load-error { width: 1fr; height: auto; padding: 1 2; border: thick $error;
                               display: none; }
    """

    def compose(self) -> ComposeResult:
        yield Label("loading…", id="load-label")
        yield ProgressBar(total=100, show_eta=False, id="load-bar")
        yield Static(id="load-error")


class FirscopeApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "firscope"
    COMMANDS = App.COMMANDS | {DebuggerCommands}
    BINDINGS = bindings() + [
        Binding("left_square_bracket", "lane_step(-1)", "lane-", show=False),
        Binding("right_square_bracket", "lane_step(1)", "lane+", show=False),
        Binding("m", "maximize_focused", "maximize", show=False),
        Binding("1", "tab('buffers')", show=False), Binding("2", "tab('attention')", show=False),
        Binding("3", "tab('profile')", show=False), Binding("4", "tab('console')", show=False),
    ]

    def __init__(self, model_path: Path, *, prompt_ids=None, prompt_text: str | None = None,
                 n: int = DEFAULT_N, fir_f32: bool = False, group: int = 32,
                 engine: str = "compiled", show_times: bool = True, q4_path: str = "packed"):
        super().__init__()
        self.q4_path = q4_path
        self.model_path = Path(model_path)
        self.prompt_ids = prompt_ids
        self.prompt_text = prompt_text
        self.n = n
        self.fir_f32 = fir_f32
        self.group = group
        self.engine_name = engine
        self.show_times = show_times
        self.session: Session | None = None
        self.ci: CommandInterpreter | None = None
        self.tokenizer = None
        self.recorder: AttentionRecorder | None = None
        self.busy = False
        self.pending: list = []  # engine actions typed ahead while one runs
        self.last_stop: Stop | None = None
        self.status_text = "loading"
        self.load_error: FirError | None = None
        self.control_filter = ControlCharacterFilter()

    def get_line_filters(self):
        # every line of every widget: no control character from a file reaches the terminal
        return [*super().get_line_filters(), self.control_filter]

    # -- layout -----------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield LoadingPanel(id="loading")
        with Vertical(id="main"):
            with Horizontal(id="top"):
                yield GraphPane(id="graph")
                yield SourcePane(id="source")
                yield RegistersPane(id="registers")
            with TabbedContent(id="bottom", initial="attention"):
                with TabPane("Buffers", id="buffers"):
                    yield BuffersView(id="buffers-view")
                with TabPane("Attention", id="attention"):
                    yield AttentionView(id="attention-view")
                with TabPane("Profile", id="profile"):
                    yield ProfileView(id="profile-view")
                with TabPane("Console", id="console"):
                    yield ConsoleView(id="console-view")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#main").display = False
        self.set_status()
        self.load()

    # -- loading ------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load")
    def load(self) -> None:
        from ..runtime.opening import open_model, prompt_ids

        def progress(what: str, frac: float) -> None:
            self.call_from_thread(self.on_progress, what, frac)

        try:
            t0 = time.perf_counter()
            model = open_model(self.model_path, fir_f32=self.fir_f32, group=self.group,
                               q4_path=self.q4_path,
                               progress=lambda w, f: progress(f"loading: {w}", f * 0.7))
            ids, tok = prompt_ids(model, prompt=self.prompt_text, tokens=self.prompt_ids)
            session = Session(model, ids, self.n, engine=self.engine_name)
            runner = session.machine.kernel_runner
            if runner is not None and hasattr(runner, "warmup"):
                progress("compiling kernels", 0.75)
                runner.warmup()
            progress("ready", 1.0)
            loaded = time.perf_counter() - t0
        except FirError as e:
            self.call_from_thread(self.show_load_error, e)
            return
        except Exception as e:  # a bug: keep the app alive and say so
            self.call_from_thread(self.show_load_error,
                                  FirError(f"internal error while loading: {type(e).__name__}: {e}"))
            return
        self.call_from_thread(self.on_loaded, session, tok, loaded)

    def on_progress(self, what: str, frac: float) -> None:
        self.query_one("#load-label", Label).update(f"{printable(self.model_path.name)}: {what}")
        self.query_one("#load-bar", ProgressBar).update(progress=frac * 100)

    def show_load_error(self, e: FirError) -> None:
        self.load_error = e
        panel = self.query_one("#load-error", Static)
        panel.display = True
        panel.update(Text(str(e) + "\n\nfix the file and press F2 to reload, or q to quit",
                          style="bold"))
        self.query_one("#load-label", Label).update(f"{printable(self.model_path)}: cannot load")
        self.query_one("#loading").display = True
        self.query_one("#main").display = False
        self.status_text = "error: " + e.message.splitlines()[0]
        self.set_status()

    def on_loaded(self, session: Session, tok, seconds: float) -> None:
        self.session = session
        self.tokenizer = tok
        self.ci = CommandInterpreter(session, tok)
        self.recorder = AttentionRecorder(session)
        self.load_error = None
        self.query_one("#loading").display = False
        self.query_one("#main").display = True
        self.query_one(BuffersView).bind_session(session)
        self.query_one(AttentionView).bind_session(session, self.recorder, tok)
        self.status_text = f"loaded in {seconds:.2f} s" if self.show_times else "loaded"
        console = self.query_one(ConsoleView)
        console.write(f"firscope: {session.model.path} · {len(session.model.nodes)} nodes · "
                      f"engine {session.machine.engine} · prompt {len(session.prompt)} tokens, "
                      f"{session.n_generate} to generate")
        console.write(self.ci.where_line())
        self.refresh_views()
        self.query_one(NodeList).focus()

    # -- status and views --------------------------------------------------------------------
    def set_status(self) -> None:
        s = self.session
        t = Text()
        t.append(" firscope ", style="bold reverse")
        if s is not None:
            m = s.model
            t.append(f"  {printable(m.folder.name)} · {'f32' if m.fir_f32 else 'q4'} · ")
            if s.finished:
                t.append(f"finished {s.step}/{s.total_steps}")
            else:
                piece = self.tokenizer.piece(s.token) if s.token is not None else "?"
                t.append(f"token {s.step + 1}/{s.total_steps} {piece!r} pos {s.step}")
        t.append("   ")
        style = "bold green" if self.busy else ("bold red" if self.status_text.startswith(
            ("error", "fault", "budget")) else "bold yellow")
        t.append(("▶ " if self.busy else "■ ") + self.status_text, style=style)
        self.query_one("#status", Static).update(t)

    def refresh_views(self, follow: bool = True) -> None:
        s = self.session
        if s is None:
            return
        saved_times = s.node_times
        if not self.show_times:
            s.node_times = {}
        try:
            self.query_one(GraphPane).show(s, self.tokenizer, follow=follow)
            self.query_one(SourcePane).show(s)
            self.query_one(RegistersPane).show(s, self.ci)
            self.query_one(BuffersView).show()
            att = self.query_one(AttentionView)
            if s.layer is not None:
                att.follow_layer(s.layer)
            att.show()
            self.query_one(ProfileView).show(s)
        finally:
            s.node_times = saved_times
        self.set_status()

    def on_option_list_option_highlighted(self, event) -> None:
        if isinstance(event.option_list, NodeList) and self.session is not None and not self.busy:
            idx = event.option_list.cursor_node()
            panes = self.query(SourcePane)  # empty while the app is closing
            if idx is not None and panes:
                panes.first().show(self.session, idx)

    # -- running the engine --------------------------------------------------------------------
    def engine(self, label: str, fn) -> None:
        if self.session is None:
            self.notify("no model loaded", severity="warning")
            return
        if self.busy:
            # Keys pressed while the engine runs are queued, like typing ahead in gdb.
            if len(self.pending) >= MAX_PENDING:
                self.notify("still running — press escape to interrupt", severity="warning")
            else:
                self.pending.append((label, fn))
            return
        self.busy = True
        self.status_text = f"running: {label} (escape interrupts)"
        self.set_status()
        self._engine_worker(label, fn)

    @work(thread=True, group="engine")
    def _engine_worker(self, label: str, fn) -> None:
        try:
            result = fn()
        except FirError as e:
            self.call_from_thread(self.on_engine_error, label, e)
            return
        except Exception as e:  # keep the UI alive; say it is a bug
            self.call_from_thread(self.on_engine_error, label,
                                  FirError(f"internal error: {type(e).__name__}: {e}"))
            return
        self.call_from_thread(self.on_engine_done, label, result)

    def on_engine_done(self, label: str, result) -> None:
        self.busy = False
        console = self.query_one(ConsoleView)
        stop = result.snapshot.stop if isinstance(result, Result) and result.snapshot else None
        if stop is not None:
            self.last_stop = stop
            console.write(result.text, "red" if stop.reason.is_error else None)
            self.status_text = self.ci.status_line(result.snapshot)
            if stop.reason.is_error:
                self.notify(stop.message.splitlines()[0][:200], severity="error", timeout=8)
        else:
            text = result.text if isinstance(result, Result) else result
            if text:
                console.write(text)
            self.status_text = f"{label}: done"
        if self.pending and stop is not None and stop.reason.wants_attention:
            self.pending.clear()  # something worth looking at: drop what was typed ahead
        self.refresh_views()
        self._next_pending()

    def _next_pending(self) -> None:
        if self.pending and not self.busy:
            label, fn = self.pending.pop(0)
            self.engine(label, fn)

    def on_engine_error(self, label: str, e: FirError) -> None:
        self.busy = False
        self.pending.clear()
        self.query_one(ConsoleView).write(f"error: {e}", "red")
        self.status_text = f"error: {e.message.splitlines()[0][:100]}"
        self.notify(str(e)[:300], severity="error", timeout=8)
        self.refresh_views()

    # -- actions ------------------------------------------------------------------------------
    def _command(self, line: str) -> None:
        self.engine(line, lambda: self.ci.run(line))

    def action_cont(self) -> None:
        self._command("continue")

    def action_next(self) -> None:
        self._command("next")

    def action_stepi(self) -> None:
        self._command("stepi")

    def action_finish(self) -> None:
        self._command("finish")

    def action_token(self) -> None:
        self._command("token")

    def action_reverse_stepi(self) -> None:
        self._command("reverse-stepi")

    def action_reverse_next(self) -> None:
        self._command("reverse-next")

    def action_interrupt(self) -> None:
        if self.session is not None and self.busy:
            self.pending.clear()
            self.session.cancel.set()
            self.status_text = "interrupting…"
            self.set_status()
        elif isinstance(self.screen, PromptScreen):
            self.screen.dismiss(None)

    def action_toggle_break(self) -> None:
        s = self.session
        if s is None or self.busy:
            return
        focused = self.focused
        try:
            if isinstance(focused, SourceLines):
                line = focused.cursor_line()
                node_idx = self.query_one(NodeList).cursor_node()
                node = s.model.nodes[node_idx if node_idx is not None else s.node_index]
                if line is None or node.kind != "micro":
                    return
                spec = f"{node.target}:{line}"
            elif isinstance(focused, NodeList):
                idx = focused.cursor_node()
                if idx is None:
                    return
                spec = s.model.nodes[idx].full_name
            else:
                if s.finished:
                    return
                spec = s.node.full_name
            what, bp = s.toggle_breakpoint(spec)
        except FirError as e:
            self.notify(str(e), severity="warning")
            return
        self.query_one(ConsoleView).write(f"breakpoint {bp.number} at {bp.spec}: {what}")
        self.notify(f"breakpoint {bp.number} {what}: {bp.spec}")
        self.refresh_views(follow=False)

    def action_lane(self) -> None:
        s = self.session
        if s is None or s.lanes() is None:
            self.notify("no kernel at this node: lanes exist inside micro nodes", severity="warning")
            return

        def chosen(value: str | None) -> None:
            if not value:
                return
            try:
                self.ci.set_lane(int(value))
            except (ValueError, FirError) as e:
                self.notify(str(e), severity="warning")
                return
            self.refresh_views(follow=False)

        self.push_screen(PromptScreen(f"focus lane (0..{s.lanes() - 1}):", str(self.ci.lane)),
                         chosen)

    def action_lane_step(self, delta: int) -> None:
        s = self.session
        if s is None or s.lanes() is None:
            return
        lanes = s.lanes()
        if not lanes or s.dispatch is None:
            return
        self.ci.set_lane((self.ci.lane + delta) % lanes)
        self.refresh_views(follow=False)

    def action_goto(self) -> None:
        s = self.session
        if s is None:
            return
        nodes = self.query_one(NodeList)
        if self.focused is nodes and nodes.cursor_node() is not None:
            name = s.model.nodes[nodes.cursor_node()].full_name
            self._command(f"goto {name}")
            return

        def chosen(value: str | None) -> None:
            if value:
                self._command(f"goto {value}")

        self.push_screen(PromptScreen("go to node (e.g. attention@1):"), chosen)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_tab(self, name: str) -> None:
        self.query_one(TabbedContent).active = name

    def action_maximize_focused(self) -> None:
        if self.screen.maximized is not None:
            self.screen.minimize()
            return
        w = self.focused
        while w is not None and not isinstance(w, (GraphPane, SourcePane, RegistersPane,
                                                   TabbedContent)):
            w = w.parent
        if w is not None:
            self.screen.maximize(w)

    def action_reload(self) -> None:
        if self.busy:
            return
        self.session = None
        self.query_one("#load-error", Static).display = False
        self.query_one("#loading").display = True
        self.query_one("#main").display = False
        self.status_text = "reloading"
        self.set_status()
        self.load()

    def action_quant(self) -> None:
        s = self.session
        if s is None:
            return
        if s.model.fir_f32:
            self.notify("loaded with --fir-f32: nothing is quantized", severity="warning")
            return
        tokens = list(s.sequence[: max(s.step, 1)])
        view = self.query_one(ProfileView)

        def measure():
            from ..profile.quant import compare_run, weight_stats
            view.weights = weight_stats(s.model)
            view.quant = compare_run(s.model, tokens, engine=s.machine.engine)
            return f"quantization error measured over {len(tokens)} token(s)"

        self.query_one(TabbedContent).active = "profile"
        self.engine("quantization error", measure)

    def action_export(self) -> None:
        s = self.session
        if s is None:
            return

        def chosen(value: str | None) -> None:
            if not value:
                return
            out = Path(value)
            self.engine(f"export to {out}", lambda: export_session(s, self.tokenizer, out))

        self.push_screen(PromptScreen("export the report to folder:", "firscope-report"), chosen)

    # -- commands from the console and the palette ------------------------------------------------
    def on_console_view_command(self, message: ConsoleView.Command) -> None:
        self.run_command(message.text)

    def run_command(self, text: str) -> None:
        if self.ci is None:
            return
        word = text.split(" ", 1)[0]
        if word in ("quit", "q"):
            self.exit()
            return
        if self.ci.resumes(text):
            self._command(text)
            return
        try:
            out = self.ci.execute(text)
        except FirError as e:
            self.query_one(ConsoleView).write(f"error: {e}", "red")
            return
        if out:
            self.query_one(ConsoleView).write(out)
        self.refresh_views(follow=False)

    def prefill_console(self, text: str) -> None:
        from textual.widgets import Input
        self.query_one(TabbedContent).active = "console"
        inp = self.query_one("#console-input", Input)
        inp.value = text
        inp.focus()


def export_session(session: Session, tokenizer, out: Path) -> str:
    """The same report as `firscope profile`, for the tokens this session decodes."""
    from ..profile.collect import preserved_state
    from ..profile.report import profile_model, write_report
    model = session.model
    n = session.n_generate
    with preserved_state(model):
        data = profile_model(model, list(session.prompt), n, engine=session.machine.engine,
                             tokenizer=tokenizer)
    files = write_report(data, out)
    return f"report written to {out}: " + ", ".join(sorted(files))


def run_app(args) -> int:
    from ..model.tokens import parse_token_list
    from ..runtime.opening import resolve_model
    ids = parse_token_list(args.tokens) if getattr(args, "tokens", None) else None
    n = DEFAULT_N if args.n is None else args.n  # -n is checked by its argparse type
    app = FirscopeApp(resolve_model(args.model), prompt_ids=ids, prompt_text=args.prompt, n=n,
                      fir_f32=args.fir_f32, group=args.group, engine=args.engine,
                      q4_path=args.q4_path)
    app.run()
    return 0
