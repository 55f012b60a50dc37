"""Address offsets are bounded when the model loads (issue 10.12).

`@in1+100000000000000000000000` used to pass `check` and crash `run` in both engines
(the offset does not fit the int64 index arithmetic), and an offset of exactly 2^63
wrapped in the compiled engine. An offset with which no index register value
(0..2^32-1) reaches inside the region can only fault, so it is refused at load with
FILE:LINE:COL at the operand; offsets at both ends of the allowed range run, with the
same bits, on both engines.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, SEED_FIR, write_random_gpt2
from firscope.errors import FirError
from firscope.runtime import load_model
from firscope.vm import compiled as C
from firscope.vm.interp import Dispatch
from model_util import line_of

# g2.add reads in1 through @in1 + OFFSET; bound to 32-element buffers in the model below.
ADD = """kernel g2.add in=2 out=1 size=in0,in1,out0 threads=out0.size tg=1 tgbytes=16
rtou 0 0
uloadf32 1 0 @in0
uloadf32 2 0 @in1
add 1 1 2
ustoref32 1 0 @out0
endkernel"""


def with_offset(tmp_path, offset: str):
    assert ADD in SEED_FIR.read_text()
    text = SEED_FIR.read_text().replace("uloadf32 2 0 @in1\n", f"uloadf32 2 0 @in1{offset}\n", 1)
    return write_random_gpt2(tmp_path / "m", n_layer=1, n_embd=32, n_head=4, n_positions=8,
                             vocab=64, fir_text=text), text


@pytest.mark.parametrize("offset", ["+100000000000000000000000", "+9223372036854775808",
                                    "+2*4611686018427387904",  # 2^63, wrapped when compiled
                                    "-9223372036854775809", "+32", "-4294967296"])
def test_an_offset_no_index_can_use_is_refused_at_load(tmp_path, offset):
    path, text = with_offset(tmp_path, offset)
    with pytest.raises(FirError) as e:
        load_model(path)
    err = e.value
    line = line_of(text, f"@in1{offset}")
    assert (err.loc.path, err.loc.line, err.loc.col) == (str(path), line, 14)  # at the '@'
    assert "puts every access through @in1 outside" in err.message
    assert "an offset must be -4294967295..31" in err.message


def test_check_says_where_and_exits_1(tmp_path):
    path, text = with_offset(tmp_path, "+100000000000000000000000")
    p = subprocess.run([sys.executable, "-m", "firscope", "check", str(path)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    line = line_of(text, "@in1+1000")
    assert f"gpt2.fir:{line}:14: address offset 100000000000000000000000" in p.stderr


@pytest.mark.parametrize("offset,index", [("+31", 0), ("-4294967295", 4294967295)])
def test_the_extreme_allowed_offsets_run_alike_on_both_engines(tmp_path, offset, index):
    """@in1+31 with U = 0 and @in1-4294967295 with U = 2^32-1 both read in1[31] / in1[0]; any
    other lane faults, at the same lane and message on both engines."""
    kernel = (f"buf ob_in f32 32\nbuf ob_out f32 32\n"
              f"kernel t.edge in=1 out=1 threads=4 tg=1 tgbytes=16\n"
              f"rtou 0 0\nuconst 1 {index}\nuloadf32 2 1 @in0{offset}\nustoref32 2 0 @out0\n"
              f"uadd 1 1 0\nuloadf32 3 1 @in0{offset}\nendkernel\n")
    text = SEED_FIR.read_text().replace("node token ext", kernel + "node token ext", 1)
    text += "node edge micro t.edge ob_in -> ob_out\n"
    model = load_model(write_random_gpt2(tmp_path / "e", fir_text=text))
    node = next(n for n in model.nodes if n.full_name == "edge")
    r = model.regions["ob_in"]
    model.arena[r.base: r.base + r.size] = np.arange(32, dtype=np.float32) + 0.5
    errors = []
    for engine in ("interp", "compiled"):
        arena = model.arena.copy()
        with pytest.raises(FirError) as e:
            if engine == "interp":
                Dispatch(node.program, arena).run()
            else:
                C.CompiledRunner(model).run(node, arena, None)
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    assert "lane 1" in errors[0] and "load from @in0" in errors[0]
    # without the faulting second load: every lane reads the edge element
    text = text.replace(f"uadd 1 1 0\nuloadf32 3 1 @in0{offset}\n", "")
    model = load_model(write_random_gpt2(tmp_path / "f", fir_text=text))
    node = next(n for n in model.nodes if n.full_name == "edge")
    r, o = model.regions["ob_in"], model.regions["ob_out"]
    model.arena[r.base: r.base + r.size] = np.arange(32, dtype=np.float32) + 0.5
    a, b = model.arena.copy(), model.arena.copy()
    Dispatch(node.program, a).run()
    C.CompiledRunner(model).run(node, b, None)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    want = 31.5 if offset == "+31" else 0.5
    assert a[o.base: o.base + 4].tolist() == [want] * 4
