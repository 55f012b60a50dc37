"""Progress lines on stderr for long profile runs (rate-limited, never on stdout)."""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``phase("timing", total)`` then ``tick(done)``; prints at most every ``every`` s."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True, every: float = 1.0,
                 prefix: str = "profile"):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.every = every
        self.prefix = prefix
        self.name = ""
        self.total = 0
        self.t_phase = 0.0
        self.t_last = 0.0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._dirty = False

    def _write(self, text: str, final: bool) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\x1b[K" + text + ("\n" if final else ""))
            self._dirty = not final
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def phase(self, name: str, total: int = 0) -> None:
        self.name, self.total = name, total
        self.t_phase = self.t_last = time.perf_counter()
        self._write(f"{self.prefix}: {name}" + (f" 0/{total}" if total else "") + " ...", False)

    def tick(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.t_last < self.every and done < self.total:
            return
        self.t_last = now
        rate = done / (now - self.t_phase) if now > self.t_phase else 0.0
        self._write(f"{self.prefix}: {self.name} {done}/{self.total} ({rate:.1f}/s)", False)

    def end(self, note: str = "") -> None:
        dt = time.perf_counter() - self.t_phase
        self._write(f"{self.prefix}: {self.name} done in {dt:.2f} s" + (f" {note}" if note else ""),
                    True)

    def note(self, text: str) -> None:
        self._write(f"{self.prefix}: {text}", True)


class Silent(Progress):
    def __init__(self):
        super().__init__(enabled=False)
