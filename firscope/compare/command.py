"""``firscope diff``: the command behind the argument parsing in cli.py.

``firscope diff MODEL.fir --against DUMP`` or ``firscope diff A.fir B.fir``.
Exit status: 0 when nothing diverges, 1 when something does (or the dump has
keys that match nothing in the model, or a run faulted), 2 for usage errors
and unreadable files. Both sides load through a
:class:`~firscope.runtime.opening.RunInput`, so that the load options mean the
same as for ``run``.
"""
from __future__ import annotations

import contextlib
import sys
from collections import Counter
from dataclasses import dataclass, replace

from ..defaults import DEFAULT_ENGINE
from ..dump import file_sha256
from ..errors import FirError
from ..model.checkpoint import shown
from ..runtime import Model
from ..runtime.opening import RunInput, check_budget
from .dumpfile import Dump
from .isolate import DumpInputs, ModelInputs, isolating
from .lockstep import DiffReport, run_lockstep
from .metrics import Tolerance, make_tolerance
from .record import DumpRecorder
from .report import format_json, format_text
from .sources import DumpSource, ModelSource
from .textdiff import changes_dict, diff_fir, divergence_link

MAX_NAMED = 8  # steps or nodes named in a "no values for" note


@dataclass(frozen=True)
class DiffOptions:
    """``firscope diff``'s arguments (``diff --engine gpu`` reads the same)."""

    source: RunInput  # model A, how it loads, and the prompt (default: the dump's tokens)
    other: str | None = None  # model B, run in lockstep with A
    against: str | None = None  # or a dump
    engine: str = DEFAULT_ENGINE
    budget: int | None = None
    rtol: float | None = None
    atol: float | None = None
    ulp: int | None = None
    json: bool = False
    per_step: bool = False
    chained: bool = False  # --engine gpu: the GPU runs on its own values throughout
    sanitize: bool = False  # --engine gpu: say when a race explains a divergence
    isolate: bool = False


@dataclass(frozen=True)
class CaptureOptions:
    """``firscope capture``'s arguments."""

    source: RunInput
    node: str
    step: int
    output: str
    against: str | None = None
    engine: str = DEFAULT_ENGINE


def _ids_of(source, model: Model) -> tuple[list[int], object]:
    return source.ids(model)


