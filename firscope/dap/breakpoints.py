"""The editor's breakpoints -> the engine's breakpoint table.

DAP sends the whole list of one kind every time (all line breakpoints of one
file, all function breakpoints, all data breakpoints, the exception filters);
the engine keeps numbered breakpoints. This keeps which engine numbers came
from which list, replaces them when a list comes again, and turns DAP's
condition and hit condition into the engine's ``if COND`` and gdb's ignore
count. DAP breakpoint ids are the engine's numbers.

Hit conditions: ``N`` or ``>=N`` stops from the N-th hit on, ``>N`` after the
N-th, ``==N`` on the N-th hit only (then the breakpoint is spent).

A line breakpoint with a ``logMessage`` is a log point (the engine's dprintf).
When the engine changes a breakpoint the client knows (spent, deleted, disabled
or enabled, made from the Debug Console with ``break``), :meth:`changes` gives
the ``breakpoint`` events that tell it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ..debug.breakpoints import (LineBreakpoint, NodeBreakpoint, parse_register_watch,
                                 parse_watch)
from ..debug.debugger import Debugger
from ..debug.session import Session
from ..errors import FirError
from .capabilities import EXCEPTION_FILTERS
from .conventions import Conventions

_HIT = re.compile(r"\s*(>=|>|==|=)?\s*([0-9]{1,12})\s*$")


def hit_rule(text: str | None) -> tuple[int, bool]:
    """A DAP hit condition -> (ignore count, temporary)."""
    if text is None or not str(text).strip():
        return 0, False
    m = _HIT.match(str(text))
    if not m:
        raise FirError(f"hit condition {text!r}: use N, >=N, >N or ==N")
    op, n = m.group(1) or ">=", int(m.group(2))
    if op == ">":
        return n, False
    if n < 1:
        raise FirError(f"hit condition {text!r}: hits are counted from 1")
    return n - 1, op in ("==", "=")


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b))


@dataclass
class BreakpointMap:
    debugger: Debugger  # every change goes through its typed calls
    source: dict
    by_file: dict[str, list[int]] = field(default_factory=dict)
    functions: list[int] = field(default_factory=list)
    data: list[int] = field(default_factory=list)
    nan: int | None = None
    stop_on_fault: bool = True
    origin: dict[int, str] = field(default_factory=dict)  # number -> "source"|"function"|"data"
    conv: Conventions = field(default_factory=Conventions)
    model_file: str = ""  # the native path (``source`` has the client's spelling)
    reported: dict[int, dict] = field(default_factory=dict)  # what the client was last told

    @property
    def session(self) -> Session:
        return self.debugger.session

    def _drop(self, numbers: list[int]) -> None:
        present = [n for n in numbers if n in self.session.breakpoints]
        if present:
            self.debugger.delete(present)
        for n in numbers:
            self.origin.pop(n, None)
            self.reported.pop(n, None)

    def _add(self, text: str, condition, hit_condition, origin: str, *, watch=False,
             log=None):
        cond = condition.strip() if isinstance(condition, str) and condition.strip() else None
        if condition is not None and not isinstance(condition, str):
            raise FirError(f"condition must be text, found {condition!r}")
        ignore, temporary = hit_rule(hit_condition)
        d = self.debugger
        if log is not None and not isinstance(log, str):
            raise FirError(f"logMessage must be text, found {log!r}")
        if watch:
            bp = d.watch(text, condition=cond, temporary=temporary)
        elif log:
            bp = d.dprintf(text, log, condition=cond, temporary=temporary)
        else:
            bp = d.break_at(text, condition=cond, temporary=temporary)
        if ignore:
            d.ignore(bp.number, ignore)
        self.origin[bp.number] = origin
        return bp

    # -- setBreakpoints -------------------------------------------------------------------
    def set_source(self, path: str, wanted: list[dict]) -> list[dict]:
        path = self.conv.path_in(path)
        for key in [k for k in self.by_file if same_file(k, path)]:
            self._drop(self.by_file.pop(key))
        if not same_file(path, self.model_file):
            msg = (f"firscope is debugging {os.path.basename(self.model_file)}; this file is "
                   "not it")
            return [{"verified": False, "line": b.get("line"), "message": msg} for b in wanted]
        numbers, out = [], []
        for b in wanted:
            line = self.conv.line_in(b.get("line"))
            if isinstance(line, bool) or not isinstance(line, int) or line < 1:
                out.append({"verified": False, "message": f"bad line {b.get('line')!r}"})
                continue
            try:
                bp = self._add(str(line), b.get("condition"), b.get("hitCondition"), "source",
                               log=b.get("logMessage"))
            except FirError as e:
                out.append({"verified": False, "line": b.get("line"), "message": e.message,
                            "source": self.source})
                continue
            numbers.append(bp.number)
            out.append(self._answer(bp, line))
        self.by_file[path] = numbers
        return out

    def _answer(self, bp, line: int | None = None) -> dict:
        """What the client is told about a breakpoint of the model file (and remembered, so
        a later change is sent as an event)."""
        actual = getattr(bp, "line", None) or line  # a kernel line snaps to an instruction
        answer = {"id": bp.number, "verified": bp.enabled, "line": self.conv.line_out(actual),
                  "source": self.source,
                  "message": bp.spec if bp.enabled else f"{bp.spec} (disabled)"}
        self.reported[bp.number] = answer
        return answer

    def _plain(self, bp) -> dict:
        """The same for a function or data breakpoint (no line in the model file)."""
        answer = {"id": bp.number, "verified": bp.enabled,
                  "message": bp.spec if bp.enabled else f"{bp.spec} (disabled)"}
        self.reported[bp.number] = answer
        return answer

    # -- what changed in the engine since the client was told ----------------------------
    def changes(self) -> list[dict]:
        """``breakpoint`` event bodies for what the engine changed behind the client."""
        table = self.session.breakpoints
        events = []
        for n, told in list(self.reported.items()):
            if n not in table:
                del self.reported[n]
                if n in table.spent:  # a hit condition ==N was met: keep it on screen, grey
                    gone = {**told, "verified": False,
                            "message": f"{told['message']}: spent (its hit condition was met)"}
                    events.append({"reason": "changed", "breakpoint": gone})
                else:
                    events.append({"reason": "removed", "breakpoint": {"id": n,
                                                                       "verified": False}})
                continue
            line = told.get("line")
            bp = table.get(n)
            now = self._answer(bp, None if line is None else self.conv.line_in(line)) \
                if "source" in told else self._plain(bp)
            if now != told:
                events.append({"reason": "changed", "breakpoint": now})
        events += self._new_from_console(table)
        return events

    def _new_from_console(self, table) -> list[dict]:
        """Breakpoints made with ``break`` in the Debug Console: shown in the gutter, and
        replaced by the next setBreakpoints of the model file like the gutter's own."""
        events = []
        for bp in table:
            if bp.number in self.origin or bp.number in self.reported:
                continue
            line = self._line_of(bp)
            if line is None:
                continue
            self.origin[bp.number] = "source"
            self.by_file.setdefault(self.model_file, []).append(bp.number)
            events.append({"reason": "new", "breakpoint": self._answer(bp, line)})
        return events

    def _line_of(self, bp) -> int | None:
        if isinstance(bp, LineBreakpoint):
            return bp.line
        if isinstance(bp, NodeBreakpoint):
            return next((n.loc.line for n in self.session.nodes if bp.matches(n)), None)
        return None

    # -- setFunctionBreakpoints ------------------------------------------------------------
    def set_functions(self, wanted: list[dict]) -> list[dict]:
        def add(b):
            name = b.get("name")
            if not isinstance(name, str) or not name.strip():
                raise FirError(f"bad name {name!r}")
            return self._add(name.strip(), b.get("condition"), b.get("hitCondition"),
                             "function")
        self.functions, answers = self._replace(self.functions, wanted, add)
        return answers

    def _replace(self, old: list[int], wanted: list[dict], add) -> tuple[list[int], list[dict]]:
        """Drop the breakpoints ``old`` and add ``wanted`` with ``add``: the numbers added,
        and DAP's answer for each (verified, or the reason it is not)."""
        self._drop(old)
        numbers, answers = [], []
        for b in wanted:
            try:
                bp = add(b)
            except FirError as e:
                answers.append({"verified": False, "message": e.message})
                continue
            numbers.append(bp.number)
            answers.append(self._plain(bp))
        return numbers, answers

    # -- setExceptionBreakpoints -------------------------------------------------------------
    def set_exceptions(self, filters: list) -> list[dict]:
        known = {f["filter"] for f in EXCEPTION_FILTERS}
        bad = [f for f in filters if f not in known]
        if bad:
            raise FirError(f"unknown exception filter {bad[0]!r} (filters: nan, fault)")
        if "nan" in filters and self.nan is None:
            self.nan = self._add("nan", None, None, "exception").number
        elif "nan" not in filters and self.nan is not None:
            self._drop([self.nan])
            self.nan = None
        self.stop_on_fault = "fault" in filters
        return [{"verified": True} for _ in filters]

    # -- data breakpoints --------------------------------------------------------------------
    def data_info(self, spec: str) -> dict:
        w = parse_register_watch(spec) or parse_watch(self.session.model, spec)
        return {"dataId": w.spec, "description": f"{w.spec} changes",
                "accessTypes": ["write"], "canPersist": False}

    def set_data(self, wanted: list[dict]) -> list[dict]:
        def add(b):
            data_id = b.get("dataId")
            if not isinstance(data_id, str) or not data_id.strip():
                raise FirError(f"bad dataId {data_id!r}")
            if b.get("accessType", "write") != "write":
                raise FirError("firscope watches writes only (expressions are read-only, so "
                               "nothing else can be seen)")
            return self._add(data_id, b.get("condition"), b.get("hitCondition"), "data",
                             watch=True)
        self.data, answers = self._replace(self.data, wanted, add)
        return answers
