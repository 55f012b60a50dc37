"""Threads for compiled kernels: how many to use, and a pool that runs ranges of work.

The q4 and f32 matrix-vector products spread rows over numba's threads
(``prange``), and so do the compiled micro-kernels on their plain driver
(vm/kernel_helpers' ``run_par``, one for every kernel: a ``prange`` over ranges
of lanes, each range one call of the kernel's ``run_plain`` through its address,
so neither is compiled again per kernel; numba's
OpenMP workers, which spin a while after each region on an idle machine
(firscope.jitcache.choose_omp_wait), take a range in microseconds). The checked
driver (budget, stop flag, store journal) spreads lanes over this module's
pool instead (:func:`run_split`): each range of lanes is one call of the same
compiled, ``nogil`` function with its own segment of the journal.

How many: :func:`adapt` (called once per decoded token) uses one thread per
core that other processes leave free (rounded: a process using more than
half a core takes one away), at most numba's (``NUMBA_NUM_THREADS``, one per
core by default) and at least one. It looks at /proc/stat every
:data:`SAMPLE_SECONDS`. The first interval starts when loading starts
(:func:`begin_watch`, called by runtime/load), so the first token already
knows what other processes did while the model loaded; only a look with no
interval of at least :data:`FIRST_SECONDS` behind it takes the 1-minute load
average, which lags by a minute (right after another heavy process ends, it
still says the machine is busy). Measured on the 2-core machines (see
benchmarks/decode.py ``--threads``): with the other core free, two threads
make a decode step faster; with it taken, OpenMP's workers wait at every
parallel region for a thread the scheduler has parked, and a row product ran
up to five times slower than on one thread. ``FIRSCOPE_THREADS=N`` fixes the
count instead (what the benchmarks use to measure each way).
"""
from __future__ import annotations

import os
import queue
import threading
import time
from typing import Callable, Sequence

# Rounding of the free cores: other processes using more than this much of a core take
# that core away from the kernels.
BUSY_CORES = 0.5
SAMPLE_SECONDS = 0.5  # how often adapt() looks at the machine again
FIRST_SECONDS = 0.1  # the shortest interval the first measurement may rest on

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


# --- how many threads -----------------------------------------------------------------
def _machine_cpu() -> tuple[float, float, float] | None:
    """(wall, busy CPU seconds of the whole machine, CPU seconds of this process), or
    None where /proc/stat does not exist."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    return time.monotonic(), busy, time.process_time()


class _Watch:
    last: tuple[float, float, float] | None = None
    others: float = 0.0  # cores other processes used over the last interval
    measured: bool = False  # an interval has been measured (before: the load average)


_WATCH = _Watch()


def begin_watch() -> None:
    """Start the first interval now, unless one has started (runtime/load calls this as
    loading begins: loading GPT-2 small takes most of a second, enough to measure)."""
    if _WATCH.last is None:
        _WATCH.last = _machine_cpu()


def _load_average() -> float:
    try:
        return min(os.getloadavg()[0], float(os.cpu_count() or 1))
    except OSError:
        return 0.0


def fixed_threads() -> int | None:
    """FIRSCOPE_THREADS, when set to a whole number >= 1."""
    v = os.environ.get("FIRSCOPE_THREADS", "")
    return int(v) if v.isdigit() and int(v) >= 1 else None


def others_busy() -> float:
    """Cores other processes kept busy since the previous look (at most every
    SAMPLE_SECONDS). With no interval of FIRST_SECONDS behind it yet, the first look
    takes the 1-minute load average (capped at the cores). /proc/stat is read only once
    the interval has passed (adapt runs every token: the read costs 20 us)."""
    last = _WATCH.last
    if last is not None and _WATCH.measured and time.monotonic() - last[0] < SAMPLE_SECONDS:
        return _WATCH.others
    now = _machine_cpu()
    if now is None:
        return 0.0
    if last is None:
        _WATCH.last = now
        _WATCH.others = _load_average()
        return _WATCH.others
    wall = now[0] - last[0]
    if wall >= (SAMPLE_SECONDS if _WATCH.measured else FIRST_SECONDS):
        _WATCH.others = max(0.0, ((now[1] - last[1]) - (now[2] - last[2])) / wall)
        _WATCH.last = now
        _WATCH.measured = True
    elif not _WATCH.measured:
        _WATCH.others = _load_average()
    return _WATCH.others


def matvec_threads() -> int:
    """Threads a parallel kernel uses now: numba's count for the calling thread, as
    :func:`adapt` last set it (at most NUMBA_NUM_THREADS, default one per core)."""
    import numba
    return numba.get_num_threads()


def adapt() -> int:
    """Set numba's thread count for the calling thread (the one that runs the kernels)
    to what the machine can give now; return it. 0 while numba is not imported: no kernel
    has run, nothing is set (importing numba for it took 0.3 s of a debugger's first stop,
    which runs none); the kernels then take numba's count (matvec_threads)."""
    import sys
    if "numba" not in sys.modules:
        return 0
    from ..jitcache import prepare_numba
    prepare_numba()
    import numba
    most = numba.config.NUMBA_NUM_THREADS
    fixed = fixed_threads()
    if fixed is not None:
        n = min(fixed, most)
    elif most <= 1:
        n = 1
    else:
        free = (os.cpu_count() or 1) - others_busy()
        n = max(1, min(most, int(free + BUSY_CORES)))
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)
    return n
