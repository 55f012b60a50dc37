"""Work items of ``eval`` and ``quant`` on an existing Dask distributed cluster (``--cluster``).

The same :class:`~.work.Task` objects the local worker processes run are submitted to the
cluster's workers, which run :func:`~.work.run_task` exactly as a local worker does: every
figure is the same bit for bit (the reference computes the same bits on every CPU, and
results are handed back in task order). Dask (``pip install 'firscope[cluster]'``) is a
well-kept engine for this; firscope adds no RPC of its own.

What a cluster must offer, checked when firscope connects (each failure is one line naming
the worker): firscope importable on every worker, at this version; the model file, its
config.json and its checkpoint at the same paths, with the same contents (a shared file
system, or the same files copied to each machine). firscope's cache folder need not be
shared: a sensitivity sweep's suffix replay reads records a worker of its first phase wrote;
a worker that finds none runs the variant from the first node instead (the same figures,
verified equal per layer; only slower).

One task runs at a time in each worker process (the model and its machine are per process
and not shared between threads), so a worker's capacity is its process, not its threads:
start workers with ``--nthreads 1`` and as many processes as there are cores to use.
"""
from __future__ import annotations

import atexit
import hashlib
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import FirError

CONNECT_SECONDS = 15
_POOLS: dict = {}  # (address, setup) -> ClusterPool, for the command's whole life


def _fingerprint(model: str) -> dict:
    """What must match between this machine and a worker: firscope's version and the
    model's files (the checkpoint by its size and its first and last MiB)."""
    import firscope
    from ..runtime.opening import resolve_model
    fir = Path(resolve_model(model))
    folder = fir.parent
    out = {"firscope": getattr(firscope, "__version__", "?")}
    for name, path in (("model file", fir), ("config.json", folder / "config.json")):
        out[name] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    ckpt = folder / "model.safetensors"
    size = ckpt.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(ckpt, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    out["model.safetensors"] = h.hexdigest()[:16]
    return out


def _probe(model: str) -> dict | str:
    """Run on each worker: its fingerprint of ``model``, or why it has none."""
    try:
        return _fingerprint(model)
    except Exception as e:  # reported per worker by the caller
        return f"{type(e).__name__}: {e}"


class ClusterPool:
    """A connection to a Dask scheduler that runs tasks and hands results back in order."""

    def __init__(self, address: str, setup):
        try:
            from distributed import Client
        except ImportError:
            raise FirError("--cluster needs Dask's distributed package: "
                           "pip install 'firscope[cluster]'") from None
        self.address, self.setup = address, setup
        _check_address(address)  # a malformed one would leave a half-made Client behind
        try:
            self.client = Client(address, timeout=f"{CONNECT_SECONDS}s", set_as_default=False)
        except (OSError, TimeoutError, ValueError) as e:
            raise FirError(f"--cluster {address}: no Dask scheduler answered there within "
                           f"{CONNECT_SECONDS} s ({e})") from None
        try:
            self._check()
        except BaseException:
            self.close()
            raise

    def _check(self) -> None:
        info = self.client.scheduler_info(n_workers=-1).get("workers", {})
        if not info:
            raise FirError(f"--cluster {self.address}: the scheduler has no workers")
        self.slots = len(info)
        mine = _fingerprint(self.setup.model)
        try:
            theirs = self.client.run(_probe, self.setup.model)
        except Exception as e:  # a worker that cannot unpickle firscope's function
            raise FirError(f"--cluster {self.address}: the workers cannot run firscope "
                           f"({type(e).__name__}: {e}); install it on every worker") from None
        for worker, got in sorted(theirs.items()):
            if isinstance(got, str):
                raise FirError(f"--cluster {self.address}: worker {worker} cannot read the "
                               f"model at {self.setup.model}: {got} (every worker needs the "
                               "model's files at the same paths)")
            for what, value in mine.items():
                if got.get(what) != value:
                    kind = "version" if what == "firscope" else "contents"
                    raise FirError(f"--cluster {self.address}: worker {worker} has another "
                                   f"{what} {kind} ({got.get(what)} here {value}); every "
                                   "worker needs the same files and firscope version")

    def run(self, fn, tasks: Sequence) -> Iterator:
        """``fn(setup, task)`` of each task on the workers; results in task order (each
        waited for in turn, whatever order the workers finish them in)."""
        futures = [self.client.submit(fn, self.setup, t, pure=False) for t in tasks]
        done = 0
        try:
            for f in futures:
                yield f.result()
                done += 1
        finally:
            if done < len(futures):
                self.client.cancel(futures)

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass


def _check_address(address: str) -> None:
    """Dask's own parse of a scheduler address, and a port in range, before connecting."""
    from distributed.comm.addressing import parse_address, parse_host_port
    try:
        scheme, where = parse_address(address)
        if scheme in ("tcp", "tls"):
            _, port = parse_host_port(where)
            if not 0 < int(port) < 65536:
                raise ValueError(f"port {port} is outside 1..65535")
    except (ValueError, TypeError) as e:
        raise FirError(f"--cluster {address}: not a scheduler address ({e}); for example "
                       "tcp://HOST:8786") from None


def cluster_address(value: str) -> str:
    """``--cluster``'s argument: a scheduler address (tcp://host:port, host:port, ...)."""
    value = value.strip()
    if not value or any(c.isspace() for c in value) or "\0" in value:
        raise ValueError(f"not a scheduler address: {value!r}")
    return value



def connect(address: str, setup) -> ClusterPool:
    """The connection to ``address`` for tasks of ``setup``, made and checked once per
    process (a plan evaluates several times; the first call says early what is wrong)."""
    pool = _POOLS.get((address, setup))
    if pool is None:
        if not _POOLS:
            atexit.register(close_all)
        pool = _POOLS[(address, setup)] = ClusterPool(address, setup)
    return pool


def close_all() -> None:
    while _POOLS:
        _POOLS.popitem()[1].close()
