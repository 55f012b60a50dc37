"""The Textual UI: ``firscope [MODEL.fir]`` (imports textual; nothing below imports this).

Textual repaints a changed screen at most ``TEXTUAL_FPS`` times a second, and the first
repaint after a change waits for the next frame: at its default of 60 a step key waited
~17 ms for it (a key took 60-65 ms to repaint, measured with benchmarks/ui.py; 48 ms at
240). firscope repaints only when a stop changes something, so it asks for 240 unless
the environment says otherwise (read when textual is first imported, which is below).

Nor does it animate (``TEXTUAL_ANIMATIONS``, unless the environment sets it): Textual
slides a tab's underline for 0.3 s, which at 240 frames a second repainted the screen
twenty times after each tab key (the key's own repaint took a tenth of that time).
"""
import os

os.environ.setdefault("TEXTUAL_FPS", "240")
os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")

__all__ = ["run_app", "FirscopeApp"]


def __getattr__(name):  # importing the app pulls in textual: only when asked
    if name == "run_app":
        from .launch import run_app
        return run_app
    if name == "FirscopeApp":
        from .app import FirscopeApp
        return FirscopeApp
    raise AttributeError(name)
