"""Names in debugger expressions -> read-only values.

``R3``/``U5`` are the focused lane's registers; ``x``, ``wte``, ``qkvw@2``
are buffers and weights (a per-layer one without ``@L`` means the current
node's layer); ``scores@2`` is what layer 2 last wrote into a buffer all
layers share, this token; ``lane``, ``step``, ``position``, ``token``,
``layer`` and ``pc`` describe where the session is.

Every array handed out is a read-only view (or a read-only copy): an
expression can look at the model, never change it.
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import FirError
from ..model import Ref
from ..vm.isa import NREGS
from .expr import DebugExpr

_REGISTER = re.compile(r"([RU])([0-9]{1,12})$")
SPECIALS = ("lane", "step", "position", "token", "layer", "pc")


def parse_register(text: str) -> tuple[str, int] | None:
    """``R3`` -> ("R", 3); None if the text is not shaped like a register; FirError if the
    number is outside 0..31."""
    m = _REGISTER.match(text)
    if not m:
        return None
    n = int(m.group(2))
    if n >= NREGS:
        raise FirError(f"register {text} is outside 0..{NREGS - 1}")
    return m.group(1), n


def read_only(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.setflags(write=False)
    return v


class Resolver:
    """Looks names up in a session's current state, for one focused lane."""

    def __init__(self, session):
        self.s = session

    def value(self, name: str, layer: int | None, lane: int = 0):
        reg = parse_register(name) if layer is None else None
        if reg is not None:
            return self._register(reg, lane)
        if layer is None and name in SPECIALS:
            return self._special(name, lane)
        return self.buffer_value(name, layer)

    def _register(self, reg: tuple[str, int], lane: int):
        file, n = reg
        d = self.s.dispatch
        if d is None:
            raise FirError(f"{file}{n}: no kernel is running (step into a micro node first)")
        if not 0 <= lane < d.lanes:
            raise FirError(f"lane {lane} does not exist in this dispatch ({d.lanes} lanes)")
        v = (d.R if file == "R" else d.U)[n, lane]
        return np.float32(v) if file == "R" else int(v)

    def _special(self, name: str, lane: int):
        s = self.s
        d = s.dispatch
        values = {"lane": lane, "step": s.step, "position": s.step, "token": s.token,
                  "layer": s.layer if s.layer is not None else -1,
                  "pc": d.pc if d is not None else -1}
        v = values[name]
        if v is None:
            raise FirError(f"'{name}' has no value here")
        return v

    def buffer_value(self, name: str, layer: int | None = None) -> np.ndarray:
        m = self.s.model
        if name in m.buffers:
            decl = m.buffers[name]
            if decl.per_layer:
                lay = layer if layer is not None else self.s.layer
                if lay is None:
                    raise FirError(f"'{name}' is per_layer: say which layer, e.g. {Ref(name, 0)}")
                if not 0 <= lay < m.layers:
                    raise FirError(f"'{name}' has layers 0..{m.layers - 1}")
                return read_only(m.view(m.instance(Ref(name, lay))))
            if layer is not None:
                return read_only(self._layer_value(name, layer))
            return read_only(m.view(m.regions[name]))
        w = self._weight(name, layer)
        if w.region is not None:
            return read_only(m.view(w.region).reshape(w.shape))
        return read_only(w.dense())  # a q4 weight is dequantized when first looked at

    def _weight(self, name: str, layer: int | None):
        m = self.s.model
        decl_layers = [w for w in m.weights.values() if w.decl == name]
        if not decl_layers:
            raise FirError(f"no buffer, weight or register named '{name}'")
        if decl_layers[0].layer is None:
            return decl_layers[0]
        lay = layer if layer is not None else self.s.layer
        if lay is None:
            raise FirError(f"'{name}' is per layer: say which, e.g. {Ref(name, 0)}")
        w = m.instance(Ref(name, lay))
        if w is None:
            raise FirError(f"'{name}' has layers 0..{m.layers - 1}")
        return w

    def _layer_value(self, name: str, layer: int) -> np.ndarray:
        """``scores@2``: what layer 2 last wrote into a buffer all layers share, this token."""
        s = self.s
        if not 0 <= layer < s.model.layers:
            raise FirError(f"layers are 0..{s.model.layers - 1}")
        rec = s.layer_values.get((name, layer))
        here = (s.step, s.node_index)
        if rec is None or rec[0] != s.step or (rec[0], rec[1]) >= here:
            raise FirError(f"{Ref(name, layer)}: layer {layer} has not written '{name}' yet in this "
                           f"token")
        return rec[2]

    # -- checking names before they are needed -------------------------------------------
    def check(self, expr: DebugExpr) -> None:
        """Refuse a condition whose names can never have a value (a typo, R99), when the
        breakpoint is set rather than when it is first tested."""
        m = self.s.model
        weights = {w.decl for w in m.weights.values()}
        for full in sorted(expr.names()):
            ref = Ref.parse(full)
            name, layer = ref.name, ref.layer
            if layer is None and parse_register(name) is not None:
                continue
            if layer is None and name in SPECIALS:
                continue
            if name in m.buffers or name in weights:
                if layer is not None and layer >= m.layers:
                    raise FirError(f"'{full}': layers are 0..{m.layers - 1}")
                continue
            raise FirError(f"no buffer, weight or register named '{name}'")
