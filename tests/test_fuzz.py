"""Property-based fuzzing of everything a model folder can hold (issue 7).

Mutated gpt2.fir files (lines and tokens dropped, duplicated, swapped and
corrupted; random and huge numbers), random token streams and bytes,
damaged model.safetensors, edited config.json and debugger expressions:
loading either succeeds or raises a FirError that says where the problem is
(a line and column in the model file, or the name of the other file); a model
that loads runs two decode steps on the interpreter under a small budget and
either works or raises a FirError. Nothing else escapes. The generators live
in tests/fuzzing.py; benchmarks/fuzz.py runs them by the thousand.
"""
from __future__ import annotations

import os

import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzzing as F
import fuzzing_io as FIO
from conftest import SEED_FIR, write_random_gpt2
from firscope.debug.expr import DebugExpr
from firscope.errors import FirError

SEED = SEED_FIR.read_text()
VOCAB = F.fir_vocabulary(SEED)
BIG = st.integers(0, 10**6)


# Derandomized, so a failure in CI reproduces with the same examples; set
# FIRSCOPE_FUZZ_RANDOM=1 to explore new ones (then Hypothesis prints the seed).
RANDOM = bool(os.environ.get("FIRSCOPE_FUZZ_RANDOM"))


def fuzz_settings(n: int):
    return settings(max_examples=n, deadline=None, database=None, derandomize=not RANDOM,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def ops_of(kinds, most=4):
    return st.lists(st.tuples(st.sampled_from(kinds), BIG, BIG, BIG), min_size=1, max_size=most)


@pytest.fixture(scope="session")
def fuzz_folder(tmp_path_factory):
    """One small random checkpoint for the whole session; each case writes files beside it."""
    folder = tmp_path_factory.mktemp("fuzz") / "model"
    write_random_gpt2(folder, n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab=64)
    return folder


@pytest.fixture(scope="session")
def damage_folder(tmp_path_factory, fuzz_folder):
    """A copy for cases that damage the checkpoint or the config (restored per case)."""
    folder = tmp_path_factory.mktemp("fuzz") / "damaged"
    shutil.copytree(fuzz_folder, folder)
    return folder


def check(outcome, detail, shown):
    assert outcome not in (F.ESCAPE, F.UNLOCATED), f"{outcome}: {F.describe(detail)}\n{shown}"


def test_the_unmutated_sample_loads_and_decodes(fuzz_folder):
    """The properties below are not vacuous: the base case loads and runs."""
    outcome, detail = F.run_case(fuzz_folder / "gpt2.fir", fir_text=SEED)
    assert outcome == F.DECODED and detail is None


@fuzz_settings(100)
@given(ops=ops_of(F.KINDS))
def test_mutated_model_file_loads_or_fails_located(fuzz_folder, ops):
    text = F.mutate_fir(SEED, ops)
    path = fuzz_folder / "mutated.fir"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    outcome, detail = F.run_case(path, fir_text=text)
    check(outcome, detail, ops)


@fuzz_settings(40)
@given(picks=st.lists(st.tuples(BIG, st.booleans()), min_size=1, max_size=150),
       header=st.booleans())
def test_random_token_streams(fuzz_folder, picks, header):
    text = ("fir 1\nconfig config.json\n" if header else "") + F.token_stream(VOCAB, picks)
    path = fuzz_folder / "tokens.fir"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    outcome, detail = F.run_case(path, fir_text=text)
    check(outcome, detail, text[:500])


@fuzz_settings(20)
@given(data=st.binary(max_size=3000), keep=st.integers(0, len(SEED)))
def test_random_bytes_and_truncations(fuzz_folder, data, keep):
    raw = SEED.encode()[:keep] + data
    path = fuzz_folder / "bytes.fir"
    path.write_bytes(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    outcome, detail = F.run_case(path, fir_text=text)
    check(outcome, detail, repr(raw[:300]))


@fuzz_settings(40)
@given(ops=ops_of(F.CKPT_KINDS, most=3))
def test_damaged_safetensors(fuzz_folder, damage_folder, ops):
    pristine = (fuzz_folder / "model.safetensors").read_bytes()
    st_path = damage_folder / "model.safetensors"
    st_path.write_bytes(F.damage_safetensors(pristine, ops))
    shutil.copy(fuzz_folder / "config.json", damage_folder / "config.json")
    outcome, detail = F.run_case(damage_folder / "gpt2.fir", fir_text=SEED,
                                 other_files=(st_path,))
    check(outcome, detail, ops)


@fuzz_settings(40)
@given(ops=ops_of(F.CONFIG_KINDS, most=3))
def test_edited_config(fuzz_folder, damage_folder, ops):
    shutil.copy(fuzz_folder / "model.safetensors", damage_folder / "model.safetensors")
    cfg = damage_folder / "config.json"
    cfg.write_text(F.damage_config((fuzz_folder / "config.json").read_text(), ops),
                   encoding="utf-8", errors="surrogatepass")
    outcome, detail = F.run_case(damage_folder / "gpt2.fir", fir_text=SEED, other_files=(cfg,))
    check(outcome, detail, ops)


EXPR_PIECES = ["x", "y", "x@0", "x@1", "empty", "1", "0", "-1", "1e308", "1e400", "10**64", "2",
               "(", ")", "[", "]", ":", ",", "+", "-", "*", "/", "//", "%", "**", "<", ">=", "==",
               " and ", " or ", "not ", "abs(", "max(", "min(", "sum(", "mean(", "int(", "float(",
               "argmax(", "len(", "sqrt(", "log(", "norm(", "isnan(", "count_nan(", "x[", "x[0:",
               "x[::", "__import__", "'a'", "lambda", ".", "@", "x@99999999999999999", "9" * 30,
               "(" * 120, ")" * 120, "-" * 150, "x@1R1"]
ARRAYS = {"x": np.linspace(-2, 2, 8, dtype=np.float32), "y": np.float32(3.0),
          "empty": np.zeros(0, dtype=np.float32), "nanv": np.float32(np.nan)}


def resolve(name, layer):
    if name not in ARRAYS:
        raise FirError(f"unknown name {name!r}")
    return ARRAYS[name]


@fuzz_settings(60)
@given(parts=st.lists(st.sampled_from(EXPR_PIECES), min_size=1, max_size=14))
def test_debugger_expressions_evaluate_or_fail_cleanly(parts):
    text = "".join(parts)
    try:
        value = DebugExpr(text).evaluate(resolve)
    except FirError:
        return
    str(value)  # whatever comes back can be shown (no 5000-digit ints, no complex)
    assert not isinstance(value, complex)


@fuzz_settings(60)
@given(data=st.data())
def test_well_formed_debugger_expressions(data):
    text = F.build_expr(lambda n: data.draw(st.integers(0, n - 1)))
    try:
        value = DebugExpr(text).evaluate(resolve)
    except FirError:
        return
    str(value)
    assert not isinstance(value, complex)


@fuzz_settings(30)
@given(data=st.data())
def test_random_well_formed_kernels_run_or_fail_cleanly(fuzz_folder, data):
    """Random instructions, balanced loops and ifs, addresses in and beyond the operands:
    the interpreter either finishes, or faults / runs out of budget with a FirError."""
    text = F.random_kernel_model(SEED, lambda n: data.draw(st.integers(0, n - 1)))
    path = fuzz_folder / "program.fir"
    path.write_text(text)
    outcome, detail = F.run_case(path, fir_text=text)
    check(outcome, detail, text[text.index("kernel fz.k"):][:2000])


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    from firscope.runtime import load_model
    return load_model(write_random_gpt2(tmp_path_factory.mktemp("dbg") / "m", n_layer=2,
                                        n_embd=32, n_head=4, n_positions=16, vocab=64))


@fuzz_settings(25)
@given(data=st.data())
def test_fuzz_looking_at_the_state_never_changes_the_decode(small_model, data):
    problem = F.check_read_only(small_model, lambda n: data.draw(st.integers(0, max(n - 1, 0))))
    assert problem is None, problem


@fuzz_settings(25)
@given(data=st.data())
def test_fuzz_reverse_then_forward_is_the_identity(small_model, data):
    problem = F.check_reverse(small_model, lambda n: data.draw(st.integers(0, max(n - 1, 0))))
    assert problem is None, problem


# -- issue 23: dump containers, output-path pairs, DAP over TCP (tests/fuzzing_io.py) --------
@pytest.fixture(scope="session")
def base_dumps(tmp_path_factory):
    return FIO.base_dumps(tmp_path_factory.mktemp("dumps"))


def _picker(seed: int):
    import random
    return random.Random(seed).randrange


@fuzz_settings(80)
@given(kind=st.sampled_from(FIO.DUMP_KINDS), seed=BIG)
def test_damaged_dumps_read_or_fail_naming_the_file(base_dumps, tmp_path_factory, kind, seed):
    outcome, detail = FIO.dump_case(kind, base_dumps, tmp_path_factory.mktemp("d"),
                                    _picker(seed))
    check(outcome, detail, (kind, seed))


@fuzz_settings(20)
@given(seed=BIG)
def test_output_path_pairs_are_refused_or_written_safely(fuzz_folder, base_dumps,
                                                         tmp_path_factory, seed):
    outcome, detail = FIO.outputs_case(str(fuzz_folder / "gpt2.fir"),
                                       tmp_path_factory.mktemp("pairs"), base_dumps[".npz"],
                                       _picker(seed))
    check(outcome, detail, seed)


@pytest.fixture(scope="session")
def dap_tcp_server():
    return FIO.TcpServer()


@fuzz_settings(40)
@given(kind=st.sampled_from(FIO.FRAME_KINDS), seed=BIG)
def test_dap_tcp_framing_is_answered_or_closed(dap_tcp_server, kind, seed):
    outcome, detail = FIO.dap_tcp_case(dap_tcp_server, kind, _picker(seed))
    check(outcome, detail, (kind, seed))


# -- issue 39: long GPU loops, devices.toml, output paths, the DAP token (fuzzing_trust.py) ----
import fuzzing_trust as FT  # noqa: E402


@fuzz_settings(12)
@given(seed=BIG)
def test_gpu_loops_are_the_references_value_or_a_fault_that_says_so(seed):
    from gpu_util import device_or_skip
    gpu = device_or_skip()
    outcome, detail = FT.gpu_loop_case(gpu, _picker(seed))
    check(outcome, detail, seed)


@pytest.fixture(scope="session")
def cost_model(fuzz_folder):
    from firscope.runtime import load_model
    return load_model(fuzz_folder / "gpt2.fir")


@fuzz_settings(30)
@given(seed=BIG)
def test_hostile_devices_files_are_located_errors_or_finite_figures(cost_model,
                                                                   tmp_path_factory, seed):
    outcome, detail = FT.devices_case(cost_model, tmp_path_factory.mktemp("dev"), _picker(seed))
    check(outcome, detail, seed)


@fuzz_settings(20)
@given(seed=BIG)
def test_outputs_never_clobber_what_they_must_not(tmp_path_factory, seed):
    from conftest import SAMPLE
    outcome, detail = FT.outputs_case(tmp_path_factory.mktemp("out"), SAMPLE, _picker(seed))
    check(outcome, detail, seed)


@fuzz_settings(len(FT.TOKEN_KINDS))
@given(kind=st.sampled_from(FT.TOKEN_KINDS))
def test_dap_sessions_without_the_token_get_nothing(dap_tcp_server, tmp_path_factory, kind):
    folder = tmp_path_factory.mktemp("auth")
    private, victim = folder / "private.txt", folder / "victim.txt"
    private.write_text("root:x:0:0:the first line of a private file\n")
    victim.write_text("IMPORTANT\n")
    outcome, detail = FT.dap_auth_case(dap_tcp_server.port, dap_tcp_server.token, kind,
                                       private, victim)
    check(outcome, detail, kind)
