"""Breakpoint and watchpoint records, and parsing what the user types for them.

Locations:
  ``attention``            the node in every layer
  ``attention@3``          one node instance
  ``g2.attn_decode:156``   a kernel source line (the line number in the .fir file)
  ``156`` / ``gpt2.fir:156``  the kernel instruction on that line of the model file
  ``token 5``              the start of decode step 5
  ``nan``                  the first node or instruction that writes NaN or Inf
A location may be followed by ``if CONDITION``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import FirError
from ..runtime import Model
from .expr import DebugExpr

_NODE = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)(?:@(\d+))?$")
_WATCH = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:@(\d+))?(?:\[\s*(-?\d*)\s*(?::\s*(-?\d*)\s*)?\])?$")


@dataclass
class Breakpoint:
    number: int
    kind: str  # "node", "line", "token", "nan", "watch"
    spec: str  # the location as shown to the user
    node: str | None = None
    layer: int | None = None
    kernel: str | None = None
    line: int | None = None
    token: int | None = None
    enabled: bool = True
    temporary: bool = False
    condition: DebugExpr | None = None
    ignore_count: int = 0
    hit_count: int = 0
    # watchpoints: an absolute arena range and its last seen values
    watch_start: int = 0
    watch_stop: int = 0
    watch_name: str = ""
    old: np.ndarray | None = field(default=None, repr=False)

    @property
    def what(self) -> str:
        return {"node": "breakpoint", "line": "breakpoint", "token": "breakpoint",
                "nan": "catchpoint", "watch": "watchpoint"}[self.kind]

    def describe(self) -> str:
        parts = [f"{self.number:<4}{self.what:<11}{'keep' if not self.temporary else 'del':<5}"
                 f"{'y' if self.enabled else 'n':<4}{self.spec}"]
        if self.condition is not None:
            parts.append(f"\n\tstop only if {self.condition.text}")
        if self.ignore_count:
            parts.append(f"\n\tignore next {self.ignore_count} hits")
        if self.hit_count:
            parts.append(f"\n\tbreakpoint already hit {self.hit_count} time"
                         f"{'s' if self.hit_count != 1 else ''}")
        return "".join(parts)


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²', which int() refuses."""
    return re.fullmatch(r"[0-9]{1,12}", text) is not None


def split_condition(text: str) -> tuple[str, DebugExpr | None]:
    m = re.search(r"\s+if\s+", " " + text)
    if not m:
        return text.strip(), None
    loc = (" " + text)[: m.start()].strip()
    cond = (" " + text)[m.end():]
    return loc, DebugExpr(cond)


def parse_location(model: Model, text: str) -> dict:
    """Turn a location into Breakpoint fields; raise FirError if it names nothing."""
    text = text.strip()
    if not text:
        raise FirError("a breakpoint needs a location: NODE, NODE@LAYER, KERNEL:LINE, LINE, "
                       "token N or nan")
    if text == "nan":
        return {"kind": "nan", "spec": "nan (NaN or Inf written)"}
    if text.startswith("token"):
        rest = text[5:].strip()
        if not _digits(rest):
            raise FirError(f"expected 'token N' with N a token index, found {text!r}")
        return {"kind": "token", "spec": f"token {int(rest)}", "token": int(rest)}
    if ":" in text:
        left, _, right = text.rpartition(":")
        if not _digits(right.strip()):
            raise FirError(f"expected KERNEL:LINE, found {text!r}")
        line = int(right)
        if left in model.kernels:
            return _line_bp(model, left, line)
        if left and (left == model.path.name or left == str(model.path)):
            return _file_line_bp(model, line)
        raise FirError(f"no kernel named '{left}' (kernels: {', '.join(model.kernels)})")
    if _digits(text):
        return _file_line_bp(model, int(text))
    m = _NODE.match(text)
    if not m:
        raise FirError(f"cannot understand location {text!r}")
    name, layer = m.group(1), m.group(2)
    names = {n.name for n in model.nodes}
    if name not in names:
        close = [n for n in sorted(names) if n.startswith(name[:3])]
        hint = f" (did you mean {', '.join(close[:4])}?)" if close else ""
        raise FirError(f"no node named '{name}'{hint}")
    if layer is not None:
        full = f"{name}@{int(layer)}"
        if not any(n.full_name == full for n in model.nodes):
            raise FirError(f"no node '{full}' (layers are 0..{model.layers - 1}, and '{name}' "
                           f"{'is' if any(n.name == name and n.layer is None for n in model.nodes) else 'is not'} "
                           "outside the repeat)")
        return {"kind": "node", "spec": full, "node": name, "layer": int(layer)}
    return {"kind": "node", "spec": name, "node": name}


