"""The debugger against a dump (issue 13): ``--against``, ``break diverge``, ``info diff``.

:func:`attach_reference` opens a dump for a session, which compares every
node's outputs with it as it runs them (``session.reference``, an
:class:`~firscope.compare.attached.AttachedDump`).
``break diverge [RTOL [ATOL] | ulp N]`` is a :class:`DivergeCheck`, a
:class:`~firscope.debug.breakpoints.NodeCheck`: it stops after the first node
whose output diverges, focused on the lane that wrote the element shown.
From that stop, ``s`` (:func:`step_into`) goes back to the start of the
diverging node and steps into its kernel on that lane, where comparing the
lanes' registers leads to the bug.

The writing lane is found by replaying the node alone from its start: the
start values of the regions it touches are the arena now with the undo log's
records back to that node undone (as ``history BUF[i]`` does).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..compare.attached import AttachedDump
from ..compare.dumpfile import Dump
from ..compare.lanes import program_regions, writers
from ..compare.lockstep import OutputResult
from ..compare.metrics import Tolerance, make_tolerance
from ..compare.report import where_text
from ..errors import FirError
from ..model.checkpoint import shown
from .breakpoints import NodeCheck
from .history import RecordKind
from .snapshot import StopReason


@dataclass(frozen=True)
class Divergence:
    """Where a ``break diverge`` stop happened, for ``s`` to step back into the node."""

    breakpoint: int
    step: int
    node: int
    lane: int | None
    at: tuple[int, int]  # the session's cursor at the stop
    result: OutputResult


def attach_reference(session, path, tolerance: Tolerance | None = None, *,
                     isolate: bool = False) -> AttachedDump:
    """Compare every node ``session`` runs from now on with the dump at ``path`` (or the
    :class:`Dump` already open there); ``isolate``: also judge each on its own (from the
    dump's inputs) and show that."""
    dump = path if isinstance(path, Dump) else Dump(path)
    ref = AttachedDump(session.model, dump, session.total_steps, tolerance)
    ref.isolate = ref.view_own = isolate
    session.attach_reference(ref)
    return ref


@dataclass(frozen=True, kw_only=True)
class DivergeCheck(NodeCheck):
    """Stops after a node whose output diverges from the attached dump."""

    tolerance: Tolerance
    isolate: bool = False  # stop after a node wrong on its own (run from the dump's inputs)

    def fired(self, session, node) -> str | None:
        ref = session.reference
        if ref is None or ref.last is None or ref.last[1] != node.index:
            return None
        if self.isolate:
            return self._fired_own(session, node, ref)
        step = ref.last[0]
        results = ref.results.get(ref.last, ())
        if results and self.tolerance != ref.tolerance:
            results = ref.compare(step, node, session.sequence[step], self.tolerance)
        bad = next((r for r in results if r.diff.diverged), None)
        if bad is None:
            return None
        lane = None
        if bad.micro and bad.diff.index is not None:
            bad = _with_writer(session, node, step, bad)
            lane = bad.writer.lane if bad.writer is not None else None
            if self.tolerance == ref.tolerance:  # info diff and the UI show the lane too
                ref.results[ref.last] = tuple(bad if r.buffer == bad.buffer else r
                                              for r in results)
        session.diverged_at = Divergence(self.number, step, node.index, lane, session.cursor,
                                         bad)
        return divergence_message(bad)

    def _fired_own(self, session, node, ref) -> str | None:
        step = ref.last[0]
        results = ref.own.get(ref.last, ())
        if results and self.tolerance != ref.tolerance:
            results = ref.judge(step, node, session.sequence[step], session.machine,
                                self.tolerance)
        bad = next((r for r in results if r.diff.diverged), None)
        if bad is None:
            return None
        lane = bad.writer.lane if bad.writer is not None else None
        # 's' from here would step through the session's own inputs, not the dump's: no jump
        session.diverged_at = None
        ref.own_lane[self.number] = lane
        return own_message(bad, ref.dump.path)

    def focus_lane(self, session, node) -> int | None:
        if self.isolate:
            ref = session.reference
            return ref.own_lane.get(self.number) if ref is not None else None
        d = getattr(session, "diverged_at", None)
        return d.lane if d is not None and d.breakpoint == self.number else None


def divergence_message(r: OutputResult) -> str:
    d = r.diff
    text = (f"{r.instance} diverges from the dump at step {r.step}: {r.buffer}[{d.index}] is "
            f"{d.other_value:.7g} in the dump, {d.ref_value:.7g} here (relative L2 "
            f"{d.rel_l2:.3g})")
    if r.writer is not None:
        text += (f"\nlane {r.writer.lane} wrote it (line {r.writer.line}); "
                 f"'s' steps into {r.instance} on lane {r.writer.lane}")
    elif r.lane_looked_up:
        text += f"\n{r.instance} did not write that element at this step (an earlier value)"
    return text


def own_message(r: OutputResult, dump) -> str:
    d = r.diff
    text = (f"{r.instance} is wrong on its own at step {r.step} (run from the dump's inputs): "
            f"{r.buffer}[{d.index}] is {d.other_value:.7g} in the dump, {d.ref_value:.7g} "
            f"from its inputs (relative L2 {d.rel_l2:.3g})")
    if r.writer is not None:
        text += f"\nlane {r.writer.lane} wrote it (line {r.writer.line})"
    return (text + f"\nto step through it on those inputs: firscope capture --node "
            f"{r.instance} --step {r.step} --against {dump} -o CASE, then firscope debug "
            "CASE/gpt2.fir")


def parse_diverge(session, text: str) -> DivergeCheck:
    """``diverge [--isolate]``, ``diverge RTOL``, ``diverge RTOL ATOL``, ``diverge ulp N``."""
    ref = session.reference
    if ref is None:
        raise FirError("break diverge needs a dump: start the debugger with --against DUMP")
    words = text.split()[1:]
    isolate = "--isolate" in words
    words = [w for w in words if w != "--isolate"]
    try:
        if not words:
            tol = ref.tolerance
        elif words[0] == "ulp" and len(words) == 2 and re.fullmatch(r"[0-9]{1,9}", words[1]):
            tol = make_tolerance(ulp=int(words[1]))
        elif len(words) <= 2 and all(_is_number(w) for w in words):
            tol = make_tolerance(float(words[0]), float(words[1]) if len(words) > 1 else None)
        else:
            raise ValueError(f"cannot read {' '.join(words)!r}")
    except ValueError as e:
        raise FirError(f"break diverge [--isolate] [RTOL [ATOL] | ulp N]: {e}") from None
    if isolate:
        ref.isolate = True  # judge every node from now on
        return DivergeCheck(spec=f"diverge --isolate ({tol.describe()})", tolerance=tol,
                            isolate=True)
    return DivergeCheck(spec=f"diverge ({tol.describe()})", tolerance=tol)


def _is_number(word: str) -> bool:
    return re.fullmatch(r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]{1,3})?", word) is not None


