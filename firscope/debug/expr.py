"""Debugger expressions: ``max(abs(x)) > 50``, ``R3 > 1e4``, ``scores@2[0:16]``.

Parsed with :mod:`ast` (which only parses) and evaluated by walking a small
whitelist of node types: names, numbers, slices, arithmetic, comparisons,
boolean logic and a fixed table of NumPy functions. Nothing reaches
``eval``; attribute access, lambdas, comprehensions and calls to anything
outside the table are refused.
"""
from __future__ import annotations

import ast
import math
import operator
import re
import warnings
from typing import Callable

import numpy as np

from ..errors import FirError

_AT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)@(\d+)(?![A-Za-z0-9_])")
_AT_MANGLE = "__at__"


def _count_nan(a):
    return int(np.isnan(np.asarray(a, dtype=np.float64)).sum())


FUNCTIONS: dict[str, Callable] = {
    "abs": np.abs, "max": np.max, "min": np.min, "sum": np.sum, "mean": np.mean,
    "std": np.std, "any": np.any, "all": np.all, "sqrt": np.sqrt, "exp": np.exp,
    "log": np.log, "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite,
    "argmax": lambda a: int(np.argmax(a)), "argmin": lambda a: int(np.argmin(a)),
    "norm": lambda a: float(np.linalg.norm(np.asarray(a, dtype=np.float64))),
    "len": lambda a: int(np.size(a)), "count_nan": _count_nan,
    "float": float, "int": int,
}

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.FloorDiv: operator.floordiv}
_CMPOPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}
MAX_EXPR = 500
MAX_DEPTH = 100  # evaluation recurses once per level of the tree


