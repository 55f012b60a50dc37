"""Breakpoint and watchpoint records, and parsing what the user types for them.

Locations:
  ``attention``            the node in every layer
  ``attention@3``          one node instance
  ``g2.attn_decode:156``   a kernel source line (the line number in the .fir file)
  ``156`` / ``gpt2.fir:156``  the kernel instruction on that line of the model file
  ``token 5``              the start of decode step 5
  ``nan``                  the first node or instruction that writes NaN or Inf
  ``race``                 an access that meets another lane's on one element (one writes)
  ``uninit``               a read of memory nothing has written since the model was loaded
A location may be followed by ``if CONDITION``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Callable, ClassVar

import numpy as np

from ..errors import FirError
from ..model.ref import Ref, layer_suffix
from ..runtime import Model
from .expr import DebugExpr, truth
from ..runtime import NodeKind

# Numbers are ASCII digits, at most 12 of them: Python refuses to convert a 5000-digit
# string to an int (and no model has that many layers or elements anyway).
_NODE = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)(?:@([0-9]{1,12}))?$")
_WATCH = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:@([0-9]{1,12}))?"
                    r"(?:\[\s*(-?[0-9]{1,12})?\s*(?::\s*(-?[0-9]{1,12})?\s*)?\])?$")


@dataclass(frozen=True, kw_only=True)
class Breakpoint:
    """What every kind shares: number, enabled, disposition, condition, counts.

    Records are frozen; the :class:`BreakpointTable` replaces one to change it.
    Number 0 is a one-off location (``until``), never stored in the table.
    """

    number: int = 0
    spec: str  # the location as shown to the user
    enabled: bool = True
    temporary: bool = False
    condition: DebugExpr | None = None
    ignore_count: int = 0
    hit_count: int = 0
    log: str | None = None  # a log point (dprintf): print this message instead of stopping

    what: ClassVar[str] = "breakpoint"

    def location(self) -> str | None:
        """The location as ``break`` reads it back; None for a kind that cannot be re-made
        from text alone (``break diverge`` needs its dump attached)."""
        return None

    def command(self) -> str | None:
        """The command that makes this breakpoint again (its condition included): what
        ``save breakpoints`` writes and the F2 reload re-issues; None as for :meth:`location`."""
        location = self.location()
        if location is None:
            return None
        cond = f" if {self.condition.text}" if self.condition is not None else ""
        if self.log is not None:
            return f"dprintf {location}{cond} {_quoted(self.log)}"
        return f"{'tbreak' if self.temporary else 'break'} {location}{cond}"

    def carried(self, model) -> "CarriedBreak | None":
        """This breakpoint as the F2 reload keeps it, to re-make in the edited model."""
        command = self.command()
        if command is None:
            return None
        return CarriedBreak(command, self.enabled, self.ignore_count)

    def describe(self) -> str:
        what = "dprintf" if self.log is not None else self.what
        parts = [f"{self.number:<4}{what:<11}{'keep' if not self.temporary else 'del':<5}"
                 f"{'y' if self.enabled else 'n':<4}{self.spec}"]
        if self.log is not None:
            parts.append(f"\n\tprint \"{self.log}\"")
        if self.condition is not None:
            parts.append(f"\n\tstop only if {self.condition.text}")
        if self.ignore_count:
            parts.append(f"\n\tignore next {self.ignore_count} hits")
        if self.hit_count:
            parts.append(f"\n\tbreakpoint already hit {self.hit_count} time"
                         f"{'s' if self.hit_count != 1 else ''}")
        return "".join(parts)


@dataclass(frozen=True, kw_only=True)
class NodeBreakpoint(Breakpoint):
    """Before a node: in every layer (``attention``) or one instance (``attention@3``)."""

    node: str
    layer: int | None = None

    def matches(self, node) -> bool:
        return node.name == self.node and (self.layer is None or node.layer == self.layer)

    def location(self) -> str:
        return self.spec


@dataclass(frozen=True, kw_only=True)
class LineBreakpoint(Breakpoint):
    """Before a kernel instruction, in every dispatch of that kernel."""

    kernel: str
    line: int

    def location(self) -> str:
        return self.spec

    def carried(self, model) -> "CarriedBreak":
        """Kept as its kernel and instruction text, so an edit that moves lines still finds
        it (:meth:`CarriedBreak.command_in`)."""
        span = kernel_span(model, self.kernel)
        start = span[0] if span else self.line
        return CarriedBreak(self.command(), self.enabled, self.ignore_count, self.kernel,
                            self.line - start, model.fir.lines[self.line - 1].strip())


@dataclass(frozen=True, kw_only=True)
class TokenBreakpoint(Breakpoint):
    """At the start of decode step ``token`` (before its first node)."""

    token: int

    def location(self) -> str:
        return self.spec


@dataclass(frozen=True, kw_only=True)
class NanCatchpoint(Breakpoint):
    """After the first node or instruction that writes NaN or Inf."""

    what: ClassVar[str] = "catchpoint"

    def location(self) -> str:
        return "nan"


@dataclass(frozen=True, kw_only=True)
class Watchpoint(Breakpoint):
    """After a write that changes an arena range (absolute ``start:stop``)."""

    region: str  # the region's display name ("x", "key_cache@2")
    start: int
    stop: int
    offset: int  # where ``start`` is inside the region

    what: ClassVar[str] = "watchpoint"

    def command(self) -> str:
        return _watch_command(self)


@dataclass(frozen=True, kw_only=True)
class RegisterWatch(Breakpoint):
    """After an instruction that changes a register (``watch R3``: in any active lane;
    ``watch lane 2 U4``: in lane 2). Registers live inside a dispatch, so every kernel
    is interpreted while one is set (gdb's software watchpoints are slow the same way)."""

    file: str  # "R" or "U"
    reg: int
    lane: int | None = None

    what: ClassVar[str] = "watchpoint"

    def command(self) -> str:
        return _watch_command(self)


def _watch_command(bp: Breakpoint) -> str:
    return f"watch {bp.spec}" + (f" if {bp.condition.text}" if bp.condition is not None else "")


_REGISTER_WATCH = re.compile(r"(?:lane\s+([0-9]{1,12})\s+)?([RU][0-9]{1,12})$")


def parse_register_watch(text: str) -> RegisterWatch | None:
    """``R3`` / ``lane 2 U4`` -> a register watchpoint; None if the text names no register."""
    from .resolver import parse_register
    m = _REGISTER_WATCH.match(text.strip())
    if not m:
        return None
    file, reg = parse_register(m.group(2))
    lane = int(m.group(1)) if m.group(1) is not None else None
    spec = f"{file}{reg}" if lane is None else f"lane {lane} {file}{reg}"
    return RegisterWatch(spec=spec, file=file, reg=reg, lane=lane)


@dataclass(frozen=True, kw_only=True)
class NodeCheck(Breakpoint):
    """A kind that decides after a node completes, however it ran (``break diverge``).

    Subclasses implement :meth:`fired`: a message when the node just completed
    should stop the run, else None. The hit rule (condition, ignore count,
    disposition) applies as for every breakpoint.
    """

    what: ClassVar[str] = "catchpoint"

    def fired(self, session, node) -> str | None:
        return None

    def focus_lane(self, session, node) -> int | None:
        """The lane a front end should focus when this check stops (after :meth:`fired`)."""
        return None


@dataclass(frozen=True, kw_only=True)
class InstructionCheck(Breakpoint):
    """A kind that looks at a dispatch instruction by instruction (``break race``).

    :meth:`wants` says whether a node must be interpreted for it; :meth:`observer`
    gives a :class:`~firscope.vm.interp.Observer` for that dispatch whose
    ``before``/``after`` return True to stop there, with ``message`` saying why
    and ``lane`` (optional) the lane to focus. With ``wants_store`` set, its ``store``
    sees every store before it lands.
    """

    what: ClassVar[str] = "catchpoint"

    def wants(self, session, node) -> bool:
        return False

    def observer(self, session, node):
        return None


@dataclass(frozen=True, kw_only=True)
class SanitizerCatchpoint(InstructionCheck):
    """``break race`` / ``break uninit``: before the instruction the sanitizer objects to,
    focused on the second lane involved. The tracker (debug/sanitizing) keeps what the
    checks know between stops, and the findings so far."""

    kind: str  # "race" or "uninit", as typed after break
    tracker: object = field(compare=False, repr=False)

    def wants(self, session, node) -> bool:
        return self.tracker.wants(session, node)

    def observer(self, session, node):
        return self.tracker.observer(session, node)

    def findings(self) -> list:
        return self.tracker.findings()

    def location(self) -> str:
        return self.kind


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass(frozen=True)
class CarriedBreak:
    """A breakpoint as the F2 reload carries it into the edited model: the command that
    made it, and for a kernel-line breakpoint its kernel, offset and instruction text."""

    command: str  # "break attention@1 if R3 > 0" (for a line breakpoint: re-resolved first)
    enabled: bool
    ignore: int
    kernel: str | None = None
    offset: int = 0
    text: str = ""

    def command_in(self, model) -> str:
        """The command for ``model``: as made, or for a line breakpoint the same instruction
        text in the same kernel nearest the old offset (lines may have moved)."""
        if self.kernel is None:
            return self.command
        span = kernel_span(model, self.kernel)
        if span is None:
            raise FirError(f"kernel {self.kernel} is no longer dispatched by any node")
        start, end = span
        lines = model.fir.lines
        same = [ln for ln in range(start, end + 1) if lines[ln - 1].strip() == self.text]
        if not same:
            raise FirError(f"{self.kernel} no longer has the instruction '{self.text}'")
        line = min(same, key=lambda ln: abs(ln - start - self.offset))
        verb, _, rest = self.command.partition(" ")
        tail = rest.partition(" ")[2]  # the condition, and a log point's message
        return f"{verb} {self.kernel}:{line}" + (f" {tail}" if tail else "")


def kernel_span(model, kernel: str) -> tuple[int, int] | None:
    """The .fir lines of ``kernel``'s body, from any node that dispatches it."""
    for node in model.nodes:
        if node.kind == NodeKind.MICRO and node.target == kernel:
            syn = node.program.kernel.syntax
            return syn.loc.line, syn.end.line
    return None


@dataclass(frozen=True)
class Hit:
    """What a breakpoint's hit rule decided: stop or not, and why a condition failed."""

    stop: bool
    error: str | None = None
    log: str | None = None  # a log point was hit: print this message (and do not stop)


class BreakpointTable:
    """The breakpoints of a session, by number, and each kind's hit rule."""

    def __init__(self):
        self._bps: dict[int, Breakpoint] = {}
        self._next = 1
        self.watch_values: dict[int, np.ndarray] = {}  # watchpoint -> values last seen
        self.spent: set[int] = set()  # temporary breakpoints deleted by their hit

    # -- the table ----------------------------------------------------------------
    def __iter__(self):
        return iter(list(self._bps.values()))

    def __len__(self) -> int:
        return len(self._bps)

    def __contains__(self, number: int) -> bool:
        return number in self._bps

    def get(self, number: int) -> Breakpoint:
        if number not in self._bps:
            raise FirError(f"no breakpoint number {number}")
        return self._bps[number]

    def add(self, bp: Breakpoint, arena: np.ndarray | None = None) -> Breakpoint:
        bp = replace(bp, number=self._next)
        self._next += 1
        self._bps[bp.number] = bp
        if isinstance(bp, Watchpoint) and arena is not None:
            self.watch_values[bp.number] = arena[bp.start: bp.stop].copy()
        return bp

    def update(self, number: int, **changes) -> Breakpoint:
        bp = replace(self.get(number), **changes)
        self._bps[number] = bp
        return bp

    def delete(self, numbers: list[int] | None = None) -> None:
        if numbers is None:
            self._bps.clear()
            self.watch_values.clear()
            return
        for n in numbers:
            self.get(n)  # all must exist before any goes
        for n in dict.fromkeys(numbers):  # `delete 1 1` deletes 1 once
            del self._bps[n]
            self.watch_values.pop(n, None)

    def toggle(self, template: Breakpoint, arena=None) -> tuple[str, Breakpoint]:
        """Delete the breakpoint at exactly this location, or add one ("added"/"deleted")."""
        for bp in self:
            if type(bp) is type(template) and bp.spec == template.spec:
                self.delete([bp.number])
                return "deleted", bp
        return "added", self.add(template, arena)

    # -- queries for the stepping core -----------------------------------------------
    def enabled(self, kind: type[Breakpoint] = Breakpoint) -> list:
        return [bp for bp in self._bps.values() if bp.enabled and isinstance(bp, kind)]

    def at_node(self, node) -> list[NodeBreakpoint]:
        return [bp for bp in self.enabled(NodeBreakpoint) if bp.matches(node)]

    def at_token(self, step: int) -> list[TokenBreakpoint]:
        return [bp for bp in self.enabled(TokenBreakpoint) if bp.token == step]

    def lines(self, kernel: str) -> dict[int, list[LineBreakpoint]]:
        out: dict[int, list[LineBreakpoint]] = {}
        for bp in self.enabled(LineBreakpoint):
            if bp.kernel == kernel:
                out.setdefault(bp.line, []).append(bp)
        return out

    def watches(self) -> list[Watchpoint]:
        return self.enabled(Watchpoint)

    def register_watches(self) -> list[RegisterWatch]:
        return self.enabled(RegisterWatch)

    def node_checks(self) -> list[NodeCheck]:
        return self.enabled(NodeCheck)

    def instruction_checks(self, session, node) -> list[InstructionCheck]:
        return [bp for bp in self.enabled(InstructionCheck) if bp.wants(session, node)]

    @property
    def nan(self) -> bool:
        return bool(self.enabled(NanCatchpoint))

    def refresh_watches(self, arena: np.ndarray) -> None:
        """Watchpoints look at the range as it is now (after a jump, an undo, a new token)."""
        for bp in self.enabled(Watchpoint):
            self.watch_values[bp.number] = arena[bp.start: bp.stop].copy()

    def changed_watches(self, arena: np.ndarray) -> list[Watchpoint]:
        out = []
        for bp in self.watches():
            old = self.watch_values.get(bp.number)
            new = arena[bp.start: bp.stop]
            if old is None or not np.array_equal(old.view(np.uint32), new.view(np.uint32)):
                out.append(bp)
        return out

    # -- the hit rule ---------------------------------------------------------------------
    def hit(self, bp: Breakpoint, evaluate: Callable[[DebugExpr], object]) -> Hit:
        """Condition, then hit count, then ignore count, then disposition (as gdb).

        A condition that cannot be evaluated stops, and says so, like gdb's
        "Error in testing condition for breakpoint N".
        """
        if bp.number == 0:
            return Hit(True)
        # Callers hold the record they started with; the counts are the table's, now.
        bp = self._bps.get(bp.number)
        if bp is None or not bp.enabled:
            return Hit(False)
        if bp.condition is not None:
            try:
                ok = truth(evaluate(bp.condition))
            except FirError as e:
                self.update(bp.number, hit_count=bp.hit_count + 1)
                return Hit(True, f"Error in testing condition for {bp.what} {bp.number}: "
                                 f"{e.message}")
            if not ok:
                return Hit(False)
        bp = self.update(bp.number, hit_count=bp.hit_count + 1)
        if bp.ignore_count > 0:
            self.update(bp.number, ignore_count=bp.ignore_count - 1)
            return Hit(False)
        if bp.log is not None:
            return Hit(False, log=bp.log)
        if bp.temporary:
            self.delete([bp.number])
            self.spent.add(bp.number)
        return Hit(True)


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²', which int() refuses."""
    return re.fullmatch(r"[0-9]{1,12}", text) is not None


def split_condition(text: str) -> tuple[str, DebugExpr | None]:
    m = re.search(r"\s+if\s+", " " + text)
    if not m:
        return text.strip(), None
    loc = (" " + text)[: m.start()].strip()
    cond = (" " + text)[m.end():]
    return loc, DebugExpr(cond)


SANITIZER_SPECS = {"race": "race (two lanes on one element, one writing)",
                   "uninit": "uninit (a read of memory nothing has written)"}


def parse_location(model: Model, text: str) -> Breakpoint:
    """Turn a location into a breakpoint template (number 0); FirError if it names nothing."""
    text = text.strip()
    if not text:
        raise FirError("a breakpoint needs a location: NODE, NODE@LAYER, KERNEL:LINE, LINE, "
                       "token N, nan, race or uninit")
    if text == "nan":
        return NanCatchpoint(spec="nan (NaN or Inf written)")
    if text in SANITIZER_SPECS:
        from .sanitizing import tracker_for
        return SanitizerCatchpoint(spec=SANITIZER_SPECS[text], kind=text,
                                   tracker=tracker_for(text, model))
    if text.startswith("token") and not _names_a_node(model, text):  # the seed has a node 'token'
        return _token_bp(text)
    if ":" in text:
        left, _, right = text.rpartition(":")
        if not _digits(right.strip()):
            raise FirError(f"expected KERNEL:LINE, found {text!r}")
        line = int(right)
        if left in model.kernels:
            return _line_bp(model, left, line)
        if left and (left == model.path.name or left == str(model.path)):
            return _file_line_bp(model, line)
        raise FirError(f"no kernel named '{left}' (kernels: {', '.join(model.kernels)})")
    if _digits(text):
        return _file_line_bp(model, int(text))
    m = _NODE.match(text)
    if not m:
        raise FirError(f"cannot understand location {text!r}")
    name, layer = m.group(1), m.group(2)
    names = {n.name for n in model.nodes}
    if name not in names:
        close = [n for n in sorted(names) if n.startswith(name[:3])]
        hint = f" (did you mean {', '.join(close[:4])}?)" if close else ""
        raise FirError(f"no node named '{name}'{hint}")
    if layer is not None:
        full = str(Ref(name, int(layer)))
        if not any(n.full_name == full for n in model.nodes):
            raise FirError(f"no node '{full}' (layers are 0..{model.layers - 1}, and '{name}' "
                           f"{'is' if any(n.name == name and n.layer is None for n in model.nodes) else 'is not'} "
                           "outside the repeat)")
        return NodeBreakpoint(spec=full, node=name, layer=int(layer))
    return NodeBreakpoint(spec=name, node=name)


def _token_bp(text: str) -> TokenBreakpoint:
    rest = text[5:].strip()
    if not _digits(rest):
        raise FirError(f"expected 'token N' with N a token index, found {text!r}")
    return TokenBreakpoint(spec=f"token {int(rest)}", token=int(rest))


def _names_a_node(model: Model, text: str) -> bool:
    m = _NODE.match(text)
    return bool(m) and any(n.name == m.group(1) for n in model.nodes)


def _line_bp(model: Model, kernel: str, line: int) -> LineBreakpoint:
    code = model.kernels[kernel]
    lines = sorted({op.loc.line for op in code.ops})
    if not lines:
        raise FirError(f"kernel '{kernel}' has no instructions")
    first_line, last_line = code.syntax.loc.line, code.syntax.end.line
    if not first_line <= line <= last_line:
        raise FirError(f"line {line} is not inside kernel '{kernel}' (lines {first_line}.."
                       f"{last_line})")
    # like gdb, a line without an instruction moves to the next one that has one
    at = next((l for l in lines if l >= line), None)
    if at is None:
        raise FirError(f"no instruction at or after line {line} in kernel '{kernel}'")
    return LineBreakpoint(spec=f"{kernel}:{at}", kernel=kernel, line=at)


def _file_line_bp(model: Model, line: int) -> Breakpoint:
    for name, code in model.kernels.items():
        if code.syntax.loc.line <= line <= code.syntax.end.line:
            return _line_bp(model, name, line)
    for n in model.nodes:
        if n.loc.line == line:
            return NodeBreakpoint(spec=n.name, node=n.name)
    raise FirError(f"line {line} of {model.path.name} is not inside a kernel or on a node")


def parse_watch(model: Model, text: str) -> Watchpoint:
    """``scores[0:64]``, ``scores@2[0:16]``, ``x`` -> an absolute arena range."""
    m = _WATCH.match(text.replace(" ", ""))
    if not m:
        raise FirError(f"cannot watch {text!r}: expected BUFFER, BUFFER[a:b] or BUFFER@LAYER[a:b]")
    name, layer, a, b = m.group(1), m.group(2), m.group(3), m.group(4)
    if name in model.buffers:
        decl = model.buffers[name]
        if decl.per_layer:
            if layer is None:
                raise FirError(f"'{name}' is per_layer: name a layer, e.g. {Ref(name, 0)}")
            if int(layer) >= model.layers:
                raise FirError(f"'{name}' has layers 0..{model.layers - 1}")
            region = model.instance(Ref(name, int(layer)))
        else:
            if layer is not None:
                raise FirError(f"'{name}' is not per_layer; drop the {layer_suffix(layer)}")
            region = model.regions[name]
    else:
        ref = Ref(name, None if layer is None else int(layer))
        disp = str(ref)
        w = model.instance(ref)
        if w is None or w.region is None:
            raise FirError(f"no arena buffer named '{disp}'")
        region = w.region
    size = region.size
    if a is None:
        lo, hi = 0, size
    elif b is None and "[" in text and ":" not in text:
        lo = int(a) if a else 0
        lo = lo + size if lo < 0 else lo
        hi = lo + 1
    else:
        lo = int(a) if a else 0
        hi = int(b) if b else size
        lo = lo + size if lo < 0 else lo
        hi = hi + size if hi < 0 else hi
    if not 0 <= lo < hi <= size:
        raise FirError(f"range [{lo}:{hi}] is outside {region.name}[0:{size}]")
    return Watchpoint(spec=f"{region.name}[{lo}:{hi}]", region=region.name,
                      start=region.base + lo, stop=region.base + hi, offset=lo)