# -- the writing lane, from the undo log ----------------------------------------------------
def _with_writer(session, node, step: int, r: OutputResult) -> OutputResult:
    start = node_start_values(session, node, step)
    if start is None:  # the undo log no longer reaches back to this node
        return r
    address = node.outs[_out_index(node, r.buffer)].region.base + r.diff.index
    found = writers(node.program, start, [address], session.machine.budget)
    return replace(r, writer=found[address], lane_looked_up=True)


def _out_index(node, buffer: str) -> int:
    return next(i for i, o in enumerate(node.outs) if o.name == buffer)


def node_start_values(session, node, step: int):
    """The kernel's regions as they were when ``node`` started at ``step`` (it has just
    completed): the arena now, with every record back to and including the node's undone."""
    regions = program_regions(node.program)
    vals = {r.base: session.arena[r.base: r.stop].copy() for r in regions}
    for rec in reversed(session.history.records):
        for c in rec.changes:
            addr = c.base + c.index
            for r in regions:
                inside = (addr >= r.base) & (addr < r.stop)
                if inside.any():
                    vals[r.base][addr[inside] - r.base] = c.old[inside]
        if rec.kind is RecordKind.NODE and (rec.step, rec.node) == (step, node.index):
            return vals
    return None


# -- s from a divergence stop ------------------------------------------------------------------
def step_into(ci):
    """From a ``break diverge`` stop: back to the diverging node's start and one instruction
    into its kernel on the lane that wrote the element; None when not at such a stop."""
    s = ci.s
    d = getattr(s, "diverged_at", None)
    stop = ci.last.stop
    if (d is None or d.lane is None or stop.reason is not StopReason.BREAKPOINT
            or stop.breakpoint != d.breakpoint or s.cursor != d.at or s.dispatch is not None):
        return None
    s.diverged_at = None
    back = s.goto((d.step, d.node), lane=d.lane)
    if back.reason is not StopReason.STEP:
        return back  # e.g. the undo log no longer reaches that node
    stop = s.stepi(1, lane=d.lane)
    r = d.result
    head = (f"stepped into {r.instance} at step {d.step}, focused on lane {d.lane}, which "
            f"writes {r.buffer}[{r.diff.index}]")
    return replace(stop, message=f"{head}\n{stop.message}" if stop.message else head,
                   lane=d.lane)


