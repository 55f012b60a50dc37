"""Where firscope keeps compiled code: one folder it owns, never beside its sources.

numba's ``cache=True`` writes machine code beside the module that defines the
function (``__pycache__``) and fails with "no locator available" when that
folder is read-only (a system-wide install, a read-only image). Every cache
firscope uses therefore lives under ``$XDG_CACHE_HOME/firscope`` (default
``~/.cache/firscope``), or, when that is not usable, in a private temporary
folder of this process. :func:`prepare_numba` must run before the first
``import numba`` of the process (it sets ``NUMBA_CACHE_DIR``; if numba is
already imported it sets numba's config value instead).

A folder is used only if this user owns it and nobody else can write it:
a cache someone else can write is a place to plant code.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

_LOCK = threading.Lock()
_PRIVATE: Path | None = None
_CHOSEN: dict[str, Path] = {}


def _usable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = folder.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            return False
        probe = folder / f".probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
        return True
    except OSError:
        return False


def cache_dir(name: str) -> Path:
    """A folder for one kind of cached file (``kernels``, ``numba``), created if needed."""
    with _LOCK:
        got = _CHOSEN.get(name)
        if got is not None:
            return got
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        for cand in (Path(base) / "firscope" / name,
                     Path(tempfile.gettempdir()) / f"firscope-{os.getuid()}" / name):
            if _usable(cand.parent) and _usable(cand):
                _CHOSEN[name] = cand
                return cand
        global _PRIVATE
        if _PRIVATE is None:  # nothing shared is usable: a private folder for this process
            _PRIVATE = Path(tempfile.mkdtemp(prefix="firscope-cache-"))
        folder = _PRIVATE / name
        folder.mkdir(exist_ok=True)
        _CHOSEN[name] = folder
        return folder


def save_atomic(path: str | os.PathLike | None, write) -> bool:
    """``write(file)`` into a file beside ``path``, renamed over it: a reader in another
    process sees the old file or the whole new one. For caches: a failure only skips the
    write (False)."""
    if path is None:
        return False
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


LOCK_WAIT_SECONDS = 120.0  # the largest kernel compiles in ~7 s on an idle CPU


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, wait: float = LOCK_WAIT_SECONDS):
    """Hold an advisory lock on ``path`` (created if need be) against other processes, for
    work that a second process should wait for and then find in a cache rather than do too
    (compiling a kernel: two processes compiling the same one at once each pay seconds).
    The lock goes with the process (a killed holder releases it). Best effort: where the
    platform has no flock, the file cannot be opened, or the holder keeps it past ``wait``
    seconds (a process stopped in a debugger), the work goes ahead without it: doing the
    work twice is only slower."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield False
        return
    try:
        f = open(path, "a+b")
    except OSError:
        yield False
        return
    try:
        held = False
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.02)
            except OSError:  # a file system without locks
                break
        yield held
    finally:
        f.close()  # releases the lock


STALE_TMP_SECONDS = 3600


def prune(folder: Path, limit_bytes: int, patterns: tuple[str, ...]) -> None:
    """Delete the least recently used files of ``folder`` matching ``patterns`` (readers
    touch what they use) until those left hold at most ``limit_bytes``, and the half
    written files of save_atomic that a killed process left (an hour old)."""
    stale = time.time() - STALE_TMP_SECONDS
    for p in folder.glob("*.tmp"):
        try:
            if p.stat().st_mtime < stale:
                p.unlink()
        except OSError:
            pass
    files = []
    for pattern in patterns:
        for p in folder.glob(pattern):
            try:
                st = p.stat()
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, p))
    files.sort()
    total = sum(s for _, s, _ in files)
    for _, size, p in files:
        if total <= limit_bytes:
            break
        try:
            p.unlink()
            total -= size
        except OSError:
            pass


def running_now() -> int | None:
    """Tasks of the whole machine runnable at this instant (/proc/loadavg's fourth field,
    this process included), or None where it cannot be read."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def choose_omp_wait() -> None:
    """Before OpenMP loads (it reads these once): on a machine other processes keep busy,
    OpenMP's threads sleep at once when they wait (OMP_WAIT_POLICY=PASSIVE) instead of
    spinning for milliseconds. Spinning makes back-to-back parallel regions fast on an
    idle machine, but with a core taken by another process the spinning thread holds the
    core its partner needs, and every region waits a scheduler time slice (8 ms per row
    product measured, against 0.1 ms).

    Busy means both: the 1-minute load average is above cores - 0.5, and other tasks are
    runnable now. The load average alone lags by a minute: right after a heavy process
    (a benchmark's previous engine) ends it still says busy, and a process that started
    then ran with PASSIVE on an idle machine (f32 decode rounds 12-22 ms instead of 17).
    Left alone when the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    try:
        load = os.getloadavg()[0]
    except OSError:
        return
    cores = os.cpu_count() or 1
    now = running_now()
    others_now = cores if now is None else now - 1  # without this process
    if load > cores - 0.5 and others_now >= 1:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


# The reference's numerics (model/numeric_kernels) are compiled into every kernel that
# calls them, and numba's cache looks only at the calling function's own file (and freezes
# the globals a function reads): a kernel cached before they changed would keep the old
# definitions. The same holds for the helpers every generated kernel calls
# (vm/kernel_helpers) and the numbers they and the kernels agree on (vm/kernel_abi); a
# generated kernel's own text is in its file's name (vm/compiled: k<sha>.py). So each
# version of these files has a cache folder of its own.
_NUMERICS = ("model/numerics.py", "model/numeric_kernels.py", "vm/kernel_abi.py",
             "vm/kernel_helpers.py")


def numerics_stamp() -> str:
    """A short hash of the files compiled into cached kernels from outside the kernels' own
    files: the reference's numerics, the kernels' helpers and their ABI."""
    h = hashlib.sha256()
    for rel in _NUMERICS:
        try:
            h.update((Path(__file__).parent / rel).read_bytes())
        except OSError:
            h.update(rel.encode())
    return h.hexdigest()[:12]


def prepare_numba() -> None:
    """Point numba's on-disk cache at a folder firscope owns (before numba compiles), and
    choose OpenMP's wait policy (before numba's threads start)."""
    if "numba" not in sys.modules:
        choose_omp_wait()
    if os.environ.get("NUMBA_CACHE_DIR"):
        return  # the user (or the test suite) chose one
    folder = str(cache_dir(f"numba-{numerics_stamp()}"))
    os.environ["NUMBA_CACHE_DIR"] = folder
    numba = sys.modules.get("numba")
    if numba is not None:  # imported before us: its config was read already
        numba.config.CACHE_DIR = folder


def entry_for(fn, args: tuple):
    """The machine code's own Python entry point of numba dispatcher ``fn`` for exactly the
    types of ``args`` (compiled, or loaded from the cache, now if need be): called with
    arguments of those types it skips the dispatcher's matching of types to signatures.
    For a caller that makes the same call again and again (runtime.Machine's plain loop).
    ``fn`` itself when numba does not expose one."""
    try:
        types = tuple(fn.typeof_pyval(a) for a in args)
        if types not in fn.overloads:
            fn.compile(types)
        entry = fn.overloads[types].entry_point
    except Exception:  # noqa: BLE001 - a numba without these internals: the dispatcher works
        return fn
    return entry if callable(entry) else fn
