"""One loaded model, with any q4-declared weight instance swapped for another form.

:class:`Bank` keeps the model as its file declares it and makes, on demand, the other
forms of each q4-declared instance (``fcw@3``): ``f32`` (the checkpoint's matrix as
``--fir-f32`` loads it) or ``q4:gN``. :meth:`Bank.variant` is the same model with a chosen
form per instance: its nodes are the model's with those weight operands replaced, its
arena the bank's (so variants run one after another, never side by side). A variant
computes exactly what a .fir file declaring those dtypes would (tests/test_quant.py).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import MappingProxyType
from typing import Mapping

import numpy as np

from ..errors import FirError
from ..fir import syntax as S
from ..fir.syntax import NodeKind
from ..model.checkpoint import Checkpoint
from ..model.decls import precision_text
from ..model.q4 import quantize_conv1d
from ..model.weights import WeightEntry


MAX_FORM_THREADS = 4


class Bank:
    def __init__(self, model):
        self.model = model
        self._ckpt = Checkpoint(model.folder)
        self._forms: dict[tuple[str, str], WeightEntry] = {}
        self._lock = threading.Lock()
        self._machines: dict[str, object] = {}
        # every q4-declared instance, in the model's order (the ones a plan can change)
        self.instances: tuple[str, ...] = tuple(
            name for name, e in model.weights.items() if e.region is None)

    def q4_form(self, name: str) -> str:
        """The instance's q4 form: its declared dtype if q4, else q4 at the model's group."""
        e = self.model.weights[name]
        d = self.model.weight_decls[e.decl]
        kind, group = d.precision(e.layer)
        if kind == "q4":
            return precision_text(kind, group, self.model.group)
        kind, group = d.precision(None)
        return precision_text("q4", group, self.model.group)

    def form(self, name: str, precision: str) -> WeightEntry:
        """Instance ``name`` stored as ``precision`` (f32, q4 or q4:gN)."""
        parsed = S.weight_dtype(precision)
        if parsed is None:
            raise FirError(f"unknown weight dtype {precision!r}")
        e = self.model.weights[name]
        kind, group = parsed
        group = group or self.model.group
        if e.declared == precision_text(kind, group, self.model.group) and \
                (kind == "f32") == (e.q4 is None) and (e.q4 is None or e.q4.group == group):
            return e
        key = (name, precision_text(kind, group))
        with self._lock:
            got = self._forms.get(key)
        if got is not None:
            return got
        raw = self._ckpt.load(e.tensor)
        if kind == "f32":
            entry = replace(e, q4=None, matrix=np.ascontiguousarray(raw.T), declared="f32")
        else:
            entry = replace(e, q4=quantize_conv1d(raw, group), matrix=None,
                            declared=precision_text(kind, group, self.model.group))
        with self._lock:
            self._forms[key] = entry
        return entry

    def variant(self, choice: Mapping[str, str]):
        """The model with ``choice`` (instance -> f32 | q4 | q4:gN) applied."""
        if not choice:
            return self.model
        weights = dict(self.model.weights)
        for name in choice:
            if name not in weights or weights[name].region is not None:
                raise FirError(f"'{name}' is not a q4-declared weight instance")
        names = list(choice)
        if len(names) > 1:  # made side by side: reading and transposing release the GIL
            with ThreadPoolExecutor(max_workers=MAX_FORM_THREADS) as pool:
                made = list(pool.map(lambda n: self.form(n, choice[n]), names))
        else:
            made = [self.form(n, choice[n]) for n in names]
        weights.update(zip(names, made))
        nodes = tuple(_renode(n, weights) for n in self.model.nodes)
        return replace(self.model, weights=MappingProxyType(weights), nodes=nodes)

    def machine(self, model, engine: str):
        """A Machine running ``model`` (a variant) at position 0: one per engine, kept, so the
        compiled kernels' plans are made once (a new Machine plans every micro node again)."""
        from ..runtime.machine import Machine
        m = self._machines.get(engine)
        if m is None:
            m = self._machines[engine] = Machine(model, engine=engine)
        else:
            m.use_model(model)
        return m

    def all_f32(self) -> dict[str, str]:
        return {name: "f32" for name in self.instances}

    def all_q4(self) -> dict[str, str]:
        return {name: self.q4_form(name) for name in self.instances}

    def nbytes(self, name: str, precision: str) -> int:
        """Bytes of the instance as loaded in that form (q4: codes two to a byte plus an f32
        scale and min per group; f32: 4 a weight), without making it."""
        e = self.model.weights[name]
        kind, group = S.weight_dtype(precision)
        rows, cols = e.shape[1], e.shape[0]  # declared [in, out]; stored [out, in]
        if kind == "f32":
            return 4 * rows * cols
        g = group or self.model.group
        ng = -(-cols // g)
        return rows * ((ng * g + 1) // 2) + 2 * 4 * rows * ng


def _renode(node, weights):
    if node.kind != NodeKind.EXT:
        return node
    swapped = False
    args = []
    for a in node.args:
        if a.weight is not None and a.region is None and weights[a.weight.name] is not a.weight:
            a = replace(a, weight=weights[a.weight.name])
            swapped = True
        args.append(a)
    return replace(node, args=tuple(args)) if swapped else node
