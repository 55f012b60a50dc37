"""The opcode table, the assembler and the SIMT interpreter (lanes, masks, faults)."""
import numpy as np
import pytest

from firscope.errors import FirError, FirFault
from firscope.vm.assembler import disassemble
from firscope.vm.interp import Dispatch
from firscope.vm.opcodes import OPCODES
from kernel_util import kernel_program, run_kernel

F = np.float32


def K(body, n_in=1, n_out=1, threads="out0.size", extra=""):
    return (f"kernel t in={n_in} out={n_out} threads={threads} tg=1 tgbytes=16 {extra}\n"
            + body.strip() + "\nendkernel\n")


def test_table_has_all_22_mnemonics_with_register_metadata():
    assert len(OPCODES) == 22
    assert OPCODES["uloadf32"].reads == (("U", 1),)
    assert OPCODES["uloadf32"].writes == (("R", 0),)
    assert OPCODES["add"].reads == (("R", 1), ("R", 2))
    assert OPCODES["forbegin"].is_control and OPCODES["forend"].operands == ()


def unary_case(op, x):
    src = K(f"rtou 0 0\nuloadf32 1 0 @in0\n{op} 2 1\nustoref32 2 0 @out0")
    out, _ = run_kernel(src, {"in0": x}, {"out0": len(x)})
    return out["out0"]


X = np.array([-3.5, -0.25, 0.0, 0.5, 2.0, 9.0], dtype=F)


def ulps(a, b):
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def test_sigmoid_exp_rsqrt_in_f32():
    # exp and sigmoid are the reference's (model/numerics: f64, rounded once to f32), here
    # equal to the correctly rounded values
    from firscope.model.numerics import exp_f32_numpy, sigmoid_f32_numpy
    exact = np.exp(X.astype(np.float64)).astype(np.float32)
    assert ulps(unary_case("exp", X), exact).max() == 0
    assert np.array_equal(unary_case("exp", X), exp_f32_numpy(X))
    sig = (1 / (1 + np.exp(-X.astype(np.float64)))).astype(np.float32)
    assert np.array_equal(unary_case("sigmoid", X), sig)
    assert np.array_equal(unary_case("sigmoid", X), sigmoid_f32_numpy(X))
    pos = np.abs(X) + F(0.5)
    assert np.array_equal(unary_case("rsqrt", pos), F(1) / np.sqrt(pos))
    assert unary_case("exp", X).dtype == np.float32


@pytest.mark.parametrize("op,fn", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                                   ("div", np.divide),
                                   ("cmplt", lambda a, b: (a < b).astype(F))])
def test_binary_ops(op, fn):
    a = X
    b = np.array([1.5, -0.25, 3.0, 0.5, -2.0, 4.0], dtype=F)
    src = K(f"rtou 0 0\nuloadf32 1 0 @in0\nuloadf32 2 0 @in1\n{op} 3 1 2\nustoref32 3 0 @out0",
            n_in=2)
    out, _ = run_kernel(src, {"in0": a, "in1": b}, {"out0": 6})
    assert np.array_equal(out["out0"], fn(a, b))


def test_const_ops_round_constants_once_to_f32():
    src = K("rtou 0 0\nuloadf32 1 0 @in0\nmulconst 2 1 1/3\naddconst 2 2 0.1\n"
            "loadconstf32 3 2*sqrt(2/pi)\nadd 2 2 3\nustoref32 2 0 @out0")
    out, _ = run_kernel(src, {"in0": X}, {"out0": 6})
    c = F(2 * np.sqrt(2 / np.pi))
    assert np.array_equal(out["out0"], (X * F(1 / 3) + F(0.1)) + c)


