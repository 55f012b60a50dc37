"""The Debug Adapter Protocol over the debugger engine: requests in, responses and events out.

A thin adapter: every request calls the typed
:class:`~firscope.debug.debugger.Debugger` that batch mode and the UI use (its
text commands, :class:`~firscope.debug.commands.CommandInterpreter`, only for
what the user types in the debug console). A movement runs in a worker thread
so that ``pause`` (the session's cancel flag)
and ``disconnect`` are answered while the model runs. Requests that read
state are answered between runs only (while running they get an error, and
``threads`` the list of the last stop); breakpoint changes that arrive while
the model runs wait for the stop, and a ``continue`` is interrupted to take
them and then resumed, since a goal-less run is the same run after a pause.

Stepping (README "Editors"):

=================  ====================================  =====================================
DAP request        between nodes (thread ``graph``)      inside a kernel (a lane thread)
=================  ====================================  =====================================
next (F10)         run the node, stop before the next    one instruction, all active lanes
stepIn (F11)       into the kernel, before its first     one instruction, all active lanes
                   instruction (an ext node: run it)
stepOut            to the end of the token               to the end of the kernel
stepBack           undo one node                         undo one instruction
reverseContinue    back to the previous node/token       (the same)
                   breakpoint or the start of history
=================  ====================================  =====================================

``granularity: "instruction"`` makes next one instruction inside a kernel too, and
between nodes enters the kernel like stepIn.
"""
from __future__ import annotations

import base64
import queue
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..debug.commands import CommandInterpreter, Result
from ..debug.info import fmt_scalar
from ..debug.snapshot import Snapshot, Stop, StopReason
from ..errors import FirError
from .breakpoints import BreakpointMap
from .conventions import Conventions
from .launch import LaunchConfig
from .lifecycle import LifeCycle, arguments
from .protocol import Writer
from .views import RequestError, Views
from ..runtime import NodeKind

BREAKPOINT_REQUESTS = ("setBreakpoints", "setFunctionBreakpoints", "setExceptionBreakpoints",
                       "setDataBreakpoints")
ALWAYS = ("initialize", "launch", "disconnect", "terminate", "pause", "threads")
# Sent before launch (after `initialized`): held, and done once the model is loaded.
PRELAUNCH = BREAKPOINT_REQUESTS + ("configurationDone",)
# Errors the user must act on: a dialog in VS Code (showUser) and the text on stderr.
USER_FACING = ("launch", "configurationDone")
MAX_HELD = 256  # configuration requests held before an authenticated launch
EXCEPTION_IDS = {StopReason.NAN: "nan", StopReason.FAULT: "fault", StopReason.BUDGET: "budget"}


def arg(request: dict, name: str, kind=None, default=None, required: bool = False):
    """One argument of a request, checked; RequestError names it when it is bad."""
    args = arguments(request)
    if name not in args:
        if required:
            raise RequestError(f"'{request.get('command')}' needs the argument '{name}'")
        return default
    value = args[name]
    if kind is not None and (not isinstance(value, kind)
                             or (kind is int and isinstance(value, bool))):
        raise RequestError(f"argument '{name}' has the wrong type ({type(value).__name__})")
    return value


@dataclass
class Run:
    """A movement running in the worker thread."""

    label: str  # what it is called in messages (continue, next, goto attention@1)
    call: Callable[[], object]  # the typed call (or a typed line's run) the worker makes
    goalless: bool  # continue / reverse-continue: interrupting and resuming is the same run
    reason: str  # the DAP stop reason when it ends by doing what it was asked
    thread: threading.Thread | None = None
    paused: bool = False
    retake: bool = False  # interrupted to take breakpoint changes; resume afterwards
    deferred: list = field(default_factory=list)


