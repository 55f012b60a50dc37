"""Profile a model and write the report folder; the entry points the CLI and TUI call.

* :func:`profile_model` runs a fresh profile: a timed run (the requested
  engine, the interpreter when the compiled engine is not installed), then
  :func:`complete_profile`.
* :func:`complete_profile` adds what a :class:`ProfileData` still lacks:
  line counts from an instrumented interpreter run of the first few steps,
  weight error, and the lockstep q4-vs-f32 comparison. It restores the
  model's buffers, so a debugging session can call it on its own model.
* :func:`write_report` writes report.html, report.json, trace.json, the
  CSV tables and logits.npz into a folder.
"""
from __future__ import annotations

import io
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from .. import __version__
from ..defaults import DEFAULT_ENGINE, DEFAULT_STEPS
from ..errors import FirError
from ..runtime import Model
from ..runtime.opening import RunInput, check_output_folder, check_steps, write_into_folder
from ..text import printable
from . import figures as F
from .collect import Profiler, make_machine, preserved_state, run_instrumented
from .data import ProfileData
from .export import FORMAT as EXPORT_FORMAT
from .export import csv_tables, dumps, report_dict, trace_json
from .html import render_html
from .progress import Progress, Silent
from .quant import compare_run, weight_stats

INSTRUMENT_STEPS = 3  # steps of the instrumented (line-counting) interpreter run


def run_meta(**extra) -> dict:
    meta = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "firscope": __version__, "numpy": np.__version__}
    meta.update(extra)
    return meta


def profile_model(model: Model, prompt: list[int], n: int, *, engine: str = "compiled",
                  instrument_steps: int = INSTRUMENT_STEPS, quant: bool = True,
                  shadow: Model | None = None, tokenizer=None,
                  progress: Progress | None = None) -> ProfileData:
    """Decode ``prompt`` + ``n`` greedy tokens with timing, then complete the profile."""
    progress = progress or Silent()
    if not prompt:
        raise FirError("the prompt is empty: give at least one token")
    check_steps(n)
    machine, actual = make_machine(model, engine)
    for t in prompt:
        machine.check_token(t)
    machine.check_room(len(prompt) + max(n - 1, 0))  # before any work, not after the warm-up
    notes = []
    if actual != engine:
        notes.append(f"engine '{engine}' is not available in this installation; timed on "
                     f"'{actual}'")
    # One discarded step first: one-time costs (compiling kernels, first-dispatch setup)
    # would otherwise land in step 0 and make runs hard to compare.
    progress.phase(f"warm-up step ({actual})")
    machine.step(prompt[0])
    machine.reset()
    progress.end()
    profiler = Profiler(model).attach(machine)
    total = len(prompt) + max(n - 1, 0)
    progress.phase(f"timed run ({actual})", total)
    done = [0]

    def on_step(result, nxt):
        done[0] += 1
        progress.tick(done[0])

    generated, _ = machine.generate(prompt, n, on_step=on_step)
    progress.end()
    profiler.detach(machine)
    data = profiler.data(**run_meta(engine=actual, engine_requested=engine, warmup_steps=1))
    if notes:
        data.meta.setdefault("notes", []).extend(notes)
    data.prompt = list(prompt)
    data.generated = list(generated)
    complete_profile(data, model, tokens=list(machine.history), instrument_steps=instrument_steps,
                     quant=quant, engine=engine, shadow=shadow, progress=progress)
    if tokenizer is not None:
        add_pieces(data, tokenizer)
    return data


def complete_profile(data: ProfileData, model: Model, *, tokens: list[int] | None = None,
                     instrument_steps: int = INSTRUMENT_STEPS, quant: bool = True,
                     engine: str = "compiled", shadow: Model | None = None,
                     progress: Progress | None = None) -> ProfileData:
    """Fill the parts ``data`` lacks; ``tokens`` (default: the timed steps) start at position 0."""
    progress = progress or Silent()
    tokens = list(tokens if tokens is not None else data.fed)
    data.meta.setdefault("created", run_meta()["created"])
    if instrument_steps and data.instructions is None and tokens:
        data.instructions = run_instrumented(model, tokens[:instrument_steps], progress=progress)
    if quant and data.quant_note is None:
        if data.weights is None:
            data.weights = weight_stats(model, progress=progress)
        if data.comparison is None and tokens:
            data.comparison = compare_run(model, tokens, shadow=shadow, engine=engine,
                                          progress=progress)
    return data


