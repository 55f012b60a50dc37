"""What the sanitizer reports: one frozen :class:`Finding` per distinct problem.

A finding names the tool that found it (race, init, mem), the kernel and node
instance, the decode step, the element (buffer and index) and the ``.fir``
lines involved, each with its source text and a caret under the address
operand. Findings are deduplicated by :attr:`Finding.key`: a race by
(kernel, line pair), an uninitialized read or an out-of-bounds access by
(kernel, line); repeats only raise :attr:`Finding.count` (accesses) and
:attr:`Finding.nodes` (dispatches).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..errors import FirError
from ..text import printable


class Tool(StrEnum):
    RACE = "race"  # racecheck: two lanes touch one element, at least one writes
    INIT = "init"  # initcheck: a read of an element nothing has written since the load
    MEM = "mem"  # memcheck: an access outside the region its address names

    @property
    def title(self) -> str:
        return {"race": "Race hazard", "init": "Uninitialized read",
                "mem": "Out-of-bounds access"}[self.value]


ALL_TOOLS = frozenset(Tool)


def parse_tools(text: str) -> frozenset[Tool]:
    """``race,init,mem`` (any subset, any order) -> the tools; an unknown name is an error."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise FirError("--tools: name at least one of race, init, mem")
    bad = [n for n in names if n not in {t.value for t in Tool}]
    if bad:
        raise FirError(f"--tools: unknown tool '{printable(bad[0])}' (race, init, mem)")
    return frozenset(Tool(n) for n in names)


class Hazard(StrEnum):
    """How two lanes met on one element, in the order this (sequential) VM ran them."""

    RAW = "read after write"
    WAR = "write after read"
    WAW = "write-write"


@dataclass(frozen=True)
class Site:
    """One access of a finding: the .fir line that made it, and which lane."""

    path: str
    line: int
    col: int  # of the address operand (or of the node line's first token)
    source: str  # the .fir line as written
    lane: int | None  # None: an ext node (no lanes)
    access: str  # "read" or "write"

    def location(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"

    def caret_lines(self) -> list[str]:
        line = printable(self.source.rstrip("\n")).expandtabs(1)
        before = printable(self.source[: max(self.col - 1, 0)]).expandtabs(1)
        return [line, " " * len(before) + "^"]


@dataclass(frozen=True)
class Finding:
    tool: Tool
    kind: str  # a Hazard's text, "uninitialized read", "out-of-bounds load" / "... store"
    kernel: str | None  # None: an ext node
    node: str  # the first node instance where it happened ("attention@0")
    node_index: int
    step: int  # decode step of that first occurrence
    sites: tuple[Site, ...]  # race: (the earlier access, the one that met it); else one
    region: str  # the buffer instance ("scores", "key_cache@1")
    index: int  # element index in it (may be outside it: memcheck)
    extent: int  # the region's declared element count
    count: int = 1  # accesses (lanes x executions) behind this one report
    nodes: int = 1  # node instances (dispatches) it happened in
    confirmed: str = ""  # race: what running the lanes in other orders showed
    node_indices: tuple[int, ...] = ()  # every node instance it happened in (plan order)

    @property
    def key(self) -> tuple:
        """What makes two findings the same report."""
        where = self.kernel if self.kernel is not None else f"node {self.node}"
        if self.tool is Tool.RACE:
            return (self.tool.value, where, tuple(sorted({s.line for s in self.sites})))
        return (self.tool.value, where, self.sites[-1].line)

    @property
    def lines(self) -> tuple[int, ...]:
        return tuple(sorted({s.line for s in self.sites}))

    @property
    def lanes(self) -> tuple[int, ...]:
        return tuple(s.lane for s in self.sites if s.lane is not None)

    @property
    def element(self) -> str:
        return f"{self.region}[{self.index}]"

    def headline(self) -> str:
        what = f"kernel '{self.kernel}'" if self.kernel is not None else "ext node"
        kind = f" ({self.kind})" if self.tool is Tool.RACE else ""
        return f"{self.tool.title}{kind} in {what} at node {self.node}, step {self.step}"

    def summary(self) -> str:
        """One sentence: who did what to which element."""
        s = self.sites
        if self.tool is Tool.RACE:
            first, second = s[0], s[1]
            return (f"lane {second.lane} {_verb(second)} {self.element} at line {second.line} "
                    f"after lane {first.lane} {_verb(first, past=True)} it at line {first.line}")
        if self.tool is Tool.INIT:
            who = f"lane {s[0].lane}" if s[0].lane is not None else f"node {self.node}"
            return (f"{who} reads {self.element} at line {s[0].line}, which nothing has "
                    "written since the model was loaded")
        return (f"lane {s[0].lane} {'stores to' if s[0].access == 'write' else 'loads from'} "
                f"{self.region}[{self.index}] at line {s[0].line}, outside "
                f"{self.region}[0:{self.extent}]; the access was skipped"
                + (" (read as 0)" if s[0].access == "read" else ""))

    def text_lines(self) -> list[str]:
        """The report block, without the ``=========`` prefix."""
        out = [self.headline(), f"    {printable(self.summary())}"]
        for site in self.sites:
            out.append(f"    {printable(site.location())}: {site.access}"
                       + (f" by lane {site.lane}" if site.lane is not None else ""))
            out += [f"        {text}" for text in site.caret_lines()]
        if self.confirmed:
            out.append(f"    {self.confirmed}")
        if self.count > 1 or self.nodes > 1:
            out.append(f"    ({self.count} access{'es' if self.count != 1 else ''} in "
                       f"{self.nodes} dispatch{'es' if self.nodes != 1 else ''})")
        return out

    def to_json(self) -> dict:
        return {"tool": self.tool.value, "kind": self.kind, "kernel": self.kernel,
                "node": self.node, "node_index": self.node_index, "step": self.step,
                "region": self.region, "index": self.index, "extent": self.extent,
                "lines": list(self.lines), "lanes": list(self.lanes),
                "sites": [{"path": x.path, "line": x.line, "col": x.col, "source": x.source,
                           "lane": x.lane, "access": x.access} for x in self.sites],
                "count": self.count, "nodes": self.nodes, "confirmed": self.confirmed,
                "node_indices": list(self.node_indices)}


def _verb(site: Site, past: bool = False) -> str:
    if site.access == "write":
        return "wrote" if past else "writes"
    return "read" if past else "reads"
