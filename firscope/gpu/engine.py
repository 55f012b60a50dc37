"""``--engine gpu``: a :class:`~firscope.runtime.Machine` whose nodes run on the GPU.

The host arena stays the mirror the rest of firscope reads: a plain decode step
runs every node in one submission and copies only the logits back; with per-node
hooks (``run --dump``) each node runs alone and its outputs are
copied back before the hooks see them. Per-instruction hooks (the debugger's
stepping, the sanitizer) are refused: a GPU cannot stop at an instruction, so
step on the reference and compare with the GPU (``firscope diff --engine gpu``).
"""
from __future__ import annotations

from ..engines import ENGINE_SPECS
from ..errors import FirError, Interrupted
from ..runtime import Machine, Model
from ..runtime.machine import DEFAULT_BUDGET
from .device import Gpu
from .runner import GpuRunner

GPU_ENGINE = "gpu"
NO_STEPPING = ENGINE_SPECS[GPU_ENGINE].why_not  # what the engine table says of it


class GpuMachine(Machine):
    engine_name = GPU_ENGINE

    def __init__(self, model: Model, *, engine: str = GPU_ENGINE, hooks=None,
                 budget: int | None = DEFAULT_BUDGET, gpu: Gpu | None = None, **layout):
        """``layout``: GpuRunner's ``page_cap`` and ``table_cap`` (bytes; default the
        adapter's largest storage binding). ``engine`` is there for the one constructor
        (firscope.engines.make_machine): it can only be ``gpu``."""
        if engine != GPU_ENGINE:
            raise ValueError(f"GpuMachine runs engine {GPU_ENGINE}, not {engine}")
        super().__init__(model, engine="interp", hooks=hooks, budget=budget)
        self.runner = GpuRunner(model, gpu, budget=budget, **layout)

    def reset(self) -> None:
        super().reset()
        for a, b in self._buffer_slices:
            if b > a:
                self.runner.write_host(a, b, self.arena[a:b])

    def begin_token(self, token: int, *, position: int | None = None) -> None:
        super().begin_token(token, position=position)
        for region in self.model.inputs.values():
            self.runner.upload(region, self.model.view(region))

    def _execute(self, node) -> None:
        if self.hooks.per_instruction:
            raise FirError(NO_STEPPING)
        self.runner.run([node.index])
        for out in node.outs:
            if out.region is not None:
                self.model.view(out.region)[:] = self.runner.download(out.region)

    def step(self, token: int):
        if self.hooks.per_node or self.hooks.per_instruction:
            return super().step(token)
        if self.stop_flag.is_set():  # ctrl+c: a submission runs to its end, so stop here
            raise Interrupted(f"stopped by the user before position {self.position}")
        self.begin_token(token)
        self.runner.run(range(len(self.model.nodes)))
        out = self.model.outputs["logits"]
        self.model.view(out)[:] = self.runner.download(out)
        return self.finish_token()
