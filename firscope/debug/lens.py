"""The logit lens (nostalgebraist; TransformerLens): read the residual stream as next-token
guesses, through the model's own final layer norm and unembedding.

Found by what the .fir declares, not by names: the node that writes the
``output:logits`` buffer must be an ext linear (the head: ``fir.linear_t
norm wte -> logits`` in GPT-2) whose input buffer is written, just before
it, by a micro node (the final norm: ``g2.layernorm x lnfw lnfb -> norm``);
that node's first input is the residual stream. ``lens`` runs those two
nodes on the current residual (or on what a layer last left in it, for
``lens --all``) and puts every buffer they touch back, bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import FirError
from .history import copy_regions, restore_regions
from ..runtime import NodeKind


@dataclass(frozen=True)
class LensPath:
    norm: object  # the final-norm node
    head: object  # the unembedding node
    residual: str  # buffer name of the residual stream


@dataclass(frozen=True)
class LensRow:
    label: str  # "now", "layer 3"
    layer: int | None
    top: tuple[tuple[int, float], ...]  # (token id, probability)


HELP = ("the logit lens needs the node that writes output:logits to be an ext linear "
        "(fir.linear_t norm wte -> logits) whose input is written just before it by a micro "
        "node (the final norm) reading the residual stream as its first input")


def find_path(model) -> LensPath:
    out = model.outputs["logits"]
    writers = [n for n in model.nodes if any(o.region == out for o in n.outs)]
    if not writers:
        raise FirError("no node writes the output:logits buffer; " + HELP)
    head = writers[-1]
    if head.kind != NodeKind.EXT or head.target not in ("fir.linear", "fir.linear_t"):
        raise FirError(f"'{head.full_name}' writes the logits with {head.target}; " + HELP)
    normed = head.args[0].region
    before = [n for n in model.nodes[: head.index] if any(o.region == normed for o in n.outs)]
    if not before or before[-1].kind != NodeKind.MICRO:
        raise FirError(f"no micro node writes '{head.args[0].display}' before "
                       f"'{head.full_name}'; " + HELP)
    norm = before[-1]
    residual = norm.args[0]
    if residual.kind != "buffer" or residual.name not in model.buffers \
            or model.buffers[residual.name].per_layer:
        raise FirError(f"'{norm.full_name}' reads '{residual.display}', not a buffer all layers "
                       "share; " + HELP)
    return LensPath(norm, head, residual.name)


def residual_writers(model, path: LensPath) -> list:
    """Every node before the final norm that writes the residual stream, in plan order (the
    embeddings, then each layer's residual adds): where the lens can read it."""
    region = model.regions[path.residual]
    return [n for n in model.nodes[: path.norm.index]
            if any(o.region == region for o in n.outs)]


def top_k(logits: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
    z = logits.astype(np.float64)
    finite = np.isfinite(z)
    if not finite.any():
        return ()
    z = np.where(finite, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")[:k]
    return tuple((int(i), float(p[i])) for i in order)


def project(session, path: LensPath, residual: np.ndarray | None = None) -> np.ndarray:
    """Logits the model would give for ``residual`` (default: the stream as it is now)."""
    return project_on(session.machine, path, residual)


def project_on(machine, path: LensPath, residual: np.ndarray | None = None) -> np.ndarray:
    """The same on any machine: the final norm and head run on ``residual`` (default: the
    stream as it is in the machine's arena), and every buffer they touch is put back."""
    m = machine.model
    arena = machine.arena
    res_region = m.regions[path.residual]
    spans = [(res_region.base, res_region.base + res_region.size)]
    for node in (path.norm, path.head):
        spans += node.written_spans()
    saved = copy_regions(arena, list(dict.fromkeys(spans)))
    try:
        if residual is not None:
            arena[res_region.base: res_region.base + res_region.size] = residual
        for node in (path.norm, path.head):
            machine.run_node(node)
        out = m.outputs["logits"]
        return arena[out.base: out.base + out.size].copy()
    finally:
        restore_regions(arena, saved)


def lens(session, k: int = 5, every_layer: bool = False) -> list[LensRow]:
    if session.finished:
        raise FirError("generation is over: there is no residual stream to read")
    if session.dispatch is not None:
        raise FirError("lens reads the residual stream between nodes: finish the kernel first "
                       "(finish, or next)")
    path = find_path(session.model)
    if not every_layer:
        return [LensRow(f"before {session.node.full_name}", session.layer,
                        top_k(project(session, path), k))]
    rows = []
    # the embeddings' own prediction first (TransformerLens's hook_embed + hook_pos_embed):
    # what the nodes before the first layer left in the residual (layer key None)
    for layer in (None, *range(session.model.layers)):
        rec = session.layer_values.get((path.residual, layer))
        if rec is None or rec[0] != session.step or rec[1] >= session.node_index:
            continue  # this layer has not run yet for this token
        rows.append(LensRow("embed" if layer is None else f"layer {layer}", layer,
                            top_k(project(session, path, rec[2]), k)))
    if not rows:
        raise FirError(f"nothing has written '{path.residual}' yet in this token (the "
                       "embeddings run first)")
    return rows