def test_integer_ops_wrap_like_uint32():
    # lane i: U1 = i*3 + 7 ; U2 = U1 + U1 ; U3 = 0xFFFFFFFF + 2 wraps to 1
    src = K("rtou 0 0\numulk 1 0 3\nuaddk 1 1 7\nuadd 2 1 1\nuconst 3 4294967295\n"
            "uaddk 3 3 2\nuaddk 4 0 -1\nustoref32 0 2 @out0", threads=4,
            n_in=0, extra="")
    prog, arena, regions = kernel_program(src, {"out0": 64})
    d = Dispatch(prog, arena)
    d.run()
    assert d.U[1].tolist() == [7, 10, 13, 16]
    assert d.U[2].tolist() == [14, 20, 26, 32]
    assert d.U[3].tolist() == [1, 1, 1, 1]
    assert d.U[4].tolist() == [0xFFFFFFFF, 0, 1, 2]  # -1 is 2^32-1
    assert np.array_equal(arena[[14, 20, 26, 32]], np.arange(4, dtype=F))


def test_rtou_truncates_and_uconst_loadconst():
    src = K("uloadf32 1 0 @in0\nrtou 2 1\nuconst 3 5\nloadconstf32 4 -2.5\n"
            "ustoref32 4 3 @out0", threads=1)
    prog, arena, regions = kernel_program(src, {"in0": 1, "out0": 8})
    arena[0] = 7.9
    d = Dispatch(prog, arena)
    d.run()
    assert d.U[2, 0] == 7 and d.U[3, 0] == 5
    assert arena[regions["out0"].base + 5] == F(-2.5)


def test_per_lane_loop_counts_diverge():
    # lane i loops i times, summing 1.0 each time; lane 0 never enters the body
    src = K("rtou 0 0\nloadconstf32 2 0\nloadconstf32 3 1\nforbegin 0\nadd 2 2 3\nforend\n"
            "ustoref32 2 0 @out0", n_in=0)
    prog, arena, _ = kernel_program(src, {"out0": 5})
    d = Dispatch(prog, arena)
    masks = []
    while not d.done:
        if d.current.spec.mnemonic == "add":
            masks.append(d.mask.copy())
        d.step()
    assert arena.tolist() == [0, 1, 2, 3, 4]
    assert len(masks) == 4  # the body ran while any lane was still looping
    assert masks[0].tolist() == [False, True, True, True, True]
    assert masks[3].tolist() == [False, False, False, False, True]
    assert d.mask.all() and not d.stack  # mask restored after the loop


def test_if_divergence_nested_in_loops():
    # for j in range(3): if lane < j: acc += 10 ; lanes 0..3
    src = K("""
rtou 0 0
loadconstf32 1 3
loadconstf32 2 0
loadconstf32 5 10
loadconstf32 6 1
loadconstf32 7 0
forbegin 1
cmplt 3 0 2
ifbegin 3
add 7 7 5
ifend
add 2 2 6
forend
ustoref32 7 0 @out0
""", n_in=0)
    out, d = run_kernel(src, {}, {"out0": 4})
    # j=0: none; j=1: lane0; j=2: lanes 0,1
    assert out["out0"].tolist() == [20, 10, 0, 0]


def test_if_with_no_active_lane_skips_body():
    src = K("loadconstf32 1 0\nifbegin 1\nuconst 9 9\nifend\nuconst 2 1", threads=2, n_in=0)
    prog, arena, _ = kernel_program(src, {"out0": 1})
    d = Dispatch(prog, arena)
    d.step(); d.step()
    assert d.pc == 4 and not d.stack  # jumped over the body in one instruction
    d.run()
    assert d.U[9].tolist() == [0, 0]


def test_addresses_with_offsets_and_named_buffers():
    src = K("rtou 0 0\nuloadf32 1 0 @in0+2*n\nustoref32 1 0 @out0\nustoref32 1 0 @side+1",
            threads=2)
    out, _ = run_kernel(src, {"in0": np.arange(6, dtype=F)}, {"out0": 2}, symbols={"n": 2},
                        buffers={"side": 3})
    assert out["out0"].tolist() == [4, 5]
    assert out["side"].tolist() == [0, 4, 5]


