"""Names a script gives (nodes, buffers, weights, steps), checked against the model, with a
did-you-mean naming the known ones when one is wrong."""
from __future__ import annotations

import difflib
import fnmatch

import numpy as np

from ..errors import FirError
from ..model.ref import Ref

__all__ = ["Names", "did_you_mean"]

_GLOB = set("*?[")


def did_you_mean(name: str, known: list[str], what: str) -> str:
    """`` (did you mean attention@0?)``, or the first known names when none is close."""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    if close:
        return f" (did you mean {', '.join(close)}?)"
    shown = ", ".join(known[:8]) + (", ..." if len(known) > 8 else "")
    return f" ({what}: {shown})"


class Names:
    """Lookups of one loaded model's names."""

    def __init__(self, model):
        self.model = model
        self.node_names = [n.full_name for n in model.nodes]
        self._node_by_name = {n.full_name: n for n in model.nodes}

    def node(self, name: str):
        """The plan node named ``name`` (``attention@0``, ``head``)."""
        if not isinstance(name, str):
            raise FirError(f"a node name is text, not {type(name).__name__}")
        node = self._node_by_name.get(name)
        if node is None:
            hint = ""
            base = name.split("@")[0]
            if base in {n.name for n in self.model.nodes} and "@" not in name:
                hint = f"; '{base}' runs once per layer: say which, e.g. {Ref(base, 0)}"
            raise FirError(f"no node '{name}'{hint}" + ("" if hint else did_you_mean(
                name, self.node_names, "nodes")))
        return node

    def nodes(self, pattern: str) -> list:
        """The nodes a name or a glob (``attention@*``) names; at least one."""
        if not isinstance(pattern, str):
            raise FirError(f"a node name is text, not {type(pattern).__name__}")
        if not _GLOB & set(pattern):
            return [self.node(pattern)]
        found = [n for n in self.model.nodes if fnmatch.fnmatchcase(n.full_name, pattern)]
        if not found:
            raise FirError(f"'{pattern}' matches no node" + did_you_mean(
                pattern, self.node_names, "nodes"))
        return found

    def buffer(self, name: str) -> str:
        """``name`` if it is a buffer the model declares (activations, not weights)."""
        m = self.model
        if not isinstance(name, str):
            raise FirError(f"a buffer name is text, not {type(name).__name__}")
        if name in m.buffers:
            return name
        base = name.partition("@")[0]
        if "@" in name and base in m.buffers:
            raise FirError(f"'{name}': give the buffer's name ({base}); the node says "
                           "which layer")
        if name in m.weight_decls or name in m.weights:
            raise FirError(f"'{name}' is a weight: record= and patch= work on buffers "
                           "(activations); a debugger session's set --weight changes a weight")
        raise FirError(f"no buffer '{name}'" + did_you_mean(name, list(m.buffers), "buffers"))

    def region(self, buffer: str, node):
        """The arena region of ``buffer`` as ``node`` sees it (its layer's instance)."""
        decl = self.model.buffers[buffer]
        if decl.per_layer and node.layer is None:
            raise FirError(f"'{buffer}' has one instance per layer and {node.full_name} is "
                           "outside the layers: patch it at a node of a layer")
        return self.model.buffer_region(buffer, node.layer)

    def weight(self, name: str, layer: int | None = None):
        m = self.model
        if not isinstance(name, str):
            raise FirError(f"a weight name is text, not {type(name).__name__}")
        if layer is not None and (isinstance(layer, bool)
                                  or not isinstance(layer, (int, np.integer))):
            raise FirError(f"layer must be an integer, not {layer!r}")
        key = str(Ref(name, int(layer))) if layer is not None else name
        entry = m.weights.get(key)
        if entry is not None:
            return entry
        if name in m.weight_decls and layer is None and m.weight_decls[name].per_layer:
            raise FirError(f"'{name}' has one instance per layer: weight('{name}', layer) with "
                           f"layer 0..{m.layers - 1}")
        if name in m.weight_decls:
            raise FirError(f"no weight '{key}' (layers 0..{m.layers - 1})")
        if name in m.buffers:
            raise FirError(f"'{name}' is a buffer, not a weight")
        raise FirError(f"no weight '{name}'" + did_you_mean(
            name, list(m.weight_decls) + list(m.weights), "weights"))

    def step(self, step, steps: int) -> int:
        """``step`` as an index of a run of ``steps`` steps (negative counts from the end)."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise FirError(f"a step is an integer, not {step!r}")
        s = int(step)
        if s < 0:
            s += steps
        if not 0 <= s < steps:
            raise FirError(f"step {int(step)} is outside this run (steps 0..{steps - 1})")
        return s
