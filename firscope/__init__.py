"""firscope: a visual debugger and profiler for .fir models, and a library for scripts and
notebooks::

    import firscope
    model = firscope.open()                      # the bundled sample (or a .fir path)
    run = model.run("def ", n=8, record="attention@*/attn")
    run.tokens, run.logits, run.value("attn", "attention@0", step=1)

``open``, ``Model``, ``Run``, ``Debugger`` and ``patching`` are imported on first use (PEP
562), so ``import firscope`` stays cheap; ``FirError`` is the one error type firscope raises
for bad input.
"""
from __future__ import annotations

from .errors import FirError

__version__ = "0.1.0"

__all__ = ["__version__", "FirError", "open", "Model", "Run", "Debugger", "patching"]


def __getattr__(name: str):
    """The library's entry points, imported when first asked for (PEP 562)."""
    if name in ("open", "Model", "Run"):
        from .api import Model, Run, open
        return {"open": open, "Model": Model, "Run": Run}[name]
    if name == "Debugger":
        from .debug.debugger import Debugger
        return Debugger
    if name == "patching":
        # `import a.b` (not `from . import b`, which asks this function for b again)
        import firscope.patching
        return firscope.patching
    raise AttributeError(f"module 'firscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
