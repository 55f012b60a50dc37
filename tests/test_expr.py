from fractions import Fraction
import math

import numpy as np
import pytest

from firscope.errors import FirError, Loc
from firscope.fir.expr import Env, eval_f32, eval_int, evaluate, parse_expr, to_f32

L = Loc("t.fir", 3, 10, "sym x = " + "y" * 20)


def ev(text, **syms):
    return evaluate(parse_expr(text, L), Env({k: Fraction(v) for k, v in syms.items()}))


def test_exact_rationals_and_precedence():
    assert ev("1+2*3") == 7
    assert ev("(1+2)*3") == 9
    assert ev("7/2") == Fraction(7, 2)
    assert ev("-3e38") == -Fraction(3 * 10**38)
    assert ev("0.044715") == Fraction(44715, 10**6)
    assert ev("--4") == 4
    assert ev("hidden-headdim", hidden=768, headdim=64) == 704
    assert ev("1/3+1/3+1/3") == 1  # exact, where floats would give 0.9999...


def test_sqrt_exact_when_square_and_inexact_otherwise():
    assert ev("sqrt(64)") == 8 and isinstance(ev("sqrt(64)"), Fraction)
    assert ev("1/sqrt(headdim)", headdim=16) == Fraction(1, 4)
    v = ev("2*sqrt(2/pi)")
    assert isinstance(v, float) and abs(v - 2 * math.sqrt(2 / math.pi)) < 1e-15


def test_integer_context_rejects_non_integral():
    expr = parse_expr("hidden/nheads", L)
    with pytest.raises(FirError, match="must be an integer") as e:
        eval_int(expr, Env({"hidden": Fraction(770), "nheads": Fraction(12)}))
    assert e.value.loc.col == 16  # the caret points at the "/" that made it non-integral
    assert eval_int(expr, Env({"hidden": Fraction(768), "nheads": Fraction(12)})) == 64


def test_f32_rounding_is_correct_once():
    # 1/3 to f32 must be the nearest f32, not a double rounding
    assert to_f32(Fraction(1, 3)) == np.float32(1 / 3)
    x = Fraction(1) + Fraction(1, 2**24)  # exactly halfway between 1 and next f32 -> even (1.0)
    assert to_f32(x) == np.float32(1.0)
    y = x + Fraction(1, 2**60)  # just above halfway -> rounds up
    assert to_f32(y) == np.nextafter(np.float32(1), np.float32(2))
    assert eval_f32(parse_expr("1/sqrt(64)", L), Env({})) == np.float32(0.125)


@pytest.mark.parametrize("text,msg,col", [
    ("1/0", "division by zero", 11),
    ("foo+1", "undefined symbol 'foo'", 10),
    ("1+", "ends too early", 12),
    ("(1+2", "missing '\\)'", 14),
    ("2 $ 3", "unexpected character", 12),
    ("cos(1)", "unknown function 'cos'", 10),
    ("in0.len", "unknown attribute", 10),
    ("1e99999999", "out of range", 10),
    ("sqrt(-4)", "sqrt of a negative", 10),
])
def test_expression_errors_have_positions(text, msg, col):
    with pytest.raises(FirError, match=msg) as e:
        ev(text)
    assert e.value.loc.line == 3 and e.value.loc.col == col
    rendered = str(e.value)
    assert rendered.startswith(f"t.fir:3:{col}: ") and "^" in rendered


def test_operand_sizes_only_in_kernels():
    expr = parse_expr("1/in0.size", L)
    with pytest.raises(FirError, match="only defined inside a kernel"):
        evaluate(expr, Env({}))
    assert evaluate(expr, Env({}, {"in0": 128})) == Fraction(1, 128)
