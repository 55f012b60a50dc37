"""The model's nodes on the GPU: the arena resident in one storage buffer, one pipeline
per distinct shader, one bind group and params buffer per node, a fault buffer.

:class:`GpuRunner` prepares every node when it is made (micro nodes from vm/wgsl,
ext nodes from gpu/shaders), so a shader the driver refuses or a buffer over the
adapter's limits is reported before anything runs. :meth:`GpuRunner.run` encodes a
list of nodes into one command buffer (one compute pass per dispatch, optionally
timed with timestamp queries), submits it and reads the fault buffer: a fault is
raised as the reference raises it (vm/wgsl.fault_error_of). Host <-> GPU copies
of regions are :meth:`upload` and :meth:`download`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import FirError, FirFault
from ..runtime import Model, PlanNode
from ..runtime.extops import embedding_fault
from ..runtime.machine import DEFAULT_BUDGET
from ..vm import wgsl
from .device import Gpu, GpuError, device_error, open_device
from .shaders import COL_LANES, EXT_SHADERS
from ..runtime import NodeKind

MIB = 1 << 20


@dataclass
class Prepared:
    """One node, ready to encode."""

    node: PlanNode
    shader: str  # a key of the pipeline cache (the shader text)
    bind_group: object
    groups: tuple[int, int]
    copy_x: tuple[int, int] | None = None  # (arena byte offset, bytes) into the x scratch
    program: object = None  # micro: the vm/wgsl WgslProgram


class GpuRunner:
    def __init__(self, model: Model, gpu: Gpu | None = None, *,
                 budget: int | None = DEFAULT_BUDGET, path_label: str | None = None):
        self.model = model
        self.gpu = gpu or open_device()
        self.budget = budget if budget is not None else 0xFFFFFFFF
        self.label = path_label or model.path.name
        self.wgpu = self.gpu.wgpu
        self.device = self.gpu.device
        self._pipelines: dict[str, tuple] = {}
        self._weights: dict[str, tuple] = {}
        try:
            self._make_buffers()
            self.prepared = [self._prepare(n) for n in model.nodes]
        except GpuError:
            raise
        except FirError:
            raise
        except Exception as e:
            raise device_error(self.gpu, "preparing the model's shaders and buffers", e) from None

    # -- buffers ------------------------------------------------------------------------------
    def _check_size(self, what: str, nbytes: int) -> None:
        lim = self.gpu.limits
        cap = min(lim.get("max-storage-buffer-binding-size", 1 << 27),
                  lim.get("max-buffer-size", 1 << 28))
        if nbytes > cap:
            raise GpuError(f"{what} ({nbytes / MIB:.1f} MiB) is over the adapter's limit of "
                           f"{cap / MIB:.1f} MiB per storage buffer ({self.gpu.name}): use a "
                           "GPU with larger buffers, or a smaller model")

    def _buffer(self, data: np.ndarray, what: str, *, writable: bool = False):
        data = np.ascontiguousarray(data)
        nbytes = max(int(data.nbytes), 4)
        self._check_size(what, nbytes)
        u = self.wgpu.BufferUsage
        usage = u.STORAGE | u.COPY_DST | (u.COPY_SRC if writable else 0)
        buf = self.device.create_buffer(size=(nbytes + 3) // 4 * 4, usage=usage)
        if data.nbytes:
            self.device.queue.write_buffer(buf, 0, data.tobytes())
        return buf

    def _make_buffers(self) -> None:
        m = self.model
        self.arena = self._buffer(m.arena, f"the arena of {m.path.name}", writable=True)
        self.faults = self._buffer(np.zeros(wgsl.FAULT_WORDS, np.uint32), "the fault buffer",
                                   writable=True)
        xs = max([n.args[0].size for n in m.nodes if n.target in ("fir.linear", "fir.linear_t")]
                 + [1])
        self.xs = self._buffer(np.zeros(xs, np.float32), "the linears' input copy")

    def _weight_buffers(self, entry) -> tuple:
        got = self._weights.get(entry.name)
        if got is None:
            if entry.q4 is not None and entry.matrix is None:
                q = entry.q4
                raw = np.ascontiguousarray(q.packed).reshape(-1)
                padded = np.zeros((raw.size + 3) // 4 * 4, np.uint8)
                padded[: raw.size] = raw
                got = (self._buffer(padded.view(np.uint32), f"weight {entry.name} (q4 codes)"),
                       self._buffer(q.scale.astype(np.float32), f"weight {entry.name} scales"),
                       self._buffer(q.minimum.astype(np.float32), f"weight {entry.name} mins"))
            else:
                got = (self._buffer(np.asarray(entry.matrix, np.float32),
                                    f"weight {entry.name}"),)
            self._weights[entry.name] = got
        return got

    # -- pipelines ----------------------------------------------------------------------------
    def _pipeline(self, text: str, extra: tuple[str, ...], what: str) -> tuple:
        got = self._pipelines.get(text)
        if got is not None:
            return got
        w = self.wgpu
        kinds = ["storage", "read-only-storage", "storage"] + \
                ["read-only-storage" for _ in extra]
        entries = [{"binding": i, "visibility": w.ShaderStage.COMPUTE, "buffer": {"type": k}}
                   for i, k in enumerate(kinds)]
        try:
            module = self.device.create_shader_module(code=text)
            layout = self.device.create_bind_group_layout(entries=entries)
            pipeline = self.device.create_compute_pipeline(
                layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": "main"})
        except Exception as e:
            raise GpuError(f"the GPU driver refused the shader of {what} ({_first_line(e)}); "
                           "`firscope wgsl` prints it: report it with the adapter "
                           f"({self.gpu.name})") from None
        got = self._pipelines[text] = (pipeline, layout)
        return got

    def _bind(self, layout, buffers: list) -> object:
        return self.device.create_bind_group(layout=layout, entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
            for i, b in enumerate(buffers)])

    def _params(self, values) -> object:
        return self._buffer(np.array(values, dtype=np.uint32), "a node's parameters")

    # -- nodes --------------------------------------------------------------------------------
    def _prepare(self, node: PlanNode) -> Prepared:
        if node.kind == NodeKind.MICRO:
            return self._prepare_micro(node)
        if node.target == "fir.embedding":
            return self._prepare_embedding(node)
        return self._prepare_linear(node)

    def _prepare_micro(self, node: PlanNode) -> Prepared:
        p = node.program
        tg = wgsl.kernel_tg(p, self.model.symbols)
        lim = self.gpu.limits
        most = min(lim.get("max-compute-workgroup-size-x", 256),
                   lim.get("max-compute-invocations-per-workgroup", 256))
        if tg > most:
            raise GpuError(f"kernel '{p.name}' at node {node.full_name} asks for tg={tg} lanes "
                           f"per threadgroup; the adapter allows {most}")
        try:
            prog = wgsl.generate(p, symbols=self.model.symbols, path=self.label, tg=max(tg, 1),
                                 budget=self.budget)
        except ValueError as e:
            raise GpuError(f"node {node.full_name}: {e}") from None
        params = prog.params.copy()
        params[wgsl.P_NODE] = node.index
        pipeline, layout = self._pipeline(prog.source, (), f"kernel '{p.name}'")
        group = self._bind(layout, [self.arena, self._params(params), self.faults])
        return Prepared(node, prog.source, group, wgsl.grid(p.threads, prog.tg), program=prog)

    def _prepare_embedding(self, node: PlanNode) -> Prepared:
        ids, table = node.args
        out = node.outs[0]
        if table.region is None or ids.region is None:
            raise GpuError(f"node {node.full_name}: fir.embedding's table is not in the arena; "
                           "the GPU engine reads tables from the arena only")
        rows, cols = table.weight.shape
        text, extra = EXT_SHADERS["embedding"]
        pipeline, layout = self._pipeline(text, extra, "fir.embedding")
        params = [cols, node.index, ids.region.base, table.region.base, rows, out.region.base]
        group = self._bind(layout, [self.arena, self._params(params), self.faults])
        return Prepared(node, text, group, wgsl.grid(cols, 64))

    def _prepare_linear(self, node: PlanNode) -> Prepared:
        x, w = node.args
        y = node.outs[0]
        entry = w.weight
        rows = y.size
        cols = x.size
        extra_buffers: list = []
        wbase = 0
        group_size = half = ngroups = 0
        if entry.region is not None and entry.matrix is None:
            wbase = entry.region.base
            kind = "rows_arena" if node.target == "fir.linear_t" else "cols_arena"
        elif entry.matrix is not None:
            kind, extra_buffers = "rows_buffer", list(self._weight_buffers(entry))
        elif entry.q4 is not None and node.target == "fir.linear":
            kind, extra_buffers = "rows_q4", list(self._weight_buffers(entry))
            group_size, half, ngroups = entry.q4.group, entry.q4.packed.shape[1], entry.q4.ngroups
        else:
            raise GpuError(f"node {node.full_name}: {node.target} over a {entry.stored} weight "
                           "has no GPU shader")
        text, extra = EXT_SHADERS[kind]
        pipeline, layout = self._pipeline(text, extra, f"{node.target} ({kind})")
        params = [rows, node.index, cols, y.region.base, wbase, group_size, half, ngroups]
        group = self._bind(layout, [self.arena, self._params(params), self.faults, self.xs]
                           + extra_buffers)
        groups = wgsl.grid(rows, COL_LANES) if kind == "cols_arena" else wgsl.grid(rows, 1)
        return Prepared(node, text, group, groups, copy_x=(x.region.base * 4, cols * 4))

    # -- running ------------------------------------------------------------------------------
    def _encode(self, encoder, prep: Prepared, timestamps=None) -> None:
        if prep.copy_x is not None:
            off, nbytes = prep.copy_x
            if nbytes:
                encoder.copy_buffer_to_buffer(self.arena, off, self.xs, 0, nbytes)
        if prep.groups[0] * prep.groups[1] == 0 or (prep.program is not None
                                                    and prep.program.threads == 0):
            return
        kw = {"timestamp_writes": timestamps} if timestamps is not None else {}
        cpass = encoder.begin_compute_pass(**kw)
        cpass.set_pipeline(self._pipelines[prep.shader][0])
        cpass.set_bind_group(0, prep.bind_group)
        cpass.dispatch_workgroups(prep.groups[0], prep.groups[1], 1)
        cpass.end()

    def run(self, indexes) -> None:
        """Run these nodes (plan indexes, in order) in one submission; raise a fault as the
        reference does."""
        try:
            encoder = self.device.create_command_encoder()
            for i in indexes:
                self._encode(encoder, self.prepared[i])
            self.device.queue.submit([encoder.finish()])
        except Exception as e:
            raise device_error(self.gpu, "running the model's dispatches", e) from None
        self.check_faults()

    def timed(self, indexes) -> list[float]:
        """Run these nodes and return each one's GPU seconds: from timestamp queries when the
        device has them, else from queue completion of one submission per node."""
        if self.gpu.timestamps:
            return self._timed_queries(list(indexes))
        out = []
        for i in indexes:
            t = time.perf_counter()
            self.run([i])  # reads the fault buffer back: waits for the work to finish
            out.append(time.perf_counter() - t)
        return out

    def _timed_queries(self, indexes: list[int]) -> list[float]:
        w = self.wgpu
        n = max(2 * len(indexes), 2)
        try:
            qs = self.device.create_query_set(type=w.QueryType.timestamp, count=n)
            res = self.device.create_buffer(size=n * 8, usage=w.BufferUsage.QUERY_RESOLVE
                                            | w.BufferUsage.COPY_SRC)
            encoder = self.device.create_command_encoder()
            for k, i in enumerate(indexes):
                self._encode(encoder, self.prepared[i], {
                    "query_set": qs, "beginning_of_pass_write_index": 2 * k,
                    "end_of_pass_write_index": 2 * k + 1})
            encoder.resolve_query_set(qs, 0, n, res, 0)
            self.device.queue.submit([encoder.finish()])
            stamps = np.frombuffer(self.device.queue.read_buffer(res), dtype=np.uint64)
        except Exception as e:
            raise device_error(self.gpu, "timing the model's dispatches", e) from None
        self.check_faults()
        # A node with nothing to dispatch wrote no stamps (zeros): it took no GPU time.
        d = stamps[1::2].astype(np.int64) - stamps[0::2].astype(np.int64)
        tick = self.gpu.tick_ns * 1e-9
        return [max(float(v), 0.0) * tick for v in d[: len(indexes)]]

    def check_faults(self) -> None:
        try:
            rec = np.frombuffer(self.device.queue.read_buffer(self.faults), dtype=np.uint32)
        except Exception as e:
            raise device_error(self.gpu, "reading the fault buffer", e) from None
        if rec[wgsl.F_COUNT_SLOT] == 0:
            return
        self.device.queue.write_buffer(self.faults, 0, np.zeros(wgsl.FAULT_WORDS,
                                                                np.uint32).tobytes())
        node = self.model.nodes[int(rec[wgsl.F_NODE])]
        if node.kind == NodeKind.MICRO:
            raise wgsl.fault_error_of(node.program, rec, self.budget)
        raw = float(np.array(rec[wgsl.F_ARG], np.uint32).view(np.float32))
        e = embedding_fault(node, raw)
        raise FirFault(f"{e.message} (on the GPU)", e.loc, node=e.node, layer=e.layer)

    def upload(self, region, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values, dtype=np.float32)
        if data.size:
            self.device.queue.write_buffer(self.arena, region.base * 4, data.tobytes())

    def upload_arena(self) -> None:
        self.device.queue.write_buffer(self.arena, 0, self.model.arena.tobytes())

    def download(self, region) -> np.ndarray:
        if region.size == 0:
            return np.zeros(0, np.float32)
        try:
            raw = self.device.queue.read_buffer(self.arena, region.base * 4, region.size * 4)
        except Exception as e:
            raise device_error(self.gpu, f"reading {region.name} back", e) from None
        return np.frombuffer(raw, dtype=np.float32).copy()


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    said = [ln for ln in lines if "error" in ln.lower() and ln.lower() != "validation error"]
    return " / ".join((said or lines)[:2])[:400] if lines else type(e).__name__


def run_program(program, arena: np.ndarray, *, gpu: Gpu | None = None, symbols=None,
                budget: int = DEFAULT_BUDGET, tg: int | None = None) -> np.ndarray:
    """One bound program on its own arena (a kernel outside a model: the per-op tolerance
    measurement, the fuzzer's kernels). Returns the arena afterwards; a fault is raised as
    the reference raises it."""
    gpu = gpu or open_device()
    w, device = gpu.wgpu, gpu.device
    prog = wgsl.generate(program, symbols=symbols or {}, tg=tg, budget=budget)
    u = w.BufferUsage
    try:
        data = np.ascontiguousarray(arena, np.float32)
        abuf = device.create_buffer_with_data(data=data.tobytes() if data.size else b"\0" * 4,
                                              usage=u.STORAGE | u.COPY_SRC | u.COPY_DST)
        params = device.create_buffer_with_data(data=prog.params.tobytes(), usage=u.STORAGE)
        faults = device.create_buffer_with_data(
            data=np.zeros(wgsl.FAULT_WORDS, np.uint32).tobytes(), usage=u.STORAGE | u.COPY_SRC)
        entries = [{"binding": i, "visibility": w.ShaderStage.COMPUTE, "buffer": {"type": k}}
                   for i, k in enumerate(("storage", "read-only-storage", "storage"))]
        layout = device.create_bind_group_layout(entries=entries)
        pipeline = device.create_compute_pipeline(
            layout=device.create_pipeline_layout(bind_group_layouts=[layout]),
            compute={"module": device.create_shader_module(code=prog.source),
                     "entry_point": "main"})
        group = device.create_bind_group(layout=layout, entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
            for i, b in enumerate((abuf, params, faults))])
        encoder = device.create_command_encoder()
        if program.threads:
            cpass = encoder.begin_compute_pass()
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(*wgsl.grid(program.threads, prog.tg), 1)
            cpass.end()
        device.queue.submit([encoder.finish()])
        rec = np.frombuffer(device.queue.read_buffer(faults), dtype=np.uint32)
        out = np.frombuffer(device.queue.read_buffer(abuf), dtype=np.float32)[: data.size]
    except Exception as e:
        raise device_error(gpu, f"running kernel '{program.name}'", e) from None
    if rec[wgsl.F_COUNT_SLOT]:
        raise wgsl.fault_error_of(program, rec, budget)
    return out.copy()