def test_out_of_bounds_access_faults_with_full_location():
    src = K("rtou 0 0\nuaddk 1 0 2\nuloadf32 1 1 @in0\nustoref32 1 0 @out0", threads=4)
    prog, arena, _ = kernel_program(src, {"in0": 4, "out0": 4})
    with pytest.raises(FirFault) as e:
        Dispatch(prog, arena).run()
    f = e.value
    assert f.kernel == "t" and f.lane == 2 and f.pc == 2 and f.address == 4
    assert "lane 2" in str(f) and "in0[0:4]" in str(f) and "index 4" in str(f)
    assert f.loc.line == 5 and str(f).startswith("test.fir:5:1:")


@pytest.mark.parametrize("value,msg", [(-1.0, "-1.0"), (np.nan, "nan"), (np.inf, "inf"),
                                       (5e9, "5000000000.0")])
def test_rtou_of_bad_value_faults(value, msg):
    src = K("uloadf32 1 0 @in0\nrtou 2 1", threads=1, n_out=1)
    prog, arena, _ = kernel_program(src, {"in0": 1, "out0": 1})
    arena[0] = value
    with pytest.raises(FirFault, match=f"rtou of R1 = {msg}"):
        Dispatch(prog, arena).run()


def test_nan_loop_count_faults_and_budget_stops_runaway():
    src = K("uloadf32 1 0 @in0\nforbegin 1\nuaddk 2 2 1\nforend", threads=1)
    prog, arena, _ = kernel_program(src, {"in0": 1, "out0": 1})
    arena[0] = np.nan
    with pytest.raises(FirFault, match="not finite"):
        Dispatch(prog, arena).run()
    arena[0] = 3e9
    from firscope.errors import BudgetExceeded
    with pytest.raises(BudgetExceeded, match="kernel 't'.*more than 1000 instructions"):
        Dispatch(prog, arena).run(budget=1000)


@pytest.mark.parametrize("body,msg,line,col", [
    ("rtou 0 0\nfma 1 2 3", "unknown instruction 'fma'", 4, 1),
    ("add 1 2", "'add' takes 3 operands", 3, 1),
    ("add 1 2 3 4", "'add' takes 3 operands", 3, 11),
    ("add 1 2 32", "register R32 is outside 0..31", 3, 9),
    ("rtou -1 0", "register U-1 is outside", 3, 6),
    ("add 1 x 3", "expected a register number", 3, 7),
    ("forbegin 1\nadd 1 1 1", "'forbegin' without a matching 'forend'", 3, 1),
    ("forend", "'forend' without a matching 'forbegin'", 3, 1),
    ("ifbegin 1\nforend", "'forend' closes the 'ifbegin' opened at line 3", 4, 1),
    ("ifend", "'ifend' without a matching 'ifbegin'", 3, 1),
    ("uloadf32 1 0 @in3", "'@in3' does not exist", 3, 14),
    ("uloadf32 1 0 @nowhere", "undefined buffer '@nowhere'", 3, 14),
    ("uloadf32 1 0 in0", "expected an address", 3, 14),
])
def test_assembler_errors(body, msg, line, col):
    src = "fir 1\n" + K(body, threads=1)
    with pytest.raises(FirError) as e:
        kernel_program(src, {"in0": 1, "out0": 1})
    assert msg in e.value.message, str(e.value)
    assert (e.value.loc.line, e.value.loc.col) == (line, col), str(e.value)


def test_non_integral_constant_is_an_error_at_bind():
    src = "fir 1\n" + K("uconst 1 n/3", threads=1)
    with pytest.raises(FirError, match="must be an integer") as e:
        kernel_program(src, {"in0": 1, "out0": 1}, symbols={"n": 4})
    assert e.value.loc.line == 3


