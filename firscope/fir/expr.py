"""Expressions of the .fir format: parsed to a tree, evaluated exactly.

Values are :class:`fractions.Fraction` while they are exact; ``sqrt`` of a
non-square and ``pi`` make a value inexact, which is then a Python float
(f64) from that point on. Integer contexts demand an exact integral value;
float contexts round once to f32. Nothing here ever calls ``eval``.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Union

import numpy as np

from ..errors import FirError, Loc

Value = Union[Fraction, float]

# Largest magnitude an expression may reach before we call it nonsense:
# keeps a hostile file from building numbers with millions of digits.
_MAX_ABS = Fraction(10) ** 60
# Deepest expression tree (parentheses, unary signs, chained operators) we
# accept: parsing and evaluating recurse once per level, and a hostile
# "((((...))))" must be an error at its position, not a RecursionError.
MAX_DEPTH = 100


@dataclass(frozen=True)
class Expr:
    loc: Loc


@dataclass(frozen=True)
class Num(Expr):
    value: Fraction
    text: str


@dataclass(frozen=True)
class Name(Expr):
    name: str


@dataclass(frozen=True)
class OperandSize(Expr):
    operand: str  # "in0", "out1": the element count bound at dispatch


@dataclass(frozen=True)
class Unary(Expr):
    op: str
    operand: Expr


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Call(Expr):
    func: str
    arg: Expr


_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)"
    r"|(?P<op>[-+*/()]))"
)
_OPERAND = re.compile(r"(in|out)\d+$")
FUNCTIONS = {"sqrt"}


def parse_expr(text: str, loc: Loc) -> Expr:
    """Parse ``text`` (which starts at ``loc``) into an expression tree."""
    tokens: list[tuple[str, str, int]] = []  # (kind, text, offset)
    pos = 0
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise FirError(f"unexpected character {text[pos]!r} in expression", loc.shifted(pos))
        kind = m.lastgroup
        start = m.start(kind)
        tokens.append((kind, m.group(kind), start))
        pos = m.end()
    if not tokens:
        raise FirError("empty expression", loc)
    parser = _ExprParser(tokens, loc, len(text))
    tree = parser.expr()
    if parser.i != len(tokens):
        _, tok, off = tokens[parser.i]
        raise FirError(f"unexpected {tok!r} in expression", loc.shifted(off))
    _check_depth(tree)
    return tree


def _children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Binary):
        return (e.left, e.right)
    if isinstance(e, Unary):
        return (e.operand,)
    if isinstance(e, Call):
        return (e.arg,)
    return ()


def _check_depth(tree: Expr) -> None:
    """Refuse trees deeper than MAX_DEPTH (chains like 1+1+...+1 are deep too)."""
    stack = [(tree, 1)]
    while stack:
        e, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise FirError(f"expression is nested too deeply (more than {MAX_DEPTH} levels)",
                           e.loc)
        stack.extend((c, depth + 1) for c in _children(e))


class _ExprParser:
    def __init__(self, tokens, loc: Loc, length: int):
        self.tokens = tokens
        self.loc = loc
        self.length = length
        self.i = 0
        self.nesting = 0  # open parentheses, calls and unary signs: bounds the recursion

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else (None, None, self.length)

    def at(self, off: int) -> Loc:
        return self.loc.shifted(off)

    def expr(self) -> Expr:
        left = self.term()
        while self.peek()[1] in ("+", "-"):
            _, op, off = self.tokens[self.i]
            self.i += 1
            left = Binary(self.at(off), op, left, self.term())
        return left

    def term(self) -> Expr:
        left = self.unary()
        while self.peek()[1] in ("*", "/"):
            _, op, off = self.tokens[self.i]
            self.i += 1
            left = Binary(self.at(off), op, left, self.unary())
        return left

    def unary(self) -> Expr:
        # Every nested parse (parentheses, call arguments, signs) passes through here.
        kind, tok, off = self.peek()
        if self.nesting >= MAX_DEPTH:
            raise FirError(f"expression is nested too deeply (more than {MAX_DEPTH} levels)",
                           self.at(off))
        self.nesting += 1
        try:
            if tok in ("-", "+"):
                self.i += 1
                return Unary(self.at(off), tok, self.unary())
            return self.atom()
        finally:
            self.nesting -= 1

    def atom(self) -> Expr:
        kind, tok, off = self.peek()
        if kind is None:
            raise FirError("expression ends too early", self.at(off))
        self.i += 1
        if kind == "num":
            exp = re.search(r"[eE]([+-]?\d+)$", tok)
            if exp and abs(int(exp.group(1))) > 400 or len(tok) > 400:
                raise FirError(f"number {tok} is out of range", self.at(off))
            try:
                value = Fraction(tok)
            except (ValueError, ZeroDivisionError):
                raise FirError(f"bad number {tok!r}", self.at(off)) from None
            if abs(value) > _MAX_ABS:
                raise FirError(f"number {tok} is too large", self.at(off))
            return Num(self.at(off), value, tok)
        if kind == "name":
            if "." in tok:
                base, attr = tok.split(".", 1)
                if attr != "size" or not _OPERAND.match(base):
                    raise FirError(f"unknown attribute {tok!r} (only inN.size and outN.size exist)",
                                   self.at(off))
                return OperandSize(self.at(off), base)
            if self.peek()[1] == "(":
                if tok not in FUNCTIONS:
                    raise FirError(f"unknown function {tok!r}", self.at(off))
                self.i += 1
                arg = self.expr()
                self.expect_close(off)
                return Call(self.at(off), tok, arg)
            return Name(self.at(off), tok)
        if tok == "(":
            inner = self.expr()
            self.expect_close(off)
            return inner
        raise FirError(f"unexpected {tok!r} in expression", self.at(off))

    def expect_close(self, open_off: int) -> None:
        if self.peek()[1] != ")":
            raise FirError("missing ')'", self.at(self.peek()[2]))
        self.i += 1


@dataclass(frozen=True, eq=False)
class SymbolTable(Mapping):
    """Symbol values by name, where each came from, and why some names are not symbols.

    ``not_symbols`` maps a name that looks like a symbol but is not one (a
    config key whose value is ``true`` or ``1.5``) to the reason, so that
    using it says what is wrong with the value instead of "undefined symbol".
    """

    values: Mapping[str, Value]
    origins: Mapping[str, str] = field(default_factory=dict)  # "config.json", "line 12"
    not_symbols: Mapping[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Value:
        return self.values[name]

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def origin(self, name: str) -> str:
        return self.origins.get(name, "built in")


@dataclass
class Env:
    """What names mean while evaluating: symbols, and operand sizes in a kernel."""

    symbols: Mapping[str, Value]
    operand_sizes: Mapping[str, int] | None = None
    what: str = "symbol"  # used in the "undefined ..." message

    def undefined(self, name: str, loc: Loc) -> FirError:
        if isinstance(self.symbols, SymbolTable) and name in self.symbols.not_symbols:
            return FirError(self.symbols.not_symbols[name], loc)
        return FirError(f"undefined {self.what} '{name}'", loc)


def evaluate(expr: Expr, env: Env) -> Value:
    if isinstance(expr, Num):
        return expr.value
    if isinstance(expr, Name):
        if expr.name == "pi":
            return math.pi
        if expr.name in env.symbols:
            return env.symbols[expr.name]
        raise env.undefined(expr.name, expr.loc)
    if isinstance(expr, OperandSize):
        if env.operand_sizes is None:
            raise FirError(f"'{expr.operand}.size' is only defined inside a kernel", expr.loc)
        if expr.operand not in env.operand_sizes:
            raise FirError(f"kernel has no operand '{expr.operand}'", expr.loc)
        return Fraction(env.operand_sizes[expr.operand])
    if isinstance(expr, Unary):
        v = evaluate(expr.operand, env)
        return -v if expr.op == "-" else v
    if isinstance(expr, Call):
        v = evaluate(expr.arg, env)
        return _sqrt(v, expr.loc)
    if isinstance(expr, Binary):
        a = evaluate(expr.left, env)
        b = evaluate(expr.right, env)
        if isinstance(a, float) or isinstance(b, float):
            a, b = float(a), float(b)
        if expr.op == "+":
            r = a + b
        elif expr.op == "-":
            r = a - b
        elif expr.op == "*":
            r = a * b
        else:
            if b == 0:
                raise FirError("division by zero", expr.loc)
            r = a / b
        if isinstance(r, Fraction) and abs(r) > _MAX_ABS:
            raise FirError("value is too large", expr.loc)
        if isinstance(r, float) and not math.isfinite(r):
            raise FirError("value is not finite", expr.loc)
        return r
    raise TypeError(f"not an expression: {expr!r}")  # pragma: no cover - programming error


def _sqrt(v: Value, loc: Loc) -> Value:
    if v < 0:
        raise FirError(f"sqrt of a negative number ({float(v):g})", loc)
    if isinstance(v, Fraction):
        n, d = math.isqrt(v.numerator), math.isqrt(v.denominator)
        if n * n == v.numerator and d * d == v.denominator:
            return Fraction(n, d)
    return math.sqrt(float(v))


def eval_int(expr: Expr, env: Env, what: str = "value") -> int:
    """Evaluate where an integer is required; a non-integral result is an error."""
    v = evaluate(expr, env)
    if isinstance(v, float):
        if v.is_integer():
            return int(v)
        raise FirError(f"{what} must be an integer, got {v!r}", expr.loc)
    if v.denominator != 1:
        raise FirError(f"{what} must be an integer, got {v} = {float(v):g}", expr.loc)
    return v.numerator


def to_f32(v: Value) -> np.float32:
    """Round an exact value to the nearest f32 once (ties to even)."""
    if isinstance(v, float) or v.denominator == 1 and abs(v.numerator) < 2**24:
        return np.float32(v)
    with np.errstate(over="ignore"):  # beyond f32: inf, which callers report
        approx = np.float32(float(v))
    if not np.isfinite(approx):
        return approx
    best, best_err = approx, None
    for cand in (np.nextafter(approx, np.float32(-np.inf)), approx,
                 np.nextafter(approx, np.float32(np.inf))):
        if not np.isfinite(cand):
            continue
        err = abs(Fraction(float(cand)) - v)
        if best_err is None or err < best_err or (
                err == best_err and int(cand.view(np.uint32)) % 2 == 0):
            best, best_err = cand, err
    return np.float32(best)


def eval_f32(expr: Expr, env: Env) -> np.float32:
    v = evaluate(expr, env)
    r = to_f32(v)
    if not np.isfinite(r):
        raise FirError(f"constant {float(v):g} does not fit in f32", expr.loc)
    return r


def free_names(expr: Expr) -> set[str]:
    """Names an expression refers to (for dependency display and checks)."""
    if isinstance(expr, Name):
        return {expr.name}
    if isinstance(expr, Unary):
        return free_names(expr.operand)
    if isinstance(expr, Call):
        return free_names(expr.arg)
    if isinstance(expr, Binary):
        return free_names(expr.left) | free_names(expr.right)
    return set()

