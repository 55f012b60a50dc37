"""The UI's feel, as a user at a terminal gets it: the first stop from the command, and how
long each step key takes to repaint.

    python benchmarks/ui.py [--models sample,gpt2] [--rounds 3] [--keys 20] [--size 120x36]

Each round starts `firscope MODEL` in a fresh process on a pseudo-terminal of the given
size (what tmux or a terminal emulator gives it) and reads what it draws:

* **first stop**: from just before the process is started to the first header that says
  "stopped at" (the model loaded, the kernels compiled or loaded from numba's cache, the
  first stop drawn). A warm-up round first (not counted) fills the caches: the figures
  are for a warm cache;
* **step keys**: ``n`` (next), ``s`` (step in) and ``r`` (reverse) pressed in turn, each
  after the screen has been quiet for 50 ms; the latency of a key is from writing it to
  the first header that says "stopped at" something other than before (the repaint of
  the new stop). A key whose stop does not change within 5 s counts as a timeout. The
  first key of a round is printed on its own: the app loads the compiled kernels (numba's
  import and cache) in a job started once the first stop is drawn, and that key waits
  behind it; the median and 95th percentile are of the keys after it.

Models: the bundled sample, and GPT-2 small shapes with random weights (benchmarks/
decode.py's checkpoint, made once under ~/.cache/firscope-bench). Prints, per model, the
median and spread of the first stop over rounds, and the median and 95th percentile of
the key latencies, with the load average before and after. Goals (issue 45): sample first
stop <= 1 s, GPT-2 small <= 1.5 s, keys <= 50 ms median and <= 150 ms p95.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import re
import select
import signal
import statistics
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu import PROMPT, SAMPLE, model_path  # noqa: E402 - the same models and prompt
STOP = re.compile(rb"stopped at ([^\x1b\r\n]{1,80})")
KEYS = "nsr"
FAILED = b"press F2 to reload"
QUIET_S = 0.05
KEY_TIMEOUT_S = 5.0
START_TIMEOUT_S = 300.0


class Terminal:
    """A child process on a pseudo-terminal; what it draws accumulates in ``seen``."""

    def __init__(self, cmd: list[str], cols: int, rows: int):
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols),
               "LINES": str(rows)}
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave,
                                     env=env, start_new_session=True, close_fds=True)
        os.close(slave)
        self.fd = master
        self.seen = b""

    def read(self, timeout: float) -> bool:
        """Read what is there within ``timeout`` s; False if nothing came."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = os.read(self.fd, 1 << 16)
        except OSError:
            return False
        self.seen += chunk
        return bool(chunk)

    def last_stop(self, since: int = 0) -> bytes | None:
        found = STOP.findall(self.seen[since:])
        return found[-1].strip() if found else None

    def wait_stop(self, since: int, before: bytes | None, timeout: float) -> float | None:
        """Seconds until a header after byte ``since`` says a stop other than ``before``."""
        t = time.perf_counter()
        while time.perf_counter() - t < timeout:
            self.read(0.005)
            if FAILED in self.seen:  # the load failed: the UI says so and waits
                return None
            now = self.last_stop(since)
            if now is not None and now != before:
                return time.perf_counter() - t
        return None

    def quiet(self, seconds: float = QUIET_S, most: float = 3.0) -> None:
        end = time.perf_counter() + most
        while time.perf_counter() < end and self.read(seconds):
            pass

    def send(self, text: str) -> int:
        mark = len(self.seen)
        os.write(self.fd, text.encode())
        return mark

    def close(self) -> None:
        try:
            self.send("q")
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.fd)


def one_round(model: Path, cols: int, rows: int, keys: int) -> dict:
    # the checkpoint has no tokenizer: benchmarks/gpu.py's prompt as ids
    extra = [] if model == SAMPLE else ["--tokens", ",".join(map(str, PROMPT))]
    term = Terminal([sys.executable, "-m", "firscope", str(model), *extra], cols, rows)
    try:
        if term.wait_stop(0, None, START_TIMEOUT_S) is None:
            raise SystemExit(f"{model}: no stop drawn within {START_TIMEOUT_S:.0f} s; it "
                             f"drew:\n{term.seen[-2000:].decode('utf-8', 'replace')}")
        first_stop = time.perf_counter() - term.t0
        term.quiet()
        lat, timeouts, first_key = [], 0, None
        for i in range(keys):
            key = KEYS[i % len(KEYS)]
            before = term.last_stop()
            mark = term.send(key)
            took = term.wait_stop(mark, before, KEY_TIMEOUT_S)
            if took is None:
                timeouts += 1
            elif i == 0:
                first_key = took
            else:
                lat.append(took)
            term.quiet()
        return {"first_stop": first_stop, "first_key": first_key, "keys": lat,
                "timeouts": timeouts}
    finally:
        term.close()


def p95(values: list[float]) -> float:
    s = sorted(values)
    return s[min(int(round(0.95 * (len(s) - 1))), len(s) - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="sample,gpt2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keys", type=int, default=21)
    ap.add_argument("--size", default="120x36")
    args = ap.parse_args()
    cols, rows = (int(v) for v in args.size.split("x"))
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    goals = {"sample": 1.0, "gpt2": 1.5}
    print(f"firscope UI at {cols}x{rows}, {args.rounds} rounds after a warm-up, "
          f"{args.keys} keys a round ({', '.join(KEYS)} in turn); load average "
          f"{os.getloadavg()[0]:.2f} before")
    for name in models:
        path = model_path(name)
        one_round(path, cols, rows, 1)  # warm-up: caches
        rounds = [one_round(path, cols, rows, args.keys) for _ in range(args.rounds)]
        firsts = [r["first_stop"] for r in rounds]
        keys = [k for r in rounds for k in r["keys"]]
        timeouts = sum(r["timeouts"] for r in rounds)
        goal = goals.get(name)
        print(f"\n{name}: first stop {statistics.median(firsts):.2f} s median "
              f"({min(firsts):.2f}-{max(firsts):.2f})"
              + (f", {statistics.median(firsts) / goal:.2f}x the {goal:g} s goal" if goal
                 else ""))
        first_keys = [r["first_key"] for r in rounds if r["first_key"] is not None]
        if first_keys:
            fk = statistics.median(first_keys)
            print(f"  first key after the first stop: {1e3 * fk:.0f} ms median "
                  f"({1e3 * min(first_keys):.0f}-{1e3 * max(first_keys):.0f}; it waits for "
                  f"the kernels' warm-up, which runs after the first stop is drawn); first "
                  f"stop + first key {statistics.median(firsts) + fk:.2f} s")
        if keys:
            med, hi = statistics.median(keys), p95(keys)
            print(f"  step keys: {1e3 * med:.0f} ms median ({med / 0.05:.2f}x the 50 ms "
                  f"goal), {1e3 * hi:.0f} ms p95 ({hi / 0.15:.2f}x the 150 ms goal), "
                  f"{len(keys)} keys" + (f", {timeouts} timed out" if timeouts else ""))
    print(f"\nload average {os.getloadavg()[0]:.2f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
