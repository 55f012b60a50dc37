"""The adapter's life cycle: initialize, launch (with progress), configurationDone,
terminate, disconnect; and what it sends unasked (log point lines, breakpoint events).

Order (README "Editors"): ``initialize`` is answered and ``initialized`` sent
at once; configuration requests that come before ``launch`` are held and done
once the model is loaded (their answers come after the launch's); the first
``configurationDone`` stops at entry or runs (``stopOnEntry``, default true).
Launch and configuration errors are shown to the user (``showUser``) and sent
as ``stderr`` output too.
"""
from __future__ import annotations

from ..debug.commands import CommandInterpreter
from ..errors import FirError
from .breakpoints import BreakpointMap
from .capabilities import CAPABILITIES, EXCEPTION_FILTERS
from .conventions import Conventions
from .launch import LaunchConfig, model_path, parse_launch, start_session
from .views import RequestError, Views

STOP_WAIT_S = 30  # how long disconnect waits for a run to stop after pausing it


def arguments(request: dict) -> dict:
    args = request.get("arguments")
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise RequestError(f"'{request.get('command')}': 'arguments' must be an object")
    return args


class LifeCycle:
    """Mixed into :class:`~firscope.dap.adapter.Adapter` (its state lives there)."""

    def r_initialize(self, req):
        self._client_said(arguments(req))
        self.out.response(req, CAPABILITIES)
        if not self.initialized_sent:
            self.initialized_sent = True
            self.out.event("initialized")

    def _client_said(self, args: dict) -> None:
        """The client's initialize arguments: how it counts lines and spells paths."""
        self.client = args
        self.conv = Conventions.of(args)
        self.initialized_sent = True

    def r_launch(self, req):
        if self.ci is not None:
            raise RequestError("a model is already launched in this session")
        config = parse_launch(arguments(req))
        progress = self._progress("firscope: loading " + (config.model or "the sample model"))
        try:
            ci = start_session(config, progress=progress)
        except FirError:
            self._prelaunch_failed()
            raise
        finally:
            progress(None)
        self._launched(ci, config)
        self.out.response(req)
        s = ci.session
        self.output(f"firscope: {s.model.path.name}, {len(s.prompt)} prompt tokens, "
                    f"{s.n_generate} to generate, {len(s.nodes)} nodes per token, engine "
                    f"{config.engine}")
        if not self.initialized_sent:  # a client that skipped initialize
            self.initialized_sent = True
            self.out.event("initialized")
        held, self.prelaunch = self.prelaunch, []
        for msg in held:
            self.dispatch(msg)

    def _launched(self, ci: CommandInterpreter, config: LaunchConfig) -> None:
        self.ci = ci
        self.config = config
        path = model_path(ci)
        self.source = self.conv.source(path)
        self.views = Views(ci, self.source, self.conv)
        self.bps = BreakpointMap(ci, self.source, conv=self.conv, model_file=str(path))
        self.bps.set_exceptions([f["filter"] for f in EXCEPTION_FILTERS if f["default"]])
        ci.session.log_sink = self._log_point

    def _prelaunch_failed(self) -> None:
        held, self.prelaunch = self.prelaunch, []
        for msg in held:
            self.out.error(msg, f"'{msg['command']}': no model is launched (the launch failed)")

    def _progress(self, title: str):
        """progressStart now; the function returned sends progressUpdate(message) and, given
        None, progressEnd. Silent for a client that did not ask for progress events."""
        if not self.client.get("supportsProgressReporting"):
            return lambda message: None
        pid = "firscope-launch"
        self.out.event("progressStart", {"progressId": pid, "title": title,
                                         "cancellable": False})

        def report(message):
            if message is None:
                self.out.event("progressEnd", {"progressId": pid})
            else:
                self.out.event("progressUpdate", {"progressId": pid, "message": message})
        return report

    def _log_point(self, bp, text: str) -> None:
        """A log point was hit (in the worker thread): its line goes out at once."""
        body = {"category": "console", "output": text + "\n"}
        line = getattr(bp, "line", None)
        if line is not None:
            body.update(source=self.source, line=self.conv.line_out(line))
        self.out.event("output", body)

    def _breakpoint_events(self) -> None:
        for body in self.bps.changes():
            self.out.event("breakpoint", body)

    def r_configurationDone(self, req):
        self.out.response(req)
        if self.configured:  # once per session
            return
        self.configured = True
        if self.config.stop_on_entry:
            self._report(self.ci.last.stop, self.ci.where_line(), "entry")
        else:
            self._start("continue", self.ci.cont, goalless=True)

    def r_disconnect(self, req):
        run = self.running
        if run is not None:
            self.ci.interrupt()
            run.paused = True
            run.thread.join(timeout=STOP_WAIT_S)
            self.running = None
            for msg in run.deferred:  # answered, even though the session is going away
                if run.thread.is_alive():  # still running: its session is not to be touched
                    self.out.error(msg, f"'{msg['command']}': the model did not stop within "
                                        f"{STOP_WAIT_S:g} s of the disconnect; not done")
                else:
                    self.dispatch(msg)
        for msg in self.prelaunch:
            self.out.error(msg, f"'{msg['command']}': the session ended before a launch")
        self.prelaunch = []
        self.closing.set()
        self.out.response(req)
        self.done = True

    def r_terminate(self, req):
        self.closing.set()
        if self.running is not None:
            self.ci.interrupt()
            self.running.paused = True
        self.out.response(req)
        if not self.ended:
            self.ended = True
            self.out.event("terminated")

    def _shutdown(self) -> None:
        if self.running is not None:
            self.ci.interrupt()
            self.running.thread.join(timeout=STOP_WAIT_S)
        self.done = True

