"""What the editor shows at a stop: threads, stack frames, scopes, variables, values.

Decisions (README "Editors" says the same to users):

* Threads: thread 1 is ``graph`` and is always there; inside a dispatch each
  lane is a thread too, ``lane L`` with id ``L + 2`` (at most
  :data:`MAX_LANE_THREADS` of them, plus the focused lane). A stop names the
  focused lane's thread inside a kernel and ``graph`` between nodes.
* Frames, innermost first: the open ``for``/``if`` blocks of the kernel, the
  kernel, the node instance (``attention@2``) and the token. The top frame's
  line is the instruction about to execute; an outer block's line is the
  opener of the block inside it; node and token frames point at the node's
  line in the graph. The ``graph`` thread has only the node and token frames.
* Frame ids and variable references are handles that live until the next
  movement (every resume starts a new table), as in VS Code's own adapters.
* Variables: Registers (R and U of the frame's lane, changed ones with the
  ``changed`` attribute in ``presentationHint``), Node operands (in0.., out0..),
  Buffers and Weights. An array is indexed children: a client that pages
  (``start``/``count``, as VS Code does from ``indexedVariables``) gets exactly
  the slice it asks for; one that does not gets groups of at most
  :data:`PAGE` children (``[0:100]``, ...), nested for large arrays, so a
  50257-element buffer is never sent whole.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..debug.commands import CommandInterpreter
from ..debug.info import fmt_scalar
from ..debug.snapshot import capture, token_range
from ..errors import FirError
from ..model.ref import Ref, layer_suffix
from ..vm.assembler import NREGS
from .conventions import Conventions

THREAD_GRAPH = 1
LANE_BASE = 2
MAX_LANE_THREADS = 1024
PAGE = 100
MAX_SLICE = 10_000  # elements one paged request may ask for
PREVIEW = 4


class RequestError(Exception):
    """A request the adapter cannot do; the message goes back to the client."""


class Handles:
    """Numbers for frames and variable containers, valid until the next movement."""

    def __init__(self):
        self._items: dict[int, object] = {}
        self._next = 1

    def add(self, item) -> int:
        ref = self._next
        self._next += 1
        self._items[ref] = item
        return ref

    def get(self, ref, what: str = "reference"):
        if isinstance(ref, bool) or not isinstance(ref, int) or ref not in self._items:
            raise RequestError(f"{what} {ref!r} is not valid at this stop (it belongs to an "
                               "earlier stop, or was never given out)")
        return self._items[ref]

    def reset(self) -> None:
        self._items.clear()


# -- containers a variablesReference can name -------------------------------------------
@dataclass(frozen=True)
class FrameRef:
    thread: int
    level: int
    lane: int | None  # the lane whose registers this frame shows


@dataclass(frozen=True)
class Registers:
    lane: int


@dataclass(frozen=True)
class Operands:
    node_index: int


@dataclass(frozen=True)
class Buffers:
    pass


@dataclass(frozen=True)
class Weights:
    pass


@dataclass(frozen=True)
class Layers:
    """A per-layer buffer or weight: one child per layer."""

    name: str
    kind: str  # "buffer" or "weight"


@dataclass(frozen=True)
class ArrayView:
    """Elements ``lo:hi`` along axis 0 of an array, named ``expr`` in expressions."""

    expr: str
    get: Callable[[], np.ndarray]
    lo: int
    hi: int
    weight: bool = False  # setVariable writes it with ``set --weight``
    index_prefix: tuple[int, ...] = ()  # for rows of a 2-D array: the row index


def thread_of_lane(lane: int) -> int:
    return lane + LANE_BASE


def type_of(a: np.ndarray) -> str:
    kind = {"f": "f32", "u": "u32", "i": "int", "b": "bool"}.get(a.dtype.kind, str(a.dtype))
    return f"{kind}[{', '.join(str(n) for n in a.shape)}]"


def preview(a: np.ndarray) -> str:
    flat = a.reshape(-1)
    head = ", ".join(fmt_scalar(x) for x in flat[:PREVIEW])
    return f"{type_of(a)} [{head}{', …' if flat.size > PREVIEW else ''}]"


class Views:
    """Answers the looking requests from the command interpreter's session at a stop."""

    def __init__(self, ci: CommandInterpreter, source: dict, conv: Conventions | None = None):
        self.ci = ci
        self.s = ci.session
        self.source = source
        self.conv = conv or Conventions()
        self.handles = Handles()

    def reset(self) -> None:
        self.handles.reset()

    # -- threads ------------------------------------------------------------------------
    def lanes_shown(self) -> list[int]:
        d = self.s.dispatch
        if d is None or d.done:
            return []
        shown = list(range(min(d.lanes, MAX_LANE_THREADS)))
        if self.ci.lane >= MAX_LANE_THREADS and self.ci.lane < d.lanes:
            shown.append(self.ci.lane)
        return shown

    def threads(self) -> list[dict]:
        out = [{"id": THREAD_GRAPH, "name": "graph"}]
        out += [{"id": thread_of_lane(lane), "name": f"lane {lane}"}
                for lane in self.lanes_shown()]
        return out

    def stopped_thread(self) -> int:
        lanes = self.lanes_shown()
        return thread_of_lane(self.ci.lane) if self.ci.lane in lanes else THREAD_GRAPH

    def lane_of_thread(self, thread) -> int | None:
        """None for the graph thread; RequestError for a thread that does not exist now."""
        if thread == THREAD_GRAPH:
            return None
        if isinstance(thread, int) and not isinstance(thread, bool):
            lane = thread - LANE_BASE
            if lane in self.lanes_shown():
                return lane
        raise RequestError(f"no thread {thread!r} here (threads: graph"
                           + (", lanes" if self.lanes_shown() else "") + ")")

    # -- stack --------------------------------------------------------------------------
    def frames(self, thread) -> list[dict]:
        lane = self.lane_of_thread(thread)
        s = self.s
        if s.finished:
            return []
        node = s.node
        out = []
        d = s.dispatch
        kernel_source = self.source
        if lane is not None and d is not None and not d.done:
            out += self._kernel_frames(d, node, lane)
            path = node.program.kernel.syntax.loc.path
            if path != str(s.model.path):  # an edited kernel: its lines are the edit's file's
                kernel_source = {"name": os.path.basename(path), "path": os.path.abspath(path)}
        kernel_frames = len(out)
        token = s.token
        piece = self.ci.tok.piece(token) if token is not None else "-"
        where = node.full_name if lane is not None else f"before {node.full_name}"
        if d is not None and lane is None:
            where = f"{node.full_name} (running {node.target})"
        out.append((f"{where} [{node.kind} {node.target}]", node.loc.line))
        out.append((f"token {s.step} {piece!r} (of tokens {token_range(s.total_steps)})",
                    node.loc.line))
        frames = []
        for level, (name, line) in enumerate(out):
            ref = self.handles.add(FrameRef(thread, level, lane))
            frames.append({"id": ref, "name": name, "line": self.conv.line_out(line),
                           "column": self.conv.column_out(1),
                           "source": kernel_source if level < kernel_frames else self.source})
        return frames

    def _kernel_frames(self, d, node, lane: int) -> list[tuple[str, int]]:
        line = d.ops[d.pc].loc.line
        blocks = []
        for f in reversed(d.stack):  # innermost first
            opener = d.ops[f.pc].loc.line
            if f.kind == "for":
                rem = f.remaining
                left = f" ({int(rem[lane])} left in lane {lane})" if rem is not None else ""
                blocks.append((f"for@{opener} iteration {f.trips}{left}", line))
            else:
                blocks.append((f"if@{opener}", line))
            line = opener
        active = "active" if d.mask[lane] else "inactive"
        blocks.append((f"{node.target} pc {d.pc} (lane {lane} of {d.lanes}, {active})", line))
        return blocks

    # -- scopes -------------------------------------------------------------------------
    def scopes(self, frame_id) -> list[dict]:
        frame = self.handles.get(frame_id, "frame")
        if not isinstance(frame, FrameRef):
            raise RequestError(f"{frame_id!r} is not a frame")
        out = []
        if frame.lane is not None:
            out.append(self._scope(f"Registers (lane {frame.lane})", Registers(frame.lane),
                                   named=2 * NREGS))
        node = self.s.node
        if node is not None:
            out.append(self._scope(f"Node operands ({node.full_name})", Operands(node.index),
                                   named=len(node.args) + len(node.outs)))
        out.append(self._scope("Buffers", Buffers(), named=len(self.s.model.buffers)))
        out.append(self._scope("Weights", Weights(), expensive=True))
        return out

    def _scope(self, name: str, item, *, named: int | None = None,
               expensive: bool = False) -> dict:
        scope = {"name": name, "variablesReference": self.handles.add(item),
                 "expensive": expensive}
        if named is not None:
            scope["namedVariables"] = named
        if isinstance(item, Registers):
            scope["presentationHint"] = "registers"
        return scope

    # -- variables ----------------------------------------------------------------------
    def variables(self, ref, start=None, count=None, kind=None) -> list[dict]:
        """Children of a container; ``kind`` is DAP's filter ("named" or "indexed")."""
        item = self.handles.get(ref, "variablesReference")
        if kind == "named" and isinstance(item, ArrayView):
            return []  # an array's children are all indexed
        if kind == "indexed" and not isinstance(item, ArrayView):
            return []  # scopes and per-layer lists have named children only
        if isinstance(item, Registers):
            return self._registers(item.lane)
        if isinstance(item, Operands):
            return self._operands()
        if isinstance(item, Buffers):
            return self._buffers()
        if isinstance(item, Weights):
            return self._weights()
        if isinstance(item, Layers):
            return self._layers(item)
        if isinstance(item, ArrayView):
            return self._elements(item, start, count)
        raise RequestError(f"{ref!r} has no children")

    def _registers(self, lane: int) -> list[dict]:
        d = self.s.dispatch
        if d is None or not 0 <= lane < d.lanes:
            raise RequestError(f"lane {lane} has no registers here")
        last = self.ci.last
        if last.lane is not None and last.lane.lane == lane:
            view = last.lane
        else:  # another lane than the focused one: the same changed rule, for that lane
            view = capture(self.s, last.stop, "", lane=lane, previous=self.ci.previous).lane
        out = []
        for file, values in (("R", view.R), ("U", view.U)):
            for i in range(NREGS):
                var = {"name": f"{file}{i}", "value": fmt_scalar(values[i]),
                       "type": "f32" if file == "R" else "u32", "variablesReference": 0,
                       "evaluateName": f"{file}{i}"}
                if (file, i) in view.changed:
                    var["presentationHint"] = {"kind": "data", "attributes": ["changed"]}
                out.append(var)
        return out

    def _operands(self) -> list[dict]:
        node = self.s.node
        if node is None:
            return []
        out = []
        pairs = [(f"in{i}", o) for i, o in enumerate(node.args)]
        pairs += [(f"out{i}", o) for i, o in enumerate(node.outs)]
        for label, o in pairs:
            var = self._array_var(label, o.display, weight=o.kind == "weight")
            var["value"] = f"{o.display}: {var['value']}"
            out.append(var)
        return out

    def _buffers(self) -> list[dict]:
        m = self.s.model
        out = []
        for name, decl in m.buffers.items():
            if decl.per_layer:
                out.append(self._layers_var(name, "buffer", m.layers))
            else:
                out.append(self._array_var(name, name))
        return out

    def _weights(self) -> list[dict]:
        m = self.s.model
        decls: dict[str, list] = {}
        for w in m.weights.values():
            decls.setdefault(w.decl, []).append(w)
        out = []
        for decl, entries in decls.items():
            if entries[0].layer is not None:
                out.append(self._layers_var(decl, "weight", len(entries)))
            else:
                out.append(self._array_var(decl, decl, weight=True))
        return out

    def _layers_var(self, name: str, kind: str, layers: int) -> dict:
        return {"name": name, "value": f"per layer, {layers} layers", "type": kind,
                "variablesReference": self.handles.add(Layers(name, kind)),
                "namedVariables": layers}

    def _layers(self, item: Layers) -> list[dict]:
        m = self.s.model
        layers = m.layers if item.kind == "buffer" else sum(
            1 for w in m.weights.values() if w.decl == item.name)
        return [self._array_var(layer_suffix(i), str(Ref(item.name, i)),
                                weight=item.kind == "weight")
                for i in range(layers)]

    def _value_of(self, expr: str) -> np.ndarray:
        return np.asarray(self.ci.evaluate(expr, lane=self.ci.lane))

    def _array_var(self, label: str, expr: str, *, weight: bool = False) -> dict:
        try:
            a = self._value_of(expr)
        except FirError as e:
            return {"name": label, "value": f"<{e.message}>", "variablesReference": 0}
        view = ArrayView(expr, lambda: self._value_of(expr), 0, a.shape[0] if a.ndim else 0,
                         weight)
        return self.array_variable(label, a, view)

    def array_variable(self, label: str, a: np.ndarray, view: ArrayView | None) -> dict:
        var = {"name": label, "value": preview(a) if a.ndim else fmt_scalar(a[()]),
               "type": type_of(a), "variablesReference": 0}
        if view is not None and a.ndim:
            var["evaluateName"] = view.expr
            var["variablesReference"] = self.handles.add(view)
            var["indexedVariables"] = view.hi - view.lo
            address = self.address_of(view.expr)
            if address is not None:
                var["memoryReference"] = hex(address * 4)
        return var

    def address_of(self, expr: str) -> int | None:
        """Arena element index of a whole buffer or arena weight named ``expr``."""
        m = self.s.model
        region = m.regions.get(expr)
        if region is None and expr in m.weights:
            region = m.weights[expr].region  # None for a q4 weight: not in the arena
        return None if region is None else region.base

    def _elements(self, view: ArrayView, start, count) -> list[dict]:
        n = view.hi - view.lo
        if start is not None or count is not None:
            lo = _nonneg(start, "start", 0)
            want = _nonneg(count, "count", n - lo) or (n - lo)
            indices = range(view.lo + lo, view.lo + lo + min(want, MAX_SLICE, max(n - lo, 0)))
        elif n <= PAGE:
            indices = range(view.lo, view.hi)
        else:
            return self._groups(view, n)
        a = view.get()
        for k in view.index_prefix:
            a = a[k]
        return [self._element(view, a, i) for i in indices]

    def _groups(self, view: ArrayView, n: int) -> list[dict]:
        size = PAGE
        while n > size * PAGE:
            size *= PAGE
        out = []
        for a in range(view.lo, view.hi, size):
            b = min(a + size, view.hi)
            sub = ArrayView(view.expr, view.get, a, b, view.weight, view.index_prefix)
            out.append({"name": f"[{a}:{b}]", "value": f"{b - a} elements", "type": "range",
                        "variablesReference": self.handles.add(sub),
                        "indexedVariables": b - a})
        return out

    def _element(self, view: ArrayView, a: np.ndarray, i: int) -> dict:
        index = view.index_prefix + (i,)
        expr = f"{view.expr}[{', '.join(str(k) for k in index)}]"
        v = a[i]
        if np.ndim(v):
            row = ArrayView(view.expr, view.get, 0, v.shape[0], view.weight, index)
            var = self.array_variable(f"[{i}]", v, row)
            var["evaluateName"] = expr
            var.pop("memoryReference", None)
            return var
        return {"name": f"[{i}]", "value": fmt_scalar(v), "type": type_of(a).split("[")[0],
                "variablesReference": 0, "evaluateName": expr}

    # -- evaluate -----------------------------------------------------------------------
    def evaluate(self, text: str, lane: int, *, hover: bool = False) -> dict:
        """An evaluate response body: a value, or an array with paged children."""
        if hover:
            text = self._hover_name(text)
        if not text:
            raise RequestError("nothing to evaluate")
        a = np.asarray(self.ci.evaluate(text, lane=lane))
        if not a.ndim:
            return {"result": fmt_scalar(a[()]), "type": str(a.dtype), "variablesReference": 0}
        view = ArrayView(text, lambda: np.asarray(self.ci.evaluate(text, lane=lane)), 0,
                         a.shape[0])
        var = self.array_variable(text, a, view)
        body = {"result": var["value"], "type": var["type"],
                "variablesReference": var["variablesReference"]}
        for key in ("indexedVariables", "memoryReference"):
            if key in var:
                body[key] = var[key]
        return body

    def _hover_name(self, text: str) -> str:
        """``@in0``/``in0``/``out1`` in a kernel name the node's operands; ``@x`` is ``x``."""
        name = text.lstrip("@")
        node = self.s.node
        if node is not None and name[:2] in ("in", "ou"):
            ops = {f"in{i}": o for i, o in enumerate(node.args)}
            ops.update({f"out{i}": o for i, o in enumerate(node.outs)})
            if name in ops:
                return ops[name].display
        return name

    # -- writing ------------------------------------------------------------------------
    def set_target(self, ref, name: str) -> tuple[str, int | None]:
        """The ``set`` target for a variable the editor edits, and its lane (registers)."""
        item = self.handles.get(ref, "variablesReference")
        if isinstance(item, Registers):
            if not re.fullmatch(r"[RU][0-9]{1,2}", name or ""):
                raise RequestError(f"no register {name!r}")
            return name, item.lane
        if isinstance(item, ArrayView):
            m = re.fullmatch(r"\[([0-9]{1,12})\]", name or "")
            if not m:
                raise RequestError(f"{name!r} is not an element of {item.expr}")
            index = item.index_prefix + (int(m.group(1)),)
            target = f"{item.expr}[{', '.join(str(k) for k in index)}]"
            return ("--weight " if item.weight else "") + target, None
        raise RequestError("only registers and array elements can be set")

    def watch_target(self, ref, name: str) -> str:
        """The ``watch`` range for a variable (dataBreakpointInfo)."""
        item = self.handles.get(ref, "variablesReference")
        if isinstance(item, (Buffers, Operands, Layers)):
            if isinstance(item, Operands):
                node = self.s.node
                ops = dict([(f"in{i}", o) for i, o in enumerate(node.args)]
                           + [(f"out{i}", o) for i, o in enumerate(node.outs)])
                if name not in ops:
                    raise RequestError(f"no operand {name!r}")
                return ops[name].display
            return name if isinstance(item, Buffers) else f"{item.name}{name}"
        if isinstance(item, ArrayView) and not item.index_prefix:
            m = re.fullmatch(r"\[([0-9]{1,12})(?::([0-9]{1,12}))?\]", name or "")
            if m:
                a = int(m.group(1))
                b = int(m.group(2)) if m.group(2) else a + 1
                return f"{item.expr}[{a}:{b}]"
        if isinstance(item, Registers) and re.fullmatch(r"[RU][0-9]{1,2}", name or ""):
            return f"lane {item.lane} {name}"  # the register watchpoint of that lane
        raise RequestError("only buffers, their elements and ranges, and registers can be "
                           "watched")


def _nonneg(v, what: str, default: int) -> int:
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise RequestError(f"'{what}' must be a whole number >= 0, found {v!r}")
    return v
