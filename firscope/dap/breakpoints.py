"""The editor's breakpoints -> the engine's breakpoint table.

DAP sends the whole list of one kind every time (all line breakpoints of one
file, all function breakpoints, all data breakpoints, the exception filters);
the engine keeps numbered breakpoints. This keeps which engine numbers came
from which list, replaces them when a list comes again, and turns DAP's
condition and hit condition into the engine's ``if COND`` and gdb's ignore
count. DAP breakpoint ids are the engine's numbers.

Hit conditions: ``N`` or ``>=N`` stops from the N-th hit on, ``>N`` after the
N-th, ``==N`` on the N-th hit only (then the breakpoint is spent).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ..debug.breakpoints import parse_watch
from ..debug.session import Session
from ..errors import FirError

_HIT = re.compile(r"\s*(>=|>|==|=)?\s*([0-9]{1,12})\s*$")
EXCEPTION_FILTERS = [
    {"filter": "nan", "label": "NaN or Inf written", "default": False,
     "description": "Stop after the first node or instruction that writes NaN or Inf"},
    {"filter": "fault", "label": "Kernel faults", "default": True,
     "description": "Stop on a kernel fault (out of bounds, bad rtou, runaway loop); "
                    "when off, a fault ends the session"},
]


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
    session: Session
    source: dict
    by_file: dict[str, list[int]] = field(default_factory=dict)
    functions: list[int] = field(default_factory=list)
    data: list[int] = field(default_factory=list)
    nan: int | None = None
    stop_on_fault: bool = True
    origin: dict[int, str] = field(default_factory=dict)  # number -> "source"|"function"|"data"

    def _drop(self, numbers: list[int]) -> None:
        present = [n for n in numbers if n in self.session.breakpoints]
        if present:
            self.session.delete_breakpoints(present)
        for n in numbers:
            self.origin.pop(n, None)

    def _add(self, text: str, condition, hit_condition, origin: str, *, watch=False):
        cond = condition.strip() if isinstance(condition, str) and condition.strip() else None
        if condition is not None and not isinstance(condition, str):
            raise FirError(f"condition must be text, found {condition!r}")
        ignore, temporary = hit_rule(hit_condition)
        full = text + (f" if {cond}" if cond else "")
        s = self.session
        bp = s.add_watch(full) if watch else s.add_breakpoint(full, temporary=temporary)
        if watch and temporary:
            s.breakpoints.update(bp.number, temporary=True)
        if ignore:
            s.set_ignore(bp.number, ignore)
        self.origin[bp.number] = origin
        return bp

    # -- setBreakpoints -------------------------------------------------------------------
    def set_source(self, path: str, wanted: list[dict]) -> list[dict]:
        self._drop(self.by_file.pop(path, []))
        model_file = self.source["path"]
        if not same_file(path, model_file):
            msg = f"firscope is debugging {os.path.basename(model_file)}; this file is not it"
            return [{"verified": False, "line": b.get("line"), "message": msg} for b in wanted]
        numbers, out = [], []
        for b in wanted:
            line = b.get("line")
            if isinstance(line, bool) or not isinstance(line, int) or line < 1:
                out.append({"verified": False, "message": f"bad line {line!r}"})
                continue
            try:
                bp = self._add(str(line), b.get("condition"), b.get("hitCondition"), "source")
            except FirError as e:
                out.append({"verified": False, "line": line, "message": e.message,
                            "source": self.source})
                continue
            numbers.append(bp.number)
            actual = getattr(bp, "line", None) or line  # a kernel line snaps to an instruction
            out.append({"id": bp.number, "verified": True, "line": actual,
                        "source": self.source, "message": bp.spec})
        self.by_file[path] = numbers
        return out

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
            answers.append({"id": bp.number, "verified": True, "message": bp.spec})
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
        w = parse_watch(self.session.model, spec)
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
