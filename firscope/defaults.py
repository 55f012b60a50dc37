"""The defaults every front end shares, written once: the command line's parsers, the UI,
the DAP launch configuration and the Python entry points (``run_batch``, ``run_profile``)
read them from here. It imports nothing heavy, so the command line builds its parsers without
loading NumPy (``firscope dap`` answers ``initialize`` before the engine is imported)."""

__all__ = ["DEFAULT_STEPS", "UI_STEPS", "SANITIZE_STEPS", "DEFAULT_GROUP", "ENGINES",
           "STEPPING_ENGINES", "DEFAULT_ENGINE"]

DEFAULT_STEPS = 16  # tokens to generate (-n) of run, debug, profile and a DAP launch
UI_STEPS = 12  # -n of the UI and of serve: a short run to step through
SANITIZE_STEPS = 4  # -n of sanitize: every kernel runs each step; a few positions suffice
DEFAULT_GROUP = 32  # q4 group size (--group)
# --engine, and the engines a debugger can stop inside: declared with the rest of what each
# engine is in firscope/engines.py (which imports nothing either)
from .engines import ENGINES, STEPPING_ENGINES  # noqa: E402
DEFAULT_ENGINE = "compiled"
