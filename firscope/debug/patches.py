"""``set``: patching registers, buffers and (explicitly) weights, replayably.

gdb's ``set var`` and TransformerLens's activation patching. A patch is made
at a place in the run (a node boundary, or an instruction count inside a
dispatch) and holds concrete values, computed once when it is made (``set x
= x * 0.5`` stores the halved values). It is part of the run from then on:

* made between nodes, it is recorded in the undo log like any write and is
  applied again whenever the forward loop arrives at that boundary;
* made inside a dispatch, its old values go into the dispatch's tape and the
  node's undo record, and it is applied again whenever that dispatch reaches
  that instruction count (the node is then interpreted, not run compiled).

So reverse execution undoes a patch like any other write, and going forward
again re-applies it: forward/back/forward identity holds. Weights are
read-only unless the patch says ``--weight``; only weights that live in the
arena (f32) can be patched.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import FirError
from ..model import Ref
from .expr import DebugExpr
from .history import Change, Record, RecordKind
from .resolver import parse_register

Where = tuple[int, int, int | None]  # (step, node index, dispatch steps or None between nodes)

_SET = re.compile(r"\s*(--weight\s+)?(?:lane\s+([0-9]{1,12})\s+)?([^=]+?)\s*=(?!=)\s*(.+)$",
                  re.S)
_TARGET = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:@([0-9]{1,12}))?\s*(\[.*\])?$", re.S)


@dataclass(frozen=True)
class Patch:
    number: int
    text: str  # as the user typed it
    where: Where
    made_at: str  # "token 2, before attention@1" / "token 2, attention@1 pc 40"
    addresses: np.ndarray | None = None  # absolute arena addresses (int64)
    values: np.ndarray | None = None  # their new values (f32)
    register: tuple[str, int, int] | None = None  # (file, number, lane)
    reg_value: float | int = 0
    weight: bool = False

    def describe(self) -> str:
        return f"{self.number:<4}{self.text}  (made at {self.made_at})"

    def apply(self, arena: np.ndarray, dispatch=None, tape=None) -> None:
        if self.register is not None:
            file, reg, lane = self.register
            regs = dispatch.R if file == "R" else dispatch.U
            regs[reg, lane] = self.reg_value
            return
        if tape is not None:
            tape.store(dispatch, self.addresses, self.values)
        arena[self.addresses] = self.values


class PatchTable:
    """The patches of a session, by number and by the place they apply."""

    def __init__(self):
        self._patches: dict[int, Patch] = {}
        self._next = 1

    def __iter__(self):
        return iter(list(self._patches.values()))

    def __len__(self) -> int:
        return len(self._patches)

    def add(self, patch: Patch) -> Patch:
        from dataclasses import replace
        patch = replace(patch, number=self._next)
        self._next += 1
        self._patches[patch.number] = patch
        return patch

    def delete(self, number: int) -> Patch:
        if number not in self._patches:
            raise FirError(f"no patch number {number}")
        return self._patches.pop(number)

    def at(self, step: int, node: int, steps: int | None) -> list[Patch]:
        return [p for p in self._patches.values() if p.where == (step, node, steps)]

    def inside(self, step: int, node: int) -> bool:
        """Whether some patch applies in the middle of this node's dispatch."""
        return any(p.where[:2] == (step, node) and p.where[2] is not None
                   for p in self._patches.values())


def apply_patch(session, patch: Patch) -> None:
    """Apply a patch where the session is (its place): between nodes with an undo record,
    inside a dispatch through the tape and the node's undo record."""
    if patch.where[2] is None:
        old = session.arena[patch.addresses].copy()
        session.history.push(Record(RecordKind.PATCH, session.step, session.node_index,
                                    (Change(0, patch.addresses.copy(), old),)))
        patch.apply(session.arena)
    else:
        if patch.addresses is not None:
            _cover(session, patch.addresses)
        patch.apply(session.arena, session.dispatch, session.tape)
    session.breakpoints.refresh_watches(session.arena)


def _cover(session, addresses: np.ndarray) -> None:
    """Make the live node's undo record include elements a patch writes outside the regions
    the node itself writes (their values now are their values at its start)."""
    before = session.node_before
    spans = [(a, a + data.size) for a, data in before]
    for addr in np.unique(addresses):
        a = int(addr)
        if not any(lo <= a < hi for lo, hi in spans):
            before.append((a, session.arena[a:a + 1].copy()))
            spans.append((a, a + 1))


