"""Edit a kernel and replay it: the edited kernel judged against the original on the same
inputs, bit for bit, with the faults the sanitizer finds and the predicted GPU cost before
and after (``firscope replay``, ``firscope cost --baseline``).

- :mod:`.replay`: load an edit (:func:`~.replay.load_edit`), replay every node that uses an
  edited kernel on the original run's inputs (:func:`~.replay.replay`), the A/B report.
- :mod:`.command`: the command line's text and JSON.
"""
from __future__ import annotations

from .replay import Edit, NodeAB, ReplayReport, load_edit, replay

__all__ = ["Edit", "NodeAB", "ReplayReport", "load_edit", "replay"]
