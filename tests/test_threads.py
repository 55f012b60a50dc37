"""model/threads: the pool that runs ranges of lanes, and how many threads kernels use."""
from __future__ import annotations

import threading
import time

import pytest

from firscope.model import threads as T


def test_run_split_runs_every_call_and_keeps_the_order():
    seen = []

    def work(k, delay):
        time.sleep(delay)
        seen.append(threading.get_ident())
        return k * k

    assert T.run_split([(work, (k, 0.02 * (3 - k))) for k in range(3)]) == [0, 1, 4]
    assert len(set(seen)) == 3  # the first on the caller, the others on workers
    assert T.run_split([(work, (5, 0))]) == [25]
    assert T.run_split([]) == []


def test_run_split_raises_after_every_call_ended():
    ended = []

    def slow():
        time.sleep(0.1)
        ended.append("slow")
        return 1

    def bad():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        T.run_split([(bad, ()), (slow, ())])
    assert ended == ["slow"]  # the caller's failure waited for the worker
    with pytest.raises(ValueError, match="boom"):
        T.run_split([(slow, ()), (bad, ())])


def fake_machine(monkeypatch, others_cores: float, cpus: int = 2):
    """/proc/stat as if other processes kept ``others_cores`` cores busy."""
    clock = {"t": 100.0, "busy": 0.0, "own": 0.0}

    def sample():
        clock["t"] += 1.0
        clock["busy"] += others_cores + 0.5  # this process uses half a core
        clock["own"] += 0.5
        return clock["t"], clock["busy"], clock["own"]
    monkeypatch.setattr(T, "_machine_cpu", sample)
    monkeypatch.setattr(T, "_WATCH", T._Watch())
    monkeypatch.setattr(T.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(T.os, "getloadavg", lambda: (others_cores, 0.0, 0.0))
    monkeypatch.delenv("FIRSCOPE_THREADS", raising=False)


@pytest.mark.parametrize("others,cpus,want", [(0.0, 2, 2), (0.3, 2, 2), (0.8, 2, 1),
                                              (1.9, 2, 1), (1.2, 4, 2), (0.2, 4, 2)])
def test_adapt_takes_the_cores_other_processes_leave(monkeypatch, others, cpus, want):
    import numba
    fake_machine(monkeypatch, others, cpus)
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    before = numba.get_num_threads()
    try:
        assert T.adapt() == want  # the first look: the load average
        assert T.adapt() == want  # then /proc/stat over the interval
        assert numba.get_num_threads() == want
    finally:
        numba.set_num_threads(before)


def test_the_first_look_trusts_the_load_average_then_the_interval(monkeypatch):
    """A short run (16 tokens in a quarter second) must not run on two threads of a busy
    machine because no interval has passed yet; a load average that overstates (our own
    start-up) is corrected by the first interval."""
    import numba
    fake_machine(monkeypatch, 0.1)
    monkeypatch.setattr(T.os, "getloadavg", lambda: (1.9, 0.0, 0.0))
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    before = numba.get_num_threads()
    try:
        assert T.adapt() == 1
        assert T.adapt() == 2
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("others,loadavg,want", [(0.1, 1.9, 2), (1.9, 0.0, 1)])
def test_the_first_look_measures_the_load_time_interval(monkeypatch, others, loadavg, want):
    """Started as loading starts (begin_watch), the first token's look rests on what other
    processes did meanwhile, not on the load average, which lags by a minute: a benchmark's
    previous process, just ended, must not cost the next one its second thread (and a busy
    machine with a low load average still gets one thread)."""
    import numba
    fake_machine(monkeypatch, others)
    monkeypatch.setattr(T.os, "getloadavg", lambda: (loadavg, 0.0, 0.0))
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    before = numba.get_num_threads()
    try:
        T.begin_watch()
        assert T.adapt() == want
        assert T._WATCH.measured
    finally:
        numba.set_num_threads(before)


def test_a_first_look_too_soon_after_begin_watch_takes_the_load_average(monkeypatch):
    import numba
    fake_machine(monkeypatch, 0.1)
    ticks = iter([(100.0, 0.0, 0.0), (100.05, 0.1, 0.05)])  # 50 ms: under FIRST_SECONDS
    monkeypatch.setattr(T, "_machine_cpu", lambda: next(ticks))
    monkeypatch.setattr(T.os, "getloadavg", lambda: (1.9, 0.0, 0.0))
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    before = numba.get_num_threads()
    try:
        T.begin_watch()
        assert T.adapt() == 1
        assert not T._WATCH.measured
    finally:
        numba.set_num_threads(before)


def test_firscope_threads_fixes_the_count(monkeypatch):
    import numba
    fake_machine(monkeypatch, 1.9)
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    monkeypatch.setenv("FIRSCOPE_THREADS", "2")
    before = numba.get_num_threads()
    try:
        assert T.adapt() == 2  # busy machine, but fixed
        monkeypatch.setenv("FIRSCOPE_THREADS", "7")
        assert T.adapt() == 2  # never more than numba has
        monkeypatch.setenv("FIRSCOPE_THREADS", "no")
        assert T.adapt() == 1  # not a number: adaptive again
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("loadavg,running,want", [
    (1.9, 1, None),  # the load average lags: only this process runs now -> keep spinning
    (1.9, 2, "PASSIVE"),  # busy for a minute and another task runs now
    (0.3, 3, None),  # a burst that just started: the thread count adapts instead
    (1.9, None, "PASSIVE"),  # no /proc/loadavg: the load average decides, as before
])
def test_openmp_sleeps_only_when_the_machine_is_busy_now(monkeypatch, loadavg, running, want):
    from firscope import jitcache
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setattr(jitcache.os, "getloadavg", lambda: (loadavg, 0.0, 0.0))
    monkeypatch.setattr(jitcache.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(jitcache, "running_now", lambda: running)
    jitcache.choose_omp_wait()
    assert jitcache.os.environ.get("OMP_WAIT_POLICY") == want


def test_running_now_reads_this_machine():
    from firscope import jitcache
    n = jitcache.running_now()
    assert n is None or n >= 1  # this process is running while it reads


def test_adapt_reads_proc_stat_only_once_the_interval_has_passed(monkeypatch):
    """adapt runs every token; the /proc/stat read (about 20 us) waits for the interval."""
    reads = []
    monkeypatch.setattr(T, "_WATCH", T._Watch())
    monkeypatch.setattr(T, "_machine_cpu", lambda: reads.append(1) or (time.monotonic(), 0, 0))
    T._WATCH.last, T._WATCH.measured, T._WATCH.others = (time.monotonic(), 0.0, 0.0), True, 0.7
    assert T.others_busy() == 0.7 and reads == []
    T._WATCH.last = (time.monotonic() - T.SAMPLE_SECONDS, 0.0, 0.0)
    T.others_busy()
    assert reads == [1]
