"""The one-line progress of a command-line run (loading, compiling) on stderr."""

import sys
import time

__all__ = ["TerminalProgress"]


class TerminalProgress:
    """``loading: weights 45%`` or ``compiling g2.attn_decode 50%`` on one line of stderr,
    on a terminal only and once the work has taken half a second: a first run compiles
    its kernels for a few seconds (later runs load them from the cache and show
    nothing)."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.shown = False

    def __call__(self, what: str, frac: float) -> None:
        if self.tty and time.perf_counter() - self.t0 >= 0.5:
            label = what if what.startswith("compil") else f"loading: {what}"
            sys.stderr.write(f"\r\x1b[K{label} {min(max(frac, 0.0), 1.0):4.0%}")
            sys.stderr.flush()
            self.shown = True

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
