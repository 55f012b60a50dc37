"""``firscope gpu --calibrate``: the adapter at hand measured with small wgpu
microbenchmarks and written as a device profile (the user's devices.toml), so that
``profile --engine gpu`` sets each dispatch's measured time beside a prediction for
this very adapter.

What is measured (each a median of :data:`ROUNDS` runs after a warm-up; GPU time from
timestamp queries where the adapter has them, else the submission's wall time):

* ``launch_overhead_us``: :data:`LAUNCHES` empty dispatches back to back in one
  submission, wall time per dispatch;
* ``dram_bandwidth_gbs``: every lane sums a grid-strided share of a buffer as large as
  one binding allows (up to 256 MiB, far past any cache), bytes / time;
* ``f32_tflops``: lanes each running 8 independent ``fma`` chains, sized until a run
  takes :data:`MIN_RUN_S`, 2 flops per fma;
* ``alu_latency_cycles``: one lane, one chain of dependent ``fma``s, time per fma
  times the profile's clock;
* ``memory_latency_ns`` / ``cache_latency_ns``: one lane chasing pointers through a
  random cycle over 128 MiB (or one binding) / 16 KiB, one cache line per hop, time per
  hop. Latencies are the difference of two runs of different lengths, so the
  dispatch's own time cancels out;
* ``simd_width``: the subgroup size the adapter reports in a shader (WGSL's
  ``subgroup_size``), where it has subgroups.

Every other figure comes from a base profile (``--device``; by default the shipped
profile the adapter's name matches). A software adapter (lavapipe) with no profile
gets a base made from the host CPU (one compute unit per CPU thread, the CPU's
clock and cache), each figure saying so. Every loop in these kernels runs fewer than
65535 trips in all per lane, under lavapipe's loop limiter.

Nothing is written until every measurement has succeeded; the new file is read back
through the profile parser before it replaces the old one.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import statistics
import time
from pathlib import Path

import numpy as np

from ..errors import FirError, UsageError
from ..cost.devices import NUMBERS, Device, find_device, load_devices, read_file, user_file
from ..text import printable
from .device import Gpu, GpuError, device_error

ROUNDS = 5
LAUNCHES = 64
MIN_RUN_S = 0.01
CHAIN = 4096  # trips of the dependent-fma loop (8 fmas a trip); twice this at most
HOPS = 8192  # pointer-chase hops; twice this at most (under lavapipe's 65535 trips)
LINE = 16  # u32 per 64-byte line: one hop per line
MAX_TRIPS = 60000  # a lane's loop trips in all, under lavapipe's limiter of 65535

EMPTY = "@compute @workgroup_size(64)\nfn main() {}\n"

READ = """
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) n: vec3<u32>) {
    let lanes = n.x * 64u;
    let count = arrayLength(&src);
    var acc = vec4<f32>(0.0);
    for (var i = gid.x; i < count; i = i + lanes) { acc = acc + src[i]; }
    dst[gid.x] = acc.x + acc.y + acc.z + acc.w;
}
"""

FMA = """
@group(0) @binding(0) var<storage, read_write> dst: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let x = f32(gid.x) * 1e-9;
    var a0 = x; var a1 = x + 1.0; var a2 = x + 2.0; var a3 = x + 3.0;
    var a4 = x + 4.0; var a5 = x + 5.0; var a6 = x + 6.0; var a7 = x + 7.0;
    let b = dst[0] + 0.999;
    let c = 1e-3;
    for (var i = 0u; i < TRIPSu; i = i + 1u) {
        a0 = fma(a0, b, c); a1 = fma(a1, b, c); a2 = fma(a2, b, c); a3 = fma(a3, b, c);
        a4 = fma(a4, b, c); a5 = fma(a5, b, c); a6 = fma(a6, b, c); a7 = fma(a7, b, c);
    }
    dst[gid.x + 1u] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}
