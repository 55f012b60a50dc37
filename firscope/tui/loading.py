"""Opening a model for the UI (in the load worker), and the panel shown meanwhile.

On F2 the new session gets what the old one carried (breakpoints, displays,
position: see :mod:`.reload`) before its first view is frozen.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, ProgressBar, Static

from ..debug.commands import CommandInterpreter
from .attention_view import AttentionRecorder
from .reload import restore
from .state import build_view


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


def open_session(path: Path, options: dict, carried, probe, wants,
                 progress: Callable[[str, float], None]) -> dict:
    """Load, tokenize the prompt, warm the kernels, restore what F2 carried, freeze a view."""
    from ..debug.session import Session
    from ..runtime.opening import open_model, prompt_ids
    t0 = time.perf_counter()
    model = open_model(path, fir_f32=options["fir_f32"], group=options["group"],
                       q4_path=options.get("q4_path", "packed"),
                       progress=lambda w, f: progress(f"loading: {w}", f * 0.7))
    ids, tok = prompt_ids(model, prompt=options["prompt_text"], tokens=options["prompt_ids"])
    against = options.get("against")
    if against is not None and options["prompt_ids"] is None and options["prompt_text"] is None:
        from ..debug.diverge import dump_tokens
        ids = dump_tokens(against)  # the tokens the dump was fed
    session = Session(model, ids, options["n"], engine=options["engine"])
    if against is not None:
        from ..debug.diverge import attach_reference
        attach_reference(session, against, isolate=options.get("isolate", False))
    runner = session.machine.kernel_runner
    if runner is not None and hasattr(runner, "warmup"):
        progress("compiling kernels", 0.75)
        runner.warmup()
    ci = CommandInterpreter(session, tok)
    recorder = AttentionRecorder(session)
    notes = restore(ci, carried) if carried is not None else []
    session.node_observers.append(probe)
    progress("ready", 1.0)
    view = build_view(session, ci, tok, recorder, wants)
    return dict(session=session, ci=ci, tok=tok, recorder=recorder, view=view, notes=notes,
                seconds=time.perf_counter() - t0)
