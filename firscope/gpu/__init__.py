"""The GPU engine (optional extra ``firscope[gpu]``): the model's kernels as WGSL compute
shaders run through wgpu, judged against the reference.

device   the only module that imports wgpu (lazily): adapter, device, limits, errors
shaders  WGSL of the ext ops (embedding, f32 and q4 linears)
runner   arena resident on the GPU, one pipeline per shader, fault buffer, timing
engine   GpuMachine (``--engine gpu``; made by firscope.engines.make_machine)
diff     the reference and the GPU in lockstep (``firscope diff MODEL --engine gpu``)
commands ``firscope gpu``, ``firscope wgsl``, ``profile --engine gpu``

``import firscope.gpu`` never needs wgpu; opening a device without it is a
:class:`GpuError` that says how to install it.
"""
from .device import Gpu, GpuError, open_device
from .engine import GPU_ENGINE, NO_STEPPING, GpuMachine

__all__ = ["GPU_ENGINE", "Gpu", "GpuError", "GpuMachine", "NO_STEPPING", "open_device"]