"""

CHAIN_KERNEL = """
@group(0) @binding(0) var<storage, read_write> dst: array<f32>;
@compute @workgroup_size(1)
fn main() {
    var a = dst[0];
    let b = dst[1] + 0.999;
    let c = 1e-3;
    for (var i = 0u; i < TRIPSu; i = i + 1u) {
        a = fma(a, b, c); a = fma(a, b, c); a = fma(a, b, c); a = fma(a, b, c);
        a = fma(a, b, c); a = fma(a, b, c); a = fma(a, b, c); a = fma(a, b, c);
    }
    dst[2] = a;
}
"""

CHASE = """
@group(0) @binding(0) var<storage, read> next: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(1)
fn main() {
    var i = 0u;
    for (var k = 0u; k < TRIPSu; k = k + 1u) { i = next[i]; }
    dst[0] = i;
}
"""

SUBGROUP = """
@group(0) @binding(0) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(subgroup_size) size: u32, @builtin(local_invocation_index) i: u32) {
    if (i == 0u) { dst[0] = size; }
}
"""


class _Bench:
    """One adapter's pipelines, buffers and timings."""

    def __init__(self, gpu: Gpu):
        self.gpu, self.w, self.device = gpu, gpu.wgpu, gpu.device

    def buffer(self, data: np.ndarray | None = None, size: int = 0, *, read_back=False):
        u = self.w.BufferUsage
        usage = u.STORAGE | u.COPY_DST | (u.COPY_SRC if read_back else 0)
        if data is not None:
            return self.device.create_buffer_with_data(data=data.tobytes(), usage=usage)
        return self.device.create_buffer(size=max(size, 16), usage=usage)

    def kernel(self, code: str, buffers: list) -> tuple:
        kinds = [("read-only-storage" if i == 0 and len(buffers) > 1 else "storage")
                 for i in range(len(buffers))]
        entries = [{"binding": i, "visibility": self.w.ShaderStage.COMPUTE,
                    "buffer": {"type": k}} for i, k in enumerate(kinds)]
        layout = self.device.create_bind_group_layout(entries=entries)
        pipeline = self.device.create_compute_pipeline(
            layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
            compute={"module": self.device.create_shader_module(code=code),
                     "entry_point": "main"})
        group = self.device.create_bind_group(layout=layout, entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
            for i, b in enumerate(buffers)])
        return pipeline, group

    def run(self, pipeline, group, groups: int, passes: int = 1) -> float:
        """Seconds of one submission of ``passes`` dispatches: GPU time of the span from
        the first to the last when timestamps exist, else wall time to completion."""
        w = self.w
        stamps = self.gpu.timestamps
        encoder = self.device.create_command_encoder()
        if stamps:
            qs = self.device.create_query_set(type=w.QueryType.timestamp, count=2)
            res = self.device.create_buffer(size=16, usage=w.BufferUsage.QUERY_RESOLVE
                                            | w.BufferUsage.COPY_SRC)
        for k in range(passes):
            kw = {}
            if stamps:
                kw["timestamp_writes"] = {"query_set": qs, **(
                    {"beginning_of_pass_write_index": 0} if k == 0 else {}), **(
                    {"end_of_pass_write_index": 1} if k == passes - 1 else {})}
            cpass = encoder.begin_compute_pass(**kw)
            cpass.set_pipeline(pipeline)
            if group is not None:
                cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(groups, 1, 1)
            cpass.end()
        if stamps:
            encoder.resolve_query_set(qs, 0, 2, res, 0)
        t = time.perf_counter()
        self.device.queue.submit([encoder.finish()])
        if stamps:
            ticks = np.frombuffer(self.device.queue.read_buffer(res), dtype=np.uint64)
            return max(float(int(ticks[1]) - int(ticks[0])), 0.0) * self.gpu.tick_ns * 1e-9
        self.device.queue.read_buffer(self._sync())  # waits for the submission
        return time.perf_counter() - t

    def _sync(self):
        if not hasattr(self, "_tiny"):
            self._tiny = self.buffer(size=16, read_back=True)
        return self._tiny

    def median(self, pipeline, group, groups: int, passes: int = 1) -> float:
        self.run(pipeline, group, groups, passes)  # warm-up: compile, page in
        return statistics.median(self.run(pipeline, group, groups, passes)
                                 for _ in range(ROUNDS))

    def best(self, pipeline, group, groups: int) -> float:
        """The fastest of ROUNDS runs after a warm-up: other work on the machine only ever
        adds time, so the minimum is the estimate a latency wants."""
        self.run(pipeline, group, groups)
        return min(self.run(pipeline, group, groups) for _ in range(ROUNDS))

    def wall_per_dispatch(self, pipeline, groups: int) -> float:
        """Wall seconds per dispatch, :data:`LAUNCHES` back to back in one submission."""
        def once():
            encoder = self.device.create_command_encoder()
            for _ in range(LAUNCHES):
                cpass = encoder.begin_compute_pass()
                cpass.set_pipeline(pipeline)
                cpass.dispatch_workgroups(groups, 1, 1)
                cpass.end()
            t = time.perf_counter()
            self.device.queue.submit([encoder.finish()])
            self.device.queue.read_buffer(self._sync())
            return (time.perf_counter() - t) / LAUNCHES
        once()
        return statistics.median(once() for _ in range(ROUNDS))

    def empty_pipeline(self):
        return self.device.create_compute_pipeline(
            layout=self.device.create_pipeline_layout(bind_group_layouts=[]),
            compute={"module": self.device.create_shader_module(code=EMPTY),
                     "entry_point": "main"})