class DebugExpr:
    """A parsed expression; ``evaluate(resolve)`` looks names up through ``resolve``."""

    def __init__(self, text: str):
        self.text = text.strip()
        if not self.text:
            raise FirError("empty expression")
        if len(self.text) > MAX_EXPR:
            raise FirError(f"expression is too long ({len(self.text)} characters)")
        mangled = _AT.sub(lambda m: f"{m.group(1)}{_AT_MANGLE}{m.group(2)}", self.text)
        try:
            with warnings.catch_warnings():  # "invalid decimal literal" and the like
                warnings.simplefilter("ignore")
                self.tree = ast.parse(mangled, mode="eval").body
        except (SyntaxError, RecursionError, MemoryError) as e:
            if not isinstance(e, SyntaxError):
                raise FirError(f"cannot parse expression {self.text!r}: nested too deeply") \
                    from None
            col = (e.offset or 1)
            raise FirError(f"cannot parse expression {self.text!r} at column {col}: {e.msg}") \
                from None
        self._check(self.tree)
        self._check_depth(self.tree)

    def _check_depth(self, tree) -> None:
        stack = [(tree, 1)]
        while stack:
            node, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise FirError(f"expression is nested too deeply (more than {MAX_DEPTH} levels)")
            stack.extend((c, depth + 1) for c in ast.iter_child_nodes(node))

    def _check(self, node) -> None:
        allowed = (ast.Name, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp,
                   ast.Subscript, ast.Slice, ast.Call, ast.Tuple, ast.Load, ast.operator,
                   ast.unaryop, ast.cmpop, ast.boolop)
        for sub in ast.walk(node):
            if not isinstance(sub, allowed):
                raise FirError(f"'{type(sub).__name__}' is not allowed in debugger expressions")
            if isinstance(sub, ast.Constant) and not isinstance(sub.value, (int, float)):
                raise FirError("only numbers are allowed as constants")
            if isinstance(sub, ast.Call):
                if not isinstance(sub.func, ast.Name) or sub.func.id not in FUNCTIONS:
                    name = getattr(sub.func, "id", "?")
                    raise FirError(f"unknown function '{name}' (known: "
                                   f"{', '.join(sorted(FUNCTIONS))})")
                if sub.keywords:
                    raise FirError("keyword arguments are not allowed")
            if isinstance(sub, ast.BinOp) and type(sub.op) not in _BINOPS:
                raise FirError("operator not allowed")
            if isinstance(sub, ast.Compare) and any(type(o) not in _CMPOPS for o in sub.ops):
                raise FirError("comparison not allowed")

    def names(self) -> set[str]:
        funcs = {id(n.func) for n in ast.walk(self.tree) if isinstance(n, ast.Call)}
        return {_unmangle(n.id) for n in ast.walk(self.tree)
                if isinstance(n, ast.Name) and id(n) not in funcs}

    def evaluate(self, resolve: Callable[[str, int | None], object]):
        with np.errstate(all="ignore"):
            return self._eval(self.tree, resolve)

    def _eval(self, node, resolve):
        if isinstance(node, ast.Constant):
            return _tame(node.value)
        if isinstance(node, ast.Name):
            name, layer = _split(node.id)
            return resolve(name, layer)
        if isinstance(node, ast.UnaryOp):
            v = self._eval(node.operand, resolve)
            if isinstance(node.op, (ast.USub, ast.UAdd)):
                if np.asarray(v).dtype == np.bool_:  # like Python: -True == -1 (NumPy refuses)
                    v = np.asarray(v).astype(np.int64)
                try:
                    return -v if isinstance(node.op, ast.USub) else +v
                except (TypeError, ValueError) as e:
                    raise FirError(f"cannot compute {ast.unparse(node)}: {e}") from None
            if isinstance(node.op, ast.Not):
                return not _truth(v)
            raise FirError("operator not allowed")
        if isinstance(node, ast.BinOp):
            a, b = self._eval(node.left, resolve), self._eval(node.right, resolve)
            if isinstance(node.op, ast.Pow):
                if np.size(b) and np.max(np.abs(b)) > 64:  # (an empty array has no max)
                    raise FirError("exponent too large")
                # in floats: Python ints would grow without bound ((10**64)**64)**64...
                a, b = _as_float(a), _as_float(b)
            try:
                return _tame(_BINOPS[type(node.op)](a, b))
            except ZeroDivisionError:
                raise FirError("division by zero") from None
            except (ArithmeticError, TypeError, ValueError) as e:  # e.g. shapes that differ
                raise FirError(f"cannot compute {ast.unparse(node)}: {e}") from None
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, resolve)
            result = True
            for op, comp in zip(node.ops, node.comparators):
                right = self._eval(comp, resolve)
                try:
                    r = _CMPOPS[type(op)](left, right)
                except (TypeError, ValueError) as e:
                    raise FirError(f"cannot compare: {e}") from None
                result = result & r if not isinstance(result, bool) or not isinstance(r, bool) \
                    else result and r
                left = right
            return result
        if isinstance(node, ast.BoolOp):
            vals = [self._eval(v, resolve) for v in node.values]
            if isinstance(node.op, ast.And):
                return all(_truth(v) for v in vals)
            return any(_truth(v) for v in vals)
        if isinstance(node, ast.Subscript):
            base = self._eval(node.value, resolve)
            idx = self._index(node.slice, resolve)
            try:
                return np.asarray(base)[idx]
            except IndexError as e:
                raise FirError(f"index out of range: {e}") from None
            except (TypeError, ValueError, OverflowError) as e:  # a zero step, a huge index
                raise FirError(f"bad index: {e}") from None
        if isinstance(node, ast.Call):
            args = [self._eval(a, resolve) for a in node.args]
            try:
                return _tame(FUNCTIONS[node.func.id](*args))
            except (TypeError, ValueError, ArithmeticError) as e:  # int(inf): OverflowError
                raise FirError(f"{node.func.id}(): {e}") from None
        if isinstance(node, ast.Tuple):
            return tuple(self._eval(e, resolve) for e in node.elts)
        raise FirError(f"'{type(node).__name__}' is not allowed")  # pragma: no cover

    def _index(self, node, resolve):
        if isinstance(node, ast.Slice):
            parts = [None if p is None else _as_int(self._eval(p, resolve))
                     for p in (node.lower, node.upper, node.step)]
            return slice(*parts)
        if isinstance(node, ast.Tuple):
            return tuple(self._index(e, resolve) for e in node.elts)
        return _as_int(self._eval(node, resolve))


def _tame(v):
    """Keep values printable and cheap: no giant Python ints, no complex numbers."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        try:
            return float(v)
        except OverflowError:
            return math.inf if v > 0 else -math.inf
    if isinstance(v, complex):
        raise FirError("the result is a complex number")
    return v


def _as_float(v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return np.float64(v)
    return v


def _as_int(v) -> int:
    if isinstance(v, (bool, np.bool_)):
        raise FirError("an index must be an integer")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise FirError("an index must be an integer") from None
    if not f.is_integer():
        raise FirError(f"an index must be an integer, got {f}")
    return int(f)


def _truth(v) -> bool:
    if isinstance(v, np.ndarray):
        if v.size != 1:
            raise FirError("a condition must be a single value; wrap arrays in any(), all() or "
                           "max()")
        return bool(v.reshape(-1)[0])
    return bool(v)


def truth(v) -> bool:
    return _truth(v)


def _split(mangled: str) -> tuple[str, int | None]:
    if _AT_MANGLE in mangled:
        name, layer = mangled.split(_AT_MANGLE, 1)
        return name, int(layer)
    return mangled, None


def _unmangle(mangled: str) -> str:
    name, layer = _split(mangled)
    return name if layer is None else f"{name}@{layer}"
