"""The machine's streaming read bandwidth, measured the way a decode step reads its weights.

Used by benchmarks/decode.py (the bandwidth floor of a token, and ``--breakdown``'s
fraction of bandwidth per linear); runnable on its own:

    python benchmarks/bandwidth.py [--threads T] [--mb 1,16,154]

A streaming read here is a sum of f32 data in 128-byte blocks (one ``<32 x float>``
vector add per block, four independent 8-lane chains: a load and an add per 32
bytes, far below what a core can compute), split in equal parts over numba's
threads (the pool firscope's kernels use, ``prange``), of a buffer several times
the last-level cache, each read at the next offset so that nothing it reads is in
a cache: like a decode step's weights, which do not fit one either. A read of
``n`` bytes is timed as one call (thread wake-up included, as a kernel call pays
it), and the figure is the best of several reads: the machine's bandwidth, not
the interference of other processes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from firscope.jitcache import prepare_numba  # noqa: E402

prepare_numba()

from llvmlite import ir  # noqa: E402 - after prepare_numba, which sets the cache folder
from numba import njit, prange  # noqa: E402
from numba.core import cgutils, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

BLOCK = 128  # bytes per vector add
LANES = BLOCK // 4


@intrinsic
def _read_blocks(typingctx, buf, first, count):
    """The sum of the <32 x float> sum of ``count`` 128-byte blocks of the 1-D f32 ``buf``
    from block ``first`` (the value only keeps the loads from being dropped)."""
    sig = types.float32(buf, first, count)

    def codegen(context, builder, signature, args):
        vec = ir.VectorType(ir.FloatType(), LANES)
        i64 = ir.IntType(64)
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        first = context.cast(builder, args[1], signature.args[1], types.int64)
        n = context.cast(builder, args[2], signature.args[2], types.int64)
        acc = cgutils.alloca_once_value(builder, ir.Constant(vec, [0.0] * LANES))
        with cgutils.for_range(builder, n) as loop:
            off = builder.mul(builder.add(first, loop.index), ir.Constant(i64, LANES))
            ptr = builder.bitcast(builder.gep(data, [off]), vec.as_pointer())
            builder.store(builder.fadd(builder.load(acc), builder.load(ptr, align=4)), acc)
        # Every lane goes into the result: returning lane 0 alone let LLVM drop the other
        # 31 lanes' loads, so the read touched one float per 128 bytes (one cache line of
        # two) and measured 40 GB/s where the f32 head's own kernel read 50-59 (Zen 4).
        v = builder.load(acc)
        total = builder.extract_element(v, ir.Constant(i64, 0))
        for k in range(1, LANES):
            total = builder.fadd(total, builder.extract_element(v, ir.Constant(i64, k)))
        return total
    return sig, codegen


@njit(cache=True, nogil=True, parallel=True)
def _stream(buf, first, count, parts):  # pragma: no cover - compiled
    out = np.zeros(parts, np.float32)
    step = (count + parts - 1) // parts
    for p in prange(parts):
        a = first + p * step
        b = min(first + count, a + step)
        if b > a:
            out[p] = _read_blocks(buf, a, b - a)
    return out.sum()


def last_level_cache() -> int:
    """Bytes of the largest cache /sys reports for cpu0 (32 MB when it says nothing)."""
    best = 0
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (d / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            best = max(best, int(text.rstrip("KMG")) * mult)
        except ValueError:
            continue
    return best or 32 << 20


class Streamer:
    """A buffer larger than the last-level cache and a cursor into it: :meth:`read`
    streams the next ``nbytes`` of it (rounded down to 128 bytes) and returns the
    seconds that took."""

    def __init__(self, largest: int):
        import numba
        self.threads = numba.get_num_threads()
        size = max(256 << 20, 4 * last_level_cache() + 2 * largest)
        self.buf = np.ones(size // 4, dtype=np.float32)  # written once: every page is there
        self.blocks = size // BLOCK
        self.cursor = 0
        _stream(self.buf, 0, 8, self.threads)  # loads (or compiles) the kernel

    def read(self, nbytes: int) -> float:
        n = max(1, nbytes // BLOCK)
        if self.cursor + n > self.blocks:
            self.cursor = 0
        t = time.perf_counter()
        _stream(self.buf, self.cursor, n, self.threads)
        dt = time.perf_counter() - t
        self.cursor += n
        return dt

    def best(self, nbytes: int, reads: int = 7) -> float:
        """Seconds of the fastest of ``reads`` reads of ``nbytes``."""
        return min(self.read(nbytes) for _ in range(reads))

    def floor(self, sizes: list[int], passes: int = 7) -> float:
        """Seconds to stream ``sizes`` (one read each, in order, as a decode step reads
        its linears' weights): the sum over reads of each one's best of ``passes``."""
        best = [float("inf")] * len(sizes)
        for _ in range(passes):
            for i, n in enumerate(sizes):
                best[i] = min(best[i], self.read(n))
        return sum(best)


def main() -> int:
    ap = argparse.ArgumentParser(description="streaming read bandwidth (numba threads)")
    ap.add_argument("--mb", default="1,16,154", help="read sizes in MB")
    args = ap.parse_args()
    sizes = [int(float(v) * (1 << 20)) for v in args.mb.split(",")]
    s = Streamer(max(sizes))
    print(f"{s.threads} threads, buffer {s.buf.nbytes >> 20} MB, last-level cache "
          f"{last_level_cache() >> 20} MB, load average {os.getloadavg()[0]:.2f}")
    for n in sizes:
        print(f"  {n / 1e6:8.1f} MB: {n / s.best(n) / 1e9:6.2f} GB/s (best of 7 reads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
