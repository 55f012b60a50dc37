"""The debugger engine: a session over a loaded model (the bdb of firscope).

Where the session is, is a cursor: decode step (token), the next node to
run, and, when stopped inside a micro node, the live :class:`Dispatch`
(pc, per-lane registers, active mask, loop/if frames). Every movement is
one stop condition handed to one loop (:meth:`Session._resume`):
``stepi``, ``next``, ``finish``, ``until``, ``continue`` and next-token only
differ in when that loop stops. The engine never prints and never calls a
UI; it returns :class:`Stop` records.

Speed: nodes run whole through the runtime (the compiled engine where there
is one) unless instruction granularity is needed: a line breakpoint in
that kernel, or locating the exact instruction behind a watchpoint, a NaN
or a fault, which re-runs that one node in the interpreter from its start.

Reverse: before each node the regions it may write are copied; after it,
only the elements that changed are kept (an undo log, bounded by
``history_budget`` bytes; the oldest entries are dropped first).
``reverse-next`` undoes one node; ``reverse-stepi`` inside a kernel
restores the node's start and replays one instruction fewer.
"""
from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import BudgetExceeded, FirError, FirFault, Interrupted
from ..model.loader import Model, PlanNode
from ..runtime.machine import DEFAULT_BUDGET, Machine
from ..vm.interp import Dispatch
from .breakpoints import Breakpoint, parse_location, parse_watch, split_condition
from .expr import DebugExpr, truth

DEFAULT_HISTORY_BUDGET = 512 * 1024 * 1024


@dataclass(frozen=True)
class Location:
    step: int  # decode step = index into the token sequence
    token: int | None  # token fed at this step
    position: int
    node_index: int | None  # the node about to run (or running); None at the end
    node: str | None  # its full name
    kernel: str | None
    pc: int | None  # inside a kernel: next instruction
    line: int | None  # its .fir line
    in_kernel: bool


@dataclass(frozen=True)
class Stop:
    reason: str  # step, breakpoint, watchpoint, nan, fault, budget, finished, interrupted, history
    message: str
    location: Location
    breakpoint: int | None = None
    old: np.ndarray | None = None
    new: np.ndarray | None = None


@dataclass
class _Change:
    base: int
    index: np.ndarray  # int64 offsets that changed
    old: np.ndarray  # their previous values

    @property
    def nbytes(self) -> int:
        return self.index.nbytes + self.old.nbytes


@dataclass
class _Record:
    kind: str  # "node", "begin" (token written), "end" (token finished)
    step: int
    node: int
    changes: list[_Change] = field(default_factory=list)
    seq_len: int = 0  # for "end": the sequence length before

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.changes) + 64


