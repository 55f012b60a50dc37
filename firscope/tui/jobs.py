"""Long work the UI starts: the job queue, progress it can show, a way to interrupt it, and
the report export that leaves no files behind when interrupted.

Every engine action is a :class:`Job`; the :class:`JobQueue` runs one at a time
and keeps what is submitted meanwhile (typing ahead, as in gdb). A
:class:`Probe` is written by the worker (a node observer, a profile progress)
and read by the UI's status timer: plain counters, never the live session. An
export writes into a hidden folder beside the target and renames it only when
complete, so escape (or an error) leaves nothing.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..debug.snapshot import token_of
from ..errors import FirError, Interrupted
from ..profile.progress import Progress

SHOW_AFTER = 0.5  # seconds before a run shows its progress
# seconds before the header says a job runs: a step, done sooner, repaints once, with its
# stop (not "running: next" first, then its stop a frame later: a header that flickered)
RUNNING_AFTER = 0.1
MAX_PENDING = 32  # jobs typed ahead while one runs


@dataclass
class Job:
    label: str
    fn: Callable[[], object] | None  # runs in the worker; None only refreshes the view
    moves: bool = False  # the command resumes the engine (Command.resumes)
    cancel: threading.Event | None = None  # escape sets it (default: the session's)
    then: Callable[[object], None] | None = None  # on the UI thread, with fn's result
    on_error: Callable[[FirError], None] | None = None  # on the UI thread, with fn's error
    quiet: bool = False  # write nothing to the console
    view: bool = True  # False: nothing a pane shows changes (no view is frozen after it)


def execute(job: Job, freeze: Callable[[], object]) -> tuple[object, Exception | None, object]:
    """Run ``job`` and freeze the view after it (in the worker): (out, error, view).
    An error is a :class:`FirError` (an interruption is :class:`Interrupted`); a bug
    becomes one that says so, and a view that cannot be built leaves ``view`` None."""
    out = error = None
    try:
        out = job.fn() if job.fn is not None else None
    except FirError as e:
        error = e
    except Exception as e:  # keep the UI alive; say it is a bug
        error = FirError(f"internal error: {type(e).__name__}: {e}")
    if not job.view:
        return out, error, None
    try:
        view = freeze()
    except Exception as e:  # a bug in a view: keep the last picture, say so
        view, error = None, error or FirError(f"internal error: {type(e).__name__}: {e}")
    return out, error, view


class JobQueue:
    """One job at a time: ``start`` hands a job to a worker; what is submitted while one runs
    waits (at most :data:`MAX_PENDING`). When the running one ended (:meth:`done`), the
    front end submits :meth:`take_next`."""

    def __init__(self, start: Callable[[Job], None]) -> None:
        self.start = start
        self.job: Job | None = None  # the running job
        self.pending: list[Job] = []
        self.probe = Probe()
        self.interrupting = False  # escape was pressed during the running job

    @property
    def busy(self) -> bool:
        return self.job is not None

    def submit(self, job: Job) -> bool:
        """Start ``job``, or queue it behind the running one; False when the queue is full."""
        if self.busy:
            if len(self.pending) >= MAX_PENDING:
                return False
            self.pending.append(job)
            return True
        self.job = job
        self.probe.reset(job.label)
        self.start(job)
        return True

    def cancel_flag(self, default: threading.Event) -> threading.Event:
        """The flag escape sets: the running job's own, else ``default`` (the session's)."""
        job = self.job
        return job.cancel if job is not None and job.cancel is not None else default

    def interrupt(self, default: threading.Event) -> None:
        """Escape: drop what waits, ask the running job to stop."""
        self.pending.clear()
        self.interrupting = True
        self.cancel_flag(default).set()

    def done(self) -> None:
        """The running job ended (its result is being shown)."""
        self.job, self.interrupting = None, False

    def drop_moves(self) -> None:
        """A stop that wants attention: the queued commands that would move on are dropped."""
        self.pending = [j for j in self.pending if not j.moves]

    def take_next(self) -> Job | None:
        """The next queued job (taken off the queue), when none runs; submit it to start it."""
        return self.pending.pop(0) if self.pending and not self.busy else None


class Probe:
    """Progress of the running job, as counters the UI thread may read at any time."""

    def __init__(self) -> None:
        self.reset("")

    def reset(self, label: str) -> None:
        self.label = label
        self.started = time.perf_counter()
        self.phase = ""
        self.done = 0
        self.total = 0
        self.token = None  # (step, total steps) of a debugger run
        self.node = None  # (node index, nodes)

    def __call__(self, session, node) -> None:
        """A node observer: the engine finished ``node`` (runs in the worker)."""
        self.token = (session.step, session.total_steps)
        self.node = (node.index + 1, len(session.nodes))

    def line(self, now: float | None = None) -> str | None:
        """``running: continue · token 3 of 0..11 · node 45/120 · 1.2 s`` once past SHOW_AFTER."""
        elapsed = (now if now is not None else time.perf_counter()) - self.started
        if elapsed < SHOW_AFTER:
            return None
        parts = [f"running: {self.label}"]
        if self.phase:
            parts.append(self.phase + (f" {self.done}/{self.total}" if self.total else ""))
        if self.token is not None:
            parts.append(token_of(*self.token))
        if self.node is not None:
            parts.append(f"node {self.node[0]}/{self.node[1]}")
        parts.append(f"{elapsed:.1f} s (escape interrupts)")
        return " · ".join(parts)


class JobProgress(Progress):
    """A profile Progress that feeds a Probe and stops the job when cancelled."""

    def __init__(self, probe: Probe, cancel: threading.Event):
        super().__init__(enabled=False)
        self.probe = probe
        self.cancel = cancel

    def _check(self) -> None:
        if self.cancel.is_set():
            raise Interrupted("interrupted by the user")

    def phase(self, name: str, total: int = 0) -> None:
        self._check()
        self.probe.phase, self.probe.total, self.probe.done = name, total, 0

    def tick(self, done: int) -> None:
        self._check()
        self.probe.done = done

    def end(self, note: str = "") -> None:
        self._check()

    def note(self, text: str) -> None:
        self._check()


def state_dir() -> Path:
    """The user's state folder for firscope (XDG: ~/.local/state/firscope)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "firscope"


