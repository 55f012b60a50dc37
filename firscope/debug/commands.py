"""gdb-style commands over a :class:`Session`: the front end (the pdb of firscope).

The batch debugger feeds this one line at a time; the TUI's keys, console
and command palette and the DAP server go through the same table. The
interpreter holds what belongs to the person looking, not to the engine:
the focused lane, the register shown across lanes, and the last
:class:`~firscope.debug.snapshot.Snapshot`. Each command says whether it
resumes execution (``resumes``), as pdb's ``do_*`` methods do by returning
1, so a UI knows to run it in a worker. A bad command raises
:class:`FirError` with a message; the caller prints it and goes on.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import FirError
from ..model import Ref
from ..model.tokens import ByteTokenizer, Tokenizer
from . import diverge, info, persist
from .info import fmt_array, fmt_value, format_stats
from .session import Session
from .checkpoints import Checkpoints
from .element_history import element_history
from .expr import DebugExpr
from .lens import lens
from .logpoints import split_dprintf
from .snapshot import DisplayValue, Snapshot, Stop, StopReason, capture

_NUMBER = re.compile(r"[0-9]{1,12}$")


@dataclass(frozen=True)
class Command:
    names: tuple[str, ...]
    usage: str
    help: str
    fn: Callable
    resumes: bool = False  # runs the engine: a UI runs it in a worker
    topics: tuple[info.InfoTopic, ...] = ()  # info's topics: each is a form of its own


@dataclass(frozen=True)
class Reply:
    """What a handler returns when it has data for a front end besides its text (``history``
    returns the writes it lists); a handler that has only text returns the str."""

    text: str
    data: object = None


@dataclass(frozen=True)
class Result:
    text: str
    snapshot: Snapshot | None  # a new stop, when the command moved
    resumed: bool
    data: object = None  # what the handler returned besides its text (see Reply)


def _count(args: list[str], default: int = 1) -> int:
    if not args:
        return default
    if not _NUMBER.match(args[0]):
        raise FirError(f"expected a count, found {args[0]!r}")
    n = int(args[0])
    if n < 1:
        raise FirError("count must be at least 1")
    return n


def _numbers(args: list[str], what: str = "breakpoint number") -> list[int]:
    out = []
    for a in args:
        if not _NUMBER.match(a):
            raise FirError(f"expected a {what}, found {a!r}")
        out.append(int(a))
    return out


class CommandInterpreter:
    def __init__(self, session: Session, tokenizer: Tokenizer | None = None):
        self.s = session
        self.tok = tokenizer or ByteTokenizer()
        self.quit = False
        self.lane = 0  # the focused lane: registers, conditions and prints look at it
        self.register = ("R", 0)  # the register shown across lanes
        self._before_last: Snapshot | None = None
        self.displays: dict[int, DebugExpr] = {}
        self._display_text: dict[int, str] = {}
        self._next_display = 1
        self.checkpoints = Checkpoints()
        start = session.here()
        self.last: Snapshot = capture(session, start, self.where_line())
        self.info_by_name = {n: t for t in info.TOPICS for n in t.names}
        self.table: list[Command] = self._commands()
        self.by_name = {n: c for c in self.table for n in c.names}

    def info_usage(self) -> str:
        """``info registers|breakpoints|...|cost [DEVICE]``: the usage line, from the table."""
        return "info " + "|".join(t.usage for t in info.TOPICS)

    def _commands(self) -> list[Command]:
        """The command table: names, usage, help, handler, and whether it resumes."""
        return [
            Command(("break", "b"), "break LOCATION [if COND]",
                    "breakpoint at a node (attention, attention@3), kernel line "
                    "(g2.attn_decode:156), token N, nan, race (lanes racing on an element), "
                    "uninit (a read of unwritten memory) or diverge [--isolate] [RTOL [ATOL] | "
                    "ulp N] (with --against)", self.c_break),
            Command(("tbreak",), "tbreak LOCATION [if COND]", "one-shot breakpoint",
                    self.c_tbreak),
            Command(("watch",), "watch BUFFER[a:b] | [lane N] REG [if COND]",
                    "stop when the range or register (R3: any lane; lane 2 U4) changes; shows "
                    "old and new values", self.c_watch),
            Command(("dprintf",), 'dprintf LOCATION [if COND] "FMT {EXPR}"',
                    "log point: print FMT with each {EXPR} evaluated there, do not stop",
                    self.c_dprintf),
            Command(("condition",), "condition N [COND]", "set or clear a breakpoint's condition",
                    self.c_condition),
            Command(("ignore",), "ignore N COUNT", "ignore the next COUNT hits", self.c_ignore),
            Command(("delete", "d"), "delete [N...]", "delete breakpoints (all without N); "
                    "delete checkpoint [N...] frees checkpoints",
                    self.c_delete),
            Command(("disable",), "disable N...", "disable breakpoints", self.c_disable),
            Command(("enable",), "enable N...", "enable breakpoints", self.c_enable),
            Command(("continue", "c"), "continue", "run to the next breakpoint or the end",
                    self.c_continue, True),
            Command(("stepi", "si", "s", "step"), "stepi [N]",
                    "execute N instructions (all active lanes)", self.c_stepi, True),
            Command(("next", "n"), "next [N]", "finish the node, stop before the next",
                    self.c_next, True),
            Command(("finish",), "finish", "run the current kernel (or token) to its end",
                    self.c_finish, True),
            Command(("until", "advance"), "until LOCATION", "run to a node or kernel line",
                    self.c_until, True),
            Command(("token", "t"), "token", "run to the start of the next token", self.c_token,
                    True),
            Command(("goto",), "goto NODE[@L] [token N]",
                    "go forward or back to the start of a node", self.c_goto, True),
            Command(("reverse-stepi", "rsi"), "reverse-stepi [N]", "undo N instructions",
                    self.c_rstepi, True),
            Command(("reverse-next", "rn"), "reverse-next [N]", "undo N nodes", self.c_rnext,
                    True),
            Command(("reverse-continue", "rc"), "reverse-continue",
                    "back to the previous node or token breakpoint", self.c_rcontinue, True),
            Command(("lane",), "lane N", "focus lane N", self.c_lane),
            Command(("set",), "set [--weight] [lane N] TARGET = EXPR",
                    "change a register or buffer here, replayably (R3 = 1.5, x[0:4] = 0, "
                    "R3[2] = 0, key_cache@1[5] = 0)", self.c_set),
            Command(("unset",), "unset N", "forget patch N for later replays", self.c_unset),
            Command(("display",), "display EXPR", "show EXPR after every stop",
                    self.c_display),
            Command(("undisplay",), "undisplay [N...]", "stop showing displays (all without N)",
                    self.c_undisplay),
            Command(("history",), "history BUF[i]",
                    "every recorded write to one element: token, node, line, lane, old -> new",
                    self.c_history),
            Command(("lens",), "lens [--all] [K]",
                    "logit lens: top-K next tokens from the residual now (--all: each layer)",
                    self.c_lens),
            Command(("checkpoint",), "checkpoint", "save the whole state (restart N goes back)",
                    self.c_checkpoint),
            Command(("restart",), "restart N", "return to checkpoint N", self.c_restart, True),
            Command(("print", "p"), "print EXPR",
                    "R3, U5, x[0:8], scores@2[0:16], max(abs(x)), stats x", self.c_print),
            Command(("stats",), "stats BUFFER", "min, max, mean, std, NaN/Inf count",
                    self.c_stats),
            Command(("info", "i"), self.info_usage(), "show state", self.c_info,
                    topics=info.TOPICS),
            Command(("where", "bt", "backtrace"), "where", "where execution is",
                    self.c_where),
            Command(("list", "l"), "list", "kernel source around the next instruction",
                    self.c_list),
            Command(("save",), "save breakpoints FILE",
                    "write breakpoints, watchpoints, catchpoints, log points and displays as "
                    "commands", lambda rest: persist.save_breakpoints(self, rest)),
            Command(("source",), "source FILE", "run the commands in FILE (a saved breakpoint "
                    "file, a batch script)", lambda rest: persist.source_file(self, rest)),
            Command(("help", "h"), "help", "this list", self.c_help),
            Command(("quit", "q"), "quit", "leave the debugger", self.c_quit),
        ]

    # -- entry points ------------------------------------------------------------------
    def command_for(self, line: str) -> Command | None:
        word = line.strip().partition(" ")[0]
        return self.by_name.get(word)

    def resumes(self, line: str) -> bool:
        cmd = self.command_for(line)
        return cmd is not None and cmd.resumes

    def run(self, line: str) -> Result:
        """Execute one command line; say what it printed and whether it moved."""
        line = line.strip()
        if not line or line.startswith("#"):
            return Result("", None, False)
        word, _, rest = line.partition(" ")
        cmd = self.by_name.get(word)
        if cmd is None:
            raise FirError(f"unknown command '{word}' (try 'help')")
        before = self.last
        reply = cmd.fn(rest.strip())
        if not isinstance(reply, Reply):
            reply = Reply(reply)
        moved = self.last is not before and cmd.resumes
        return Result(reply.text, self.last if moved else None, cmd.resumes, reply.data)

    def execute(self, line: str) -> str:
        return self.run(line).text

    @property
    def previous(self) -> Snapshot | None:
        """The stop before the last one: what changed marks compare with (views of lanes
        other than the focused one use it)."""
        return self._before_last

    # -- stops -------------------------------------------------------------------------
    def _moved(self, stop: Stop) -> str:
        """Every movement ends here: focus, freeze a snapshot, describe the stop."""
        if stop.lane is not None:
            self.lane = stop.lane
        lanes = self.s.lanes()
        if lanes is not None and not 0 <= self.lane < max(lanes, 1):
            self.lane = 0
        text = self.describe_stop(stop)
        if self.s.log_lines:  # log points hit on the way, printed before the stop
            text = "\n".join(self.s.log_lines + [text])
            self.s.log_lines.clear()
        displays = self._evaluate_displays()
        if displays:
            text += "\n" + "\n".join(f"{v.number}: {v.expr} = {v.text}" for v in displays)
        self._before_last = self.last
        self.last = capture(self.s, stop, text, lane=self.lane, register=self.register,
                            previous=self._before_last, displays=displays)
        return text

    def refocus(self) -> Snapshot:
        """The same stop seen with another lane or register (marks compare with the stop
        before it, as they did)."""
        self.last = capture(self.s, self.last.stop, self.last.description, lane=self.lane,
                            register=self.register, previous=self._before_last,
                            displays=self._evaluate_displays(mark=False))
        return self.last

    def describe_stop(self, stop: Stop) -> str:
        lines = []
        r = stop.reason
        if r in (StopReason.FINISHED, StopReason.HISTORY, StopReason.INTERRUPTED):
            lines.append(stop.message)
            if r is not StopReason.FINISHED:
                lines.append(self.where_line())
            return "\n".join(lines)
        head = self._head(stop)
        if head:
            lines.append(head)
        if stop.old is not None and stop.new is not None:
            lines.append(f"Old value = {fmt_array(stop.old)}")
            lines.append(f"New value = {fmt_array(stop.new)}")
        lines.append(self.where_line())
        return "\n".join(lines)

    @staticmethod
    def _head(stop: Stop) -> str:
        """The stop's first words, as batch mode prints them (and the UI header, for a
        catchpoint)."""
        r = stop.reason
        if r is StopReason.FAULT:
            return "Program received a fault:\n" + stop.message
        if r is StopReason.BUDGET:
            return "Stopped: instruction budget exhausted:\n" + stop.message
        if r is StopReason.NAN:
            return "Catchpoint (nan): " + stop.message
        return stop.message

    def status_line(self, snap: Snapshot | None = None) -> str:
        """One line for a status bar or header, the same whoever moved (a key, the console,
        the palette): ``stopped: breakpoint 1 at attention@1``, ``fault at embeddings, line
        65``, ``stopped: watchpoint 2 at mlp@1, line 62``."""
        stop = (snap or self.last).stop
        loc = stop.location
        where = loc.node or "end"
        if loc.in_kernel and loc.line is not None:
            where += f", line {loc.line}"
        head = self._head(stop).splitlines()
        if head and head[0].startswith("Catchpoint"):
            # a catchpoint's stop says what it caught (divergence, race, uninit, NaN), in the
            # words batch mode prints
            return head[0] + (f" (stopped at {where})" if loc.node and loc.node not in head[0]
                              else "")
        label = stop.reason.label
        if stop.breakpoint is not None and stop.reason in (StopReason.BREAKPOINT,
                                                           StopReason.WATCHPOINT):
            label += f" {stop.breakpoint}"
        return f"{label} at {where}"

    def token_text(self, token: int | None) -> str:
        if token is None:
            return "-"
        return f"{token} {self.tok.piece(token)!r}"

    def where_line(self) -> str:
        s = self.s
        loc = s.location()
        if s.finished:
            return f"[finished: {s.step} steps]"
        tok = f"token {loc.step} {self.token_text(loc.token)} pos {loc.position}"
        node = s.node
        d = s.dispatch
        if d is not None and not d.done:
            op = d.ops[d.pc]
            return (f"{loc.node} ({loc.kernel}) pc {loc.pc} at {s.model.path.name}:{loc.line}"
                    f"  [{tok}]\n{loc.line}\t{op.text}")
        return f"before {loc.node} ({node.kind} {node.target})  [{tok}]"

    # -- breakpoints ---------------------------------------------------------------------
    def c_break(self, rest):
        bp = self.s.add_breakpoint(rest)
        return f"{bp.what.capitalize()} {bp.number} at {bp.spec}" + (
            f" if {bp.condition.text}" if bp.condition else "")

    def c_tbreak(self, rest):
        bp = self.s.add_breakpoint(rest, temporary=True)
        return f"Temporary breakpoint {bp.number} at {bp.spec}"

    def c_dprintf(self, rest):
        location, message = split_dprintf(rest)
        bp = self.s.add_breakpoint(location, log=message)
        return f'Dprintf {bp.number} at {bp.spec}: "{message}"' + (
            f" if {bp.condition.text}" if bp.condition else "")

    def c_watch(self, rest):
        bp = self.s.add_watch(rest)
        return f"Watchpoint {bp.number}: {bp.spec}" + (
            f" if {bp.condition.text}" if bp.condition else "")

    def c_condition(self, rest):
        parts = rest.split(None, 1)
        if not parts:
            raise FirError("usage: condition N [COND]")
        n = _numbers(parts[:1])[0]
        self.s.set_condition(n, parts[1] if len(parts) > 1 else None)
        return (f"Breakpoint {n} now unconditional." if len(parts) == 1
                else f"Breakpoint {n} stops only if {parts[1]}")

    def c_ignore(self, rest):
        parts = rest.split()
        if len(parts) != 2:
            raise FirError("usage: ignore N COUNT")
        n, count = _numbers(parts)
        self.s.set_ignore(n, count)
        return f"Will ignore next {count} crossings of breakpoint {n}."

    def c_delete(self, rest):
        words = rest.split()
        if words and words[0] in ("checkpoint", "checkpoints"):
            return self._delete_checkpoints(words[1:])
        nums = _numbers(rest.split()) if rest else None
        self.s.delete_breakpoints(nums)
        return "Deleted all breakpoints." if nums is None else \
            f"Deleted {', '.join(map(str, dict.fromkeys(nums)))}."

    def _delete_checkpoints(self, words: list[str]) -> str:
        nums = _numbers(words, "checkpoint number") if words else [c.number for c in
                                                                   self.checkpoints]
        for n in nums:
            self.checkpoints.get(n)  # all checked before any is deleted
        for n in dict.fromkeys(nums):
            self.checkpoints.delete(n, self.s)
        return "Deleted no checkpoints." if not nums else \
            f"Deleted checkpoint {', '.join(map(str, dict.fromkeys(nums)))}."

    def c_disable(self, rest):
        self.s.set_enabled(_numbers(rest.split()), False)
        return ""

    def c_enable(self, rest):
        self.s.set_enabled(_numbers(rest.split()), True)
        return ""

    # -- movements -----------------------------------------------------------------------
    def c_continue(self, rest):
        return self._moved(self.s.cont(lane=self.lane))

    def c_stepi(self, rest):
        into = None if rest else diverge.step_into(self)  # from a `break diverge` stop
        if into is not None:
            return self._moved(into)
        return self._moved(self.s.stepi(_count(rest.split()), lane=self.lane))

    def c_next(self, rest):
        return self._moved(self.s.next(_count(rest.split()), lane=self.lane))

    def c_finish(self, rest):
        return self._moved(self.s.finish(lane=self.lane))

    def c_until(self, rest):
        if not rest:
            raise FirError("usage: until LOCATION")
        return self._moved(self.s.until(rest, lane=self.lane))

    def c_token(self, rest):
        return self._moved(self.s.next_token(lane=self.lane))

    def c_goto(self, rest):
        m = re.fullmatch(r"(\S+)(?:\s+token\s+([0-9]{1,12}))?", rest.strip())
        if not m:
            raise FirError("usage: goto NODE[@L] [token N]")
        try:
            idx = self.s.model.node_index(m.group(1))
        except KeyError:
            raise FirError(f"no node '{m.group(1)}'") from None
        step = int(m.group(2)) if m.group(2) else self.s.step
        return self._moved(self.s.goto((step, idx), lane=self.lane))

    def c_rstepi(self, rest):
        return self._moved(self.s.reverse_stepi(_count(rest.split()), lane=self.lane))

    def c_rnext(self, rest):
        return self._moved(self.s.reverse_next(_count(rest.split()), lane=self.lane))

    def c_rcontinue(self, rest):
        return self._moved(self.s.reverse_continue(lane=self.lane))

    # -- looking ---------------------------------------------------------------------------
    def set_lane(self, lane: int) -> None:
        self.s.check_lane(lane)
        self.lane = lane
        self.refocus()

    def set_register(self, file: str, reg: int) -> None:
        self.register = (file, reg)
        self.refocus()

    def c_lane(self, rest):
        if not rest:
            return f"focused lane: {self.lane}"
        if not _NUMBER.match(rest):
            raise FirError(f"expected a lane number, found {rest!r}")
        lane = int(rest)
        self.set_lane(lane)
        return f"[Switching to lane {lane}]"

    def c_print(self, rest):
        if not rest:
            raise FirError("usage: print EXPR")
        if rest.startswith("stats "):
            return self.c_stats(rest[6:])
        value = self.s.evaluate(rest, lane=self.lane)
        return f"$ = {fmt_value(value)}"

    def c_stats(self, rest):
        if not rest:
            raise FirError("usage: stats BUFFER")
        value = np.asarray(self.s.evaluate(rest, lane=self.lane))
        return format_stats(rest, value)

    def c_info(self, rest):
        what, _, arg = rest.partition(" ")
        topic = self.info_by_name.get(what)
        if topic is None:
            raise FirError(f"usage: {self.info_usage()}")
        return topic.fn(self, arg.strip())

    def c_where(self, rest):
        return info.where(self)

    def c_list(self, rest):
        return info.listing(self)

    def c_help(self, rest):
        return "\n".join(f"  {c.usage:<44} {c.help}" for c in self.table)

    def c_quit(self, rest):
        self.quit = True
        return ""

    # -- changing state, watching expressions, looking back ----------------------------------
    def c_set(self, rest):
        patch = self.s.set(rest, lane=self.lane)
        self.refocus()
        return f"Patch {patch.number}: {patch.text}  (at {patch.made_at})"

    def c_unset(self, rest):
        nums = _numbers(rest.split(), "patch number")
        if len(nums) != 1:
            raise FirError("usage: unset N")
        p = self.s.patches.delete(nums[0])
        return (f"Patch {p.number} forgotten: later replays no longer apply it (the values it "
                "set stay until something writes them)")

    def _evaluate_displays(self, mark: bool = True) -> tuple[DisplayValue, ...]:
        out = []
        for n, expr in self.displays.items():
            try:
                text, error = fmt_value(self.s.evaluate(expr, lane=self.lane)), False
            except FirError as e:
                text, error = f"<error: {e.message}>", True
            changed = n in self._display_text and self._display_text[n] != text
            if mark:
                self._display_text[n] = text
            out.append(DisplayValue(n, expr.text, text, changed, error))
        return tuple(out)

    def c_display(self, rest):
        if not rest:
            return info.info_display(self)
        expr = DebugExpr(rest)
        self.s.resolver.check(expr)
        n = self._next_display
        self._next_display += 1
        self.displays[n] = expr
        value = next(v for v in self._evaluate_displays() if v.number == n)
        self.refocus()
        return f"{n}: {expr.text} = {value.text}"

    def c_undisplay(self, rest):
        nums = _numbers(rest.split(), "display number") if rest else list(self.displays)
        for n in nums:
            if n not in self.displays:
                raise FirError(f"no display number {n}")
        for n in nums:
            self.displays.pop(n)
            self._display_text.pop(n, None)
        self.refocus()
        return ""

    def c_history(self, rest):
        text = rest.strip()
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])@([0-9]{1,12})", text)
        if m:  # x[5]@2 is x@2[5]
            text = f"{Ref(m.group(1), int(m.group(3)))}{m.group(2)}"
        if not text:
            raise FirError("usage: history BUF[i]")
        from .breakpoints import parse_watch
        w = parse_watch(self.s.model, text)
        if w.stop - w.start != 1:
            raise FirError(f"history follows one element: give an index, e.g. {w.region}[0]")
        writes, truncated = element_history(self.s, w.start)
        head = (f"{w.region}[{w.offset}]: {len(writes)} write{'s' if len(writes) != 1 else ''} "
                "in the recorded history (oldest first)")
        if truncated:
            head += "; older history was dropped to stay within the memory budget"
        lines = [head] + [f"  #{i:<3} {wr.describe()}" for i, wr in enumerate(writes)]
        return Reply("\n".join(lines), writes)

    def c_lens(self, rest):
        parts = rest.split()
        every = "--all" in parts
        nums = [p for p in parts if p != "--all"]
        k = _count(nums, 5)
        rows = lens(self.s, k=k, every_layer=every)
        out = []
        for row in rows:
            cells = "  ".join(f"{self.tok.piece(t)!r} {p:.3f}" for t, p in row.top)
            out.append(f"{row.label:<24} {cells}")
        return "\n".join(out)

    def c_checkpoint(self, rest):
        ck, dropped = self.checkpoints.save(self.s)
        lines = [f"checkpoint {ck.number}: {ck.made_at}"]
        if dropped:
            lines.append(f"dropped checkpoint{'s' if len(dropped) > 1 else ''} "
                         f"{', '.join(str(c.number) for c in dropped)} (oldest first) to stay "
                         "within the memory budget checkpoints share with the undo log")
        return "\n".join(lines)

    def c_restart(self, rest):
        nums = _numbers(rest.split(), "checkpoint number")
        if len(nums) != 1:
            raise FirError("usage: restart N")
        ck = self.checkpoints.get(nums[0])
        from .checkpoints import restore
        restore(self.s, ck)
        self.checkpoints.rebudget(self.s)  # the restored log gets the share left to it
        return self._moved(self.s.here(StopReason.STEP, f"restarted at checkpoint {ck.number}: "
                                                       f"{ck.made_at}"))