def _line_bp(model: Model, kernel: str, line: int) -> dict:
    code = model.kernels[kernel]
    lines = sorted({op.loc.line for op in code.ops})
    if not lines:
        raise FirError(f"kernel '{kernel}' has no instructions")
    first_line, last_line = code.syntax.loc.line, code.syntax.end.line
    if not first_line <= line <= last_line:
        raise FirError(f"line {line} is not inside kernel '{kernel}' (lines {first_line}.."
                       f"{last_line})")
    # like gdb, a line without an instruction moves to the next one that has one
    at = next((l for l in lines if l >= line), None)
    if at is None:
        raise FirError(f"no instruction at or after line {line} in kernel '{kernel}'")
    return {"kind": "line", "spec": f"{kernel}:{at}", "kernel": kernel, "line": at}


def _file_line_bp(model: Model, line: int) -> dict:
    for name, code in model.kernels.items():
        if code.syntax.loc.line <= line <= code.syntax.end.line:
            return _line_bp(model, name, line)
    for n in model.nodes:
        if n.loc.line == line:
            return {"kind": "node", "spec": n.name, "node": n.name}
    raise FirError(f"line {line} of {model.path.name} is not inside a kernel or on a node")


def parse_watch(model: Model, text: str) -> dict:
    """``scores[0:64]``, ``scores@2[0:16]``, ``x`` -> an absolute arena range."""
    m = _WATCH.match(text.replace(" ", ""))
    if not m:
        raise FirError(f"cannot watch {text!r}: expected BUFFER, BUFFER[a:b] or BUFFER@LAYER[a:b]")
    name, layer, a, b = m.group(1), m.group(2), m.group(3), m.group(4)
    if name in model.buffers:
        decl = model.buffers[name]
        if decl.per_layer:
            if layer is None:
                raise FirError(f"'{name}' is per_layer: name a layer, e.g. {name}@0")
            if int(layer) >= model.layers:
                raise FirError(f"'{name}' has layers 0..{model.layers - 1}")
            region = model.regions[f"{name}@{int(layer)}"]
        else:
            if layer is not None:
                raise FirError(f"'{name}' is not per_layer; drop the @{layer}")
            region = model.regions[name]
    else:
        disp = name if layer is None else f"{name}@{int(layer)}"
        w = model.weights.get(disp)
        if w is None or w.region is None:
            raise FirError(f"no arena buffer named '{disp}'")
        region = w.region
    size = region.size
    if a is None:
        lo, hi = 0, size
    elif b is None and "[" in text and ":" not in text:
        lo = int(a) if a else 0
        lo = lo + size if lo < 0 else lo
        hi = lo + 1
    else:
        lo = int(a) if a else 0
        hi = int(b) if b else size
        lo = lo + size if lo < 0 else lo
        hi = hi + size if hi < 0 else hi
    if not 0 <= lo < hi <= size:
        raise FirError(f"range [{lo}:{hi}] is outside {region.name}[0:{size}]")
    return {"kind": "watch", "spec": f"{region.name}[{lo}:{hi}]", "watch_start": region.base + lo,
            "watch_stop": region.base + hi, "watch_name": region.name}
