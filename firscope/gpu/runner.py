"""The model's nodes on the GPU: the arena resident in pages and split tables
(gpu/layout), one pipeline per distinct shader, one bind group and params buffer per
dispatch, a fault buffer.

:class:`GpuRunner` prepares every node when it is made (micro nodes from vm/wgsl,
ext nodes from gpu/shaders), so a shader the driver refuses or a buffer over the
adapter's limits is reported before anything runs. :meth:`GpuRunner.run` encodes a
list of nodes into one command buffer (one compute pass per dispatch, optionally
timed with timestamp queries; an op over a split table is one dispatch per chunk),
submits it and reads the fault buffer: a fault is raised as the reference raises
it (vm/wgsl.fault_error_of). Host <-> GPU copies of regions are :meth:`upload` and
:meth:`download`, of host ranges :meth:`write_host`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import FirError, FirFault
from ..runtime import Model, NodeKind, PlanNode
from ..runtime.extops import embedding_fault
from ..runtime.machine import DEFAULT_BUDGET
from ..vm import wgsl
from .device import Gpu, GpuError, device_error, open_device
from .layout import ArenaLayout
from .shaders import COL_LANES, COLS, EMBEDDING, FAULTS_BINDING, PARAMS_BINDING, ROWS, ROWS_Q4, \
    ROWS_Q4_WORDS, binding_of, compose, q4_by_words

MIB = 1 << 20


@dataclass
class Pass:
    """One dispatch: a pipeline (keyed by its shader text), its bind group, its grid."""

    shader: str
    bind_group: object
    groups: tuple[int, int]


@dataclass
class Prepared:
    """One node, ready to encode."""

    node: PlanNode
    passes: list[Pass] = field(default_factory=list)
    copy_x: tuple | None = None  # (buffer, byte offset, bytes) copied into the x scratch
    program: object = None  # micro: the vm/wgsl WgslProgram


class GpuRunner:
    def __init__(self, model: Model, gpu: Gpu | None = None, *,
                 budget: int | None = DEFAULT_BUDGET, path_label: str | None = None,
                 page_cap: int | None = None, table_cap: int | None = None):
        """``page_cap`` / ``table_cap``: bytes per page and per table chunk (default the
        adapter's largest storage binding; tests set them small to split a small model)."""
        self.model = model
        self.gpu = gpu or open_device()
        self.budget = budget if budget is not None else 0xFFFFFFFF
        self.label = path_label or model.path.name
        self.wgpu = self.gpu.wgpu
        self.device = self.gpu.device
        self._pipelines: dict[str, tuple] = {}
        self._weights: dict[str, tuple] = {}
        try:
            cap = self._cap()
            self.layout = ArenaLayout(model, min(page_cap or cap, cap),
                                      min(table_cap or page_cap or cap, cap), self.gpu.name)
            self._make_buffers()
            self.prepared = [self._prepare(n) for n in model.nodes]
        except GpuError:
            raise
        except FirError:
            raise
        except Exception as e:
            if _out_of_memory(e):
                raise GpuError(f"{self.label} needs {self.needed_bytes() / MIB:.1f} MiB on the "
                               f"GPU ({self.gpu.name}), more than it could allocate "
                               f"({_first_line(e)}); WebGPU does not say how much memory an "
                               "adapter has: use a GPU with more memory, or a smaller model"
                               ) from None
            raise device_error(self.gpu, "preparing the model's shaders and buffers", e) from None

    def needed_bytes(self) -> int:
        """Bytes the model's buffers take on the GPU: the arena's pages and tables, the
        weights stored beside it (q4 codes, scales and minimums; f32 matrices)."""
        total = sum(4 * (p.hi - p.lo) for p in self.layout.pages)
        total += sum(4 * (c.hi - c.lo) for t in self.layout.tables.values() for c in t.chunks)
        seen = set()
        for node in self.model.nodes:
            for a in node.args:
                e = a.weight
                if e is None or e.name in seen or (e.region is not None and e.matrix is None):
                    continue
                seen.add(e.name)
                total += e.matrix.nbytes if e.matrix is not None else e.q4.nbytes
        return total

    # -- buffers ------------------------------------------------------------------------------
    def _cap(self) -> int:
        lim = self.gpu.limits
        return min(lim.get("max-storage-buffer-binding-size", 1 << 27),
                   lim.get("max-buffer-size", 1 << 28)) // 4 * 4

    def _check_size(self, what: str, nbytes: int) -> None:
        cap = self._cap()
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
        m, lay = self.model, self.layout
        self.pages = [self._buffer(m.arena[p.lo:p.hi], f"page {i} of the arena of "
                                   f"{m.path.name}", writable=True)
                      for i, p in enumerate(lay.pages)]
        self.chunks = {(name, k): self._buffer(m.arena[c.lo:c.hi],
                                               f"{name} rows {c.row_lo}..{c.row_lo + c.rows - 1}",
                                               writable=True)
                       for name, t in lay.tables.items() for k, c in enumerate(t.chunks)}
        self.faults = self._buffer(np.zeros(wgsl.FAULT_WORDS, np.uint32), "the fault buffer",
                                   writable=True)
        xs = max([n.args[0].size for n in m.nodes if n.target in ("fir.linear", "fir.linear_t")]
                 + [1])
        self.xs = self._buffer(np.zeros(xs, np.float32), "the linears' input copy")

    def _where(self, region) -> tuple[object, int]:
        """The page buffer a region kept whole lies in, and its base there."""
        page, base = self.layout.place(region)
        return self.pages[page], base

    def _table_parts(self, region) -> list[tuple[object, int, int, int]]:
        """(buffer, base, first row, rows) of each piece of a row table."""
        if self.layout.is_table(region):
            t = self.layout.tables[region.name]
            return [(self.chunks[(t.name, k)], 0, c.row_lo, c.rows)
                    for k, c in enumerate(t.chunks)]
        buf, base = self._where(region)
        return [(buf, base, 0, None)]

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
    def _pipeline(self, text: str, writable: dict[int, bool], what: str) -> tuple:
        """The pipeline of a shader; ``writable``: binding -> bound read_write (else read)."""
        got = self._pipelines.get(text)
        if got is not None:
            return got
        w = self.wgpu
        most = self.gpu.limits.get("max-storage-buffers-per-shader-stage", 8)
        if len(writable) > most:
            raise GpuError(f"{what} needs {len(writable)} storage buffers at once (its data, "
                           f"its params and the fault buffer); the adapter allows {most} per "
                           "shader")
        entries = [{"binding": b, "visibility": w.ShaderStage.COMPUTE,
                    "buffer": {"type": "storage" if rw else "read-only-storage"}}
                   for b, rw in sorted(writable.items())]
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

    def _pass(self, text: str, writable: dict[int, bool], buffers: dict[int, object],
              params, groups, what: str) -> Pass:
        """A dispatch of ``text`` over ``buffers`` (binding -> buffer) and its params."""
        writable = {**writable, PARAMS_BINDING: False, FAULTS_BINDING: True}
        buffers = {**buffers, PARAMS_BINDING: self._params(params),
                   FAULTS_BINDING: self.faults}
        _, layout = self._pipeline(text, writable, what)
        group = self.device.create_bind_group(layout=layout, entries=[
            {"binding": b, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
            for b, buf in sorted(buffers.items())])
        return Pass(text, group, groups)

    def _ext_pass(self, shader, roles: dict[str, object], params, groups, what: str,
                  constants: dict[str, int] | None = None) -> Pass:
        """An ext op's dispatch: each role's buffer (one binding per distinct buffer)."""
        distinct: list = []
        slots = {}
        for r in shader.roles:
            buf = roles[r.name]
            k = next((i for i, b in enumerate(distinct) if b is buf), None)
            if k is None:
                distinct.append(buf)
                k = len(distinct) - 1
            slots[r.name] = k
        text, writable = compose(shader, slots, constants)
        return self._pass(text, {binding_of(k): rw for k, rw in enumerate(writable)},
                          {binding_of(k): b for k, b in enumerate(distinct)},
                          params, groups, what)

    def _params(self, values) -> object:
        return self._buffer(np.array(values, dtype=np.uint32), "a node's parameters")

    # -- nodes --------------------------------------------------------------------------------
    def _prepare(self, node: PlanNode) -> Prepared:
        if node.kind == NodeKind.MICRO:
            return self._prepare_micro(node)
        if node.target == "fir.embedding":
            return self._prepare_embedding(node)
        return self._prepare_linear(node)

    def _windows(self, node: PlanNode) -> list[int]:
        """The pages a micro node's regions lie in, in the order its operands name them."""
        pages: list[int] = []
        for name, region in node.program.operands:
            if self.layout.is_table(region):
                raise GpuError(f"node {node.full_name}: kernel '{node.target}' reads {name} = "
                               f"{region.name}, which is split across buffers (a kernel "
                               "needs each region whole)")
            page = self.layout.place(region)[0]
            if page not in pages:
                pages.append(page)
        return pages or [0]

    def _prepare_micro(self, node: PlanNode) -> Prepared:
        p = node.program
        tg = wgsl.kernel_tg(p, self.model.symbols)
        lim = self.gpu.limits
        most = min(lim.get("max-compute-workgroup-size-x", 256),
                   lim.get("max-compute-invocations-per-workgroup", 256))
        if tg > most:
            raise GpuError(f"kernel '{p.name}' at node {node.full_name} asks for tg={tg} lanes "
                           f"per threadgroup; the adapter allows {most}")
        pages = self._windows(node)
        window = {page: j for j, page in enumerate(pages)}

        def place(region):
            page, base = self.layout.place(region)
            return window[page], base
        try:
            prog = wgsl.generate(p, symbols=self.model.symbols, path=self.label, tg=max(tg, 1),
                                 budget=self.budget, place=place)
        except ValueError as e:
            raise GpuError(f"node {node.full_name}: {e}") from None
        params = prog.params.copy()
        params[wgsl.P_NODE] = node.index
        bindings = {wgsl.window_binding(j): self.pages[page] for page, j in window.items()}
        what = f"kernel '{p.name}'" + (f" at node {node.full_name} (its regions lie in "
                                       f"{len(pages)} pages of the arena)" if len(pages) > 1
                                       else "")
        one = self._pass(prog.source, {b: True for b in bindings}, bindings, params,
                         wgsl.grid(p.threads, prog.tg), what)
        return Prepared(node, [one], program=prog)

    def _prepare_embedding(self, node: PlanNode) -> Prepared:
        ids, table = node.args
        out = node.outs[0]
        if table.region is None or ids.region is None:
            raise GpuError(f"node {node.full_name}: fir.embedding's table is not in the arena; "
                           "the GPU engine reads tables from the arena only")
        rows, cols = table.weight.shape
        out_buf, out_base = self._where(out.region)
        ids_buf, ids_base = self._where(ids.region)
        passes = []
        for k, (tbuf, tbase, row_lo, n) in enumerate(self._table_parts(table.region)):
            params = [cols, node.index, ids_base, tbase, rows, out_base, row_lo,
                      rows if n is None else n, 1 if k == 0 else 0]
            passes.append(self._ext_pass(EMBEDDING, {"out": out_buf, "ids": ids_buf,
                                                     "tbl": tbuf},
                                         params, wgsl.grid(cols, 64), "fir.embedding"))
        return Prepared(node, passes)

    def _prepare_linear(self, node: PlanNode) -> Prepared:
        x, w = node.args
        y = node.outs[0]
        entry = w.weight
        rows, cols = y.size, x.size
        y_buf, y_base = self._where(y.region)
        x_buf, x_base = self._where(x.region)
        copy_x = (x_buf, x_base * 4, cols * 4)
        what = f"{node.target} at node {node.full_name}"
        if entry.region is not None and entry.matrix is None:
            if node.target != "fir.linear_t":
                w_buf, w_base = self._where(entry.region)
                one = self._ext_pass(COLS, {"y": y_buf, "xs": self.xs, "w": w_buf},
                                     [rows, node.index, cols, y_base, w_base],
                                     wgsl.grid(rows, COL_LANES), what)
                return Prepared(node, [one], copy_x=copy_x)
            passes = [self._ext_pass(ROWS, {"y": y_buf, "xs": self.xs, "w": wbuf},
                                     [rows if n is None else n, node.index, cols,
                                      y_base + row_lo, wbase, 0, 0, 0],
                                     wgsl.grid(rows if n is None else n, 1), what)
                      for wbuf, wbase, row_lo, n in self._table_parts(entry.region)]
            return Prepared(node, passes, copy_x=copy_x)
        if entry.matrix is not None:
            (wbuf,) = self._weight_buffers(entry)
            one = self._ext_pass(ROWS, {"y": y_buf, "xs": self.xs, "w": wbuf},
                                 [rows, node.index, cols, y_base, 0, 0, 0, 0],
                                 wgsl.grid(rows, 1), what)
            return Prepared(node, [one], copy_x=copy_x)
        if entry.q4 is not None and node.target == "fir.linear":
            q = entry.q4
            packed, scale, minimum = self._weight_buffers(entry)
            shader = ROWS_Q4_WORDS if q4_by_words(cols, q.packed.shape[1], q.group) \
                else ROWS_Q4
            one = self._ext_pass(shader, {"y": y_buf, "xs": self.xs, "packed": packed,
                                           "scale": scale, "minimum": minimum},
                                 [rows, node.index, cols, y_base, 0, q.group,
                                  q.packed.shape[1], q.ngroups],
                                 wgsl.grid(rows, 1), what, {"group": q.group})
            return Prepared(node, [one], copy_x=copy_x)
        raise GpuError(f"node {node.full_name}: {node.target} over a {entry.stored} weight "
                       "has no GPU shader")

    # -- running ------------------------------------------------------------------------------
    def _encode(self, encoder, prep: Prepared, timestamps=None) -> None:
        if prep.copy_x is not None:
            buf, off, nbytes = prep.copy_x
            if nbytes:
                encoder.copy_buffer_to_buffer(buf, off, self.xs, 0, nbytes)
        if prep.program is not None and prep.program.threads == 0:
            return
        passes = [p for p in prep.passes if p.groups[0] * p.groups[1]]
        for k, one in enumerate(passes):
            kw = {}
            if timestamps is not None:  # the node's time: the first pass's start to the last's end
                stamps = {"query_set": timestamps["query_set"]}
                if k == 0:
                    stamps["beginning_of_pass_write_index"] = \
                        timestamps["beginning_of_pass_write_index"]
                if k == len(passes) - 1:
                    stamps["end_of_pass_write_index"] = timestamps["end_of_pass_write_index"]
                kw["timestamp_writes"] = stamps
            cpass = encoder.begin_compute_pass(**kw)
            cpass.set_pipeline(self._pipelines[one.shader][0])
            cpass.set_bind_group(0, one.bind_group)
            cpass.dispatch_workgroups(one.groups[0], one.groups[1], 1)
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

    def _piece(self, kind: str, index) -> tuple[object, int]:
        """The GPU buffer of a layout piece and the host element its byte 0 holds."""
        if kind == "page":
            return self.pages[index], self.layout.pages[index].lo
        name, k = index
        return self.chunks[index], self.layout.tables[name].chunks[k].lo

    def write_host(self, lo: int, hi: int, values: np.ndarray | None = None) -> None:
        """Host arena elements [lo, hi) (or ``values`` standing for them) to the GPU."""
        data = self.model.arena[lo:hi] if values is None else \
            np.ascontiguousarray(values, dtype=np.float32)
        for kind, index, a, b in self.layout.pieces(lo, hi):
            buf, first = self._piece(kind, index)
            self.device.queue.write_buffer(buf, (a - first) * 4, data[a - lo: b - lo].tobytes())

    def upload(self, region, values: np.ndarray) -> None:
        if region.size:
            self.write_host(region.base, region.base + region.size, values)

    def upload_arena(self) -> None:
        self.write_host(0, self.model.arena.size)

    def download(self, region) -> np.ndarray:
        out = np.zeros(region.size, np.float32)
        lo = region.base
        try:
            for kind, index, a, b in self.layout.pieces(lo, lo + region.size):
                buf, first = self._piece(kind, index)
                raw = self.device.queue.read_buffer(buf, (a - first) * 4, (b - a) * 4)
                out[a - lo: b - lo] = np.frombuffer(raw, dtype=np.float32)
        except Exception as e:
            raise device_error(self.gpu, f"reading {region.name} back", e) from None
        return out


def _out_of_memory(e: BaseException) -> bool:
    text = str(e).lower()
    return "out of memory" in text or "outofmemory" in text or "oom" in text.split()


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