def _chase_table(nbytes: int, rng: np.random.Generator) -> np.ndarray:
    """u32 indices: a single random cycle through every 64-byte line of the buffer."""
    lines = max(nbytes // (4 * LINE), 2)
    order = rng.permutation(lines)  # visit the lines in this order, then back to the first
    table = np.zeros(lines * LINE, np.uint32)
    table[order * LINE] = np.roll(order, -1) * LINE
    return table


def measure(gpu: Gpu, *, quick: bool = False, progress=None) -> dict[str, tuple[float, str]]:
    """field -> (value, how it was measured) for the figures a microbenchmark gives."""
    say = progress or (lambda what: None)
    b = _Bench(gpu)
    out: dict[str, tuple[float, str]] = {}
    timing = ("timestamp queries" if gpu.timestamps else
              "wall time of the submission (no timestamp queries)")
    try:
        say("launch overhead")
        empty = b.empty_pipeline()
        launch = b.wall_per_dispatch(empty, 1)
        out["launch_overhead_us"] = (launch * 1e6, f"{LAUNCHES} empty dispatches back to back "
                                     "in one submission, wall time per dispatch")

        say("read bandwidth")
        cap = min(gpu.limits.get("max-storage-buffer-binding-size", 1 << 27),
                  gpu.limits.get("max-buffer-size", 1 << 28), 1 << 28)
        nbytes = (16 << 20) if quick else cap // 16 * 16
        src = b.buffer(size=nbytes)
        lanes = 64 * 1024
        pipe, group = b.kernel(READ, [src, b.buffer(size=lanes * 4)])
        s = b.median(pipe, group, lanes // 64)
        out["dram_bandwidth_gbs"] = (nbytes / s / 1e9, f"{lanes} lanes sum a grid-strided "
                                     f"{nbytes >> 20} MiB buffer (vec4 loads), bytes / {timing}")

        say("f32 throughput")
        trips = 256 if quick else 1024
        pipe, group = b.kernel(FMA.replace("TRIPS", str(trips)),
                               [b.buffer(size=4 * ((1 << 22) + 2))])
        groups = 64
        while True:
            s = b.median(pipe, group, groups)
            if s >= MIN_RUN_S or groups >= (1 << 16):
                break
            groups *= 4
        flops = groups * 64 * trips * 8 * 2
        out["f32_tflops"] = (flops / s / 1e12, f"{groups * 64} lanes x {trips} trips x 8 "
                             f"independent fma chains, 2 flops an fma / {timing}")

        say("dependent-chain latency")
        trips = (CHAIN // 8, CHAIN) if quick else (CHAIN // 4, 2 * CHAIN)
        buf = b.buffer(size=16)
        per_fma = _per_trip(b, CHAIN_KERNEL, [buf], trips, "dependent-chain") / 8
        out["_alu_latency_ns"] = (per_fma * 1e9, f"one lane, a chain of dependent fmas, the "
                                  f"{timing} of {trips[1] * 8} less that of {trips[0] * 8}, "
                                  "per fma")

        rng = np.random.default_rng(0)
        hops = (HOPS // 8, HOPS) if quick else (HOPS // 4, 2 * HOPS)
        far = (8 << 20) if quick else min(cap, 128 << 20)  # past a CPU's or a GPU's cache
        for name, size, what in (("memory_latency_ns", far, "memory"),
                                 ("cache_latency_ns", 16 << 10, "cache")):
            say(f"{what} latency")
            table = b.buffer(_chase_table(size, rng))
            per_hop = _per_trip(b, CHASE, [table, b.buffer(size=16)], hops, f"{what} latency")
            out[name] = (per_hop * 1e9, f"one lane chasing pointers through a random cycle "
                         f"over {size >> 10} KiB, one 64-byte line a hop, the {timing} of "
                         f"{hops[1]} hops less that of {hops[0]}, per hop")

        size = _subgroup_size(b)
        if size:
            out["simd_width"] = (size, "the subgroup_size builtin a shader reads")
    except GpuError:
        raise
    except Exception as e:
        raise device_error(gpu, "calibrating", e) from None
    if gpu.lost:
        raise device_error(gpu, "calibrating", RuntimeError(gpu.lost[0]))
    return out


def _per_trip(b: _Bench, template: str, buffers: list, trips: tuple[int, int],
              what: str) -> float:
    """Seconds per loop trip of a one-lane kernel: the difference of the fastest runs of two
    trip counts, so that the dispatch's own time cancels out. When other work drowns the
    difference, twice more with counts four times larger (a lane's loops stay under
    MAX_TRIPS, lavapipe's limiter)."""
    for _ in range(3):
        times = []
        for n in trips:
            pipe, group = b.kernel(template.replace("TRIPS", str(n)), buffers)
            times.append(b.best(pipe, group, 1))
        per = (times[1] - times[0]) / (trips[1] - trips[0])
        if per > 0:
            return per
        trips = (min(trips[0] * 4, MAX_TRIPS // 8), min(trips[1] * 4, MAX_TRIPS))
    raise GpuError(f"the {what} measurement was lost in noise ({trips[1]} trips took "
                   f"{times[1] * 1e6:.1f} us, {trips[0]} took {times[0] * 1e6:.1f} us): "
                   "run it again on an idle machine; nothing was written")


def _subgroup_size(b: _Bench) -> int | None:
    if "subgroup" not in getattr(b.gpu, "features", set()):
        return None
    try:
        dst = b.buffer(size=16, read_back=True)
        pipe, group = b.kernel(SUBGROUP, [dst])
        b.run(pipe, group, 1)
        return int(np.frombuffer(b.device.queue.read_buffer(dst), np.uint32)[0]) or None
    except Exception:  # the device was opened without the feature, or an old wgpu
        return None


# -- the base profile ----------------------------------------------------------------------
def cpu_base(gpu: Gpu, fallback: Device) -> tuple[dict, dict]:
    """Figures of a software adapter's host CPU, for what microbenchmarks do not measure:
    (values, sources)."""
    threads = os.cpu_count() or 1
    mhz = _cpu_mhz()
    l3 = _cache_mb()
    values = {k: getattr(fallback, k) for k in NUMBERS}
    sources = {k: f"not measured: {fallback.key}'s figure, for want of a CPU's (it enters "
                  "the occupancy estimate only)" for k in NUMBERS}
    cpu = "the host CPU (a software adapter runs shaders on it)"
    values.update(compute_units=threads, max_lanes_per_cu=1024, max_threadgroups_per_cu=1,
                  tg_memory_per_cu=int(gpu.limits.get("max-compute-workgroup-storage-size",
                                                      32768)))
    sources.update(
        compute_units=f"{cpu}: one per CPU thread (os.cpu_count() = {threads}; lavapipe runs "
                      "one worker thread per CPU, Mesa's LP_NUM_THREADS)",
        max_lanes_per_cu=f"{cpu}: one workgroup of up to 1024 lanes at a time per thread",
        max_threadgroups_per_cu=f"{cpu}: a worker thread runs one workgroup at a time",
        tg_memory_per_cu="the adapter's max-compute-workgroup-storage-size limit")
    if mhz:
        values["clock_ghz"] = mhz / 1000
        sources["clock_ghz"] = f"{cpu}: the highest 'cpu MHz' in /proc/cpuinfo"
    if l3:
        values["l2_mb"] = l3
        sources["l2_mb"] = f"{cpu}: its last-level cache (sysfs or sysconf)"
    return values, sources


def _cpu_mhz() -> float | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    found = [float(m) for m in re.findall(r"cpu MHz\s*:\s*([0-9.]+)", text)]
    return max(found) if found else None


def _cache_mb() -> float | None:
    """The host's last-level cache (Linux's sysfs, else sysconf), MiB."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        m = re.fullmatch(r"(\d+)([KMG]?)", f.read_text().strip()) if f.is_file() else None
        if m:
            sizes.append(int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20,
                                             "G": 1 << 30}[m.group(2)])
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            v = os.sysconf(name)
        except (ValueError, OSError, AttributeError):
            continue
        if v and v > 0:
            sizes.append(v)
    return max(sizes) / (1 << 20) if sizes else None


def base_profile(gpu: Gpu, name: str | None) -> tuple[dict, dict, str]:
    """(values, sources, what it is) for the figures not measured."""
    from .sol import matching_device
    devices = load_devices()
    if name is not None:
        d = find_device(name, devices)
    else:
        d = matching_device(gpu.name, devices)
    if d is not None:
        sources = {}
        for k in NUMBERS:
            said = d.sources.get(k, "no source")
            # a profile calibrated before: its figures keep their own words (measured ones
            # are measured again)
            sources[k] = said if said.startswith(("measured by firscope", "not measured")) \
                else f"not measured: from profile {d.key} ({said})"
        return {k: getattr(d, k) for k in NUMBERS}, sources, f"profile {d.key}"
    if gpu.is_software:
        values, sources = cpu_base(gpu, find_device(None, devices))
        return values, sources, "the host CPU"
    raise GpuError(f"no device profile matches the adapter '{printable(gpu.name)}': name the "
                   "nearest chip with --device NAME (`firscope cost --list-devices`) for the "
                   "figures a microbenchmark does not measure (compute units, occupancy "
                   "limits, clock, cache)")


def profile_key(gpu: Gpu) -> str:
    """A devices.toml key from the adapter's name: 'llvmpipe (LLVM 15, 256 bits)' ->
    'llvmpipe'."""
    head = gpu.name.split("(")[0].strip().lower()
    key = re.sub(r"[^a-z0-9]+", "-", head).strip("-")[:48] or "adapter"
    return key if key[0].isalnum() else "gpu-" + key


def calibrated(gpu: Gpu, measured: dict, base: tuple[dict, dict, str], *, key: str,
               when: str) -> tuple[dict, dict]:
    """The profile's values and sources: measured figures over the base's."""
    values, sources, _ = base
    values, sources = dict(values), dict(sources)
    stamp = f"measured by firscope gpu --calibrate on {when} ({gpu.name}, {gpu.backend})"
    for k, (v, how) in measured.items():
        if k == "_alu_latency_ns":
            values["alu_latency_cycles"] = max(v * values["clock_ghz"], 0.1)
            sources["alu_latency_cycles"] = (f"{stamp}: {how} ({v:.3g} ns), times clock_ghz "
                                             f"{values['clock_ghz']:.3g}")
            continue
        values[k] = int(round(v)) if NUMBERS[k][0] is int else float(f"{v:.4g}")
        sources[k] = f"{stamp}: {how}"
    return values, sources


def profile_text(key: str, name: str, values: dict, sources: dict) -> str:
    def num(k, v):
        return str(int(v)) if NUMBERS[k][0] is int else repr(float(v))
    lines = [f"[{key}]", f"name = {json.dumps(name)}"]
    lines += [f"{k} = {num(k, values[k])}" for k in NUMBERS]
    lines += [f"[{key}.sources]"] + [f"{k} = {json.dumps(sources[k])}" for k in NUMBERS]
    return "\n".join(lines) + "\n"


def write_profile(path: Path, key: str, text: str) -> None:
    """Put ``text`` (tables [key] and [key.sources]) into ``path`` in place of any tables of
    that key; other lines stay. Checked by the profile parser before it replaces the file."""
    old = path.read_text(encoding="utf-8").split("\n") if path.is_file() else []
    kept, skipping = [], False
    header = re.compile(r"\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$")
    for line in old:
        m = header.match(line)
        if m:
            skipping = m.group(1) in (key, f"{key}.sources")
        if not skipping:
            kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    new = "\n".join(kept + ([""] if kept else []) + [text])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new, encoding="utf-8")
    try:
        read_file(tmp)
    except FirError as e:
        tmp.unlink(missing_ok=True)
        raise GpuError(f"the profile measured is not valid ({e.message.splitlines()[0]}): "
                       f"nothing was written to {printable(path)}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def run_calibrate(*, device: str | None = None, key: str | None = None, quick: bool = False,
                  out=None) -> int:
    """``firscope gpu --calibrate``: measure, print, write the profile."""
    import sys

    from .device import open_device
    out = out or sys.stdout
    gpu = open_device()
    base = base_profile(gpu, device)  # a typo in --device fails before any measuring
    key = key or profile_key(gpu)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}", key):
        raise UsageError(f"--key '{printable(key)}': give a name of letters, digits, '_', "
                         "'.', '+' or '-'")
    print(f"calibrating {printable(gpu.name)} ({gpu.backend}); the rest from {base[2]}",
          file=out, flush=True)
    measured = measure(gpu, quick=quick,
                       progress=lambda what: print(f"  measuring {what} ...", file=out,
                                                   flush=True))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    values, sources = calibrated(gpu, measured, base, key=key, when=when)
    path = user_file()
    try:
        write_profile(path, key, profile_text(key, gpu.name, values, sources))
    except OSError as e:
        raise GpuError(f"{path}: cannot write the profile: {e.strerror or e}") from None
    width = max(len(k) for k in NUMBERS)
    for k in NUMBERS:
        mark = "measured" if sources[k].startswith("measured") else "base"
        print(f"  {k:{width}} = {values[k]:<12.4g} {mark}", file=out)
    print(f"wrote device profile [{key}] to {printable(path)}; `firscope profile --engine gpu` "
          "uses it for this adapter", file=out)
    return 0