class Session:
    def __init__(self, model: Model, prompt: list[int], n_generate: int, *,
                 engine: str = "compiled", history_budget: int = DEFAULT_HISTORY_BUDGET,
                 budget: int | None = DEFAULT_BUDGET, machine: Machine | None = None):
        if not prompt:
            raise FirError("the prompt is empty: give at least one token")
        self.model = model
        self.nodes = model.nodes
        self.machine = machine or Machine(model, engine=engine, budget=budget)
        self.arena = self.machine.arena
        for t in prompt:
            self.machine.check_token(int(t))
        self.prompt = [int(t) for t in prompt]
        self.n_generate = max(int(n_generate), 0)
        self.total_steps = len(self.prompt) + max(self.n_generate - 1, 0)
        self.machine.reset()
        self.machine.check_room(self.total_steps)
        self.sequence: list[int] = list(self.prompt)
        self.logits: list[np.ndarray] = []
        self.step = 0
        self.node_index = 0
        self.dispatch: Dispatch | None = None
        self._node_before: list[tuple[int, np.ndarray]] | None = None
        self.finished = False
        self.history: deque[_Record] = deque()
        self.history_bytes = 0
        self.history_budget = history_budget
        self.history_truncated = False
        self.breakpoints: dict[int, Breakpoint] = {}
        self._next_bp = 1
        self.focus_lane = 0
        self.cancel = self.machine.stop_flag  # set it (from any thread) to interrupt a run
        self.node_times: dict[int, float] = {}  # node index -> seconds of its last whole run
        self.line_counts: dict[str, np.ndarray] = {}  # kernel -> per-pc counts, last dispatch
        self._prev_regs: tuple[str, int, np.ndarray, np.ndarray] | None = None
        self._mark_regs: tuple[str, int, np.ndarray, np.ndarray] | None = None
        self._write_cache: dict[int, list[tuple[int, int]]] = {}
        # Called as f(session, node) after every node completes, however it ran
        # (the UI records attention maps this way).
        self.node_observers: list = []
        # The last value each layer left in a buffer that all layers share (scores@2,
        # x@3): (step, node index, copy), for the current token.
        self.layer_values: dict[tuple[str, int], tuple[int, int, np.ndarray]] = {}
        self._begin_step()
        self._note_stop()

    # ------------------------------------------------------------------ where
    @property
    def node(self) -> PlanNode | None:
        return None if self.finished else self.nodes[self.node_index]

    @property
    def token(self) -> int | None:
        return self.sequence[self.step] if self.step < len(self.sequence) else None

    @property
    def layer(self) -> int | None:
        n = self.node
        return n.layer if n is not None else None

    def location(self) -> Location:
        if self.finished:
            return Location(self.step, None, self.step, None, None, None, None, None, False)
        n = self.node
        d = self.dispatch
        kernel = n.target if n.kind == "micro" else None
        pc = line = None
        if d is not None and not d.done:
            pc, line = d.pc, d.ops[d.pc].loc.line
        elif n.kind == "micro":
            pc, line = 0, n.program.ops[0].loc.line if n.program.ops else None
        return Location(self.step, self.token, self.step, self.node_index, n.full_name, kernel,
                        pc, line, d is not None)

    # ------------------------------------------------------------- stepping API
    def stepi(self, count: int = 1) -> Stop:
        """Execute ``count`` instructions (an ext node counts as one)."""
        return self._repeat(self._stepi_once, count)

    def next(self, count: int = 1) -> Stop:
        """Finish the current node and stop before the next one."""
        def once():
            target = self._boundary_after_current()
            return self._resume(lambda s, i: (s, i) == target, "step")
        return self._repeat(once, count)

    def _repeat(self, once, count: int) -> Stop:
        """Run a movement ``count`` times; anything but a plain step ends it early."""
        self.cancel.clear()  # an interrupt meant for an earlier run must not stop this one
        stop = None
        for _ in range(max(count, 1)):
            stop = once()
            if stop.reason != "step":
                break
        return self._finish(stop)

    def finish(self) -> Stop:
        """Inside a kernel: run it to the end. Between nodes: run to the end of the token."""
        if self.dispatch is not None:
            target = self._boundary_after_current()
            return self._finish(self._resume(lambda s, i: (s, i) == target, "step"))
        return self.next_token()

    def next_token(self) -> Stop:
        start = self.step
        return self._finish(self._resume(lambda s, i: s > start and i == 0, "step"))

    def cont(self) -> Stop:
        return self._finish(self._resume(None, "step"))

    def until(self, where: str) -> Stop:
        """Run to a node or kernel line (a one-off breakpoint, like gdb's until/advance)."""
        fields = parse_location(self.model, where)
        if fields["kind"] not in ("node", "line", "token"):
            raise FirError("until needs a node, a kernel line or 'token N'")
        bp = Breakpoint(0, temporary=True, **fields)
        return self._finish(self._resume(None, "step", extra=bp))

    def reverse_next(self, count: int = 1) -> Stop:
        return self._repeat(self._reverse_node, count)

    def reverse_stepi(self, count: int = 1) -> Stop:
        return self._repeat(self._reverse_instruction, count)

    def goto_node(self, full_name: str) -> Stop:
        """Run forward, or back, to the start of a node of the current token."""
        try:
            idx = self.model.node_index(full_name)
        except KeyError:
            raise FirError(f"no node '{full_name}'") from None
        step = self.step
        if idx > self.node_index or (idx == self.node_index and self.dispatch is None):
            if idx == self.node_index:
                return self._finish(self._make_stop("step", f"at {full_name}"))
            return self._finish(self._resume(lambda s, i: (s, i) == (step, idx), "step"))
        while self.dispatch is not None or (self.step, self.node_index) > (step, idx):
            st = self._reverse_node()
            if st.reason != "step":
                return self._finish(st)
        return self._finish(self._make_stop("step", f"at {full_name}"))

    # ------------------------------------------------------------- breakpoints
    def add_breakpoint(self, text: str, *, temporary: bool = False) -> Breakpoint:
        loc, cond = split_condition(text)
        fields = parse_location(self.model, loc)
        bp = Breakpoint(self._next_bp, temporary=temporary, condition=cond, **fields)
        self.breakpoints[bp.number] = bp
        self._next_bp += 1
        return bp

    def add_watch(self, text: str) -> Breakpoint:
        loc, cond = split_condition(text)
        fields = parse_watch(self.model, loc)
        bp = Breakpoint(self._next_bp, condition=cond, **fields)
        bp.old = self.arena[bp.watch_start: bp.watch_stop].copy()
        self.breakpoints[bp.number] = bp
        self._next_bp += 1
        return bp

    def toggle_breakpoint(self, text: str) -> tuple[str, Breakpoint]:
        """Delete a breakpoint at exactly this location, or add one ("added"/"deleted")."""
        loc, _ = split_condition(text)
        fields = parse_location(self.model, loc)
        for bp in list(self.breakpoints.values()):
            if bp.spec == fields["spec"] and bp.kind == fields["kind"]:
                del self.breakpoints[bp.number]
                return "deleted", bp
        return "added", self.add_breakpoint(text)

    def delete_breakpoints(self, numbers: list[int] | None = None) -> None:
        if numbers is None:
            self.breakpoints.clear()
            return
        for n in numbers:
            if n not in self.breakpoints:
                raise FirError(f"no breakpoint number {n}")
        for n in numbers:
            del self.breakpoints[n]

    def get_breakpoint(self, n: int) -> Breakpoint:
        if n not in self.breakpoints:
            raise FirError(f"no breakpoint number {n}")
        return self.breakpoints[n]

    def set_condition(self, n: int, text: str | None) -> None:
        self.get_breakpoint(n).condition = DebugExpr(text) if text and text.strip() else None

    def set_ignore(self, n: int, count: int) -> None:
        if count < 0:
            raise FirError("ignore count must be >= 0")
        self.get_breakpoint(n).ignore_count = count

    def set_enabled(self, numbers: list[int], enabled: bool) -> None:
        for n in numbers:
            self.get_breakpoint(n).enabled = enabled

    def line_breakpoints(self, kernel: str) -> dict[int, list[Breakpoint]]:
        out: dict[int, list[Breakpoint]] = {}
        for bp in self.breakpoints.values():
            if bp.kind == "line" and bp.enabled and bp.kernel == kernel:
                out.setdefault(bp.line, []).append(bp)
        return out

    # ------------------------------------------------------------------ lanes
    def set_lane(self, lane: int) -> None:
        lanes = self.lanes()
        if lanes is None:
            raise FirError("no kernel is running: step into a micro node first")
        if not 0 <= lane < lanes:
            raise FirError(f"lane {lane} does not exist (0..{lanes - 1})")
        self.focus_lane = lane

    def lanes(self) -> int | None:
        if self.dispatch is not None:
            return self.dispatch.lanes
        n = self.node
        if n is not None and n.kind == "micro":
            return n.program.threads
        return None

    def changed_registers(self) -> set[tuple[str, int]]:
        """Registers of the focused lane that changed since the previous stop."""
        d = self.dispatch
        prev = self._mark_regs
        if d is None or prev is None or prev[0] != self._dispatch_key():
            return set()
        lane = self.focus_lane
        if lane >= d.lanes:
            return set()
        _, _, R, U = prev
        out = {("R", int(i)) for i in np.flatnonzero(R[:, lane].view(np.uint32)
                                                      != d.R[:, lane].view(np.uint32))}
        out |= {("U", int(i)) for i in np.flatnonzero(U[:, lane] != d.U[:, lane])}
        return out

    def changed_lanes(self, file: str, reg: int) -> np.ndarray:
        d = self.dispatch
        prev = self._mark_regs
        if d is None or prev is None or prev[0] != self._dispatch_key():
            return np.zeros(0 if d is None else d.lanes, dtype=bool)
        old = prev[2] if file == "R" else prev[3]
        cur = d.R if file == "R" else d.U
        return old[reg].view(np.uint32) != cur[reg].view(np.uint32)

    def _dispatch_key(self) -> str:
        return f"{self.step}:{self.node_index}"

    def _note_stop(self) -> None:
        """Remember the registers at this stop; marks compare against the previous stop
        in the same dispatch, or against the dispatch's initial registers."""
        d = self.dispatch
        if d is None:
            self._mark_regs = self._prev_regs = None
            return
        key = self._dispatch_key()
        if self._prev_regs is not None and self._prev_regs[0] == key:
            self._mark_regs = self._prev_regs
        else:
            R0 = np.zeros_like(d.R)
            R0[0] = np.arange(d.lanes, dtype=np.float32)
            self._mark_regs = (key, 0, R0, np.zeros_like(d.U))
        self._prev_regs = (key, 0, d.R.copy(), d.U.copy())

    # ------------------------------------------------------------ expressions
    def resolve(self, name: str, layer: int | None):
        """Value of a name in debugger expressions."""
        d = self.dispatch
        if re.fullmatch(r"[RU][0-9]{1,3}", name) and layer is None:
            reg = int(name[1:])
            if reg > 31:
                raise FirError(f"register {name} is outside 0..31")
            if d is None:
                raise FirError(f"{name}: no kernel is running (step into a micro node first)")
            if self.focus_lane >= d.lanes:
                raise FirError(f"lane {self.focus_lane} does not exist in this dispatch")
            file = d.R if name[0] == "R" else d.U
            v = file[reg, self.focus_lane]
            return np.float32(v) if name[0] == "R" else int(v)
        special = {"lane": lambda: self.focus_lane, "step": lambda: self.step,
                   "position": lambda: self.step, "token": lambda: self.token,
                   "layer": lambda: self.layer if self.layer is not None else -1,
                   "pc": lambda: d.pc if d is not None else -1}
        if name in special and layer is None:
            v = special[name]()
            if v is None:
                raise FirError(f"'{name}' has no value here")
            return v
        return self.buffer_value(name, layer)

    def buffer_value(self, name: str, layer: int | None = None) -> np.ndarray:
        m = self.model
        if name in m.buffers:
            decl = m.buffers[name]
            if decl.per_layer:
                lay = layer if layer is not None else self.layer
                if lay is None:
                    raise FirError(f"'{name}' is per_layer: say which layer, e.g. {name}@0")
                if not 0 <= lay < m.layers:
                    raise FirError(f"'{name}' has layers 0..{m.layers - 1}")
                return m.view(m.regions[f"{name}@{lay}"])
            if layer is not None:
                return self._layer_value(name, layer)
            return m.view(m.regions[name])
        decl_layers = [w for w in m.weights.values() if w.decl == name]
        if decl_layers:
            if decl_layers[0].layer is None:
                w = decl_layers[0]
            else:
                lay = layer if layer is not None else self.layer
                if lay is None:
                    raise FirError(f"'{name}' is per layer: say which, e.g. {name}@0")
                w = m.weights.get(f"{name}@{lay}")
                if w is None:
                    raise FirError(f"'{name}' has layers 0..{m.layers - 1}")
            if w.region is not None:
                return m.view(w.region).reshape(w.shape)
            return w.dense()  # a q4 weight is dequantized when first looked at
        raise FirError(f"no buffer, weight or register named '{name}'")

    def _layer_value(self, name: str, layer: int) -> np.ndarray:
        """``scores@2``: what layer 2 last wrote into a buffer all layers share, this token."""
        if not 0 <= layer < self.model.layers:
            raise FirError(f"layers are 0..{self.model.layers - 1}")
        rec = self.layer_values.get((name, layer))
        here = (self.step, self.node_index)
        if rec is None or rec[0] != self.step or (rec[0], rec[1]) >= here:
            raise FirError(f"{name}@{layer}: layer {layer} has not written '{name}' yet in this "
                           f"token")
        return rec[2]

    def evaluate(self, text: str):
        return DebugExpr(text).evaluate(self.resolve)

    # ------------------------------------------------------------ internals
    def _finish(self, stop: Stop) -> Stop:
        self._note_stop()
        return stop

    def _make_stop(self, reason: str, message: str, bp: int | None = None, old=None,
                   new=None) -> Stop:
        return Stop(reason, message, self.location(), bp, old, new)

    def _boundary_after_current(self) -> tuple[int, int]:
        if self.node_index + 1 < len(self.nodes):
            return self.step, self.node_index + 1
        return self.step + 1, 0

    def _write_regions(self, node: PlanNode) -> list[tuple[int, int]]:
        cached = self._write_cache.get(node.index)
        if cached is None:
            if node.kind == "ext":
                regs = [o.region for o in node.outs]
            else:
                regs = node.program.written_regions()
            seen = {}
            for r in regs:
                seen[(r.base, r.base + r.size)] = True
            cached = list(seen)
            self._write_cache[node.index] = cached
        return cached

    def _snapshot(self, node: PlanNode) -> list[tuple[int, np.ndarray]]:
        return [(a, self.arena[a:b].copy()) for a, b in self._write_regions(node)]

    def _restore(self, snap: list[tuple[int, np.ndarray]]) -> None:
        for a, data in snap:
            self.arena[a: a + data.size] = data

    def _diff(self, snap: list[tuple[int, np.ndarray]]) -> list[_Change]:
        out = []
        for a, old in snap:
            new = self.arena[a: a + old.size]
            idx = np.flatnonzero(old.view(np.uint32) != new.view(np.uint32))
            if idx.size:
                out.append(_Change(a, idx, old[idx]))
        return out

    def _push(self, rec: _Record) -> None:
        self.history.append(rec)
        self.history_bytes += rec.nbytes
        while self.history_bytes > self.history_budget and len(self.history) > 1:
            old = self.history.popleft()
            self.history_bytes -= old.nbytes
            self.history_truncated = True

    def _begin_step(self) -> None:
        m = self.machine
        inputs = [(r.base, self.arena[r.base: r.base + r.size].copy())
                  for r in self.model.inputs.values()]
        m.position = self.step
        m.begin_token(self.sequence[self.step])
        self._push(_Record("begin", self.step, 0, self._diff(inputs)))
        # watchpoints see the token buffers change; that is not a stop
        for bp in self.breakpoints.values():
            if bp.kind == "watch":
                bp.old = self.arena[bp.watch_start: bp.watch_stop].copy()

    def _end_step(self) -> None:
        m = self.machine
        res = m.finish_token()
        self._push(_Record("end", self.step, len(self.nodes), seq_len=len(self.sequence)))
        self.logits.append(res.logits)
        generated_so_far = len(self.sequence) - len(self.prompt)
        if self.step == len(self.sequence) - 1 and generated_so_far < self.n_generate:
            self.sequence.append(int(np.argmax(res.logits)))
        self.step += 1
        self.node_index = 0
        if self.step >= self.total_steps:
            self.finished = True
        else:
            self._begin_step()

    def _advance_node(self) -> None:
        self.node_index += 1
        if self.node_index >= len(self.nodes):
            self._end_step()

    def _undo(self, rec: _Record) -> None:
        for c in rec.changes:
            self.arena[c.base + c.index] = c.old
        self.history_bytes -= rec.nbytes
        if rec.kind == "end":
            self.logits.pop()
            del self.sequence[rec.seq_len:]
            self.finished = False
            m = self.machine
            m.history.pop()
            m.position = rec.step
            m.current_token = self.sequence[rec.step]
            self.step, self.node_index = rec.step, len(self.nodes)
        elif rec.kind == "begin":
            self.step, self.node_index = rec.step - 1, len(self.nodes)
            self.machine.position = rec.step
        else:
            self.step, self.node_index = rec.step, rec.node

    def _refresh_watches(self) -> None:
        for bp in self.breakpoints.values():
            if bp.kind == "watch":
                bp.old = self.arena[bp.watch_start: bp.watch_stop].copy()

    # -- forward --------------------------------------------------------------
    def _enter_dispatch(self, node: PlanNode) -> None:
        self._node_before = self._snapshot(node)
        d = self.machine.dispatch(node)
        d.line_counts = np.zeros(len(d.ops), dtype=np.int64)
        self.dispatch = d
        if self.focus_lane >= d.lanes:
            self.focus_lane = 0

    def _complete_dispatch(self) -> None:
        node = self.nodes[self.node_index]
        d = self.dispatch
        self.line_counts[node.target] = d.line_counts
        self._push(_Record("node", self.step, self.node_index, self._diff(self._node_before)))
        self.dispatch = None
        self._node_before = None
        self._observe(node)
        self._advance_node()

    def _stepi_once(self) -> Stop:
        if self.finished:
            return self._make_stop("finished", self._end_message())
        if self.dispatch is None:
            node = self.nodes[self.node_index]
            if node.kind == "ext":
                stop = self._run_whole(node)
                if stop is not None:
                    return stop
                return self._make_stop("step", f"ran {node.full_name} ({node.target})")
            self._enter_dispatch(node)
        stop = self._drive(limit=1, skip_first_line=True)
        if stop is not None:
            return stop
        if self.dispatch.done:
            self._complete_dispatch()
        return self._make_stop("step", "")

    def _resume(self, boundary_stop, reason: str, extra: Breakpoint | None = None) -> Stop:
        """The one forward loop. ``boundary_stop(step, node)`` says where to stop between nodes."""
        first = True
        self.cancel.clear()
        while True:
            if self.finished:
                return self._make_stop("finished", self._end_message())
            if self.cancel.is_set():
                return self._make_stop("interrupted", "interrupted by the user")
            if self.dispatch is not None:
                stop = self._drive(skip_first_line=first, extra=extra)
                if stop is not None:
                    return stop
                self._complete_dispatch()
                first = False
                if not self.finished and boundary_stop and boundary_stop(self.step, self.node_index):
                    return self._make_stop(reason, "")
                continue
            node = self.nodes[self.node_index]
            if not first:
                stop = self._check_boundary(node, extra)
                if stop is not None:
                    return stop
            first = False
            if node.kind == "micro" and self._needs_instructions(node, extra):
                self._enter_dispatch(node)
                continue
            stop = self._run_whole(node)
            if stop is not None:
                return stop
            if not self.finished and boundary_stop and boundary_stop(self.step, self.node_index):
                return self._make_stop(reason, "")

    def _needs_instructions(self, node: PlanNode, extra: Breakpoint | None) -> bool:
        """Whether this kernel must be interpreted instruction by instruction: a line
        breakpoint in it, or `break nan`, which watches every register write."""
        if self.line_breakpoints(node.target):
            return True
        if extra is not None and extra.kind == "line" and extra.kernel == node.target:
            return True
        return any(bp.kind == "nan" and bp.enabled for bp in self.breakpoints.values())

    def _check_boundary(self, node: PlanNode, extra: Breakpoint | None) -> Stop | None:
        candidates = [bp for bp in self.breakpoints.values() if bp.enabled]
        if extra is not None:
            candidates.append(extra)
        for bp in candidates:
            if bp.kind == "node" and bp.node == node.name and (bp.layer is None
                                                               or bp.layer == node.layer):
                pass
            elif bp.kind == "token" and self.node_index == 0 and bp.token == self.step:
                pass
            else:
                continue
            if self._hit(bp):
                return self._bp_stop(bp)
        return None

    def _hit(self, bp: Breakpoint) -> bool:
        if bp.condition is not None:
            try:
                ok = truth(bp.condition.evaluate(self.resolve))
            except FirError:
                ok = True  # like gdb: an error in the condition stops, so the user sees it
        else:
            ok = True
        if not ok:
            return False
        bp.hit_count += 1
        if bp.ignore_count > 0:
            bp.ignore_count -= 1
            return False
        return True

    def _bp_stop(self, bp: Breakpoint) -> Stop:
        if bp.number == 0:
            return self._make_stop("step", f"reached {bp.spec}")
        if bp.temporary:
            self.breakpoints.pop(bp.number, None)
        label = "Temporary breakpoint" if bp.temporary else "Breakpoint"
        return self._make_stop("breakpoint", f"{label} {bp.number}, {bp.spec}", bp.number)

    def _run_whole(self, node: PlanNode) -> Stop | None:
        """Run one node through the runtime and move past it; check watches and NaN.

        Returns a Stop when something fired. If the node is a kernel, the exact
        instruction is found by replaying it in the interpreter from its start.
        """
        snap = self._snapshot(node)
        t = time.perf_counter()
        try:
            self.machine.run_node(node)
        except Interrupted as e:
            self._restore(snap)  # the node is undone: the cursor stays before it
            return self._make_stop("interrupted", f"interrupted by the user ({e.message})")
        except (FirFault, BudgetExceeded) as e:
            self._restore(snap)
            if node.kind == "micro" and isinstance(e, FirFault):
                # Re-run it in the interpreter and stop on the faulting instruction.
                self._enter_dispatch(node)
                stop = self._drive()
                if stop is not None:
                    return stop
                self._complete_dispatch()  # the interpreter did not fault: engines disagree
                return self._make_stop("fault", f"{e} (the interpreter ran this node without "
                                                "a fault: please report)")
            return self._make_stop("fault" if isinstance(e, FirFault) else "budget", str(e))
        self.node_times[node.index] = time.perf_counter() - t
        changes = self._diff(snap)
        watches = self._watches_changed()
        nan = self._nan_after_node(changes)
        if (watches or nan) and node.kind == "micro":
            self._restore(snap)
            self._enter_dispatch(node)
            stop = self._drive()
            if stop is not None:
                return stop
            self._complete_dispatch()
            return None
        self._push(_Record("node", self.step, node.index, changes))
        self._observe(node)
        self._advance_node()
        for bp in watches:
            old = bp.old
            new = self.arena[bp.watch_start: bp.watch_stop].copy()
            bp.old = new
            if self._hit(bp):
                return self._make_stop("watchpoint", self._watch_message(bp, old, new, node),
                                       bp.number, old, new)
        if nan:
            return self._make_stop("nan", nan)
        return None

    def _observe(self, node: PlanNode) -> None:
        if node.layer is not None:
            for a, b in self._write_regions(node):
                name = self._region_names.get(a)
                if name is not None:
                    self.layer_values[(name, node.layer)] = (self.step, node.index,
                                                             self.arena[a:b].copy())
        for f in self.node_observers:
            f(self, node)

    @property
    def _region_names(self) -> dict[int, str]:
        """Arena base -> buffer name, for buffers shared by all layers."""
        names = getattr(self, "_shared_names", None)
        if names is None:
            m = self.model
            names = {m.regions[n].base: n for n, d in m.buffers.items() if not d.per_layer}
            self._shared_names = names
        return names

    def _watches_changed(self) -> list[Breakpoint]:
        out = []
        for bp in self.breakpoints.values():
            if bp.kind == "watch" and bp.enabled:
                new = self.arena[bp.watch_start: bp.watch_stop]
                if not np.array_equal(bp.old.view(np.uint32), new.view(np.uint32)):
                    out.append(bp)
        return out

    def _nan_after_node(self, changes) -> str | None:
        if not any(bp.kind == "nan" and bp.enabled for bp in self.breakpoints.values()):
            return None
        node = self.nodes[self.node_index]
        for c in changes:
            vals = self.arena[c.base + c.index]
            bad = ~np.isfinite(vals)
            if bad.any():
                addr = int(c.base + c.index[np.flatnonzero(bad)[0]])
                return (f"node {node.full_name} wrote {float(self.arena[addr])!r} to "
                        f"{self._name_address(addr)}")
        return None

    def _name_address(self, addr: int) -> str:
        for name, r in self.model.regions.items():
            if r.base <= addr < r.base + r.size:
                return f"{name}[{addr - r.base}]"
        return f"arena[{addr}]"

    def _watch_message(self, bp, old, new, node) -> str:
        diff = np.flatnonzero(old.view(np.uint32) != new.view(np.uint32))
        i = int(diff[0]) if diff.size else 0
        start = bp.watch_start - self.model.regions[bp.watch_name].base
        return (f"Watchpoint {bp.number}: {bp.spec} changed at {node.full_name} "
                f"({diff.size} element{'s' if diff.size != 1 else ''}; first "
                f"{bp.watch_name}[{start + i}]: {float(old[i])!r} -> {float(new[i])!r})")

    def _drive(self, limit: int | None = None, skip_first_line: bool = False,
               extra: Breakpoint | None = None) -> Stop | None:
        """Interpret the live dispatch until it ends (None) or something stops it."""
        d = self.dispatch
        node = self.nodes[self.node_index]
        lines = self.line_breakpoints(node.target)
        if extra is not None and extra.kind == "line" and extra.kernel == node.target:
            lines = dict(lines)
            lines.setdefault(extra.line, []).append(extra)
        watches = [bp for bp in self.breakpoints.values() if bp.kind == "watch" and bp.enabled]
        nan_on = any(bp.kind == "nan" and bp.enabled for bp in self.breakpoints.values())
        budget = self.machine.budget
        stored: list = []
        d.store_hook = (lambda disp, where, values: stored.append((where, values))) \
            if (watches or nan_on) else None
        n = 0
        try:
            while not d.done:
                op = d.ops[d.pc]
                if limit is not None and n >= limit:
                    return None
                if lines and op.loc.line in lines and not (skip_first_line and n == 0):
                    for bp in lines[op.loc.line]:
                        if self._hit(bp):
                            return self._bp_stop(bp)
                if n & 1023 == 0 and self.cancel.is_set():
                    return self._make_stop("interrupted", "interrupted by the user")
                if budget is not None and d.steps >= budget:
                    d.over_budget(budget)
                stored.clear()
                d.step()
                n += 1
                if nan_on:
                    msg = self._nan_after_instruction(d, op, stored)
                    if msg:
                        return self._make_stop("nan", msg)
                if watches and stored:
                    for bp in watches:
                        new = self.arena[bp.watch_start: bp.watch_stop]
                        if not np.array_equal(bp.old.view(np.uint32), new.view(np.uint32)):
                            old = bp.old
                            bp.old = new.copy()
                            if self._hit(bp):
                                return self._make_stop(
                                    "watchpoint", self._watch_message(bp, old, new, node) +
                                    f" by line {op.loc.line}: {op.text}", bp.number, old,
                                    new.copy())
        except FirFault as f:
            return self._make_stop("fault", str(f))
        except BudgetExceeded as e:
            return self._make_stop("budget", str(e))
        finally:
            d.store_hook = None
        return None

    def _nan_after_instruction(self, d: Dispatch, op, stored) -> str | None:
        for where, values in stored:
            bad = ~np.isfinite(values)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                addr = int(np.asarray(where).reshape(-1)[i])
                return (f"line {op.loc.line} ({op.text}) wrote {float(values.reshape(-1)[i])!r} "
                        f"to {self._name_address(addr)}")
        if op.spec.is_control:
            return None
        for file, idx in op.spec.writes:
            if file != "R":
                continue
            reg = op.args[idx]
            vals = d.R[reg]
            bad = ~np.isfinite(vals) & d.mask
            if bad.any():
                lane = int(np.flatnonzero(bad)[0])
                return (f"line {op.loc.line} ({op.text}) wrote {float(vals[lane])!r} to R{reg} "
                        f"in lane {lane}")
        return None

    def _end_message(self) -> str:
        return f"end of generation after {self.step} steps"

    # -- reverse ----------------------------------------------------------------
    def _reverse_node(self) -> Stop:
        if self.dispatch is not None:
            self._restore(self._node_before)
            self.dispatch = None
            self._node_before = None
            self._refresh_watches()
            return self._make_stop("step", "")
        # Token bookkeeping is only undone on the way to a node: with no node left in
        # the (possibly truncated) history, stay where we are.
        while self.history and any(r.kind == "node" for r in self.history):
            rec = self.history.pop()
            self._undo(rec)
            if rec.kind == "node":
                self._refresh_watches()
                return self._make_stop("step", "")
        return self._make_stop("history", "no more reverse-execution history" +
                               (" (older history was dropped to stay within the memory budget)"
                                if self.history_truncated else ""))

    def _reverse_instruction(self) -> Stop:
        d = self.dispatch
        if d is not None and d.steps > 0:
            self._replay_current(d.steps - 1)
            return self._make_stop("step", "")
        stop = self._reverse_node()
        if stop.reason != "step":
            return stop
        node = self.nodes[self.node_index]
        if node.kind == "ext":
            return stop
        # Back into the previous kernel: run it once to count, then replay one fewer.
        self._enter_dispatch(node)
        snap = self._node_before
        self.dispatch.run()
        total = self.dispatch.steps
        self._restore(snap)
        self._replay_current(total - 1)
        return self._make_stop("step", "")

    def _replay_current(self, steps: int) -> None:
        node = self.nodes[self.node_index]
        snap = self._node_before
        self._restore(snap)
        d = self.machine.dispatch(node)
        d.line_counts = np.zeros(len(d.ops), dtype=np.int64)
        for _ in range(steps):
            d.step()
        self.dispatch = d
        self._refresh_watches()
