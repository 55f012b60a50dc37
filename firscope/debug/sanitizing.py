"""``break race`` and ``break uninit``: the sanitizer's checks as debugger catchpoints.

A tracker holds what a catchpoint knows across dispatches and stops (the
catchpoint record itself is frozen and replaced when its counts change): the
lane analysis facts per node, the race shadow of the live dispatch, the init
shadow of the whole run, and every finding so far (the UI marks their nodes
and lines). Each time the session interprets a node the tracker wants, its
observer shows each memory instruction to a
:class:`~firscope.sanitize.DispatchChecker` *before* the instruction runs, so
the stop is on the offending instruction with the focus on the second lane
involved (the one whose access met the other's).

Race: only kernels the lane analysis cannot prove race-free are interpreted;
a stop happens once per (dispatch, line pair). Init: the shadow must know
everything written since the model was loaded. The tracker follows the
session node by node (``Session.observe_nodes``); when the session is somewhere it
did not follow it to (the catchpoint set mid-run, a jump back, ``goto``), it
replays the run up to there on a copy of the arena (the unpatched run: ``set``
patches are not replayed). A node the session is stopped inside when that
happens counts as having written all it will write, so within that one
dispatch an uninitialized read may be missed, never reported falsely.
"""
from __future__ import annotations

from ..runtime.machine import Machine
from ..sanitize import Collector, DispatchChecker, InitShadow, RaceShadow, Sanitizer, Tool
from ..sanitize.facts import KernelFacts, facts_of
from ..vm.interp import Observer
from ..runtime import NodeKind


class _Tracker:
    tool: Tool

    def __init__(self, model):
        self.model = model
        self.collector = Collector()
        self._facts: dict[int, KernelFacts] = {}
        self._dispatch = None  # the live dispatch the checker belongs to
        self._checker: DispatchChecker | None = None
        self._checked: tuple | None = None  # (dispatch, steps) last shown to the checker
        self._stopped: set = set()  # (dispatch, key) already stopped at
        self._dispatches = 0

    def facts(self, node) -> KernelFacts:
        f = self._facts.get(node.index)
        if f is None:
            f = self._facts[node.index] = facts_of(node.program)
        return f

    def findings(self):
        return self.collector.findings()

    def observer(self, session, node):
        d = session.dispatch
        if d is None:
            return None
        if d is not self._dispatch:
            self._dispatch, self._stopped = d, set()
            self._dispatches += 1
            self._checker = self.new_checker(session, node)
        return _Stopper(self, d) if self._checker is not None else None

    def new_checker(self, session, node) -> DispatchChecker | None:
        raise NotImplementedError

    def check(self, d, op):
        """The events of ``op`` (once per instruction count, however often the session
        resumes there) and the first one to stop at, if any."""
        if self._checker is None or not self._checker.wanted[op.pc]:
            return None
        at = (d, d.steps)
        if self._checked == at:
            return None
        self._checked = at
        stop = None
        for event in self._checker.check(d, op):
            self.collector.add(event, self._dispatches)
            if event.finding.tool is self.tool and (d, event.key) not in self._stopped:
                self._stopped.add((d, event.key))
                stop = stop or event
        return stop


class RaceTracker(_Tracker):
    tool = Tool.RACE

    def __init__(self, model):
        super().__init__(model)
        self.shadow = RaceShadow()

    def wants(self, session, node) -> bool:
        return node.kind == NodeKind.MICRO and bool(self.facts(node).race_regions)

    def new_checker(self, session, node):
        bases = self.facts(node).race_regions
        if not bases:
            return None
        return DispatchChecker(node, session.step, race=self.shadow, race_bases=bases)


class UninitTracker(_Tracker):
    tool = Tool.INIT

    def __init__(self, model):
        super().__init__(model)
        self.shadow: InitShadow | None = None
        self._session = None
        self._expected = None  # the cursor the session is at if nothing moved it
        self._blind = None  # a dispatch entered before the shadow knew of it

    def wants(self, session, node) -> bool:
        self.sync(session)
        if node.kind != NodeKind.MICRO:
            return False
        f = self.facts(node)
        return not all(self.shadow.full(r) for r in f.loads + f.stores)

    def new_checker(self, session, node):
        self.sync(session)
        if session.dispatch is self._blind:
            return None
        return DispatchChecker(node, session.step, init=self.shadow)

    # -- following the session -----------------------------------------------------------
    def sync(self, session) -> None:
        if self._session is not session:
            self._session = session
            session.observe_nodes(self._node_done)
            self._expected = None
        if self._expected != session.cursor:
            self.rebuild(session)

    def _node_done(self, session, node) -> None:
        if self.shadow is None or self._expected != (session.step, node.index):
            self._expected = None  # not where we followed it: rebuild on next use
            return
        if node.kind == NodeKind.EXT:
            for o in node.outs:
                self.shadow.mark_region(o.region)
        idx = node.index + 1
        self._expected = (session.step, idx) if idx < len(session.nodes) else \
            (session.step + 1, 0)

    def rebuild(self, session) -> None:
        """The init shadow of the run up to the session's cursor, from a replay."""
        step, index = session.cursor
        inside = session.dispatch is not None and session.dispatch.steps > 0
        if inside:
            index += 1  # count the live node as done: it is already running
        self.shadow = replay_shadow(self.model, session.sequence, step, index,
                                    engine=session.machine.engine)
        self._blind = session.dispatch if inside else None
        self._expected = session.cursor


def replay_shadow(model, sequence: list[int], step: int, index: int, *,
                  engine: str = "compiled") -> InitShadow:
    """What a run writes up to node ``index`` of decode step ``step``, replayed on a copy of
    the arena under initcheck (the model's own arena is not touched)."""
    if (step, index) == (0, 0):
        return InitShadow(model)
    machine = Machine(model, engine=engine)
    machine.arena = model.arena.copy()  # weights included: the kernels read them
    machine.reset()
    sanitizer = Sanitizer(model, {Tool.INIT}).attach(machine)
    for s in range(step):
        machine.step(sequence[s])
    if index:
        machine.begin_token(sequence[step])
        for node in model.nodes[:index]:
            machine.run_node(node)
    sanitizer.detach()
    return sanitizer.init


class _Stopper(Observer):
    """A catchpoint's view of one drive through a dispatch: stop before a bad access."""

    wants_before = True

    def __init__(self, tracker: _Tracker, d):
        self.tracker = tracker
        self.d = d
        self.message = ""
        self.lane: int | None = None

    def before(self, d, op) -> bool:
        if op.spec.mem is None:
            return False
        event = self.tracker.check(d, op)
        if event is None:
            return False
        f = event.finding
        kind = f" ({f.kind})" if f.tool is Tool.RACE else ""
        self.message = f"{f.tool.title.lower()}{kind}: {f.summary()}"
        self.lane = event.lane
        return True


def tracker_for(kind: str, model):
    """The tracker behind ``break race`` / ``break uninit``."""
    return RaceTracker(model) if kind == "race" else UninitTracker(model)