def add_pieces(data: ProfileData, tokenizer) -> None:
    """Token id -> display text for every token the report mentions."""
    ids = set(data.prompt) | set(data.generated) | set(data.fed)
    if data.comparison is not None:
        ids |= {s.top_f32 for s in data.comparison.logits}
        ids |= {s.top_q4 for s in data.comparison.logits}
    for i in sorted(ids):
        try:
            data.pieces[int(i)] = tokenizer.piece(int(i))
        except Exception:  # a tokenizer that cannot show a token: the report shows ids only
            return


def build_figures(report: dict) -> dict[str, bytes | None]:
    figs = {
        "time_by_name": F.time_by_name(report["timing"]),
        "time_by_layer": F.time_by_layer(report["timing"]),
        "time_per_step": F.time_per_step(report["timing"]),
        "timeline": F.timeline(report["timing"], report["nodes"]),
        "instructions": F.instructions(report["instructions"]),
        "weight_error": F.weight_error(report["quant"]),
        "activation_error": F.activation_error(report["quant"], report["nodes"]),
        "logits": F.logits(report["quant"]),
    }
    figs["attention"] = F.attention(report["attention"])
    figs["roofline"] = F.roofline(report.get("gpu"))
    figs["gpu_split"] = F.gpu_split(report.get("gpu"))
    corpus = report.get("corpus")
    if corpus and corpus.get("weights"):
        from ..quant.planning import sensitivity_chart
        figs["sensitivity"] = sensitivity_chart(corpus["weights"], corpus["layers"])
    return figs


def check_report_folder(path, what: str = "-o") -> Path:
    """The one rule for a report folder (``profile -o`` and the UI's export): a new or
    empty folder, or one holding a previous firscope report (its report.json says
    ``"format": "firscope-profile"``), whose files are then replaced; any other folder is
    refused before profiling, so nothing firscope did not write is ever overwritten."""
    out = Path(path)
    if out.is_dir() and not out.is_symlink():
        try:
            holds = next(iter(os.scandir(out)), None) is not None
        except OSError as e:
            raise FirError(f"{printable(out)}: cannot read the report folder: "
                           f"{e.strerror or e}") from None
        if holds and not _holds_a_report(out / "report.json"):
            raise FirError(f"{printable(out)}: holds files and no firscope report "
                           f"(report.json); {what} writes into a new or empty folder or over a "
                           "previous firscope report: choose another")
    elif out.is_symlink():
        raise FirError(f"{printable(out)}: is a symbolic link; {what} writes into a new or "
                       "empty folder or a previous report: give the folder itself")
    return check_output_folder(out, what)


def _holds_a_report(path: Path, limit: int = 256 << 20) -> bool:
    import json
    import stat as st
    try:
        info = os.lstat(path)
        if not st.S_ISREG(info.st_mode) or info.st_size > limit:
            return False
        with open(path, "rb") as f:
            report = json.loads(f.read(limit))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(report, dict) and report.get("format") == EXPORT_FORMAT


def write_report(data: ProfileData, out_dir, *, progress: Progress | None = None
                 ) -> dict[str, Path]:
    """Write the report folder; returns {file name: path} of everything written.

    Every file is written under a new temporary name and renamed into place, so a
    link already in the folder is replaced rather than written through, and a file
    is either the old one or the whole new one.
    """
    progress = progress or Silent()
    out = check_report_folder(out_dir)
    progress.phase("writing the report")
    report = report_dict(data)
    contents: dict[str, str | bytes] = dict(csv_tables(data, report))
    if data.tokens:
        contents["trace.json"] = trace_json(data)
    if data.comparison is not None:
        buf = io.BytesIO()
        np.savez(buf, q4=data.comparison.logits_q4, f32=data.comparison.logits_f32,
                 tokens=np.asarray(data.comparison.tokens, dtype=np.int64))
        contents["logits.npz"] = buf.getvalue()
    contents["report.json"] = dumps(report)
    names = sorted(contents)
    contents["report.html"] = render_html(report, build_figures(report), names)
    files: dict[str, Path] = {}
    try:
        for name, content in contents.items():
            files[name] = write_into_folder(out, name, content)
    except OSError as e:
        raise FirError(f"{printable(out)}: cannot write the report: {e.strerror or e}") from None
    progress.end()
    return files


