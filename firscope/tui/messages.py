"""What workers hand to the UI thread: a finished job with its frozen view, load progress,
a loaded session, a load error. Workers only post these; they never touch a widget.

Messages are dataclasses (as toolong's): their fields are what they carry."""
from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from ..errors import FirError
from .jobs import Job
from .state import StopView

__all__ = ["ElementMessage", "Job", "JobDone", "LoadFailed", "LoadProgress", "Loaded"]


@dataclass
class JobDone(Message):
    job: Job
    out: object
    error: Exception | None
    view: StopView | None


@dataclass
class Loaded(Message):
    parts: dict


@dataclass
class LoadProgress(Message):
    what: str
    frac: float


@dataclass
class LoadFailed(Message):
    error: FirError


@dataclass
class ElementMessage(Message):
    """A pane asks about one element or register: ``target`` ("x[3]", "R3") and its value."""

    target: str
    value: str
