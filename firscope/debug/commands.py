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
from ..model.tokens import ByteTokenizer, Tokenizer
from .resolver import parse_register
from .session import Session
from .snapshot import Snapshot, Stop, StopReason, capture

_NUMBER = re.compile(r"[0-9]{1,12}$")


@dataclass(frozen=True)
class Command:
    names: tuple[str, ...]
    usage: str
    help: str
    fn: Callable
    resumes: bool = False  # runs the engine: a UI runs it in a worker


@dataclass(frozen=True)
class Result:
    text: str
    snapshot: Snapshot | None  # a new stop, when the command moved
    resumed: bool


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


INFO_TOPICS = "registers|breakpoints|watch|lanes [REG]|node"


class CommandInterpreter:
    def __init__(self, session: Session, tokenizer: Tokenizer | None = None):
        self.s = session
        self.tok = tokenizer or ByteTokenizer()
        self.quit = False
        self.lane = 0  # the focused lane: registers, conditions and prints look at it
        self.register = ("R", 0)  # the register shown across lanes
        self._before_last: Snapshot | None = None
        start = session.here()
        self.last: Snapshot = capture(session, start, self.where_line())
        self.table: list[Command] = [
            Command(("break", "b"), "break LOCATION [if COND]",
                    "breakpoint at a node (attention, attention@3), kernel line "
                    "(g2.attn_decode:156), token N, or nan", self.c_break),
            Command(("tbreak",), "tbreak LOCATION [if COND]", "one-shot breakpoint",
                    self.c_tbreak),
            Command(("watch",), "watch BUFFER[a:b] [if COND]",
                    "stop when the range changes; shows old and new values", self.c_watch),
            Command(("condition",), "condition N [COND]", "set or clear a breakpoint's condition",
                    self.c_condition),
            Command(("ignore",), "ignore N COUNT", "ignore the next COUNT hits", self.c_ignore),
            Command(("delete", "d"), "delete [N...]", "delete breakpoints (all without N)",
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
            Command(("print", "p"), "print EXPR",
                    "R3, U5, x[0:8], scores@2[0:16], max(abs(x)), stats x", self.c_print),
            Command(("stats",), "stats BUFFER", "min, max, mean, std, NaN/Inf count",
                    self.c_stats),
            Command(("info", "i"), f"info {INFO_TOPICS}", "show state", self.c_info),
            Command(("where", "bt", "backtrace"), "where", "where execution is",
                    self.c_where),
            Command(("list", "l"), "list", "kernel source around the next instruction",
                    self.c_list),
            Command(("help", "h"), "help", "this list", self.c_help),
            Command(("quit", "q"), "quit", "leave the debugger", self.c_quit),
        ]
        self.by_name = {n: c for c in self.table for n in c.names}

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
        text = cmd.fn(rest.strip())
        moved = self.last is not before and cmd.resumes
        return Result(text, self.last if moved else None, cmd.resumes)

    def execute(self, line: str) -> str:
        return self.run(line).text

    # -- stops -------------------------------------------------------------------------
    def _moved(self, stop: Stop) -> str:
        """Every movement ends here: focus, freeze a snapshot, describe the stop."""
        if stop.lane is not None:
            self.lane = stop.lane
        lanes = self.s.lanes()
        if lanes is not None and not 0 <= self.lane < max(lanes, 1):
            self.lane = 0
        text = self.describe_stop(stop)
        self._before_last = self.last
        self.last = capture(self.s, stop, text, lane=self.lane, register=self.register,
                            previous=self._before_last)
        return text

    def refocus(self) -> Snapshot:
        """The same stop seen with another lane or register (marks compare with the stop
        before it, as they did)."""
        self.last = capture(self.s, self.last.stop, self.last.description, lane=self.lane,
                            register=self.register, previous=self._before_last)
        return self.last

    def describe_stop(self, stop: Stop) -> str:
        lines = []
        r = stop.reason
        if r in (StopReason.FINISHED, StopReason.HISTORY, StopReason.INTERRUPTED):
            lines.append(stop.message)
            if r is not StopReason.FINISHED:
                lines.append(self.where_line())
            return "\n".join(lines)
        head = stop.message
        if r is StopReason.FAULT:
            head = "Program received a fault:\n" + stop.message
        elif r is StopReason.BUDGET:
            head = "Stopped: instruction budget exhausted:\n" + stop.message
        elif r is StopReason.NAN:
            head = "Catchpoint (nan): " + stop.message
        if head:
            lines.append(head)
        if stop.old is not None and stop.new is not None:
            lines.append(f"Old value = {_fmt_array(stop.old)}")
            lines.append(f"New value = {_fmt_array(stop.new)}")
        lines.append(self.where_line())
        return "\n".join(lines)

    def status_line(self, snap: Snapshot | None = None) -> str:
        """One line for a status bar or header, the same whoever moved (a key, the console,
        the palette): ``stopped: breakpoint 1 at attention@1``, ``fault at embeddings, line
        65``, ``stopped: watchpoint 2 at mlp@1, line 62``."""
        stop = (snap or self.last).stop
        loc = stop.location
        where = loc.node or "end"
        if loc.in_kernel and loc.line is not None:
            where += f", line {loc.line}"
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
        nums = _numbers(rest.split()) if rest else None
        self.s.delete_breakpoints(nums)
        return "Deleted all breakpoints." if nums is None else \
            f"Deleted {', '.join(map(str, dict.fromkeys(nums)))}."

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
        return f"$ = {_fmt_value(value)}"

    def c_stats(self, rest):
        if not rest:
            raise FirError("usage: stats BUFFER")
        value = np.asarray(self.s.evaluate(rest, lane=self.lane))
        return format_stats(rest, value)

    def c_info(self, rest):
        what, _, arg = rest.partition(" ")
        if what in ("registers", "reg", "r"):
            return self.info_registers()
        if what in ("breakpoints", "break", "b", "watch", "watchpoints"):
            return self.info_breakpoints()
        if what in ("lanes", "lane"):
            return self.info_lanes(arg.strip() or None)
        if what in ("node", "n"):
            return self.info_node()
        raise FirError(f"usage: info {INFO_TOPICS}")

    def c_where(self, rest):
        s = self.s
        if s.finished:
            return f"[finished after {s.step} steps]"
        loc = s.location()
        node = s.node
        out = []
        frame = 0
        d = s.dispatch
        if d is not None and not d.done:
            nest = " ".join(f"{f.kind}@{d.ops[f.pc].loc.line}" +
                            (f"#{f.trips}" if f.kind == "for" else "") for f in d.stack)
            out.append(f"#{frame}  {loc.kernel} pc {loc.pc} at {s.model.path.name}:{loc.line}  "
                       f"lane {self.lane} of {d.lanes} ({int(d.mask.sum())} active)"
                       + (f"  in {nest}" if nest else ""))
            frame += 1
        out.append(f"#{frame}  node {loc.node} ({node.kind} {node.target}), node "
                   f"{loc.node_index + 1} of {len(s.nodes)}")
        out.append(f"#{frame + 1}  token {loc.step} {self.token_text(loc.token)} at position "
                   f"{loc.position} (step {loc.step + 1} of {s.total_steps})")
        return "\n".join(out)

    def c_list(self, rest):
        s = self.s
        node = s.node
        if node is None or node.kind != "micro":
            raise FirError("not at a kernel")
        lines = s.model.fir.lines
        syntax = node.program.kernel.syntax
        loc = s.location()
        cur = loc.line or syntax.loc.line  # a kernel without instructions: its header
        lo = max(syntax.loc.line, cur - 5)
        hi = min(syntax.end.line, cur + 5)
        bps = set(s.breakpoints.lines(node.target))
        out = []
        for ln in range(lo, hi + 1):
            mark = ("●" if ln in bps else " ") + ("▶" if ln == cur and s.dispatch else " ")
            out.append(f"{mark}{ln:5d}  {lines[ln - 1]}")
        return "\n".join(out)

    def c_help(self, rest):
        return "\n".join(f"  {c.usage:<44} {c.help}" for c in self.table)

    def c_quit(self, rest):
        self.quit = True
        return ""

    # -- info ----------------------------------------------------------------------------
    def info_registers(self) -> str:
        s = self.s
        d = s.dispatch
        if d is None:
            raise FirError("no kernel is running (use stepi to enter a micro node)")
        if d.lanes == 0:
            raise FirError("this dispatch has no lanes: there are no registers")
        snap = self.last
        lane = self.lane
        changed = snap.lane.changed if snap.lane is not None and snap.lane.lane == lane \
            else frozenset()
        out = [f"lane {lane} of {d.lanes} ({'active' if d.mask[lane] else 'inactive'}), "
               f"pc {d.pc}"]
        for i in range(32):
            r = d.R[i, lane]
            u = d.U[i, lane]
            cr = "*" if ("R", i) in changed else " "
            cu = "*" if ("U", i) in changed else " "
            out.append(f"R{i:<3}{float(r):>16.8g}{cr}   U{i:<3}{int(u):>12}{cu}")
        return "\n".join(out)

    def info_lanes(self, reg: str | None) -> str:
        s = self.s
        d = s.dispatch
        if d is None:
            raise FirError("no kernel is running")
        mask = "".join("■" if m else "□" for m in d.mask[:256])
        out = [f"{d.lanes} lanes, {int(d.mask.sum())} active: {mask}"
               + ("..." if d.lanes > 256 else "")]
        if reg:
            parsed = parse_register(reg)
            if parsed is None:
                raise FirError(f"expected a register like R3 or U5, found {reg!r}")
            if parsed != self.register:
                self.set_register(*parsed)
            across = self.last.across
            file, i = parsed
            vals = d.R[i] if file == "R" else d.U[i]
            for lane in range(min(d.lanes, 256)):
                mark = "*" if across is not None and across.changed[lane] else " "
                act = "■" if d.mask[lane] else "□"
                v = f"{float(vals[lane]):.8g}" if file == "R" else str(int(vals[lane]))
                focus = "  <- focused" if lane == self.lane else ""
                out.append(f"  lane {lane:<5}{act} {reg} = {v}{mark}{focus}")
        return "\n".join(out)

    def info_breakpoints(self) -> str:
        bps = list(self.s.breakpoints)
        if not bps:
            return "No breakpoints or watchpoints."
        out = ["Num Type       Disp Enb What"]
        out += [bp.describe() for bp in bps]
        return "\n".join(out)

    def info_node(self) -> str:
        s = self.s
        node = s.node
        if node is None:
            return "finished"
        out = [f"node {node.full_name}: {node.kind} {node.target}  ({s.model.path.name}:"
               f"{node.loc.line})"]
        for i, o in enumerate(node.args):
            label = f"in{i}" if node.kind == "micro" else f"arg{i}"
            out.append(f"  {label:<5} {o.display:<16} {o.kind:<7} {o.size} elements")
        for i, o in enumerate(node.outs):
            out.append(f"  out{i:<2} {o.display:<16} {o.kind:<7} {o.size} elements")
        if node.kind == "micro":
            out.append(f"  threads {node.program.threads}, {len(node.program.ops)} instructions")
        t = s.node_times.get(node.index)
        if t is not None:
            out.append(f"  last run: {t * 1e3:.3f} ms")
        return "\n".join(out)


def _fmt_value(v) -> str:
    if isinstance(v, np.ndarray):
        return _fmt_array(v)
    if isinstance(v, (np.floating, float)):
        return f"{float(v):.9g}"
    if isinstance(v, (np.bool_, bool)):
        return str(bool(v)).lower()
    return str(v)


def _fmt_array(a: np.ndarray) -> str:
    a = np.asarray(a)
    with np.printoptions(precision=6, threshold=64, edgeitems=8, linewidth=100,
                         suppress=False):
        body = np.array2string(a, separator=", ")
    return body if a.ndim == 0 else f"{body}  (shape {list(a.shape)})"


def format_stats(name: str, a: np.ndarray) -> str:
    a = np.asarray(a, dtype=np.float64)
    finite = a[np.isfinite(a)]
    nan = int(np.isnan(a).sum())
    inf = int(np.isinf(a).sum())
    if finite.size == 0:
        return f"{name}: shape {list(a.shape)}, no finite values (NaN {nan}, Inf {inf})"
    return (f"{name}: shape {list(a.shape)}  min {finite.min():.6g}  max {finite.max():.6g}  "
            f"mean {finite.mean():.6g}  std {finite.std():.6g}  NaN {nan}  Inf {inf}")