def add_sanitizer(data: ProfileData, model: Model, *, engine: str = "compiled",
                  progress: Progress | None = None) -> None:
    """Run the kernel sanitizer on the profile's prompt and generation length; keep its report.
    The model's buffers are put back afterwards (a session may share them)."""
    from ..sanitize import sanitize_run
    progress = progress or Silent()
    progress.phase("sanitizer run")
    with preserved_state(model):
        report, _ = sanitize_run(model, list(data.prompt), len(data.generated), engine=engine)
    data.sanitizer = report.to_json()
    progress.end()


def add_gpu(data: ProfileData, model: Model, device, *, engine: str = "compiled",
            progress: Progress | None = None) -> None:
    """The speed-of-light analysis of the profile's last step on ``device`` (report.json's
    ``gpu``); the model's buffers are put back afterwards."""
    from ..cost import analyse_position
    progress = progress or Silent()
    fed = list(data.fed) or list(data.prompt)
    if not fed:
        return
    progress.phase(f"GPU cost analysis ({device.key})")
    with preserved_state(model):
        data.gpu = analyse_position(model, device, fed, len(fed) - 1, engine=engine).as_dict()
    progress.end()


def add_corpus(data: ProfileData, model: Model, corpus_opts, *,
               progress: Progress | None = None) -> None:
    """Score a corpus (firscope/quant): the all-q4 eval figures and every q4 weight's
    sensitivity (report.json's ``corpus``). Runs on its own copy of the arena."""
    from ..quant.commands import open_corpus
    from ..quant.planning import sensitivity, sensitivity_doc
    from ..quant.variants import Bank
    progress = progress or Silent()
    bank = Bank(model.with_own_arena())
    corpus = open_corpus(bank, corpus_opts)
    progress.phase(f"sensitivity over {len(corpus.chunks)} chunk(s) of {corpus.ctx} tokens")
    sens = sensitivity(bank, str(model.path), corpus, corpus_opts, quiet=True)
    data.corpus = {"corpus": str(corpus.path), "corpus_sha256": corpus.digest,
                   "ctx": corpus.ctx, "chunks": len(corpus.chunks),
                   "first_scored": corpus.first_scored, "notes": list(corpus.notes),
                   **sensitivity_doc(sens)}
    progress.end()


def run_profile(source: RunInput, *, n: int = DEFAULT_STEPS, engine: str = DEFAULT_ENGINE,
                out: str | Path, against: str | Path | None = None,
                sanitize: bool = False, device: str | None = None, corpus=None) -> int:
    """``firscope profile``: the CLI glue (argument parsing lives in cli.py). ``against``: a
    dump the profiled run is compared with (the report's divergence section); ``sanitize``:
    also run the kernel sanitizer on the same tokens; ``device``: add the GPU speed-of-light
    section (firscope/cost) for that device profile."""
    check_steps(n)
    dev = None
    if device is not None:  # a typo in the name fails before the run, not after it
        from ..cost import find_device
        dev = find_device(device)
    # A folder we cannot write is reported before minutes of profiling, not after.
    out = check_report_folder(out)
    if corpus is not None:  # and a corpus that is not there
        from ..fir.source import regular_file_size
        regular_file_size(Path(corpus.corpus), "a corpus file")
    progress = Progress(sys.stderr)
    progress.phase("loading the model")
    opened = source.open()
    progress.end()
    data = profile_model(opened.model, list(opened.ids), n, engine=engine,
                         tokenizer=opened.tokenizer, progress=progress)
    if against is not None:
        from .divergence import compare_with_dump
        progress.phase("comparing with the dump")
        data.divergence = compare_with_dump(opened.model, against, list(data.fed),
                                            engine=engine)
        progress.end()
    if sanitize:
        add_sanitizer(data, opened.model, engine=engine, progress=progress)
    if dev is not None:
        add_gpu(data, opened.model, dev, engine=engine, progress=progress)
    if corpus is not None:
        add_corpus(data, opened.model, corpus, progress=progress)
    files = write_report(data, out, progress=progress)
    print(f"wrote {printable(files['report.html'])}")
    for name in sorted(files):
        if name != "report.html":
            print(f"      {printable(files[name])}")
    if data.sanitizer is not None:
        n_err = data.sanitizer["errors"]
        print(f"sanitizer: ERROR SUMMARY: {n_err} error{'s' if n_err != 1 else ''} "
              "(listed in the report)")
    return 0
