"""Running a model under the sanitizer: which nodes to instrument, and how.

:class:`Sanitizer` attaches to a :class:`~firscope.runtime.Machine`: it takes
the machine's kernel runner (so every micro node passes through
:meth:`Sanitizer.run_kernel`) and adds node hooks (ext ops' reads and writes
for initcheck). For each micro node it decides from the kernel's static
facts (:mod:`.facts`) and the init shadow whether anything can be found:

* nothing (racecheck: lanes proven disjoint; memcheck: every access proven in
  bounds; initcheck: every region the kernel reads or writes already fully
  written): the node runs on the machine's own engine, compiled where it is,
  untouched;
* else the step interpreter runs it with a :class:`DispatchChecker` watching
  every memory instruction and, with memcheck, out-of-bounds accesses skipped
  (a skipped load reads 0) instead of faulting. A dispatch that meets a race
  nobody reported yet is re-run in other lane orders (:mod:`.confirm`).
"""
from __future__ import annotations

import re
import time

from ..errors import BudgetExceeded, FirError, FirFault
from ..runtime import Model
from ..runtime.machine import DEFAULT_BUDGET, Machine
from ..vm.interp import Dispatch, Observer
from .checker import Collector, DispatchChecker, Event
from .confirm import reorder_outcome
from .facts import KernelFacts, facts_of
from .findings import ALL_TOOLS, Finding, Site, Tool
from .report import KernelStatus, SanitizeReport
from .shadow import InitShadow, RaceShadow
from ..runtime import NodeKind


class _Watch(Observer):
    """The interpreter loop's view for a sanitized dispatch: every memory instruction."""

    wants_before = True

    def __init__(self, checker: DispatchChecker, memcheck: bool):
        self.checker = checker
        self.wanted = checker.wanted
        self.events: list[Event] = []
        self.wants_memcheck = memcheck  # out-of-bounds accesses reported and skipped

    def memcheck(self, d, op, addr, indices, lanes) -> None:
        self.checker.memcheck(d, op, addr, indices, lanes)

    def before(self, d, op) -> bool:
        if self.wanted[op.pc]:
            found = self.checker.check(d, op)
            if found:
                self.events += found
        return False


class _Runner:
    """Stands in for the machine's kernel runner; keeps the engine's own for fast nodes."""

    def __init__(self, sanitizer: "Sanitizer", inner):
        self.sanitizer = sanitizer
        self.inner = inner

    def run(self, node, arena, budget=None, stop=None) -> None:
        self.sanitizer.run_kernel(node, arena, budget, stop, self.inner)

    def warmup(self, progress=None) -> None:
        if self.inner is not None:
            self.inner.warmup(progress)


