"""Collecting a profile from a running :class:`~firscope.runtime.Machine`, through its hooks.

:class:`Profiler` attaches to any machine (a CLI run, or the debugger's
session machine) and records per node per token timings, attention
probabilities, and, when ``count_lines`` is set, per kernel line execution
counts and active lanes. Counting lines adds an ``on_dispatch`` hook, which
makes the machine step kernels instruction by instruction on the
interpreter; time such a run separately from the timed one.

Token boundaries are inferred from the nodes themselves (node 0 starts a
step, the last node ends it), so a session stepping node by node is
profiled the same way as a plain :meth:`Machine.step`. Nodes that do not
pass through :meth:`Machine.run_node` (a debugger single-stepping a kernel
through :meth:`Machine.dispatch`) have no time (-1) in their step.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from ..cost.record import geometry, kernel_shape
from ..runtime import Model, PlanNode
from ..runtime.machine import Hooks, Machine
from .data import (SIMD_WIDTH, AttentionMaps, InstructionProfile,
                   NodeInstructions, ProfileData, TokenTiming)
from .progress import Progress, Silent
from .sites import find_attention_sites  # noqa: F401 - defined there, named here as before
from ..runtime import NodeKind

ATTENTION_MAX_TOKENS = 64  # rows kept per attention site (the report's heatmaps)
PROBABILITY_TOLERANCE = 1e-3  # a softmax row must sum to 1 within this


def buffer_slices(model: Model) -> list[tuple[int, int]]:
    return [(r.base, r.base + r.size) for r in model.buffer_regions()]


@contextmanager
def preserved_state(model: Model) -> Iterator[None]:
    """Run something on ``model``'s arena, then put every buffer back as it was.

    The debugger's session shares the model's arena: an extra run for a
    report must not change what the session shows (its KV cache, x, ...).
    """
    saved = [(a, b, model.arena[a:b].copy()) for a, b in buffer_slices(model)]
    try:
        yield
    finally:
        for a, b, data in saved:
            model.arena[a:b] = data


def make_machine(model: Model, engine: str, hooks: Hooks | None = None) -> tuple[Machine, str]:
    """A machine on ``engine``; the interpreter when the compiled engine is not installed."""
    try:
        return Machine(model, engine=engine, hooks=hooks), engine
    except ImportError:
        if engine != "compiled":
            raise
        return Machine(model, engine="interp", hooks=hooks), "interp"


class Profiler:
    """Per node per token timings (and optionally line counts and attention) via hooks.

    ``attach(machine)`` appends the hooks, ``detach(machine)`` removes them.
    ``data()`` returns a :class:`ProfileData` of what was collected so far;
    ``fill(data)`` adds it to an existing one.
    """

    def __init__(self, model: Model, *, timing: bool = True, count_lines: bool = False,
                 attention: bool = True, attention_max_tokens: int = ATTENTION_MAX_TOKENS):
        self.model = model
        self.n_nodes = len(model.nodes)
        self.timing = timing
        self.count_lines = count_lines
        self.origin_ns: int | None = None
        self.tokens: list[TokenTiming] = []
        self._open: TokenTiming | None = None
        self._start_ns = 0
        self.attention_max_tokens = attention_max_tokens
        self.attention = {s.node: AttentionMaps(s) for s in find_attention_sites(model)} \
            if attention else {}
        self.dropped_sites: list[str] = []  # sites whose rows were not probabilities
        self.instructions = InstructionProfile("interp", []) if count_lines else None
        self._dispatch = None
        self._lane_acc: np.ndarray | None = None
        self._hooks: list[tuple[str, object]] = []

    # -- hooks ----------------------------------------------------------------------
    def attach(self, machine: Machine) -> "Profiler":
        h = machine.hooks
        pairs = [("before_node", self._before_node), ("after_node", self._after_node)]
        if self.count_lines:
            pairs += [("on_dispatch", self._on_dispatch),
                      ("before_instruction", self._before_instruction)]
        for name, fn in pairs:
            getattr(h, name).append(fn)
        self._hooks = pairs
        return self

    def detach(self, machine: Machine) -> None:
        for name, fn in self._hooks:
            hooks = getattr(machine.hooks, name)
            for i, x in enumerate(hooks):
                if x == fn:
                    del hooks[i]
                    break
        self._hooks = []

    def _before_node(self, machine: Machine, node: PlanNode) -> None:
        now = time.perf_counter_ns()
        if self.origin_ns is None:
            self.origin_ns = now
        op = self._open
        if op is not None and op.position != machine.position and op.ran.any():
            # The previous step ended without its last node passing through run_node (a
            # debugger stepped into it instruction by instruction): keep it, partial.
            if self.timing:
                self.tokens.append(op)
        if op is None or op.position != machine.position or (node.index == 0 and op.ran.any()):
            # A new step, or the same step run again from its first node (a reverse step
            # in the debugger): then the unfinished record of that step is replaced.
            token = machine.current_token if machine.current_token is not None else -1
            self._open = TokenTiming(len(self.tokens), int(token), int(machine.position),
                                     np.full(self.n_nodes, -1, dtype=np.int64),
                                     np.full(self.n_nodes, -1, dtype=np.int64))
            if self.instructions is not None and (op is None or op.position != machine.position):
                self.instructions.tokens.append(int(token))
        self._start_ns = now - self.origin_ns

    def _after_node(self, machine: Machine, node: PlanNode, seconds: float) -> None:
        op = self._open
        if op is None:
            return
        if self.timing:
            op.node_start_ns[node.index] = self._start_ns
            op.node_ns[node.index] = int(round(seconds * 1e9))
        if self.count_lines and node.kind == NodeKind.MICRO:
            self._harvest(node)
        if node.index in self.attention:
            self._capture(machine, node)
        if node.index == self.n_nodes - 1:
            if self.timing:
                self.tokens.append(op)
            self._open = None

    def _on_dispatch(self, machine: Machine, node: PlanNode, dispatch) -> None:
        dispatch.line_counts = np.zeros(len(dispatch.ops), dtype=np.int64)
        self._dispatch = dispatch
        self._lane_acc = np.zeros(len(dispatch.ops), dtype=np.int64)
        self._warp_acc = np.zeros(len(dispatch.ops), dtype=np.int64)
        tg, _ = kernel_shape(self.model, node.program)
        _, self._n_warps, warp_of = geometry(dispatch.lanes, tg, SIMD_WIDTH)
        self._warp_starts = np.flatnonzero(np.r_[True, warp_of[1:] != warp_of[:-1]]) \
            if dispatch.lanes else None

    def _before_instruction(self, dispatch, op) -> None:
        if dispatch is self._dispatch:
            if dispatch.full:
                self._lane_acc[op.pc] += dispatch.lanes
                self._warp_acc[op.pc] += self._n_warps
            else:
                self._lane_acc[op.pc] += int(np.count_nonzero(dispatch.mask))
                self._warp_acc[op.pc] += int(np.count_nonzero(
                    np.logical_or.reduceat(dispatch.mask, self._warp_starts)))

    def _harvest(self, node: PlanNode) -> None:
        d = self._dispatch
        if d is None or d.program is not node.program:
            return
        ni = self.instructions.nodes.get(node.index)
        if ni is None:
            n = len(d.ops)
            ni = NodeInstructions(node.index, node.target, d.lanes, 0, 0, 0,
                                  np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
                                  np.zeros(n, dtype=np.int64))
            self.instructions.nodes[node.index] = ni
        ni.dispatches += 1
        ni.steps += d.steps
        ni.lane_steps += d.lane_steps
        ni.line_counts += d.line_counts
        ni.lane_counts += self._lane_acc
        ni.warp_counts += self._warp_acc
        self._dispatch = None

    def _capture(self, machine: Machine, node: PlanNode) -> None:
        maps = self.attention[node.index]
        if len(maps.rows) >= self.attention_max_tokens:
            return
        s = maps.site
        pos = machine.position
        if pos >= s.n_positions:
            return
        base = s.base
        block = machine.arena[base: base + s.n_head * s.n_positions].reshape(s.n_head,
                                                                             s.n_positions)
        rows = block[:, : pos + 1].astype(np.float32, copy=True)
        sums = rows.astype(np.float64).sum(axis=1)
        if not (np.isfinite(rows).all() and (rows >= 0).all()
                and np.all(np.abs(sums - 1) < PROBABILITY_TOLERANCE)):
            del self.attention[node.index]
            self.dropped_sites.append(s.full_name)
            return
        if maps.positions and maps.positions[-1] == pos:
            maps.rows[-1] = rows  # the same step run again
        else:
            maps.positions.append(pos)
            maps.rows.append(rows)

    # -- results ----------------------------------------------------------------------
    def fill(self, data: ProfileData) -> ProfileData:
        if self.timing:
            data.tokens = list(self.tokens)
        if self.instructions is not None:
            data.instructions = self.instructions
        if self.attention:
            data.attention = [m for _, m in sorted(self.attention.items()) if m.rows]
        if self.dropped_sites:
            data.meta.setdefault("notes", []).append(
                "attention not shown for " + ", ".join(self.dropped_sites) +
                ": the buffer did not hold probabilities")
        return data

    def data(self, **meta) -> ProfileData:
        return self.fill(ProfileData.for_model(self.model, **meta))


def run_instrumented(model: Model, tokens: list[int], *,
                     progress: Progress | None = None) -> InstructionProfile:
    """Run ``tokens`` from position 0 on the step interpreter, counting every kernel line.

    The model's buffers are restored afterwards.
    """
    progress = progress or Silent()
    prof = Profiler(model, timing=False, count_lines=True, attention=False)
    with preserved_state(model):
        machine = Machine(model, engine="interp", hooks=Hooks())
        prof.attach(machine)
        machine.reset()
        progress.phase("instrumented run (interp, line counts)", len(tokens))
        for i, t in enumerate(tokens):
            machine.step(t)
            progress.tick(i + 1)
        progress.end()
    return prof.instructions