def run_diff(args: DiffOptions, *, out=None, err=None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    def announce(lines: list[str]) -> None:  # before the run: what changed between A and B
        if not args.json:
            print("\n".join(lines), file=out, flush=True)
    try:
        report = build_report(args, announce)
    except FirError as e:
        print(f"firscope: {e}" if e.loc is None else str(e), file=err)
        return 2
    text = format_json(report) if args.json else format_text(report, per_step=args.per_step)
    print(text, file=out)
    return report.exit_code


def run_capture(args: CaptureOptions, *, out=None, err=None) -> int:
    """``firscope capture``: 0 when the case folder is written, 2 for usage errors."""
    from .capture import capture
    out = out or sys.stdout
    err = err or sys.stderr
    source = args.source
    try:
        model = source.load()
        if args.against is not None and not (source.tokens or source.prompt is not None):
            dump = Dump(args.against)
            try:
                tokens = dump.tokens
            finally:
                dump.close()
            if not tokens:
                raise FirError(f"{args.against}: the dump does not say which tokens it was "
                               "fed (no 'tokens' metadata): give --tokens or --prompt")
        else:
            tokens, _ = source.ids(model)
        result = capture(model, args.node, args.step, list(tokens), args.output,
                         against=args.against, engine=args.engine)
    except FirError as e:
        print(f"firscope: {e}" if e.loc is None else str(e), file=err)
        return 2
    print(result.text, file=out)
    return 0


def tolerance_of(args) -> Tolerance:
    try:
        return make_tolerance(args.rtol, args.atol, args.ulp)
    except ValueError as e:
        raise FirError(str(e)) from None


def build_report(args: DiffOptions, announce=None) -> DiffReport:
    if (args.other is None) == (args.against is None):
        raise FirError("give the run to compare with: --against DUMP, or a second model "
                       "file (firscope diff A.fir B.fir)")
    tol = tolerance_of(args)
    budget = check_budget(args.budget)
    model = args.source.load()
    if args.against is not None:
        return _against_dump(model, args, tol, budget)
    other = replace(args.source, model=args.other).load()
    tokens, tokens_from = given_tokens(args.source, model)
    fd = diff_fir(model.path, other.path)
    if announce is not None:
        announce(fd.lines + [""] if fd.lines else
                 [f"{model.path.name} and {other.path.name}: kernels and graph are the same", ""])
    source = ModelSource(model, other, len(tokens), engine=args.engine, budget=budget)
    isolate = isolating(ModelInputs(model, source)) if args.isolate else None
    report = run_lockstep(model, source, tokens, tol, engine=args.engine, budget=budget,
                          isolate=isolate)
    report.meta["tokens_from"] = tokens_from
    report.changes = changes_dict(fd)
    report.links = divergence_link(fd, report, model, other)
    _coverage_notes(model, report, source.plan)
    return report


def given_tokens(source: RunInput, model: Model, prompt_ids=_ids_of) -> tuple[list[int], str]:
    """The ids a diff is fed (``prompt_ids(source, model)``) and where they came from, as
    the report says it: ``--tokens``, ``--prompt`` or the default prompt."""
    ids, _ = prompt_ids(source, model)
    if source.tokens:
        return ids, "--tokens"
    if source.prompt is not None:
        return ids, "--prompt"
    return ids, "the default prompt"


def _against_dump(model: Model, args: DiffOptions, tol: Tolerance, budget: int) -> DiffReport:
    dump = Dump(args.against)
    warnings = list(dump.warnings)
    if args.source.tokens or args.source.prompt is not None:
        tokens, tokens_from = given_tokens(args.source, model)
        try:
            said = dump.tokens
        except FirError as e:
            said = None
            warnings.append(e.message)
        if said is not None and said != tokens:
            warnings.append(f"the dump says it was fed {len(said)} tokens ({_ids(said)}); "
                            f"comparing with the {len(tokens)} given ({_ids(tokens)})")
    else:
        tokens, tokens_from = dump.tokens, "the dump's metadata"
        if tokens is None:
            raise FirError(f"{dump.path}: the dump does not say which tokens it was fed (no "
                           "'tokens' metadata): give --tokens or --prompt")
        if not tokens:
            raise FirError(f"{dump.path}: the dump's 'tokens' metadata is empty: give --tokens")
    if dump.model_hash is not None:
        mine = file_sha256(model.path)
        if dump.model_hash.lower() != mine:
            warnings.append(f"the dump was made from another model file (its sha256 "
                            f"{shown(dump.model_hash[:16])}..., {model.path.name} has "
                            f"{mine[:16]}...): comparing anyway")
    source = DumpSource(model, dump, len(tokens))
    isolate = isolating(DumpInputs(model, source)) if args.isolate else None
    try:
        report = run_lockstep(model, source, tokens, tol, engine=args.engine, budget=budget,
                              isolate=isolate)
    finally:
        dump.close()
    report.warnings[:0] = warnings
    report.meta.update(tokens_from=tokens_from, producer=dump.producer,
                       model_hash=dump.model_hash)
    _dtype_notes(dump, source, tol, report)
    _coverage_notes(model, report, source.plan)
    return report


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids[:8])) + (",..." if len(ids) > 8 else "")


def _dtype_notes(dump: Dump, source: DumpSource, tol: Tolerance, report: DiffReport) -> None:
    kinds = Counter(w.dtype for nodes in source.plan.by_step.values()
                    for ws in nodes.values() for w in ws)
    for dtype in ("F16", "BF16"):
        if kinds.get(dtype):
            report.notes.append(f"{kinds[dtype]} tensors are stored as {dtype}: for them the "
                                f"tolerance widens to {tol.for_dtype(dtype).describe()} (the "
                                "storage's rounding)")


def _coverage_notes(model: Model, report: DiffReport, plan) -> None:
    steps = len(report.tokens)
    if plan.beyond:
        report.notes.append(f"{len(plan.beyond)} keys are at steps past the {steps} compared "
                            f"(e.g. {shown(plan.beyond[0])}): not compared")
    present = set(plan.by_step)
    missing = [s for s in range(steps) if s not in present]
    if missing and len(missing) < steps:
        report.notes.append(f"no values for {len(missing)} of {steps} steps: "
                            f"{_names(map(str, missing))}")
    nodes = plan.nodes()
    absent = [n.full_name for n in model.nodes if n.index not in nodes]
    if absent and len(absent) < len(model.nodes):
        report.notes.append(f"no values for {len(absent)} of {len(model.nodes)} nodes: "
                            f"{_names(absent)}")
    if not plan.outputs:
        report.notes.append("nothing was compared: the other side has no value for any node "
                            "output of this run")


def _names(items) -> str:
    items = list(items)
    text = ", ".join(items[:MAX_NAMED])
    return text + (f", ... ({len(items) - MAX_NAMED} more)" if len(items) > MAX_NAMED else "")


@contextlib.contextmanager
def dump_recording(machine, path, pattern: str | None, steps: int):
    """``run --dump``: record while the body runs; the file appears only if it succeeds."""
    if path is None:
        if pattern is not None:
            raise FirError("--dump-nodes needs --dump FILE")
        yield None
        return
    recorder = DumpRecorder(machine, path, pattern=pattern, steps=steps)
    try:
        yield recorder
    except BaseException:
        recorder.abort()
        raise
    recorder.close()