def parse_set(session, text: str, lane: int) -> Patch:
    """``[--weight] [lane N] TARGET = EXPR`` -> a patch (number 0) at the current place."""
    m = _SET.match(text)
    if not m:
        raise FirError("usage: set [--weight] [lane N] TARGET = EXPR  (R3, U4, R3[2], x[0:4], "
                       "key_cache@2[3], wte[5, 0:4])")
    weight, lane_text, target, expr_text = m.groups()
    if lane_text is not None:
        lane = int(lane_text)
    value = session.evaluate(DebugExpr(expr_text), lane=lane)
    here = _where(session)
    made_at = _made_at(session)
    tm = _TARGET.match(target.strip())
    if not tm:
        raise FirError(f"cannot set {target.strip()!r}: expected a register (R3, U4, R3[2]) or "
                       "a buffer element or range (x[0:4], key_cache@2[3])")
    name, layer, index = tm.groups()
    reg = parse_register(name) if layer is None else None
    if reg is not None:
        return _register_patch(session, text, here, made_at, reg, index, lane, value)
    addresses, is_weight = _addresses(session, name, layer, index, bool(weight))
    values = _as_values(value, addresses.shape)
    return Patch(0, text.strip(), here, made_at, addresses.reshape(-1), values.reshape(-1),
                 weight=is_weight)


def _where(session) -> Where:
    d = session.dispatch
    return session.step, session.node_index, (d.steps if d is not None else None)


def _made_at(session) -> str:
    if session.finished:
        raise FirError("generation is over: there is nothing left to patch")
    node = session.node.full_name
    d = session.dispatch
    if d is not None:
        return f"token {session.step}, {node} pc {d.pc} (after {d.steps} instructions)"
    return f"token {session.step}, before {node}"


def _register_patch(session, text, here, made_at, reg, index, lane, value) -> Patch:
    d = session.dispatch
    file, n = reg
    if d is None:
        raise FirError(f"{file}{n}: no kernel is running (step into a micro node first)")
    if index is not None:
        inner = index.strip()[1:-1].strip()
        if not re.fullmatch(r"[0-9]{1,12}", inner):
            raise FirError(f"{file}{n}[...] takes a lane number, found {inner!r}")
        lane = int(inner)
    if not 0 <= lane < d.lanes:
        raise FirError(f"lane {lane} does not exist in this dispatch ({d.lanes} lanes)")
    v = np.asarray(value)
    if v.size != 1:
        raise FirError(f"a register holds one value; the expression gives {v.size}")
    v = v.reshape(-1)[0]
    if file == "R":
        reg_value = np.float32(v)
    else:
        f = float(v)
        if not (f.is_integer() and 0 <= f < 2 ** 32):
            raise FirError(f"U{n} holds an integer in 0..2^32-1, not {v!r}")
        reg_value = np.uint32(int(f))
    return Patch(0, text.strip(), here, made_at, register=(file, n, lane), reg_value=reg_value)


def _addresses(session, name, layer, index, weight_ok) -> tuple[np.ndarray, bool]:
    m = session.model
    lay = int(layer) if layer is not None else None
    if name in m.buffers:
        decl = m.buffers[name]
        if decl.per_layer:
            lay = lay if lay is not None else session.layer
            if lay is None or not 0 <= lay < m.layers:
                raise FirError(f"'{name}' is per_layer: say which layer, e.g. {Ref(name, 0)} "
                               f"(layers 0..{m.layers - 1})")
            region = m.instance(Ref(name, lay))
        elif lay is not None:
            raise FirError(f"{Ref(name, lay)} is a copy of what layer {lay} wrote into '{name}', "
                           f"which all layers share: set {name}[...] at the place you want "
                           "instead")
        else:
            region = m.regions[name]
        shape = (region.size,)
        is_weight = False
    else:
        w = session.resolver._weight(name, lay)
        if not weight_ok:
            raise FirError(f"'{w.name}' is a weight: weights are read-only; say "
                           f"'set --weight {w.name}...' to patch it for an experiment")
        if w.region is None:
            raise FirError(f"'{w.name}' is a {w.dtype} weight stored outside the arena; only "
                           "f32 weights can be patched")
        region, shape, is_weight = w.region, tuple(w.shape), True
    flat = np.arange(region.base, region.base + region.size, dtype=np.int64).reshape(shape)
    if index is None:
        return flat, is_weight
    key = DebugExpr(f"__i__{index}")
    try:
        picked = key.evaluate(lambda n, l: flat if n == "__i__" else
                              session.resolver.value(n, l))
    except FirError as e:
        raise FirError(f"cannot set {name}{index}: {e.message}") from None
    return np.atleast_1d(np.asarray(picked, dtype=np.int64)), is_weight


def _as_values(value, shape) -> np.ndarray:
    v = np.asarray(value, dtype=np.float64)
    try:
        out = np.broadcast_to(v, shape)
    except ValueError:
        raise FirError(f"the value has shape {list(v.shape)}, the target {list(shape)}") from None
    with np.errstate(over="ignore"):
        return np.array(out, dtype=np.float32)
