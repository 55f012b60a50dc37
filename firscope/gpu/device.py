"""Finding a GPU through wgpu: the only module of firscope that imports ``wgpu``.

:func:`open_device` imports wgpu on first use (``import firscope.gpu`` works without
it), asks for an adapter, and requests a device with the adapter's own limits for
storage buffers (the WebGPU defaults, 128 MiB per binding, are far below what most
GPUs offer) and with timestamp queries when the adapter has them. Every way this can
fail is a :class:`GpuError`: one line saying what happened and what to do.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

from ..errors import FirError

INSTALL_HINT = "install the optional extra: pip install 'firscope[gpu]'"
ADAPTER_HINT = ("no GPU adapter was found: install a Vulkan, Metal or D3D12 driver (on a "
                "machine without a GPU, Mesa's lavapipe: apt-get install mesa-vulkan-drivers)")
# Limits worth showing (and the ones a model's buffers must fit).
SHOWN_LIMITS = ("max-buffer-size", "max-storage-buffer-binding-size",
                "max-storage-buffers-per-shader-stage", "max-compute-workgroup-size-x",
                "max-compute-invocations-per-workgroup", "max-compute-workgroups-per-dimension",
                "min-storage-buffer-offset-alignment")
_RAISED = ("max-buffer-size", "max-storage-buffer-binding-size",
           "max-storage-buffers-per-shader-stage", "max-compute-workgroup-size-x",
           "max-compute-invocations-per-workgroup")


class GpuError(FirError):
    """The GPU engine cannot run here (no wgpu, no adapter, device lost, shader refused,
    a buffer over the adapter's limits)."""


@dataclass
class Gpu:
    """An opened device and what the adapter said about itself."""

    wgpu: object  # the module
    adapter: object
    device: object
    info: dict
    limits: dict
    timestamps: bool  # the device accepts timestamp queries
    lost: list = field(default_factory=list)  # reasons the device was lost (set by wgpu)
    tick_ns: float = 1.0  # nanoseconds per timestamp tick (wgpu-native resolves raw ticks)
    features: frozenset = frozenset()  # the features the device was opened with

    @property
    def name(self) -> str:
        return str(self.info.get("device") or self.info.get("description") or "unknown")

    @property
    def backend(self) -> str:
        return str(self.info.get("backend_type", "?"))

    @property
    def is_software(self) -> bool:
        """A CPU rasterizer (lavapipe, llvmpipe, SwiftShader, WARP): times mean little."""
        return str(self.info.get("adapter_type", "")).lower() == "cpu" or any(
            s in self.name.lower() for s in ("llvmpipe", "lavapipe", "swiftshader", "warp"))

    def describe(self) -> str:
        i = self.info
        timing = "timestamp queries" if self.timestamps else \
            "queue completion per dispatch (no timestamp-query feature)"
        lines = [f"adapter  {self.name}",
                 f"backend  {self.backend}",
                 f"type     {i.get('adapter_type', '?')}",
                 f"vendor   {i.get('vendor', '?')} (id {i.get('vendor_id', '?')}), device id "
                 f"{i.get('device_id', '?')}",
                 f"driver   {i.get('description', '?')}",
                 f"timing   {timing}"]
        if self.timestamps:
            lines.append(f"tick     {self.tick_ns:g} ns per timestamp tick")
        lines += [f"limit    {k} = {self.limits[k]}" for k in SHOWN_LIMITS if k in self.limits]
        if self.is_software:
            lines.append("note     a software adapter: results are real, times are not a GPU's")
        return "\n".join(lines)


def import_wgpu():
    try:
        import wgpu  # noqa: PLC0415 - the optional extra, imported only here
    except ImportError as e:
        raise GpuError(f"the GPU engine needs wgpu ({e}); {INSTALL_HINT}") from None
    return wgpu


_OPENED: list[Gpu] = []


def open_device() -> Gpu:
    """The process's one device (opened on first call; a lost one is opened again)."""
    if _OPENED and not _OPENED[0].lost:
        return _OPENED[0]
    _OPENED.clear()
    wgpu = import_wgpu()
    # Mesa's drivers warn on stderr when XDG_RUNTIME_DIR is unset (a CI container)
    if not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="firscope-xdg-")
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:  # wgpu raises its own types, or RuntimeError from the native side
        raise GpuError(f"{ADAPTER_HINT} ({type(e).__name__}: {_one_line(e)})") from None
    if adapter is None:
        raise GpuError(ADAPTER_HINT)
    limits = {k: adapter.limits[k] for k in adapter.limits}
    features = set(adapter.features)
    timestamps = "timestamp-query" in features
    wanted = {k: limits[k] for k in _RAISED if k in limits}
    # timestamps time the dispatches; subgroups let calibration read the subgroup size
    asked = [f for f in ("timestamp-query", "subgroup") if f in features]
    try:
        device = adapter.request_device_sync(required_features=asked, required_limits=wanted)
    except Exception as e:
        raise GpuError(f"the adapter {adapter.info.get('device', '?')} refused a device "
                       f"({_one_line(e)}); update the GPU driver") from None
    gpu = Gpu(wgpu, adapter, device, dict(adapter.info), limits, timestamps,
              tick_ns=_timestamp_period(device) if timestamps else 1.0,
              features=frozenset(asked))
    try:
        device.lost.then(lambda info: gpu.lost.append(getattr(info, "message", str(info))))
    except Exception:  # older wgpu: no promise; a lost device then shows as an error later
        pass
    _OPENED.append(gpu)
    return gpu


def _timestamp_period(device) -> float:
    """Nanoseconds per timestamp tick. WebGPU says resolved timestamps are nanoseconds, but
    wgpu-native hands over the driver's raw ticks (1 ns on NVIDIA and lavapipe, 10-80 ns
    on other GPUs) and wgpu-py does not wrap the call that says how long a tick is."""
    try:
        from wgpu.backends.wgpu_native import _api  # noqa: PLC0415 - the native backend
        period = float(_api.libf.wgpuQueueGetTimestampPeriod(device.queue._internal))
    except Exception:  # another backend or version: trust the WebGPU spec
        return 1.0
    return period if period > 0 else 1.0


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def device_error(gpu: Gpu | None, what: str, e: BaseException) -> GpuError:
    """A GpuError for a wgpu failure while ``what``: a lost device says so."""
    if gpu is not None and gpu.lost:
        return GpuError(f"the GPU device was lost while {what} ({gpu.lost[0]}); run again "
                        "(a kernel that runs too long can make the driver reset the GPU: "
                        "lower --budget)")
    return GpuError(f"the GPU failed while {what}: {_one_line(e)}")
