"""``record=`` and ``patch=`` of :meth:`firscope.Model.run`: what is kept and what is changed
right after chosen nodes, through the machine's ``Hooks.at_node`` (the other nodes keep the
plain loop, so recording a few buffers costs what copying them costs).

Everything is checked before the run starts: a glob that matches nothing, an unknown node
or buffer (with a did-you-mean), a weight, a function that is not callable. A patch
function's answer is checked when it comes: an array of another shape, or not of real
numbers, stops the run with an error naming the node, the buffer and both shapes.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import FirError

__all__ = ["Recording", "PatchFn"]

PatchFn = Callable[[np.ndarray, int], "np.ndarray | None"]
Key = tuple[int, str, str]  # (step, node instance, buffer): a dump's step{S}/{node}/{buffer}


class Recording:
    """The taps of one run: which outputs to copy, which buffers to patch, and what was
    kept (``values``)."""

    def __init__(self, api_model, record: str | Sequence[str] | None,
                 patch: Mapping[tuple[str, str], PatchFn] | None):
        self.names = api_model.names
        self.model = api_model.names.model
        self.values: dict[Key, np.ndarray] = {}
        # node index -> [(start, end, node, buffer)]: what a dump of this run would hold
        self.records: dict[int, list[tuple[int, int, str, str]]] = {}
        self.patches: dict[int, list[tuple[str, int, int, PatchFn]]] = {}
        self._patch_text: list[str] = []
        self._select(record)
        self._patch(patch)
        self._hooked: dict[int, list[Callable]] = {}

    @property
    def recorded_outputs(self) -> frozenset[tuple[str, str]]:
        """(node instance, buffer) of every output recorded at every step."""
        return frozenset((name, b) for outs in self.records.values() for _, _, name, b in outs)

    def describe_patches(self) -> tuple[str, ...]:
        return tuple(self._patch_text)

    # ------------------------------------------------------------------ checks
    def _select(self, record) -> None:
        if record is None:
            return
        from ..compare.record import select_outputs
        if isinstance(record, str):
            pattern = record
        else:
            try:
                parts = list(record)
            except TypeError:
                raise FirError(f"record takes globs (text or a list of text), not "
                               f"{type(record).__name__}") from None
            if not all(isinstance(p, str) for p in parts):
                raise FirError("record takes globs as text, e.g. 'attention@*/attn'")
            pattern = ",".join(parts)
        try:
            chosen = select_outputs(self.model, pattern)
        except FirError as e:
            raise FirError(e.message.replace("--dump-nodes:", "record:", 1)) from None
        for node, i in chosen:
            r = node.outs[i].region
            self.records.setdefault(node.index, []).append(
                (r.base, r.base + r.size, node.full_name, node.outs[i].name))

    def _patch(self, patch) -> None:
        if patch is None:
            return
        if not isinstance(patch, Mapping):
            raise FirError("patch takes a mapping {(node, buffer): fn}, not "
                           f"{type(patch).__name__}")
        for key, fn in patch.items():
            if not (isinstance(key, tuple) and len(key) == 2):
                raise FirError(f"patch keys are (node, buffer) pairs, found {key!r}")
            node_name, buffer = key
            nodes = self.names.nodes(node_name)
            buffer = self.names.buffer(buffer)
            if not callable(fn):
                raise FirError(f"patch[{key!r}] must be a function fn(value, step), not "
                               f"{type(fn).__name__}")
            for node in nodes:
                region = self.names.region(buffer, node)
                self.patches.setdefault(node.index, []).append(
                    (buffer, region.base, region.size, fn))
            self._patch_text.append(f"{node_name}/{buffer}")

    # ------------------------------------------------------------------ the run
    def attach(self, machine) -> None:
        taps = machine.hooks.at_node
        for index in set(self.records) | set(self.patches):
            fn = self._tap
            taps.setdefault(index, []).append(fn)
            self._hooked.setdefault(index, []).append(fn)

    def detach(self, machine) -> None:
        taps = machine.hooks.at_node
        for index, fns in self._hooked.items():
            kept = [f for f in taps.get(index, []) if not any(f is g for g in fns)]
            if kept:
                taps[index] = kept
            else:
                taps.pop(index, None)
        self._hooked = {}

    def _tap(self, machine, node) -> None:
        step = machine.position
        arena = machine.arena
        patches = self.patches.get(node.index)
        if patches:
            for buffer, base, size, fn in patches:
                self._apply(fn, node, buffer, arena[base: base + size], step)
        values = self.values
        for start, end, name, buffer in self.records.get(node.index, ()):
            kept = arena[start:end].copy()
            kept.flags.writeable = False
            values[(step, name, buffer)] = kept

    @staticmethod
    def _apply(fn: PatchFn, node, buffer: str, view: np.ndarray, step: int) -> None:
        value = view.copy()
        value.setflags(write=False)
        out = fn(value, step)
        if out is None:
            return
        new = np.asarray(out)
        if new.dtype.kind != "f":
            raise FirError(f"patch of {node.full_name}/{buffer} at step {step} returned "
                           f"{new.dtype} values; return floats (float32; float16 and float64 "
                           f"are rounded to float32) of shape {view.shape}, or None to keep "
                           "the buffer")
        if new.shape != view.shape:
            raise FirError(f"patch of {node.full_name}/{buffer} at step {step} returned shape "
                           f"{new.shape}; the buffer has shape {view.shape}")
        view[:] = new.astype(np.float32, copy=False)
