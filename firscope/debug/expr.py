"""Debugger expressions: ``max(abs(x)) > 50``, ``R3 > 1e4``, ``scores@2[0:16]``.

Parsed with :mod:`ast` (which only parses) and evaluated by walking a small
whitelist of node types: names, numbers, slices, arithmetic, comparisons,
boolean logic and a fixed table of NumPy functions. Nothing reaches
``eval``; attribute access, lambdas, comprehensions and calls to anything
outside the table are refused.

Read-only: the values names resolve to are read-only views of the arena and
the weights, every function takes exactly one argument (NumPy's functions
accept an output array as a further positional argument), a tuple is only an
index, and no operation may build an array much larger than its operands
(:data:`MAX_RESULT_ELEMENTS`). Printing, conditions and displays can therefore
never change the model, nor exhaust memory from a short line of input.
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
from ..model import Ref

# A layer is at most 12 ASCII digits (Python will not convert 5000-digit strings).
_AT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)@([0-9]{1,12})(?![A-Za-z0-9_])")
_AT_MANGLE = "__at__"


def _count_nan(a):
    return int(np.isnan(np.asarray(a, dtype=np.float64)).sum())


def _one(fn):
    """A function of exactly one argument. NumPy's functions take an output array as a
    further positional argument (np.abs(a, out)), and names are views of the live arena:
    any second argument is refused before anything is called."""
    return fn, 1


# name -> (function, number of arguments). Every function takes one value.
FUNCTIONS: dict[str, tuple[Callable, int]] = {
    "abs": _one(np.abs), "max": _one(np.max), "min": _one(np.min), "sum": _one(np.sum),
    "mean": _one(np.mean), "std": _one(np.std), "any": _one(np.any), "all": _one(np.all),
    "sqrt": _one(np.sqrt), "exp": _one(np.exp), "log": _one(np.log),
    "isnan": _one(np.isnan), "isinf": _one(np.isinf), "isfinite": _one(np.isfinite),
    "argmax": _one(lambda a: int(np.argmax(a))), "argmin": _one(lambda a: int(np.argmin(a))),
    "norm": _one(lambda a: float(np.linalg.norm(np.asarray(a, dtype=np.float64)))),
    "len": _one(lambda a: int(np.size(a))), "count_nan": _one(_count_nan),
    "float": _one(float), "int": _one(int),
}
# An operation may not build an array larger than this many elements, unless it is no
# larger than one of its operands (abs(wte) is as big as wte; wte[:, None] * wte is not).
MAX_RESULT_ELEMENTS = 1 << 24

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
        # A tuple is only an index (w[3, 0:4]): a value tuple could be repeated or
        # concatenated into any size ((1,) * 10**9) or turned into a huge array.
        index_tuples = {id(n.slice) for n in ast.walk(node)
                        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Tuple)}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Tuple) and id(sub) not in index_tuples:
                raise FirError("a tuple is only allowed as an index (w[3, 0:4])")
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
                arity = FUNCTIONS[sub.func.id][1]
                if len(sub.args) != arity:
                    raise FirError(f"{sub.func.id}() takes {arity} argument"
                                   f"{'s' if arity != 1 else ''}, found {len(sub.args)}")
            if isinstance(sub, ast.BinOp) and type(sub.op) not in _BINOPS:
                raise FirError("operator not allowed")
            if isinstance(sub, ast.Compare) and any(type(o) not in _CMPOPS for o in sub.ops):
                raise FirError("comparison not allowed")

    def names(self) -> set[str]:
        funcs = {id(n.func) for n in ast.walk(self.tree) if isinstance(n, ast.Call)}
        return {_unmangle(n.id) for n in ast.walk(self.tree)
                if isinstance(n, ast.Name) and id(n) not in funcs}

    def evaluate(self, resolve: Callable[[str, int | None], object]):
        # NumPy's floating-point errors and its Python warnings ("Mean of empty slice"):
        # the value (nan, inf) says it; nothing goes to stderr past the session's output.
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return self._eval(self.tree, resolve)

    def _eval(self, node, resolve):
        handler = _HANDLERS.get(type(node))
        if handler is None:  # pragma: no cover - _check refuses these at parse time
            raise FirError(f"'{type(node).__name__}' is not allowed")
        return handler(self, node, resolve)

    def _constant(self, node, resolve):
        return _tame(node.value)

    def _name(self, node, resolve):
        name, layer = _split(node.id)
        return resolve(name, layer)

    def _unary(self, node, resolve):
        v = self._eval(node.operand, resolve)
        if isinstance(node.op, ast.Not):
            return not _truth(v)
        if not isinstance(node.op, (ast.USub, ast.UAdd)):
            raise FirError("operator not allowed")
        if np.asarray(v).dtype == np.bool_:  # like Python: -True == -1 (NumPy refuses)
            v = np.asarray(v).astype(np.int64)
        try:
            return -v if isinstance(node.op, ast.USub) else +v
        except (TypeError, ValueError) as e:
            raise FirError(f"cannot compute {ast.unparse(node)}: {e}") from None

    def _binop(self, node, resolve):
        a, b = self._eval(node.left, resolve), self._eval(node.right, resolve)
        if isinstance(node.op, ast.Pow):
            if np.size(b) and np.max(np.abs(b)) > 64:  # (an empty array has no max)
                raise FirError("exponent too large")
            # in floats: Python ints would grow without bound ((10**64)**64)**64...
            a, b = _as_float(a), _as_float(b)
        _check_result_size(a, b)
        try:
            return _tame(_BINOPS[type(node.op)](a, b))
        except ZeroDivisionError:
            raise FirError("division by zero") from None
        except (ArithmeticError, TypeError, ValueError) as e:  # e.g. shapes that differ
            raise FirError(f"cannot compute {ast.unparse(node)}: {e}") from None

    def _compare(self, node, resolve):
        left = self._eval(node.left, resolve)
        result = True
        for op, comp in zip(node.ops, node.comparators):
            right = self._eval(comp, resolve)
            _check_result_size(left, right)
            try:
                r = _CMPOPS[type(op)](left, right)
            except (TypeError, ValueError) as e:
                raise FirError(f"cannot compare: {e}") from None
            both_plain = isinstance(result, bool) and isinstance(r, bool)
            result = (result and r) if both_plain else result & r
            left = right
        return result

    def _boolop(self, node, resolve):
        vals = [self._eval(v, resolve) for v in node.values]
        if isinstance(node.op, ast.And):
            return all(_truth(v) for v in vals)
        return any(_truth(v) for v in vals)

    def _subscript(self, node, resolve):
        base = self._eval(node.value, resolve)
        idx = self._index(node.slice, resolve)
        try:
            return np.asarray(base)[idx]
        except IndexError as e:
            raise FirError(f"index out of range: {e}") from None
        except (TypeError, ValueError, OverflowError) as e:  # a zero step, a huge index
            raise FirError(f"bad index: {e}") from None

    def _call(self, node, resolve):
        args = [self._eval(a, resolve) for a in node.args]
        try:
            return _tame(FUNCTIONS[node.func.id][0](*args))
        except (TypeError, ValueError, ArithmeticError) as e:  # int(inf): OverflowError
            raise FirError(f"{node.func.id}(): {e}") from None

    def _index(self, node, resolve):
        if isinstance(node, ast.Slice):
            parts = [None if p is None else _as_int(self._eval(p, resolve))
                     for p in (node.lower, node.upper, node.step)]
            return slice(*parts)
        if isinstance(node, ast.Tuple):
            return tuple(self._index(e, resolve) for e in node.elts)
        return _as_int(self._eval(node, resolve))


_HANDLERS = {ast.Constant: DebugExpr._constant, ast.Name: DebugExpr._name,
             ast.UnaryOp: DebugExpr._unary, ast.BinOp: DebugExpr._binop,
             ast.Compare: DebugExpr._compare, ast.BoolOp: DebugExpr._boolop,
             ast.Subscript: DebugExpr._subscript, ast.Call: DebugExpr._call}


def _check_result_size(a, b) -> None:
    """Refuse an operation whose broadcast result would be larger than both operands and
    than MAX_RESULT_ELEMENTS, before NumPy allocates it."""
    sa, sb = np.shape(a), np.shape(b)
    if not sa and not sb:
        return
    try:
        shape = np.broadcast_shapes(sa, sb)
    except ValueError:
        return  # NumPy reports the shape mismatch itself
    size = math.prod(shape)
    if size > MAX_RESULT_ELEMENTS and size > max(math.prod(sa), math.prod(sb)):
        raise FirError(f"the result would have {size} elements (shape {list(shape)}); "
                       f"expressions may build at most {MAX_RESULT_ELEMENTS}")


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
    return str(Ref(name, layer))
