"""Where a model's attention probabilities can be read (the UI's attention view and the
profiler): a module of its own so that the UI's start does not import the profiler (its
data classes and the cost model it counts with)."""
from __future__ import annotations

from dataclasses import dataclass

from ..runtime import Model, NodeKind


@dataclass(frozen=True)
class AttentionSite:
    """Where softmax probabilities can be read after an attention node."""

    node: int
    full_name: str
    layer: int | None
    buffer: str  # region display name, e.g. "scores"
    base: int  # arena address of the region
    n_head: int
    n_positions: int  # row stride: head h starts at h * n_positions


def find_attention_sites(model: Model) -> list[AttentionSite]:
    """Micro nodes that store into a buffer of ``n_head * n_positions`` elements.

    Read from the kernels' operands, not from a buffer name: a node whose
    program stores into such a buffer is taken to leave head ``h``'s softmax
    row at ``h * n_positions + 0..position``. :class:`Profiler` checks that
    every captured row sums to 1 and drops a site whose rows do not.
    """
    n_head = model.config.get("n_head")
    n_pos = model.config.get("n_positions")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (n_head, n_pos)):
        return []
    sites = []
    for node in model.nodes:
        if node.kind != NodeKind.MICRO or node.program is None:
            continue
        for region in node.program.written_regions():
            if region.is_buffer and region.size == n_head * n_pos:
                sites.append(AttentionSite(node.index, node.full_name, node.layer, region.name,
                                           region.base, n_head, n_pos))
                break
    return sites
