"""Stopping a headless run from the keyboard: ctrl+c ends it where it is, naming the kernel
and line, instead of a traceback from wherever Python happened to be."""
from __future__ import annotations

import contextlib
import os
import signal
import threading

__all__ = ["ctrl_c_stops", "stop_between_nodes"]


def stop_between_nodes(machine) -> None:
    """Check the machine's stop flag before every node: kernels poll it while they run,
    but short kernels and ext ops never do, so a run of them would not stop."""
    machine.stop_between_nodes = True  # the plain loop looks too: no hook, no slower step


@contextlib.contextmanager
def ctrl_c_stops(stop_flag: threading.Event):
    """While this runs, ctrl+c sets the machine's stop flag instead of raising at once.

    The interpreter and compiled kernels poll the flag, so the run ends with an
    Interrupted error naming the kernel, node and line it was in (exit 130).
    Python runs signal handlers only between bytecodes, which a compiled
    kernel never reaches, so a helper thread also sets the flag from the
    signal wakeup fd. A second ctrl+c raises KeyboardInterrupt as usual.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    presses = 0

    def on_sigint(signum, frame):
        nonlocal presses
        presses += 1
        if presses > 1:
            raise KeyboardInterrupt
        stop_flag.set()

    r, w = os.pipe()
    os.set_blocking(w, False)

    def watch():
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                return
            if not data:  # write end closed: the run is over
                return
            if signal.SIGINT in data:
                stop_flag.set()

    old_handler = signal.signal(signal.SIGINT, on_sigint)
    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    watcher = threading.Thread(target=watch, name="firscope-ctrl-c", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGINT, old_handler)
        os.close(w)
        watcher.join(timeout=1.0)
        os.close(r)