def default_report_dir(model_folder: str, now: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return state_dir() / "reports" / f"{model_folder}-{stamp}"


@dataclass(frozen=True)
class ExportDone:
    folder: Path
    files: tuple[str, ...]

    def text(self) -> str:
        return f"report written to {self.folder}: " + ", ".join(self.files)


def patch_note(session) -> str | None:
    """What the report must say when the session it exports was patched with ``set``."""
    patches = list(session.patches)
    if not patches:
        return None
    listed = "; ".join(f"{p.text} (at {p.made_at})" for p in patches)
    note = f"the debugging session was patched with {len(patches)} set command(s): {listed}."
    if any(not p.weight for p in patches):
        note += (" This report reruns the session's tokens from the start without the buffer "
                 "and register patches.")
    if any(p.weight for p in patches):
        note += " The weight patches were in effect when this report ran."
    return note


def export_session(session, tokenizer, out: Path, progress: JobProgress,
                   device: str | None = None) -> ExportDone:
    """The same report as `firscope profile`, for the tokens this session decodes
    (``device``: with the GPU speed-of-light section, as ``profile --device``).

    The folder rule is profile -o's (``check_report_folder``): a new or empty folder, or
    a previous firscope report. A new one is written as a hidden folder next to ``out``
    and renamed at the end, so an interrupted or failed export leaves no files.
    """
    from ..profile.collect import preserved_state
    from ..profile.report import check_report_folder, write_report
    out = Path(os.path.abspath(Path(out).expanduser()))  # not resolve(): a link is refused
    previous = out.is_dir() and not out.is_symlink() and any(out.iterdir())
    if os.path.lexists(out):
        check_report_folder(out, "the export")
    if previous:  # replaced file by file, as profile -o does
        with preserved_state(session.model):
            data = _export_data(session, tokenizer, progress, device)
        files = write_report(data, out, progress=progress)
        return ExportDone(out, tuple(sorted(files)))

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".fs-export-", dir=out.parent))
    except OSError as e:
        raise FirError(f"{out}: cannot create the report folder: {e.strerror or e}") from None
    try:
        with preserved_state(session.model):
            data = _export_data(session, tokenizer, progress, device)
        files = write_report(data, staging, progress=progress)
        progress._check()
        if out.exists():
            out.rmdir()  # empty (checked above)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportDone(out, tuple(sorted(files)))


def _export_data(session, tokenizer, progress, device: str | None):
    from ..profile.report import profile_model
    data = profile_model(session.model, list(session.prompt), session.n_generate,
                         engine=session.machine.engine, tokenizer=tokenizer, progress=progress)
    if device is not None:  # the GPU speed-of-light section, as profile --device
        from ..cost import find_device
        from ..profile.report import add_gpu
        add_gpu(data, session.model, find_device(device), engine=session.machine.engine,
                progress=progress)
    note = patch_note(session)
    if note:
        data.meta.setdefault("notes", []).append(note)
    return data


def measure_quant(session):
    """Quantization error (q4 vs an f32 shadow) over the tokens decoded so far; the
    session's buffers are put back afterwards."""
    from ..profile.collect import preserved_state
    from ..profile.quant import compare_run, weight_stats
    tokens = list(session.sequence[: max(session.step, 1)])
    with preserved_state(session.model):
        return (weight_stats(session.model),
                compare_run(session.model, tokens, engine=session.machine.engine), len(tokens))


def measure_cost(session, device: str | None):
    """The GPU speed-of-light analysis of the session's current (or last) step, on a copy of
    its arena (firscope/cost); None before the first token."""
    from ..cost import analyse_current, find_device
    return analyse_current(session.model, session.machine, find_device(device),
                           stop=session.cancel)
