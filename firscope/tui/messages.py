"""What workers hand to the UI thread: a finished job with its frozen view, load progress,
a loaded session, a load error. Workers only post these; they never touch a widget."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from textual.message import Message

from ..errors import FirError
from .state import StopView


@dataclass
class Job:
    label: str
    fn: Callable[[], object] | None  # runs in the worker; None only refreshes the view
    moves: bool = False  # the command resumes the engine (Command.resumes)
    cancel: threading.Event | None = None  # escape sets it (default: the session's)
    then: Callable[[object], None] | None = None  # on the UI thread, with fn's result
    quiet: bool = False  # write nothing to the console


class JobDone(Message):
    def __init__(self, job: Job, out, error: Exception | None, view: StopView | None) -> None:
        self.job, self.out, self.error, self.view = job, out, error, view
        super().__init__()


class Loaded(Message):
    def __init__(self, parts: dict) -> None:
        self.parts = parts
        super().__init__()


class LoadProgress(Message):
    def __init__(self, what: str, frac: float) -> None:
        self.what, self.frac = what, frac
        super().__init__()


class LoadFailed(Message):
    def __init__(self, error: FirError) -> None:
        self.error = error
        super().__init__()


class ElementMessage(Message):
    """A pane asks about one element or register: ``target`` ("x[3]", "R3") and its value."""

    def __init__(self, target: str, value: str) -> None:
        self.target, self.value = target, value
        super().__init__()
