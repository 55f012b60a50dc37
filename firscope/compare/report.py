"""What ``firscope diff`` prints: a table per node output, the first divergence, JSON.

The text table has one row per node output (``attention@3/attn``), worst
over the compared steps; ``--per-step`` prints one row per step instead.
The line that matters starts with ``first divergence:``. The JSON (``--json``)
has one entry per output per step and a ``first_divergence`` object or null.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ..model.checkpoint import shown
from .lockstep import DiffReport, OutputResult

MAX_LISTED = 50  # mismatching keys listed in the text report (the JSON lists all)


@dataclass(frozen=True)
class OutputSummary:
    """One node output over every compared step."""

    name: str  # "attention@3/attn"
    node: int
    steps: int
    max_abs: float
    rel_l2: float
    max_ulp: int
    shown: OutputResult | None  # the first divergence, else the first step that differed
    first_diverged: int | None  # step
    nonfinite: int

    isolated: bool = False

    @property
    def status(self) -> str:
        if self.first_diverged is not None:
            if self.isolated:
                return f"WRONG ON ITS OWN at step {self.first_diverged}"
            return f"DIVERGED at step {self.first_diverged}"
        return "within tolerance" if self.shown is not None else "exact"


def summarize(report: DiffReport) -> list[OutputSummary]:
    """Per node output, in graph order (then output order)."""
    groups: dict[str, list[OutputResult]] = {}
    for r in report.results:
        groups.setdefault(r.name, []).append(r)
    out = []
    for name, rows in groups.items():
        first_div = next((r for r in rows if r.diff.diverged), None)
        first_diff = next((r for r in rows if not r.diff.exact), None)
        out.append(OutputSummary(
            name, rows[0].node, len(rows), max(r.diff.max_abs for r in rows),
            max(r.diff.rel_l2 for r in rows), max(r.diff.max_ulp for r in rows),
            first_div or first_diff, first_div.step if first_div else None,
            sum(r.diff.nonfinite for r in rows), report.isolated))
    return sorted(out, key=lambda s: s.node)


def _g(x: float) -> str:
    return "0" if x == 0 else f"{x:.3g}"


def where_text(r: OutputResult) -> str:
    """``step 3 [64] lane 1``: the element a row points at, and who wrote it."""
    d = r.diff
    if d.index is None:
        return "-"
    text = f"step {r.step} [{d.index}]"
    if r.writer is not None:
        text += f" lane {r.writer.lane}"
    elif r.lane_looked_up:
        text += " (not written by this dispatch)"
    return text


def divergence_sentence(head: str, step: int, instance: str, output: str, diff, *,
                        token: int | None = None, writer: str = "") -> str:
    """The one wording of a first divergence (``firscope diff``, the profile's report, the
    UI's Diff tab): ``HEAD: step S[ (token T)], INSTANCE, output B, element I[WRITER]:
    REASON (relative L2 X)``."""
    at = f"step {step}" + ("" if token is None else f" (token {token})")
    return (f"{head}: {at}, {instance}, output {output}, element {diff.index}{writer}: "
            f"{diff.reason} (relative L2 {diff.rel_l2:.3g})")


def first_divergence_line(report: DiffReport) -> str:
    f = report.first_divergence
    head = "first node wrong on its own" if report.isolated else "first divergence"
    if f is None:
        if report.failure:
            return f"{head}: none before the run failed ({report.failure})"
        return f"{head}: none"
    shown = f.buffer if f.display == f.buffer else f"{f.buffer} ({f.display})"
    writer = ""
    if f.writer is not None:
        writer = f", written by lane {f.writer.lane} at line {f.writer.line}"
    elif f.lane_looked_up:
        writer = ", which this dispatch did not write (an earlier value)"
    return divergence_sentence(head, f.step, f.instance, shown, f.diff,
                               token=report.tokens[f.step], writer=writer)


def format_text(report: DiffReport, *, per_step: bool = False) -> str:
    lines = [f"reference: {report.reference} (engine {report.engine})",
             f"other:     {report.other}" + _producer(report),
             f"tokens:    {len(report.tokens)} steps ({report.meta.get('tokens_from', 'given')})",
             f"tolerance: {report.tolerance.describe()}"]
    lines += [f"warning: {w}" for w in report.warnings]
    lines += [f"note: {n}" for n in report.notes]
    if report.isolated:
        lines.append("isolate:   every node run on the other run's inputs; errors are each "
                     "node's own")
    lines.append("")
    lines += _table(report, per_step)
    lines.append("")
    lines.append(coverage_line(report))
    lines += _mismatch_lines(report)
    if report.isolated:
        lines += isolate_lines(report)
    if report.failure:
        lines.append(f"run failed: {report.failure}")
    lines.append(first_divergence_line(report))
    lines += [f"  {t}" for t in report.links]
    return "\n".join(lines)


def _producer(report: DiffReport) -> str:
    p = report.meta.get("producer")
    return f" (producer: {shown(p)})" if p else ""  # text from the file: escaped, short


def _table(report: DiffReport, per_step: bool) -> list[str]:
    head = (f"{'node output':<34} {'steps':>5} {'max abs':>10} {'rel L2':>10} {'max ULP':>11}  "
            f"{'first differing':<30} status")
    if per_step:
        head = head.replace(" steps", "  step")
    rows = [head]
    if per_step:
        for r in report.results:
            d = r.diff
            status = ("DIVERGED" if d.diverged else "within tolerance" if not d.exact
                      else "exact")
            rows.append(f"{r.name:<34} {r.step:>5} {_g(d.max_abs):>10} {_g(d.rel_l2):>10} "
                        f"{d.max_ulp:>11}  {where_text(r):<30} {status}")
        return rows
    for s in summarize(report):
        where = where_text(s.shown) if s.shown is not None else "-"
        rows.append(f"{s.name:<34} {s.steps:>5} {_g(s.max_abs):>10} {_g(s.rel_l2):>10} "
                    f"{s.max_ulp:>11}  {where:<30} {s.status}")
    return rows


def coverage_line(report: DiffReport) -> str:
    steps = len(report.tokens)
    text = (f"compared {len(report.results)} of {report.possible} node outputs "
            f"({report.steps_compared} of {steps} steps, {report.nodes_compared} of "
            f"{report.total_nodes} nodes)")
    diverged = len(report.diverged)
    if diverged:
        text += f"; {diverged} diverged"
    return text


def _mismatch_lines(report: DiffReport) -> list[str]:
    out = []
    if report.mismatches:
        n = len(report.mismatches)
        what = "keys that do not match the model" if report.other_kind == "dump" else \
            "outputs that do not match"
        out.append(f"{n} {what} (not compared):")
        for m in report.mismatches[:MAX_LISTED]:
            out.append(f"  {shown(m.key)}: {m.problem}")
        if n > MAX_LISTED:
            out.append(f"  ... and {n - MAX_LISTED} more (--json lists all)")
    if report.unmatched:
        out.append(f"{len(report.unmatched)} without a counterpart (not compared):")
        out += [f"  {m.key}: {m.problem}" for m in report.unmatched[:MAX_LISTED]]
    return out


# -- JSON ---------------------------------------------------------------------------------------
def _num(x):
    """JSON has no NaN or Infinity: those become strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def result_dict(r: OutputResult) -> dict:
    d = r.diff
    return {"step": r.step, "instance": r.instance, "buffer": r.buffer, "display": r.display,
            "elements": d.elements, "differing": d.differing, "max_abs": _num(d.max_abs),
            "rel_l2": _num(d.rel_l2), "max_ulp": d.max_ulp, "nonfinite": d.nonfinite,
            "first_index": d.first_index, "index": d.index,
            "reference": _num(d.ref_value), "other": _num(d.other_value),
            "lane": r.writer.lane if r.writer else None,
            "line": r.writer.line if r.writer else None,
            "diverged": d.diverged, "reason": d.reason or None}


def first_divergence_dict(report: DiffReport) -> dict | None:
    f = report.first_divergence
    if f is None:
        return None
    d = f.diff
    return {"step": f.step, "token": report.tokens[f.step], "instance": f.instance,
            "buffer": f.buffer, "index": d.index,
            "lane": f.writer.lane if f.writer else None,
            "line": f.writer.line if f.writer else None,
            "reference": _num(d.ref_value), "other": _num(d.other_value),
            "rel_l2": _num(d.rel_l2), "reason": d.reason}


def report_dict(report: DiffReport) -> dict:
    return {
        "reference": {"model": report.reference, "engine": report.engine},
        "other": {"kind": report.other_kind, "path": report.other,
                  **{k: v for k, v in report.meta.items() if k != "tokens_from"}},
        "tokens": report.tokens, "tokens_from": report.meta.get("tokens_from", "given"),
        "tolerance": report.tolerance.as_dict(),
        "compared": {"outputs": len(report.results), "possible": report.possible,
                     "steps": report.steps_compared, "of_steps": len(report.tokens),
                     "nodes": report.nodes_compared, "of_nodes": report.total_nodes},
        "first_divergence": first_divergence_dict(report),
        "diverged": len(report.diverged),
        "mismatches": [{"key": m.key, "problem": m.problem} for m in report.mismatches],
        "unmatched": [{"key": m.key, "problem": m.problem} for m in report.unmatched],
        "warnings": report.warnings, "notes": report.notes, "failure": report.failure,
        "seconds": round(report.seconds, 3),
        "outputs": [result_dict(r) for r in report.results],
        "isolate": isolate_dict(report) if report.isolated else None,
        "changes": report.changes if report.other_kind == "model" else None,
        "divergence_links": report.links,
        "exit": report.exit_code,
    }


def format_json(report: DiffReport) -> str:
    return json.dumps(report_dict(report), indent=1, allow_nan=False)


# -- --isolate ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class WrongNode:
    """A node instance wrong on its own (at one step or more)."""

    instance: str
    kernel: str
    steps: tuple[int, ...]
    first: OutputResult  # its first diverging output
    rel_l2: float  # worst over its diverging outputs


def wrong_on_their_own(report: DiffReport) -> list[WrongNode]:
    """The instances whose own outputs diverge (``--isolate``), in graph order."""
    rows: dict[int, list[OutputResult]] = {}
    for r in report.diverged:
        rows.setdefault(r.node, []).append(r)
    return [WrongNode(rs[0].instance, report.kernels.get(node, "?"),
                      tuple(sorted({r.step for r in rs})), rs[0],
                      max(r.diff.rel_l2 for r in rs)) for node, rs in sorted(rows.items())]


def isolate_lines(report: DiffReport) -> list[str]:
    wrong = wrong_on_their_own(report)
    by_kernel: dict[str, list[WrongNode]] = {}
    for w in wrong:
        by_kernel.setdefault(w.kernel, []).append(w)
    lines = [f"wrong on their own: {len(wrong)} node instances of {len(by_kernel)} kernels"
             if wrong else "wrong on their own: none"]
    for kernel, ws in by_kernel.items():
        steps = sorted({s for w in ws for s in w.steps})
        lines.append(f"  {kernel}: {', '.join(w.instance for w in ws)} (steps "
                     f"{_steps_text(steps)}; worst relative L2 {max(w.rel_l2 for w in ws):.3g})")
    inh = report.inherited
    if inh:
        (step, node), origin = next(iter(inh.items()))
        instances = len({n for _, n in inh})
        lines.append(f"inherited an error (right on their own, fed a value downstream of a wrong "
                     f"node): {len(inh)} node runs of {instances} instances, e.g. "
                     f"{report.results_name(node)} at step {step} (downstream of {origin})")
    nj = report.not_judged
    if nj:
        first = nj[0]
        lines.append(f"not judged: {len(nj)} node runs of {len({n.node for n in nj})} instances "
                     f"(the other side lacks their inputs), e.g. {first.instance} at step "
                     f"{first.step}: {first.reason}")
    return lines


def _steps_text(steps: list[int]) -> str:
    if len(steps) > 2 and steps == list(range(steps[0], steps[-1] + 1)):
        return f"{steps[0]}..{steps[-1]}"
    text = ",".join(map(str, steps[:8]))
    return text + (",..." if len(steps) > 8 else "")


def isolate_dict(report: DiffReport) -> dict:
    return {
        "wrong_on_their_own": [{"instance": w.instance, "kernel": w.kernel,
                                "steps": list(w.steps), "rel_l2": _num(w.rel_l2),
                                "first": result_dict(w.first)}
                               for w in wrong_on_their_own(report)],
        "inherited": [{"step": s, "instance": report.results_name(n), "from": origin}
                      for (s, n), origin in report.inherited.items()],
        "not_judged": [{"step": n.step, "instance": n.instance, "reason": n.reason}
                       for n in report.not_judged],
    }