# -- info diff ---------------------------------------------------------------------------------
def info_diff(ci, arg: str = "") -> str:
    s = ci.s
    ref = s.reference
    if ref is None:
        raise FirError("no dump is attached: start the debugger with --against DUMP")
    if arg:
        if not re.fullmatch(r"[0-9]{1,9}", arg):
            raise FirError(f"usage: info diff [STEP], found {arg!r}")
        step = int(arg)
    else:
        step = s.step if any(k[0] == s.step for k in ref.results) else max(s.step - 1, 0)
    lines = [f"dump {ref.dump.path}: {ref.plan.outputs} outputs over {len(ref.plan.by_step)} "
             f"steps; tolerance {ref.tolerance.describe()}"]
    lines += [f"warning: {w}" for w in ref.warnings]
    if ref.mismatches:
        lines.append(f"{len(ref.mismatches)} keys match nothing in the model, e.g. "
                     f"{shown(ref.mismatches[0].key)}: {ref.mismatches[0].problem}")
    if step in ref.skipped:
        lines.append(f"step {step} not compared: {ref.skipped[step]}")
    rows = ref.step_results(step)
    lines.append(f"step {step}: {len(rows)} outputs compared so far, "
                 f"{sum(r.diff.diverged for r in rows)} diverged")
    for r in rows:
        d = r.diff
        status = "DIVERGED" if d.diverged else ("within" if not d.exact else "exact")
        lines.append(f"  {r.name:<32} max abs {d.max_abs:<10.3g} rel L2 {d.rel_l2:<10.3g} "
                     f"ULP {d.max_ulp:<11} {where_text(r):<24} {status}")
    first = ref.first_divergence()
    lines.append("first divergence so far: " + (
        f"step {first.step}, {first.name} [{first.diff.index}]: {first.diff.reason}"
        if first else "none"))
    if ref.isolate:
        lines += _own_lines(ref, step)
    return "\n".join(lines)


def _own_lines(ref, step: int) -> list[str]:
    """``info diff`` with ``--isolate``: each node's own error at ``step``."""
    keys = sorted(k for k in ref.own if k[0] == step)
    rows = [r for k in keys for r in ref.own[k]]
    wrong = sorted({r.instance for r in rows if r.diff.diverged})
    lines = [f"on their own (run from the dump's inputs), step {step}: {len(rows)} outputs, "
             f"wrong: {', '.join(wrong) if wrong else 'none'}"]
    lines += [f"  {r.name:<32} rel L2 {r.diff.rel_l2:<10.3g} "
              f"{'WRONG ON ITS OWN' if r.diff.diverged else 'ok'}" for r in rows
              if not r.diff.exact]
    missing = sorted(ref.model.nodes[n].full_name for s, n in ref.not_judged if s == step)
    if missing:
        lines.append(f"  not judged ({len(missing)}): {', '.join(missing[:8])}"
                     + (", ..." if len(missing) > 8 else ""))
    mine = ref.first_divergence(own=True)
    lines.append("first node wrong on its own so far: " + (
        f"step {mine.step}, {mine.name} [{mine.diff.index}]: {mine.diff.reason}"
        if mine else "none"))
    return lines