class Adapter(LifeCycle):
    """One debug session: the state between the client's requests."""

    def __init__(self, writer: Writer, closing: threading.Event | None = None,
                 token: str | None = None):
        self.out = writer
        # over TCP (``--port``): the secret the server printed; until a launch presents it,
        # nothing but initialize is answered and the held configuration waits
        self.token = token
        # set once the client said disconnect/terminate or closed its end: SIGINT is then
        # the quiet way out (server.py)
        self.closing = closing or threading.Event()
        self.conv = Conventions()
        self.prelaunch: list[dict] = []
        self.configured = False
        self.initialized_sent = False
        self.source: dict | None = None
        self.inbox: queue.Queue = queue.Queue()
        self.ci: CommandInterpreter | None = None
        self.views: Views | None = None
        self.bps: BreakpointMap | None = None
        self.config: LaunchConfig | None = None
        self.running: Run | None = None
        self.last_threads = [{"id": 1, "name": "graph"}]
        self.done = False  # disconnected: the server loop ends
        self.ended = False  # generation over or the session terminated
        self.client: dict = {}

    # ================================================================ the loop
    def serve(self, reader, first: tuple[str, object] | None = None) -> None:
        """Read requests on a thread of their own; handle them and worker results here.
        ``first``: what was read (and perhaps answered) before the engine was imported."""
        if first is not None:
            self.inbox.put(first)
            if first[0] == "eof":
                self.closing.set()

        def pump():
            try:
                while True:
                    try:
                        msg = reader()
                    except Exception as e:  # bad framing: say so, read on
                        self.inbox.put(("garbage", str(e)))
                        continue
                    if msg is None:
                        break
                    self.inbox.put(("message", msg))
            finally:
                self.closing.set()
                self.inbox.put(("eof", None))
        if first is None or first[0] != "eof":
            threading.Thread(target=pump, name="dap-reader", daemon=True).start()
        while not self.done:
            kind, item = self.inbox.get()
            if kind == "message":
                self.dispatch(item)
            elif kind == "initialized":
                self._client_said(item)
            elif kind == "ran":
                self._ran(*item)
            elif kind == "garbage":
                self.output(f"firscope dap: ignored a malformed message: {item}\n", "stderr")
            elif kind == "eof":
                self._shutdown()
                break

    def dispatch(self, msg: dict) -> None:
        if msg.get("type") != "request" or not isinstance(msg.get("command"), str):
            self.output(f"firscope dap: ignored a message that is not a request: "
                        f"{str(msg)[:200]}\n", "stderr")
            return
        command = msg["command"]
        handler = getattr(self, "r_" + command, None)
        try:
            if self.token is not None and not self._authenticated(msg):
                return
            if handler is None:
                raise RequestError(f"unknown request '{command}'")
            if command not in ALWAYS:
                if self.ci is None and command in PRELAUNCH:
                    self.prelaunch.append(msg)  # answered once the model is loaded
                    return
                if self.ci is None:
                    raise RequestError(f"'{command}': no model is launched yet")
                if self.running is not None:
                    if command in BREAKPOINT_REQUESTS:
                        self._defer(msg)
                        return
                    raise RequestError(f"'{command}': the model is running (pause it first)")
            handler(msg)
        except (RequestError, FirError) as e:
            self._fail(msg, str(e))  # a FirError with a position: FILE:LINE:COL: ...
        except Exception as e:  # a bug: answer, log, and stay up
            traceback.print_exc(file=sys.stderr)
            self._fail(msg, f"internal error in firscope: {type(e).__name__}: {e}")

    def _authenticated(self, msg: dict) -> bool:
        """A TCP session before its token: ``initialize`` and ``disconnect`` are answered,
        the configuration requests are held (not executed), a ``launch`` must carry the
        token (``"token"`` in its arguments) or the connection is closed, and anything
        else is refused. Whoever reaches a local port must not read or write this user's
        files through the adapter (issue 39.2)."""
        import hmac
        command = msg["command"]
        if command in ("initialize", "disconnect", "terminate"):
            return True
        if command in PRELAUNCH and len(self.prelaunch) < MAX_HELD:
            self.prelaunch.append(msg)  # answered once launched, or refused with it
            return False
        given = arguments(msg).get("token") if command == "launch" else None
        if isinstance(given, str) and hmac.compare_digest(given.encode("utf-8", "replace"),
                                                          self.token.encode("utf-8")):
            self.token = None  # this connection has shown it
            return True
        why = ("this firscope dap server needs the token it printed when it started: give "
               "it as \"token\" in the launch configuration")
        self.out.error(msg, why if command == "launch" else
                       f"'{command}': not before an authenticated launch; {why}")
        if command == "launch":
            held, self.prelaunch = self.prelaunch, []
            for m in held:
                self.out.error(m, f"'{m['command']}': refused: the launch was not "
                                  "authenticated")
            self.done = True  # a wrong or missing token ends the connection
        return False

    def _fail(self, msg: dict, text: str) -> None:
        user = msg.get("command") in USER_FACING
        self.out.error(msg, text, show_user=user)
        if user:  # a client that shows no dialog still shows this in its console
            self.output(f"firscope: {text}", "stderr")

    def _defer(self, msg: dict) -> None:
        r = self.running
        r.deferred.append(msg)
        if r.goalless and not r.retake:
            r.retake = True
            self.ci.interrupt()

    # ================================================================ output
    def output(self, text: str, category: str = "console") -> None:
        if text:
            self.out.event("output", {"category": category,
                                      "output": text if text.endswith("\n") else text + "\n"})

    # ================================================================ breakpoints
    def r_setBreakpoints(self, req):
        source = arg(req, "source", dict, required=True)
        path = source.get("path")
        if not isinstance(path, str):
            raise RequestError("setBreakpoints needs a source with a 'path'")
        wanted = arg(req, "breakpoints", list)
        if wanted is None:  # the deprecated form: lines only
            wanted = [{"line": n} for n in arg(req, "lines", list, [])]
        wanted = [b if isinstance(b, dict) else {"line": None} for b in wanted]
        self.out.response(req, {"breakpoints": self.bps.set_source(path, wanted)})

    def r_setFunctionBreakpoints(self, req):
        wanted = [b if isinstance(b, dict) else {} for b in
                  arg(req, "breakpoints", list, required=True)]
        self.out.response(req, {"breakpoints": self.bps.set_functions(wanted)})

    def r_setExceptionBreakpoints(self, req):
        filters = arg(req, "filters", list, required=True)
        self.out.response(req, {"breakpoints": self.bps.set_exceptions(filters)})

    def r_dataBreakpointInfo(self, req):
        name = arg(req, "name", str, required=True)
        ref = arg(req, "variablesReference", int)
        try:
            spec = self.views.watch_target(ref, name) if ref else name
            body = self.bps.data_info(spec)
        except (RequestError, FirError) as e:
            body = {"dataId": None, "description": e.message if isinstance(e, FirError)
                    else str(e)}
        self.out.response(req, body)

    def r_setDataBreakpoints(self, req):
        wanted = [b if isinstance(b, dict) else {} for b in
                  arg(req, "breakpoints", list, required=True)]
        self.out.response(req, {"breakpoints": self.bps.set_data(wanted)})

    # ================================================================ running
    def _focus(self, req) -> None:
        """Stepping a lane's thread focuses that lane (conditions and stops look at it)."""
        thread = arg(req, "threadId", int)
        if thread is None or self.views is None:
            return
        lane = self.views.lane_of_thread(thread)
        if lane is not None and lane != self.ci.lane:
            self.ci.set_lane(lane)

    def _move(self, req, label: str, call: Callable[[], object], *, goalless: bool = False,
              reason: str = "step", body: dict | None = None) -> None:
        if self.ended:
            raise RequestError("the session has ended")
        self._focus(req)
        if req.get("command") == "continue":
            body = {"allThreadsContinued": True}
        self.out.response(req, body)
        self._start(label, call, goalless=goalless, reason=reason)

    def _in_kernel(self) -> bool:
        d = self.ci.session.dispatch
        return d is not None and not d.done

    def _step_in(self, req) -> None:
        """Into the next node's kernel, stopping before its first instruction."""
        d = self.ci
        node = d.s.node
        if self._in_kernel() or node is None or node.kind != NodeKind.MICRO or not node.program.ops:
            return self._move(req, "stepi", d.step)
        # until KERNEL:LINE stops before pc 0: the cursor is before this node, so the first
        # dispatch of that kernel is this one.
        where = f"{node.target}:{node.program.ops[0].loc.line}"
        self._move(req, f"until {where}", lambda: d.until(where))

    def r_continue(self, req):
        self._move(req, "continue", self.ci.cont, goalless=True)

    def r_next(self, req):
        if arg(req, "granularity", str) == "instruction":
            return self._step_in(req)
        if self._in_kernel():
            return self._move(req, "stepi", self.ci.step)
        self._move(req, "next", self.ci.next)

    def r_stepIn(self, req):
        self._step_in(req)

    def r_stepOut(self, req):
        self._move(req, "finish", self.ci.finish)

    def r_stepBack(self, req):
        if self._in_kernel() or arg(req, "granularity", str) == "instruction":
            return self._move(req, "reverse-stepi", self.ci.reverse_step)
        self._move(req, "reverse-next", self.ci.reverse_next)

    def r_reverseContinue(self, req):
        self._move(req, "reverse-continue", self.ci.reverse_continue, goalless=True)

    def r_pause(self, req):
        self.out.response(req)
        if self.running is None:
            if self.ci is not None and not self.ended:  # already stopped: say where
                self._report(self.ci.last.stop, "", "pause")
            return
        self.running.paused = True
        self.ci.interrupt()

    def r_gotoTargets(self, req):
        line = arg(req, "line", int, required=True)
        s = self.ci.session
        at = self.conv.line_in(line)
        targets = [{"id": n.index + 1, "label": f"{n.full_name} (token {s.step})", "line": line}
                   for n in s.nodes if n.loc.line == at]
        self.out.response(req, {"targets": targets})

    def r_goto(self, req):
        target = arg(req, "targetId", int, required=True)
        nodes = self.ci.session.nodes
        if not 1 <= target <= len(nodes):
            raise RequestError(f"no goto target {target}")
        node = nodes[target - 1].full_name
        self._move(req, f"goto {node}", lambda: self.ci.goto(node), reason="goto")

    def _start(self, label: str, call: Callable[[], object], *, goalless: bool,
               reason: str = "step") -> None:
        self.views.reset()
        run = Run(label, call, goalless, reason)
        self.running = run
        # A pause meant for the last run must not stop this one. Cleared here, before the
        # worker starts, so that a pause from now on is never lost: the engine only reads it.
        self.ci.clear_interrupt()

        def work():
            try:
                result = call()
                item = (result.description if isinstance(result, Snapshot) else
                        result.text if isinstance(result, Result) else str(result or ""), None)
            except FirError as e:
                item = ("", str(e))
            except Exception as e:  # a bug: keep the adapter up and say so
                traceback.print_exc(file=sys.stderr)
                item = ("", f"internal error in firscope: {type(e).__name__}: {e}")
            self.inbox.put(("ran", item))
        run.thread = threading.Thread(target=work, name="dap-run", daemon=True)
        run.thread.start()

    def _ran(self, text: str, error: str | None) -> None:
        run = self.running
        run.thread.join()
        self.running = None
        stop = self.ci.last.stop
        for msg in run.deferred:
            self.dispatch(msg)
        self._breakpoint_events()  # spent (a hit condition ==N), before the stop is shown
        if run.retake and not run.paused and error is None \
                and stop.reason is StopReason.INTERRUPTED:
            self._start(run.label, run.call, goalless=run.goalless, reason=run.reason)
            return
        if error is not None:
            self.output(error, "stderr")
            stop = self.ci.last.stop
        self._report(stop, text, run.reason)

    # ================================================================ stops
    def _report(self, stop: Stop, text: str, reason: str) -> None:
        self.output(text)
        if self.ended:  # terminated while it ran: no stop to show any more
            return
        r = stop.reason
        if r is StopReason.FINISHED:
            s = self.ci.session
            self.output(f"generated: {self.ci.tok.decode(s.sequence)!r}")
            return self._end(0)
        if r.is_error and not self.bps.stop_on_fault:
            self.output(stop.message, "stderr")
            return self._end(1)
        self.last_threads = self.views.threads()
        body = {"reason": self._reason(stop, reason), "threadId": self.views.stopped_thread(),
                "allThreadsStopped": True, "description": stop.reason.label,
                "text": (stop.message or text).split("\n")[0]}
        if stop.breakpoint is not None:
            body["hitBreakpointIds"] = [stop.breakpoint]
        self.out.event("stopped", body)

    def _reason(self, stop: Stop, reason: str) -> str:
        r = stop.reason
        if r is StopReason.ENTRY:
            return "entry"
        if r is StopReason.BREAKPOINT:
            origin = self.bps.origin.get(stop.breakpoint)
            return "function breakpoint" if origin == "function" else "breakpoint"
        if r is StopReason.WATCHPOINT:
            return "data breakpoint"
        if r in EXCEPTION_IDS:
            return "exception"
        if r is StopReason.INTERRUPTED:
            return "pause"
        return reason if reason != "entry" else "step"

    def _end(self, code: int) -> None:
        if not self.ended:
            self.ended = True
            self.out.event("exited", {"exitCode": code})
            self.out.event("terminated")

    def r_exceptionInfo(self, req):
        stop = self.ci.last.stop
        if stop.reason not in EXCEPTION_IDS:
            raise RequestError("the last stop was not an exception")
        first = stop.message.split("\n")[0]
        self.out.response(req, {"exceptionId": EXCEPTION_IDS[stop.reason], "description": first,
                                "breakMode": "always",
                                "details": {"message": stop.message,
                                            "typeName": stop.reason.label,
                                            "stackTrace": self.ci.where_line()}})

    # ================================================================ looking
    def r_threads(self, req):
        if self.running is not None or self.views is None:
            return self.out.response(req, {"threads": self.last_threads})
        self.last_threads = self.views.threads()
        self.out.response(req, {"threads": self.last_threads})

    def r_stackTrace(self, req):
        frames = self.views.frames(arg(req, "threadId", int, required=True))
        start = max(arg(req, "startFrame", int, 0), 0)
        levels = arg(req, "levels", int, 0)
        shown = frames[start: start + levels] if levels and levels > 0 else frames[start:]
        self.out.response(req, {"stackFrames": shown, "totalFrames": len(frames)})

    def r_scopes(self, req):
        self.out.response(req, {"scopes": self.views.scopes(
            arg(req, "frameId", int, required=True))})

    def r_variables(self, req):
        ref = arg(req, "variablesReference", int, required=True)
        variables = self.views.variables(ref, arg(req, "start", int), arg(req, "count", int),
                                         arg(req, "filter", str))
        self.out.response(req, {"variables": variables})

    def r_setVariable(self, req):
        ref = arg(req, "variablesReference", int, required=True)
        name = arg(req, "name", str, required=True)
        value = arg(req, "value", str, required=True)
        target, lane = self.views.set_target(ref, name)
        weight = target.startswith("--weight ")
        shown = target.removeprefix("--weight ")
        self.ci.set(shown, value, lane=lane, weight=weight)
        new = self.ci.evaluate(shown, lane=lane)
        self.out.response(req, {"value": fmt_scalar(np.asarray(new)[()]) if np.ndim(new) == 0
                                else str(new)})

    def r_evaluate(self, req):
        text = arg(req, "expression", str, required=True).strip()
        context = arg(req, "context", str, "repl")
        frame = arg(req, "frameId", int)
        lane = self.ci.lane
        if frame is not None:
            f = self.views.handles.get(frame, "frame")
            lane = getattr(f, "lane", None)
            lane = self.ci.lane if lane is None else lane
        if context == "repl" and self._is_command(text):
            return self._repl_command(req, text)
        self.out.response(req, self.views.evaluate(text, lane, hover=context == "hover"))

    def _is_command(self, text: str) -> bool:
        word = text.split(None, 1)[0] if text else ""
        cmd = self.ci.command_for(text)
        if cmd is None or len(word) < 2:
            return False  # one-letter aliases (n, c, p) are names a model may use
        m = self.ci.model
        return word not in m.buffers and not any(w.decl == word for w in m.weights.values())

    def _repl_command(self, req, text: str) -> None:
        cmd = self.ci.command_for(text)
        if cmd.names[0] == "quit":
            raise RequestError("use the editor's stop button to end the session")
        if cmd.resumes:  # a line the user typed: the text commands parse it
            return self._move(req, text, lambda: self.ci.run(text),
                              body={"result": "", "variablesReference": 0})
        self.ci.clear_interrupt()  # `source FILE` may move, in place: not stopped by a past pause
        result = self.ci.execute(text)
        self._breakpoint_events()  # `break`, `delete`, `disable`... typed in the console
        self.out.response(req, {"result": result, "variablesReference": 0})
        if self.client.get("supportsInvalidatedEvent"):
            self.out.event("invalidated", {"areas": ["variables"]})

    def r_firscopeKernel(self, req):
        """Custom request (``session.customRequest('firscopeKernel', {...})``): ``action``
        edit (``name``, ``file``), replay (``node``, ``all``), toggle (``name``), history,
        revert (``name``) or write;
        answers ``{"result": text}``, the A/B report for replay."""
        action = arg(req, "action", str, required=True)
        if action == "edit":
            text = self.ci.kernel_edit(arg(req, "name", str, required=True),
                                       arg(req, "file", str, required=True))
        elif action == "replay":
            text = self.ci.kernel_replay(arg(req, "node", str), every=arg(req, "all", bool,
                                                                            False))
        elif action == "revert":
            text = self.ci.kernel_revert(arg(req, "name", str))
        elif action == "write":
            text = self.ci.kernel_write()
        elif action == "toggle":
            text = self.ci.kernel_toggle(arg(req, "name", str))
        elif action == "history":
            text = self.ci.kernel_history()
        else:
            raise RequestError(f"unknown action {action!r} (edit, replay, toggle, history, "
                               "revert, write)")
        self.out.response(req, {"result": text})
        if self.client.get("supportsInvalidatedEvent"):
            self.out.event("invalidated", {"areas": ["variables"]})

    def r_readMemory(self, req):
        ref = arg(req, "memoryReference", str, required=True)
        offset = arg(req, "offset", int, 0)
        count = arg(req, "count", int, required=True)
        try:
            start = int(ref, 16) + offset
        except ValueError:
            raise RequestError(f"bad memoryReference {ref!r}") from None
        raw = self.ci.session.arena.view(np.uint8)
        if count < 0:
            raise RequestError("count must be >= 0")
        # Bytes before address 0 do not exist: the answer starts at 0 (its address says so)
        # and counts the ones skipped as unreadable, never shifts real bytes to -N.
        lo, hi = max(start, 0), min(start + min(count, 1 << 24), raw.size)
        data = raw[lo:hi].tobytes() if hi > lo else b""
        self.out.response(req, {"address": hex(lo), "data": base64.b64encode(data).decode(),
                                "unreadableBytes": count - len(data)})

    def r_source(self, req):
        lines = self.ci.model.fir.lines
        self.out.response(req, {"content": "\n".join(lines) + "\n", "mimeType": "text/x-fir"})
