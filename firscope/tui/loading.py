"""Opening a model for the UI (in the load worker), and the panel shown meanwhile.

On F2 the new session gets what the old one carried (breakpoints, displays,
position: see :mod:`.reload`) before its first view is frozen.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, ProgressBar, Static

from ..defaults import DEFAULT_ENGINE, DEFAULT_GROUP, UI_STEPS
from ..runtime.opening import RunInput
from .attention_view import AttentionRecorder
from .jobs import Job, JobProgress, Probe
from .reload import restore
from .state import build_view


@dataclass(frozen=True)
class UiOptions:
    """What the UI opens (on start and on each F2) and how it shows times."""

    prompt_ids: Sequence[int] | None = None  # wins over prompt_text
    prompt_text: str | None = None  # neither: the default prompt (or the dump's tokens)
    n: int = UI_STEPS
    fir_f32: bool = False
    group: int = DEFAULT_GROUP
    engine: str = DEFAULT_ENGINE
    q4_path: str = "packed"
    against: str | None = None  # a dump every node is compared with (the Diff tab)
    isolate: bool = False  # with against: nodes coloured by their own error
    device: str | None = None  # the GPU whose predicted times the Profile tab shows
    corpus: str | None = None  # --corpus: a sensitivity sweep shown in the Profile tab
    corpus_ctx: int | None = None
    corpus_chunks: int | None = None
    show_times: bool = True
    time_of: Callable | None = None  # node times as shown (tests: deterministic ones)

    def run_input(self, path: Path) -> RunInput:
        tokens = tuple(self.prompt_ids) if self.prompt_ids is not None else None
        return RunInput(model=str(path), fir_f32=self.fir_f32, group=self.group,
                        prompt=self.prompt_text, tokens=tokens, q4_path=self.q4_path)


class LoadingPanel(Vertical):
    DEFAULT_CSS = """
    LoadingPanel { align: center middle; height: 1fr; }
    LoadingPanel > * { width: 70; max-width: 100%; }
    LoadingPanel #load-error { width: 1fr; height: auto; padding: 1 2; border: thick $error;
                               display: none; }
    LoadingPanel.-error #load-error { display: block; }
    """

    def compose(self) -> ComposeResult:
        yield Label("loading…", id="load-label")
        yield ProgressBar(total=100, show_eta=False, id="load-bar")
        yield Static(id="load-error")


LOAD_PROGRESS_S = 0.1  # the loading panel's progress: at most this often


def throttled(post: Callable[[str, float], None]) -> Callable[[str, float], None]:
    """The load's progress passed on to ``post`` at most every LOAD_PROGRESS_S, and not in
    the first: the sample's load reported 56 steps in ~50 ms, each a message and a layout
    on the UI's thread, whose GIL the load (on its own thread) then waited for."""
    last = [time.perf_counter()]

    def progress(what: str, frac: float) -> None:
        now = time.perf_counter()
        if now - last[0] >= LOAD_PROGRESS_S:
            last[0] = now
            post(what, frac)
    return progress


def open_session(path: Path, options: UiOptions, carried, probe, wants,
                 progress: Callable[[str, float], None]) -> dict:
    """Load, tokenize the prompt, restore what F2 carried, freeze a view: the first stop. The
    compiled kernels are not loaded here (numba's import and cache, or a cold compile, is
    most of a small model's start): the app warms them in its first job (warm_session),
    behind which the keys typed meanwhile wait."""
    from ..debug.opening import open_session as open_debug_session
    t0 = time.perf_counter()
    session, ci = open_debug_session(
        options.run_input(path), n=options.n, engine=options.engine, against=options.against,
        isolate=options.isolate, progress=lambda w, f: progress(f"loading: {w}", f * 0.95),
        warm=False)
    tok = ci.tok
    recorder = AttentionRecorder(session)
    notes = restore(ci, carried) if carried is not None else []
    session.observe_nodes(probe)
    progress("ready", 1.0)
    view = build_view(session, ci, tok, recorder, wants)
    return dict(session=session, ci=ci, tok=tok, recorder=recorder, view=view, notes=notes,
                seconds=time.perf_counter() - t0)


def warm_job(session, probe: Probe, then: Callable[[object], None] | None = None) -> Job:
    """The app's first job, submitted as the first stop is drawn: load (a cold cache:
    compile) the kernels the engine will call (debug.opening.warm_session); keys typed
    meanwhile wait behind it. ``probe.phase`` names what it is at (the status bar shows it
    past Probe.SHOW_AFTER); escape stops it (the rest then load at their first use)."""
    from ..debug.opening import warm_session
    heard = JobProgress(probe, session.cancel)  # escape raises Interrupted at the next phase
    return Job("loading kernels",
               lambda: warm_session(session, lambda what, frac: heard.phase(what)), quiet=True,
               view=False, then=then)
