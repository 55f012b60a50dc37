"""Threads for compiled kernels: how many to use, and a pool that runs ranges of work.

The q4 and f32 matrix-vector products spread rows over numba's threads
(``prange``); the compiled micro-kernels spread lanes over this module's
pool instead (:func:`run_split`): each range of lanes is one call of the same
compiled, ``nogil`` function, so running lanes on two threads costs no second
compile (a ``prange`` version of every generated kernel took longer to
compile than the kernel itself).
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Sequence

_JOBS: queue.SimpleQueue = queue.SimpleQueue()
_WORKERS: list[threading.Thread] = []
_LOCK = threading.Lock()


def _work() -> None:
    while True:
        fn, args, box, done = _JOBS.get()
        try:
            box.append((True, fn(*args)))
        except BaseException as e:  # noqa: BLE001 - handed to the caller, who re-raises it
            box.append((False, e))
        done.release()


def _ensure_workers(n: int) -> None:
    if len(_WORKERS) >= n:
        return
    with _LOCK:
        while len(_WORKERS) < n:
            t = threading.Thread(target=_work, name=f"firscope-worker-{len(_WORKERS)}",
                                 daemon=True)
            t.start()
            _WORKERS.append(t)


def run_split(calls: Sequence[tuple[Callable, tuple]]) -> list:
    """Run ``fn(*args)`` for every (fn, args): the first on the calling thread, each other
    one on a worker thread, all at once; return their results in order. The functions
    should release the GIL (numba ``nogil``), or nothing runs in parallel. If any raises,
    the first exception is raised once every call has ended (they may share memory)."""
    if len(calls) <= 1:
        return [fn(*args) for fn, args in calls]
    _ensure_workers(len(calls) - 1)
    done = threading.Semaphore(0)
    boxes: list[list] = [[] for _ in calls]
    for (fn, args), box in zip(calls[1:], boxes[1:]):
        _JOBS.put((fn, args, box, done))
    try:
        fn, args = calls[0]
        boxes[0].append((True, fn(*args)))
    except BaseException as e:  # noqa: BLE001 - re-raised below, after the others end
        boxes[0].append((False, e))
    for _ in range(len(calls) - 1):
        done.acquire()
    out = []
    for box in boxes:
        ok, value = box[0]
        if not ok:
            raise value
        out.append(value)
    return out
