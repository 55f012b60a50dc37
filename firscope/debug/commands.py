"""gdb-style text commands over the typed :class:`~firscope.debug.debugger.Debugger`: the
pdb of firscope.

The batch debugger feeds this one line at a time; so do the UI's console and
command palette and the DAP REPL, for text a user typed. Each command parses
its arguments into one typed call of the Debugger and formats the answer;
what a front end does for its own keys, clicks and protocol requests calls
the Debugger directly. Each command says whether it resumes execution
(``resumes``), as pdb's ``do_*`` methods do by returning 1, so a UI knows to
run it in a worker. A bad command raises :class:`FirError` with a message;
the caller prints it and goes on.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import FirError
from ..model import Ref
from ..model.tokens import Tokenizer
from . import info, persist
from .debugger import Debugger
from .info import fmt_value, format_stats
from .logpoints import split_dprintf
from .session import Session
from .snapshot import Snapshot

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


class CommandInterpreter(Debugger):
    """The text commands over the typed :class:`~firscope.debug.debugger.Debugger` (as
    pdb's ``Pdb`` over ``bdb.Bdb``): :meth:`run` parses a line into one typed call and
    formats its answer."""

    def __init__(self, session: Session, tokenizer: Tokenizer | None = None):
        super().__init__(session, tokenizer)
        self.quit = False
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
        ] + self._looking_commands()

    def _looking_commands(self) -> list[Command]:
        """The rest of the table: what looks, changes values or kernels, and saves."""
        return [
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
            Command(("kernel",), "kernel edit NAME FILE | replay [NODE] [--all] | toggle "
                    "[NAME] | history | revert [NAME] | write", "edit a kernel here: the "
                    "session runs FILE's block from now on; replay judges it on this node's "
                    "inputs (--all: every node so far) with the cost before/after; toggle A/B "
                    "(the model's own code or the kept edit); history: which version ran each "
                    "node; revert; write it into the model file",
                    self.c_kernel),
            Command(("save",), "save breakpoints FILE",
                    "write breakpoints, watchpoints, catchpoints, log points and displays as "
                    "commands", lambda rest: persist.save_command(self, rest)),
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

    # -- breakpoints ---------------------------------------------------------------------
    def c_break(self, rest):
        return made_text(self.break_at(rest))

    def c_tbreak(self, rest):
        bp = self.break_at(rest, temporary=True)
        return f"Temporary breakpoint {bp.number} at {bp.spec}"

    def c_dprintf(self, rest):
        location, message = split_dprintf(rest)
        bp = self.dprintf(location, message)
        return f'Dprintf {bp.number} at {bp.spec}: "{message}"' + (
            f" if {bp.condition.text}" if bp.condition else "")

    def c_watch(self, rest):
        bp = self.watch(rest)
        return f"Watchpoint {bp.number}: {bp.spec}" + (
            f" if {bp.condition.text}" if bp.condition else "")

    def c_condition(self, rest):
        parts = rest.split(None, 1)
        if not parts:
            raise FirError("usage: condition N [COND]")
        n = _numbers(parts[:1])[0]
        self.condition(n, parts[1] if len(parts) > 1 else None)
        return (f"Breakpoint {n} now unconditional." if len(parts) == 1
                else f"Breakpoint {n} stops only if {parts[1]}")

    def c_ignore(self, rest):
        parts = rest.split()
        if len(parts) != 2:
            raise FirError("usage: ignore N COUNT")
        n, count = _numbers(parts)
        self.ignore(n, count)
        return f"Will ignore next {count} crossings of breakpoint {n}."

    def c_delete(self, rest):
        words = rest.split()
        if words and words[0] in ("checkpoint", "checkpoints"):
            nums = self.delete_checkpoints(_numbers(words[1:], "checkpoint number")
                                           if words[1:] else None)
            return "Deleted no checkpoints." if not nums else \
                f"Deleted checkpoint {', '.join(map(str, nums))}."
        nums = _numbers(words) if rest else None
        self.delete(nums)
        return deleted_text(nums)

    def c_disable(self, rest):
        self.disable(_numbers(rest.split()))
        return ""

    def c_enable(self, rest):
        self.enable(_numbers(rest.split()))
        return ""

    # -- movements -----------------------------------------------------------------------
    def c_continue(self, rest):
        return self.cont().description

    def c_stepi(self, rest):
        return self.step(_count(rest.split()) if rest else None).description

    def c_next(self, rest):
        return self.next(_count(rest.split())).description

    def c_finish(self, rest):
        return self.finish().description

    def c_until(self, rest):
        if not rest:
            raise FirError("usage: until LOCATION")
        return self.until(rest).description

    def c_token(self, rest):
        return self.next_token().description

    def c_goto(self, rest):
        return self.goto(*parse_goto(rest)).description

    def c_rstepi(self, rest):
        return self.reverse_step(_count(rest.split())).description

    def c_rnext(self, rest):
        return self.reverse_next(_count(rest.split())).description

    def c_rcontinue(self, rest):
        return self.reverse_continue().description

    # -- looking ---------------------------------------------------------------------------
    def c_lane(self, rest):
        if not rest:
            return f"focused lane: {self.lane}"
        lane = parse_lane(rest)
        self.set_lane(lane)
        return f"[Switching to lane {lane}]"

    def c_print(self, rest):
        if not rest:
            raise FirError("usage: print EXPR")
        if rest.startswith("stats "):
            return self.c_stats(rest[6:])
        return f"$ = {fmt_value(self.evaluate(rest))}"

    def c_stats(self, rest):
        if not rest:
            raise FirError("usage: stats BUFFER")
        return format_stats(rest, np.asarray(self.evaluate(rest)))

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
        return patch_text(patch)

    def c_unset(self, rest):
        nums = _numbers(rest.split(), "patch number")
        if len(nums) != 1:
            raise FirError("usage: unset N")
        p = self.unset(nums[0])
        return (f"Patch {p.number} forgotten: later replays no longer apply it (the values it "
                "set stay until something writes them)")

    def c_display(self, rest):
        if not rest:
            return info.info_display(self)
        return display_text(self.display(rest))

    def c_undisplay(self, rest):
        self.undisplay(_numbers(rest.split(), "display number") if rest else None)
        return ""

    def c_history(self, rest):
        text = rest.strip()
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])@([0-9]{1,12})", text)
        if m:  # x[5]@2 is x@2[5]
            text = f"{Ref(m.group(1), int(m.group(3)))}{m.group(2)}"
        if not text:
            raise FirError("usage: history BUF[i]")
        h = self.history(text)
        return Reply(history_text(h), list(h.writes))

    def c_lens(self, rest):
        parts = rest.split()
        every = "--all" in parts
        nums = [p for p in parts if p != "--all"]
        rows = self.lens(_count(nums, 5), every_layer=every)
        out = []
        for row in rows:
            cells = "  ".join(f"{self.tok.piece(t)!r} {p:.3f}" for t, p in row.top)
            out.append(f"{row.label:<24} {cells}")
        return "\n".join(out)

    def c_kernel(self, rest):
        words = rest.split()
        usage = FirError("usage: kernel edit NAME FILE | kernel replay [NODE] [--all] | "
                         "kernel toggle [NAME] | kernel history | kernel revert [NAME] | "
                         "kernel write")
        if not words:
            raise usage
        action, args = words[0], words[1:]
        if action == "edit" and len(args) == 2:
            return self.kernel_edit(args[0], args[1])
        if action == "replay" and len(args) <= 2:
            every = "--all" in args
            nodes = [a for a in args if a != "--all"]
            if len(nodes) <= 1:
                return self.kernel_replay(nodes[0] if nodes else None, every=every)
        if action == "revert" and len(args) <= 1:
            return self.kernel_revert(args[0] if args else None)
        if action == "write" and not args:
            return self.kernel_write()
        if action == "toggle" and len(args) <= 1:
            return self.kernel_toggle(args[0] if args else None)
        if action == "history" and not args:
            return self.kernel_history()
        raise usage

    def c_checkpoint(self, rest):
        ck, dropped = self.checkpoint()
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
        return self.restart(nums[0]).description


def parse_lane(text: str) -> int:
    """``lane N``'s N: ASCII digits only (``int`` takes '²' and '٣' too)."""
    text = text.strip()
    if not _NUMBER.match(text):
        raise FirError(f"expected a lane number, found {text!r}")
    return int(text)


def parse_goto(text: str) -> tuple[str, int | None]:
    """``NODE[@L] [token N]`` -> (node, token or None)."""
    m = re.fullmatch(r"(\S+)(?:\s+token\s+([0-9]{1,12}))?", text.strip())
    if not m:
        raise FirError("usage: goto NODE[@L] [token N]")
    return m.group(1), int(m.group(2)) if m.group(2) else None


# -- answers in words, shared by the text commands and the front ends' own keys ----------------
def made_text(bp) -> str:
    """``Breakpoint 1 at attention@1 if R3 > 0``: what making a breakpoint says."""
    return f"{bp.what.capitalize()} {bp.number} at {bp.spec}" + (
        f" if {bp.condition.text}" if bp.condition else "")


def deleted_text(numbers: list[int] | None) -> str:
    return "Deleted all breakpoints." if numbers is None else \
        f"Deleted {', '.join(map(str, dict.fromkeys(numbers)))}."


def patch_text(patch) -> str:
    return f"Patch {patch.number}: {patch.text}  (at {patch.made_at})"


def display_text(value) -> str:
    return f"{value.number}: {value.expr} = {value.text}"


def history_text(h) -> str:
    n = len(h.writes)
    head = f"{h.element}: {n} write{'s' if n != 1 else ''} in the recorded history (oldest first)"
    if h.truncated:
        head += "; older history was dropped to stay within the memory budget"
    return "\n".join([head] + [f"  #{i:<3} {wr.describe()}" for i, wr in enumerate(h.writes)])