class Sanitizer:
    def __init__(self, model: Model, tools=ALL_TOOLS):
        self.model = model
        self.tools = frozenset(tools)
        self.init = InitShadow(model) if Tool.INIT in self.tools else None
        self.race = RaceShadow()
        self.collector = Collector()
        self._facts: dict[int, KernelFacts] = {}
        self.dispatches = 0  # micro nodes run
        self.instrumented = 0  # of which through the instrumented interpreter
        self.seconds = 0.0
        self._run = 0  # node runs so far (ext and micro): which run a finding was seen in
        self._machine: Machine | None = None
        self._inner = None

    # -- attaching -------------------------------------------------------------------------
    def attach(self, machine: Machine) -> "Sanitizer":
        """Watch ``machine``'s nodes. A machine with per-instruction hooks steps every kernel
        itself, past the kernel runner: the sanitizer would see none of them."""
        if machine.hooks.per_instruction:
            raise FirError("the sanitizer cannot watch a machine with per-instruction hooks "
                           "(a line-counting profiler): give it a machine of its own")
        self._machine = machine
        self._inner = machine.kernel_runner
        machine.kernel_runner = _Runner(self, self._inner)
        machine.hooks.before_node.append(self._before_node)
        machine.hooks.after_node.append(self._after_node)
        return self

    def detach(self) -> None:
        m = self._machine
        if m is None:
            return
        m.kernel_runner = self._inner
        m.hooks.before_node.remove(self._before_node)
        m.hooks.after_node.remove(self._after_node)
        self._machine = None

    def facts(self, node) -> KernelFacts:
        f = self._facts.get(node.index)
        if f is None:
            f = self._facts[node.index] = facts_of(node.program)
        return f

    @property
    def step(self) -> int:
        return self._machine.position if self._machine is not None else 0

    # -- ext nodes ---------------------------------------------------------------------------
    def _before_node(self, machine, node) -> None:
        self._run += 1
        if node.kind != NodeKind.EXT or self.init is None:
            return
        if node.target == "fir.embedding":
            ids = node.args[0].region  # the op reads ids[0] and a row of a weight
            reads = [(ids, ids.base, ids.base + 1)]
        else:
            x = node.args[0].region
            reads = [(x, x.base, x.stop)]
        for region, a, b in reads:
            if self.init.full(region):
                continue
            missing = [i for i in range(a, b) if i < self.init.span and not self.init.written[i]]
            if missing:
                self._ext_uninit(node, region, missing)

    def _ext_uninit(self, node, region, missing: list[int]) -> None:
        loc = node.loc
        s = Site(loc.path, loc.line, _token_col(loc.text, node.args[0].name, loc.col),
                 loc.text, None, "read")
        f = Finding(Tool.INIT, "uninitialized read", None, node.full_name, node.index,
                    self.step, (s,), region.name, missing[0] - region.base, region.size)
        self.collector.add(Event(f.key, len(missing), -1, f), self._run)

    def _after_node(self, machine, node, seconds) -> None:
        if node.kind == NodeKind.EXT and self.init is not None:
            for o in node.outs:
                self.init.mark_region(o.region)

    # -- micro nodes -----------------------------------------------------------------------
    def needs(self, node) -> tuple[bool, bool, bool]:
        """(race, mem, init): which checks can find something in this dispatch now."""
        f = self.facts(node)
        race = Tool.RACE in self.tools and bool(f.race_regions)
        mem = Tool.MEM in self.tools and not f.memory_proven
        init = self.init is not None and not all(self.init.full(r) for r in f.loads + f.stores)
        return race, mem, init

    def run_kernel(self, node, arena, budget, stop, inner) -> None:
        t = time.perf_counter()
        self.dispatches += 1
        race, mem, init = self.needs(node)
        try:
            if not (race or mem or init):
                if inner is not None:
                    inner.run(node, arena, budget, stop=stop)
                else:
                    Dispatch(node.program, arena).run(budget, stop=stop)
                return
            self.instrumented += 1
            self._instrumented(node, arena, budget, stop, race)
        finally:
            self.seconds += time.perf_counter() - t

    def _instrumented(self, node, arena, budget, stop, race: bool) -> None:
        program = node.program
        f = self.facts(node)
        checker = DispatchChecker(node, self.step, race=self.race if race else None,
                                  race_bases=f.race_regions if race else frozenset(),
                                  init=self.init)
        before = None
        if race:
            before = [(r.base, arena[r.base: r.stop].copy()) for r in f.stores]
        d = Dispatch(program, arena)
        watch = _Watch(checker, Tool.MEM in self.tools)
        new_races = []
        try:
            d.run(budget, stop, observer=watch)
        finally:  # a fault the tools do not cover ends the run: keep what came before it
            for event in watch.events + checker.out_of_bounds:
                if self.collector.add(event, self._run) and event.finding.tool is Tool.RACE:
                    new_races.append(event.key)
        if new_races and before is not None:
            outcome = reorder_outcome(program, arena, before, budget)
            for key in new_races:
                self.collector.confirm(key, outcome)

    # -- results ---------------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        return self.collector.findings()

    def kernel_status(self) -> list[KernelStatus]:
        """Per kernel the model dispatches: proven race-free, or checked at run time and why."""
        out: dict[str, KernelStatus] = {}
        for node in self.model.nodes:
            if node.kind != NodeKind.MICRO:
                continue
            f = self.facts(node)
            old = out.get(node.target)
            reason = f.race_reason()
            if old is None:
                out[node.target] = KernelStatus(node.target, f.race_free, reason,
                                                f.memory_proven, 1)
            else:
                out[node.target] = KernelStatus(
                    node.target, old.race_free and f.race_free, old.reason or reason,
                    old.memory_proven and f.memory_proven, old.nodes + 1)
        return list(out.values())

    def report(self, **meta) -> SanitizeReport:
        return SanitizeReport(tuple(sorted(self.tools)), tuple(self.findings()),
                              tuple(self.kernel_status()), self.dispatches, self.instrumented,
                              dict(meta))