def test_disassembly_resolves_operands():
    src = K("rtou 0 0\nuloadf32 1 0 @in0+1\nustoref32 1 0 @out0", threads=2)
    prog, _, _ = kernel_program(src, {"in0": 3, "out0": 2})
    lines = disassemble(prog)
    assert "uloadf32 R1 U0 @in0+1=[in0+1]" in lines[1]


# --- the table drives every engine -------------------------------------------------------
def test_every_opcode_has_a_numba_renderer():
    """The compiled engine's backend keeps its own table, as the WGSL one does."""
    from firscope.vm import codegen
    assert set(codegen.RENDERERS) == set(OPCODES)
    assert all(callable(r) for r in codegen.RENDERERS.values())
    assert codegen._Checked.code_for_op is codegen.RENDERERS


def test_rows_are_complete_and_consistent():
    from firscope.vm.isa import Category, FrameKind, Operand
    from firscope.vm.opcodes import CLOSER, OPENER
    assert OPENER == {FrameKind.FOR: "forbegin", FrameKind.IF: "ifbegin"}
    assert CLOSER == {FrameKind.FOR: "forend", FrameKind.IF: "ifend"}
    for spec in OPCODES.values():
        assert callable(spec.interp), spec.mnemonic
        assert isinstance(spec.category, Category)
        assert all(isinstance(k, Operand) for k in spec.operands)
        assert len(spec.names) == len(spec.operands)
        assert (spec.opens is not None or spec.closes is not None) == spec.is_control
        if spec.mem is not None:
            kinds = spec.operands
            assert kinds[spec.mem.address] is Operand.A
            assert kinds[spec.mem.index] is Operand.US
            assert kinds[spec.mem.value] is (Operand.RS if spec.stores else Operand.RD)
        else:
            assert Operand.A not in spec.operands
    assert [m for m, s in OPCODES.items() if s.stores] == ["ustoref32"]
    assert [m for m, s in OPCODES.items() if s.mem and not s.stores] == ["uloadf32"]


def test_frames_say_their_kind_with_the_enum():
    from firscope.vm.isa import FrameKind
    src = K("rtou 0 0\nloadconstf32 1 2\nforbegin 1\nifbegin 1\nuconst 2 1\nifend\nforend",
            threads=2, n_in=0)
    prog, arena, _ = kernel_program(src, {"out0": 2})
    d = Dispatch(prog, arena)
    kinds = []
    while not d.done:
        d.step()
        kinds.append(tuple(f.kind for f in d.stack))
    assert (FrameKind.FOR, FrameKind.IF) in kinds
    assert all(isinstance(k, FrameKind) for ks in kinds for k in ks)


def _mnemonic_tests(path) -> list[str]:
    """Comparisons in a module's source against mnemonics (`spec.mnemonic == ...`,
    `m in ("forbegin", ...)`): what the opcode table's fields are for."""
    import ast
    names = set(OPCODES)
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            hit = any(isinstance(e, ast.Constant) and e.value in names for e in items) or (
                isinstance(side, ast.Attribute) and side.attr == "mnemonic")
            if hit:
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
                break
    return found


def test_no_engine_tests_mnemonics():
    """Adding an opcode is one row: nothing outside the table branches on a mnemonic. (The
    fir parser is exempt: it sits above vm and names stray 'forend' lines itself.)"""
    from conftest import REPO
    pkg = REPO / "firscope"
    found = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        if rel == "vm/opcodes.py" or rel.startswith("fir/"):
            continue
        found += _mnemonic_tests(path)
    assert not found, "\n".join(found)


def test_the_mnemonic_check_finds_what_it_looks_for(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("if op.spec.mnemonic == 'x':\n    pass\nif m in ('forbegin', 'ifbegin'):\n"
                 "    pass\nif k == 'Rd':\n    pass\n")
    assert [f.split(":")[1] for f in _mnemonic_tests(p)] == ["1", "3"]
