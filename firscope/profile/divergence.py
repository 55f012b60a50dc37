"""The profiling report's "divergence" section: the profiled run against a dump (issue 13).

:func:`compare_with_dump` runs the lockstep diff of :mod:`firscope.compare` on
the profiled tokens and keeps what the report shows (:class:`~.data.Divergence`);
:func:`divergence_section` is its JSON form for report.json.
"""
from __future__ import annotations

from pathlib import Path

from ..compare.dumpfile import Dump
from ..compare.lockstep import DiffReport, run_lockstep
from ..compare.metrics import Tolerance
from ..compare.report import coverage_line, first_divergence_line, summarize
from ..compare.sources import DumpSource
from ..runtime import Model
from .collect import preserved_state
from .data import Divergence, DivergenceRow


def divergence_of(report: DiffReport, producer: str | None = None) -> Divergence:
    first = report.first_divergence
    rows = []
    for s in summarize(report):
        r = s.shown
        rows.append(DivergenceRow(s.name, s.node, s.steps, s.max_abs, s.rel_l2, s.max_ulp,
                                  s.status, r.step if r else None,
                                  r.diff.index if r else None,
                                  r.writer.lane if r is not None and r.writer else None))
    return Divergence(report.other, producer, report.tolerance.describe(), len(report.results),
                      report.possible, first_divergence_line(report),
                      first.step if first else None, first.node if first else None, rows,
                      [(m.key, m.problem) for m in report.mismatches],
                      [coverage_line(report)] + report.warnings + report.notes)


def compare_with_dump(model: Model, dump_path: str | Path, tokens: list[int], *,
                      engine: str = "compiled", tolerance: Tolerance | None = None
                      ) -> Divergence:
    """Run ``tokens`` on ``model`` in lockstep with a dump; the model's buffers are restored
    afterwards (a debugging session may be using them)."""
    dump = Dump(dump_path)
    try:
        with preserved_state(model):
            report = run_lockstep(model, DumpSource(model, dump, len(tokens)), tokens,
                                  tolerance or Tolerance(), engine=engine)
    finally:
        dump.close()
    return divergence_of(report, dump.producer)


def divergence_section(data) -> dict | None:
    """report.json's "divergence": None when no dump was given."""
    d = data.divergence
    if d is None:
        return None
    return {"other": d.other, "producer": d.producer, "tolerance": d.tolerance,
            "compared": d.compared, "possible": d.possible, "first": d.first,
            "first_step": d.first_step, "first_node": d.first_node,
            "rows": [dict(r.__dict__) for r in d.rows],
            "mismatches": [{"key": k, "problem": p} for k, p in d.mismatches],
            "notes": list(d.notes)}