def check_dispatch(node, arena, budget: int | None, step: int = 0) -> list[Finding]:
    """Run ``node``'s kernel once on ``arena`` on the step interpreter, watched for races and
    out-of-bounds accesses (skipped and reported, as ``firscope sanitize`` does): a node run
    on its own inputs (an edited kernel replayed, firscope/edit). A fault the tools do not
    cover (a runaway loop) propagates after what was found before it is kept."""
    from ..vm.runaway import runaway_stop
    if budget is not None and runaway_stop(node.program, max(budget, 0)) is not None:
        # a certain runaway: the plain interpreter names it at once, without running it
        Dispatch(node.program, arena).run(budget)
    f = facts_of(node.program)
    checker = DispatchChecker(node, step, race=RaceShadow(), race_bases=f.race_regions)
    watch = _Watch(checker, True)
    collector = Collector()
    try:
        Dispatch(node.program, arena).run(budget, observer=watch)
    finally:
        for event in watch.events + checker.out_of_bounds:
            collector.add(event, 0)
    return collector.findings()


def _token_col(text: str, name: str, default: int) -> int:
    """1-based column of the argument ``name`` on a node line (after ``ext OP``)."""
    for i, m in enumerate(re.finditer(r"\S+", text)):
        if i >= 4 and m.group() == name:
            return m.start() + 1
    return default


def sanitize_run(model: Model, prompt: list[int], n: int, *, tools=ALL_TOOLS,
                 engine: str = "compiled", budget: int | None = DEFAULT_BUDGET
                 ) -> tuple[SanitizeReport, list[int]]:
    """Decode ``prompt`` + ``n`` greedy tokens from a reset machine under the sanitizer.
    Returns the report and the generated ids."""
    machine = Machine(model, engine=engine, budget=budget)
    machine.reset()
    sanitizer = Sanitizer(model, tools).attach(machine)
    t = time.perf_counter()
    generated, stopped = [], None
    try:
        generated, _ = machine.generate(prompt, n)
    except (FirFault, BudgetExceeded) as e:
        # A fault the tools do not cover (an rtou of a negative value; an out-of-bounds
        # access without memcheck) or a runaway loop ends the run: what was found stays.
        stopped = str(e)
    finally:
        sanitizer.detach()
    seconds = time.perf_counter() - t
    report = sanitizer.report(steps=len(machine.history), engine=engine, seconds=seconds,
                              model=str(model.path), stopped=stopped)
    return report, generated


def run_sanitize(source, *, n: int, engine: str = "compiled", tools=ALL_TOOLS,
                 as_json: bool = False, out=None) -> int:
    """``firscope sanitize``: open, run under the sanitizer, print the report.
    Exit status 1 when anything was found (CI), else 0."""
    import sys
    from ..runtime.opening import check_steps
    out = out or sys.stdout
    check_steps(n)
    opened = source.open()
    report, _ = sanitize_run(opened.model, list(opened.ids), n, tools=tools, engine=engine)
    out.write(report.json_text() if as_json else report.text() + "\n")
    return 1 if report.failed else 0
