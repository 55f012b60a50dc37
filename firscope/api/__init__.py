"""firscope as a library: open a model, run it, record and patch what it computes, debug it.

A front end like tui/ and dap/ (DESIGN.md): it calls the runtime for runs and the typed
debugger API (:class:`firscope.debug.debugger.Debugger`) for sessions. ``import firscope``
does not import it; ``firscope.open`` does, on first use (PEP 562).
"""
from __future__ import annotations

from .model import Model, open
from .run import Run

__all__ = ["Model", "Run", "open"]
