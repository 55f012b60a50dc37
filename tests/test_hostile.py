"""Broken and hostile inputs, one test per failure mode (issue 7).

Whatever the input, firscope reports a clear FirError and keeps working: it
never hangs, never takes the machine's memory, and never runs code from a
model file. Cases that could hang if the guard were missing run in a
subprocess with a timeout.
"""
from __future__ import annotations

import ast
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import tokenize
from pathlib import Path

import numpy as np
import pytest

from firscope.errors import BudgetExceeded, FirError, Interrupted
from firscope.fir.parser import MAX_FILE_BYTES, parse_file
from firscope.runtime import load_model
from firscope.model.decls import MAX_PLAN_INSTRUCTIONS
from firscope.runtime import Machine
from conftest import REPO, SEED_FIR
from model_util import firscope, line_of, load_err

SEED = SEED_FIR.read_text()
PACKAGE = REPO / "firscope"

# g2.add (first dispatched by node 'embeddings') starts with a loop of 3e9 empty trips.
RUNAWAY = SEED.replace("""threads=out0.size tg=1 tgbytes=16
rtou 0 0
uloadf32 1 0 @in0
uloadf32 2 0 @in1""", """threads=out0.size tg=1 tgbytes=16
loadconstf32 20 3e9
forbegin 20
forend
rtou 0 0
uloadf32 1 0 @in0
uloadf32 2 0 @in1""", 1)


def with_fir(make_model, text, name="m", **kw) -> Path:
    return make_model(name, fir_text=text, **kw)


def fs(*args, timeout=120):
    """Run the command line in a fresh process: hostile input's regression would be a hang,
    and the timeout fails it instead of hanging the suite."""
    p = firscope(*args, cwd=REPO, timeout=timeout, fresh=True)
    assert "Traceback" not in p.stderr, p.stderr
    return p


# --- runaway kernels -------------------------------------------------------------------
def test_runaway_loop_stops_at_the_budget_naming_kernel_and_line(make_model):
    path = with_fir(make_model, RUNAWAY)
    m = Machine(load_model(path), engine="interp", budget=20_000)
    with pytest.raises(BudgetExceeded) as e:
        m.step(1)
    err = e.value
    assert "kernel 'g2.add' at node embeddings executed more than 20000 instructions" in str(err)
    assert err.loc.line in (line_of(RUNAWAY, "forbegin 20"), line_of(RUNAWAY, "forend")) \
        and err.loc.path == str(path)
    # the machine keeps working: a fresh one on the same model is stopped again, not hung
    with pytest.raises(BudgetExceeded):
        Machine(m.model, engine="interp", budget=1000).step(2)


@pytest.mark.parametrize("engine,budget", [("interp", "200000"), ("compiled", None)])
def test_run_budget_end_to_end(make_model, engine, budget):
    """`firscope run` on a kernel looping 3e9 times: exit 1 naming kernel and line,
    by --budget or (compiled) the default budget."""
    path = with_fir(make_model, RUNAWAY)
    args = ["run", path, "--tokens", "1", "-n", "1", "--engine", engine]
    p = fs(*args, *(["--budget", budget] if budget else []), timeout=300)
    assert p.returncode == 1, p.stderr
    assert "kernel 'g2.add' at node embeddings executed more than" in p.stderr
    assert f"gpt2.fir:{line_of(RUNAWAY, 'forend')}:" in p.stderr and "forend" in p.stderr


@pytest.mark.parametrize("shape", ["long", "nested"])
def test_kernels_too_big_to_compile_run_on_the_interpreter(make_model, shape):
    """Compiling 10k straight-line instructions took numba over 15 minutes, and 30 nested
    loops took the lane analysis 2^30 walks: such kernels run on the interpreter, and the
    step finishes."""
    compiled = pytest.importorskip("firscope.vm.compiled")
    if shape == "long":
        n = compiled.MAX_COMPILED_OPS + 600
        body = "".join(f"addconst 1 1 {i}.5\n" for i in range(n))
        expect = f"{n + 10} instructions"
    else:
        body = "loadconstf32 20 1\n" + "forbegin 20\n" * 30 + "forend\n" * 30
        expect = "blocks nested 29 deep"
    head = "kernel g2.gelu_new in=1 out=1 size=in0,out0 threads=out0.size tg=1 tgbytes=16\n"
    text = SEED.replace(head + "rtou 0 0\n", head + "rtou 0 0\n" + body)
    m = Machine(load_model(with_fir(make_model, text)), engine="compiled")
    m.step(1)
    assert expect in m.kernel_runner.fallbacks["gelu@0"]


def test_run_budget_must_be_positive(random_model):
    p = fs("run", random_model, "--tokens", "1", "--budget", "0", "--engine", "interp")
    # bounded at the argument parser (issue 23): a usage error, as for every command
    assert p.returncode == 2 and "argument --budget: must be 1..1000000000000000" in p.stderr
    assert "Traceback" not in p.stderr


def test_ctrl_c_names_kernel_and_line(make_model):
    path = with_fir(make_model, RUNAWAY)
    for wait in (4, 10, 25):  # the signal must land after loading, inside the kernel
        proc = subprocess.Popen([sys.executable, "-m", "firscope", "run", str(path), "--tokens",
                                 "1", "-n", "1", "--engine", "interp", "--budget", str(10**15)],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        time.sleep(wait)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        if "kernel 'g2.add'" in err:
            break
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted (ctrl+c)" in err or "interrupted in kernel" in err, err
    assert "kernel 'g2.add' at node embeddings" in err
    assert f"gpt2.fir:{line_of(RUNAWAY, 'forend')}:" in err or \
        f"gpt2.fir:{line_of(RUNAWAY, 'forbegin 20')}:" in err


def test_stop_flag_interrupts_the_interpreter_cooperatively(make_model):
    """What the UI's cancel key does: set the machine's stop flag from another thread."""
    m = Machine(load_model(with_fir(make_model, RUNAWAY)), engine="interp", budget=None)
    timer = threading.Timer(0.5, m.stop_flag.set)
    timer.start()
    try:
        with pytest.raises(Interrupted) as e:
            m.step(1)
    finally:
        timer.cancel()
    assert "kernel 'g2.add' at node embeddings" in str(e.value)
    assert e.value.loc.line in (line_of(RUNAWAY, "forbegin 20"), line_of(RUNAWAY, "forend"))
    # `firscope run` also stops before the next node (ext ops and short kernels do not poll)
    from firscope.runtime.interrupt import stop_between_nodes
    stop_between_nodes(m)
    m.reset()
    with pytest.raises(Interrupted, match="before node token"):
        m.step(1)
    m.stop_flag.clear()
    m.reset()
    m.budget = 1000
    with pytest.raises(BudgetExceeded):  # cleared: it runs again
        m.step(1)


def test_session_cancel_stops_a_runaway_continue(make_model):
    from firscope.debug.session import Session
    model = load_model(with_fir(make_model, RUNAWAY))
    s = Session(model, [1], 1, engine="interp", budget=None)
    timer = threading.Timer(0.5, s.cancel.set)
    timer.start()
    stop = s.cont()
    timer.cancel()
    assert stop.reason == "interrupted" and "g2.add" in stop.message
    assert stop.location.node == "embeddings"  # the node was undone: the cursor is before it


# --- resources -----------------------------------------------------------------------------
def test_memory_is_refused_with_the_figure(random_model):
    e = load_err(random_model, memory_limit=64 * 1024)
    assert re.search(r"model needs \d+\.\d MiB \(arena .*\) but only 0\.1 MiB of memory is "
                     r"available", str(e)), str(e)


@pytest.mark.parametrize("size,msg", [
    (str(10**30), f"buffer 'scores' has size {10**30}"),
    ("9223372036854775807+1", "buffer 'scores' has size 9223372036854775808"),
    ("-1", "buffer 'scores' has size -1"),
    ("n_head*n_positions*1000000000", "model needs"),  # 2^38 elements: allowed, too big
])
def test_absurd_buffer_sizes(make_model, size, msg):
    text = SEED.replace("buf scores f32 n_head*n_positions", f"buf scores f32 {size}")
    e = load_err(with_fir(make_model, text), memory_limit=1 << 30)
    assert msg in str(e) and e.loc.line == line_of(text, "buf scores"), str(e)


def test_shape_product_overflowing_int64_is_still_sized(make_model):
    """Three dims of 2^40: np.prod wraps to 0 in int64 and skipped the memory check."""
    big = "1099511627776"
    text = SEED.replace("weight lnfw f32 ln_f.weight tensor [n_embd]",
                        f"weight lnfw f32 ln_f.weight tensor [{big},{big},{big}]")
    e = load_err(with_fir(make_model, text), memory_limit=1 << 30)
    assert "model needs" in str(e) and "GiB" in str(e)


@pytest.mark.parametrize("dims,msg", [
    ("[0,n_embd]", "dimension 0 is out of range"),
    ("[-1,n_embd]", "dimension -1 is out of range"),
    ("[n_positions,n_embd-n_embd]", "dimension 0 is out of range"),
    ("[n_positions,n_embd/3]", "must be an integer"),
])
def test_zero_or_negative_dims(make_model, dims, msg):
    text = SEED.replace("tensor [n_positions,n_embd]", f"tensor {dims}")
    e = load_err(with_fir(make_model, text))
    assert msg in str(e) and e.loc.line == line_of(text, "weight wpe"), str(e)


@pytest.mark.parametrize("threads,msg", [
    ("3e9", "dispatches 3000000000 threads (allowed 0..16777216)"),
    ("-1", "dispatches -1 threads"),
    ("16777216", "dispatches 16777216 threads, whose registers need"),  # refused by memory
    (str(10**70), "too large"),
])
def test_enormous_thread_counts(make_model, threads, msg):
    text = SEED.replace("kernel g2.gelu_new in=1 out=1 size=in0,out0 threads=out0.size",
                        f"kernel g2.gelu_new in=1 out=1 size=in0,out0 threads={threads}")
    e = load_err(with_fir(make_model, text), memory_limit=1 << 30)
    assert msg in str(e), str(e)
    assert e.loc.line == line_of(text, "kernel g2.gelu_new")


@pytest.mark.parametrize("count,msg", [
    ("3e9", "repeat count 3000000000 is out of range"),
    ("-1", "repeat count -1 is out of range"),
    ("100000", f"at most 50000 nodes and {MAX_PLAN_INSTRUCTIONS} instructions"),
    ("10*10*10*10*10*10*10*10*10*10", "repeat count 10000000000 is out of range"),
])
def test_enormous_repeat_counts(make_model, count, msg):
    """Refused before unrolling (repeat 100000 used to bind instructions for ~25 minutes):
    in a subprocess, so a regression fails by the timeout instead of hanging the suite."""
    text = SEED.replace("repeat layers", f"repeat {count}")
    p = fs("check", with_fir(make_model, text), timeout=120)
    assert p.returncode == 1 and msg in p.stderr, p.stderr
    assert f"gpt2.fir:{line_of(text, 'repeat ')}:" in p.stderr


def test_huge_and_binary_model_files(tmp_path):
    huge = tmp_path / "huge.fir"
    huge.write_text("fir 1\n" + "# padding\n" * (MAX_FILE_BYTES // 10 + 1))
    with pytest.raises(FirError, match="too large for a .fir model file"):
        parse_file(huge)
    binary = tmp_path / "bin.fir"
    binary.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(FirError, match="not UTF-8") as e:
        parse_file(binary)
    assert (e.value.loc.line, e.value.loc.col) == (2, 128 - 10)  # 0x80; the one newline: 0x0a
    nul = tmp_path / "nul.fir"
    nul.write_bytes(b"fir 1\n\x00\x01\x02 x\n")
    with pytest.raises(FirError, match="unknown directive") as e:
        parse_file(nul)
    assert (e.value.loc.line, e.value.loc.col) == (2, 1)


@pytest.mark.parametrize("odd", ["\x0c", "\x0b", "\x1c", "\x85", "\u2028", "\u2029"])
def test_line_numbers_count_newlines_only(make_model, odd):
    """str.splitlines() also breaks at these; an editor does not, so positions must not."""
    text = SEED.replace("# Config checks owned", f"# Config{odd}checks owned")
    text = text.replace("sym mlp = 4*hidden", "sym mlp = 4*hidden*")
    e = load_err(with_fir(make_model, text))
    assert e.loc.line == line_of(text, "sym mlp") and e.loc.text == "sym mlp = 4*hidden*"
    crlf = with_fir(make_model, text.replace("\n", "\r\n"), "crlf")
    e = load_err(crlf)
    assert e.loc.line == line_of(text, "sym mlp") and e.loc.text == "sym mlp = 4*hidden*"


@pytest.mark.parametrize("old,new", [
    ("add 1 1 2", "add 1 1 \u00b2"),  # isdigit() is true for a superscript, int() refuses it
    ("add 1 1 2", "add R\u00b2 1 2"),
    ("add 1 1 2", "add ----1 1 2"),
    ("kernel g2.add in=2", "kernel g2.add in=\u00b2"),
])
def test_odd_digits_in_registers_and_counts(make_model, old, new):
    text = SEED.replace(old, new, 1)
    e = load_err(with_fir(make_model, text))
    assert e.loc.line == line_of(text, new) and ("register" in str(e) or "in=" in str(e))


@pytest.mark.parametrize("where,old,new", [
    ("sym headdim", "sym headdim = hidden/nheads",
     "sym headdim = " + "(" * 500 + "hidden/nheads" + ")" * 500),
    ("sym mlp", "sym mlp = 4*hidden", "sym mlp = " + "-" * 300 + "4*hidden"),
    ("sym mlp", "sym mlp = 4*hidden", "sym mlp = 4*hidden" + "+0" * 5000),
    ("buf fc", "buf fc f32 mlp", "buf fc f32 " + "(" * 5000 + "mlp" + ")" * 5000),
    ("mulconst 2 2 sqrt(", "mulconst 2 2 2*sqrt(2/pi)",
     "mulconst 2 2 " + "sqrt(" * 300 + "2" + ")" * 300),
])
def test_deeply_nested_expressions_are_located_errors(make_model, where, old, new):
    text = SEED.replace(old, new)
    e = load_err(with_fir(make_model, text))
    assert "nested too deeply" in str(e) and e.loc.line == line_of(text, where), str(e)


def test_config_missing_key_is_an_undefined_symbol_where_used(make_model):
    path = make_model("nokey")
    cfg = json.loads((path.parent / "config.json").read_text())
    del cfg["n_embd"]
    (path.parent / "config.json").write_text(json.dumps(cfg))
    e = load_err(path)
    line = line_of(SEED, "sym hidden = n_embd")
    assert "undefined symbol 'n_embd'" in str(e)
    assert (e.loc.line, e.loc.col) == (line, SEED.splitlines()[line - 1].index("n_embd") + 1)


@pytest.mark.parametrize("text,msg", [
    ("[1, 2]", "config must be a JSON object"),
    ('{"n_embd": 64', "config is not valid JSON"),
    ("", "config is not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"n_embd": ' + "9" * 5000 + "}", "not usable JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_config_that_is_not_usable_json(make_model, text, msg):
    path = make_model("cfg")
    cfg = path.parent / "config.json"
    cfg.write_bytes(text if isinstance(text, bytes) else text.encode())
    e = load_err(path)
    assert msg in str(e) and "config.json" in str(e), str(e)


@pytest.mark.parametrize("value,msg", [
    ("1e999", "must be a finite number, found inf"),
    ("NaN", "must be a finite number, found nan"),
    ('"small"', "must be a number"),
])
def test_non_finite_epsilon(make_model, value, msg):
    path = make_model("eps")
    cfg = path.parent / "config.json"
    cfg.write_text(cfg.read_text().replace('"layer_norm_epsilon": 1e-05',
                                           f'"layer_norm_epsilon": {value}'))
    e = load_err(path)
    assert msg in str(e) and e.loc.line == line_of(SEED, "epsilon layer_norm_epsilon")


def test_require_config_with_a_giant_number(make_model):
    """Fraction("1e999999999") would build a billion-digit integer: a subprocess with a
    timeout, so a regression fails instead of hanging the suite."""
    text = SEED.replace("require config model_type gpt2", "require config n_embd 1e999999999")
    p = fs("check", with_fir(make_model, text), timeout=120)
    assert p.returncode == 1
    assert "config check failed: n_embd must be 1e999999999, config.json has 64" in p.stderr


@pytest.mark.parametrize("target,msg", [
    ("/dev/zero", "is not a regular file"),
    (".", "is a directory"),
    ("fifo.json", "is not a regular file"),
    ("nope.json", "config file not found"),
])
def test_config_path_is_read_as_data_only(make_model, target, msg):
    """A 'config' line naming a device, a directory or a FIFO is an error, not a hang."""
    text = SEED.replace("config config.json", f"config {target}")
    path = with_fir(make_model, text)
    os.mkfifo(path.parent / "fifo.json")
    p = fs("check", path, timeout=60)
    assert p.returncode == 1 and msg in p.stderr, p.stderr
    assert f"gpt2.fir:{line_of(text, 'config ' + target)}:8:" in p.stderr


@pytest.mark.parametrize("kind", ["fifo", "dir", "devzero", "missing"])
def test_model_file_that_is_not_a_regular_file(tmp_path, kind):
    path = tmp_path / "m.fir"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
        (path / "x").write_text("")
        with pytest.raises(FirError, match="is a directory, expected a .fir model file"):
            parse_file(path)
    elif kind == "devzero":
        path.symlink_to("/dev/zero")
    p = fs("check", path, timeout=60)
    assert p.returncode == 1
    assert {"fifo": "is not a regular file", "dir": "a folder; give the .fir file",
            "devzero": "is not a regular file", "missing": "no such file"}[kind] in p.stderr


def _st_damage(b: bytes, how: str) -> bytes:
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8: 8 + n])
    data = b[8 + n:]

    def with_header(h, pad=True) -> bytes:
        raw = json.dumps(h).encode() if not isinstance(h, bytes) else h
        raw += b" " * ((8 - len(raw) % 8) % 8 if pad else 0)
        return struct.pack("<Q", len(raw)) + raw + data

    name = sorted(k for k in header if k != "__metadata__")[0]
    if how == "empty":
        return b""
    if how == "truncated-header":
        return b[: 8 + n // 2]
    if how == "truncated-data":
        return b[: len(b) - 100]
    if how == "length-2^64-1":
        return struct.pack("<Q", 2**64 - 1) + b[8:]
    if how == "deep-json":
        return with_header(b"[" * 50_000 + b"]" * 50_000)
    if how == "huge-int":
        return with_header(b'{"a": ' + b"9" * 5000 + b"}")
    if how == "dtype-list":
        header[name]["dtype"] = ["F32"]
    elif how == "shape-infinity":
        return with_header(json.dumps(header).replace(
            json.dumps(header[name]["shape"]), "[Infinity]", 1).encode())
    elif how == "shape-float":
        header[name]["shape"] = [1.5] * len(header[name]["shape"])
    elif how == "shape-huge":
        header[name]["shape"] = [10**30, 10**30]
    elif how == "offsets-backwards":
        header[name]["data_offsets"] = header[name]["data_offsets"][::-1]
    elif how == "entry-not-object":
        header[name] = 7
    elif how == "int-dtype":
        header[name]["dtype"] = "I32"
    return with_header(header)


@pytest.mark.parametrize("how,msg", [
    ("empty", "truncated safetensors file"),
    ("truncated-header", "corrupt or truncated"),
    ("truncated-data", "truncated safetensors file"),
    ("length-2^64-1", "corrupt or truncated"),
    ("deep-json", "nested too deeply"),
    ("huge-int", "not JSON"),
    ("dtype-list", "unsupported dtype"),
    ("shape-infinity", "corrupt safetensors entry"),
    ("shape-float", "corrupt safetensors entry"),
    ("shape-huge", "do not hold"),
    ("offsets-backwards", "corrupt safetensors entry"),
    ("entry-not-object", "corrupt safetensors entry"),
    ("int-dtype", "weights must be floating point"),
])
def test_corrupt_or_truncated_safetensors(make_model, how, msg):
    path = make_model("st")
    st = path.parent / "model.safetensors"
    st.write_bytes(_st_damage(st.read_bytes(), how))
    e = load_err(path)
    assert msg in str(e) and "model.safetensors" in str(e), str(e)


@pytest.mark.parametrize("kind", ["fifo", "dir", "devzero"])
def test_checkpoint_that_is_not_a_regular_file(make_model, kind):
    path = make_model("stf")
    st = path.parent / "model.safetensors"
    st.unlink()
    if kind == "fifo":
        os.mkfifo(st)
    elif kind == "dir":
        st.mkdir()
    else:
        st.symlink_to("/dev/zero")
    p = fs("check", path, timeout=60)
    assert p.returncode == 1 and "model.safetensors" in p.stderr
    assert ("is a directory" if kind == "dir" else "is not a regular file") in p.stderr


@pytest.mark.parametrize("index,msg", [
    ({"weight_map": {"wte.weight": {"a": 1}}}, "must be a file name"),
    ({"weight_map": {"wte.weight": "../outside.safetensors"}}, "outside the model folder"),
    ({"weight_map": {"wte.weight": "x" * 5000}}, "File name too long"),
    ({"weight_map": []}, "expected an object with a 'weight_map'"),
    ("[" * 100_000, "not usable JSON"),
])
def test_hostile_sharded_index(make_model, index, msg):
    path = make_model("idx")
    (path.parent / "model.safetensors").unlink()
    text = index if isinstance(index, str) else json.dumps(index)
    (path.parent / "model.safetensors.index.json").write_text(text)
    e = load_err(path)
    assert msg in str(e) or (msg in str(e.loc) if e.loc else False), str(e)


def test_missing_model_file():
    e = load_err(REPO / "no" / "such.fir")
    assert "such.fir: no such file" in str(e)


def test_q4_weight_as_an_ext_input_is_refused_at_load(make_model):
    """fir.embedding reading its ids from a q4 weight (stored outside the arena)."""
    text = SEED.replace("node token ext fir.embedding token_id wte -> x",
                        "node token ext fir.embedding qkvw wte -> x")
    text = text.replace("weight qkvw q4 h.{i}.attn.c_attn.weight",
                        "weight qkvw q4 h.0.attn.c_attn.weight")
    e = load_err(with_fir(make_model, text))
    assert "reads 'qkvw' from the arena, but it is a q4 weight" in str(e)
    assert e.loc.line == line_of(text, "node token ext")


# --- no code from a model file ---------------------------------------------------------------
# Every call that could run code or unpickle data, anywhere in the package, with its reason.
ALLOWED_DYNAMIC = {
    # the compiled engine imports the per-lane kernel source it generated itself from the
    # opcode table (checked below: no text from the model file reaches that code)
    ("vm/kernel_cache.py", "importlib.util.spec_from_file_location"),
    ("vm/kernel_cache.py", "importlib.util.module_from_spec"),
    ("vm/kernel_cache.py", "spec.loader.exec_module"),
    # the one constructor imports the machine class of an engine named in its own table
    # (firscope/engines.ENGINE_SPECS; an unknown name is refused before any import)
    ("engines.py", "importlib.import_module"),
    # serve's UI children ask Linux to kill them when the server dies (prctl PR_SET_PDEATHSIG
    # with a constant signal; nothing from a model or a browser reaches the call)
    ("dap/webserve.py", "import ctypes"),
    ("dap/webserve.py", "ctypes.CDLL"),
    # `firscope --corpus FILE` runs `python -m firscope quant sensitivity` beside the UI: an
    # argument list (no shell), this interpreter, the model's and the corpus's paths as
    # arguments; its JSON output is read with json.loads
    ("tui/corpus_actions.py", "import subprocess"),
    ("tui/corpus_actions.py", "subprocess.Popen"),
    # the kernel editor's ctrl+e runs the user's own $VISUAL / $EDITOR (from their
    # environment, split by shlex, no shell) on the draft's file; nothing from a model file
    # reaches the command
    ("tui/kernel_editor.py", "import subprocess"),
    ("tui/kernel_editor.py", "subprocess.call"),
}
_DANGEROUS_BUILTINS = {"eval", "exec", "compile", "__import__", "breakpoint"}
_DANGEROUS_MODULES = {"pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "joblib",
                      "torch", "yaml", "ctypes", "subprocess", "runpy", "code", "codeop"}


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def dynamic_code_sites(root: Path) -> set[tuple[str, str]]:
    found = set()
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        tree = ast.parse(f.read_text(encoding="utf-8"), str(f))
        dangerous = set()  # local names bound to dangerous modules in this file
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in _DANGEROUS_MODULES:
                        found.add((rel, f"import {a.name}"))
                        dangerous.add((a.asname or a.name).split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] in _DANGEROUS_MODULES | {"importlib"}:
                    found.add((rel, f"from {node.module} import"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = _dotted(node.func)
                head = name.split(".")[0]
                if isinstance(node.func, ast.Name) and name in _DANGEROUS_BUILTINS:
                    found.add((rel, name))
                elif head in dangerous or name.startswith("importlib"):
                    found.add((rel, name))
                elif name.endswith("exec_module") or name in ("os.system", "os.popen") \
                        or name.startswith("os.exec") or name.startswith("os.spawn"):
                    found.add((rel, name))
                elif name.endswith(".load") or name.endswith(".loads"):
                    kws = {k.arg: k.value for k in node.keywords}
                    pickle_ok = kws.get("allow_pickle")
                    if isinstance(pickle_ok, ast.Constant) and pickle_ok.value is True:
                        found.add((rel, f"{name}(allow_pickle=True)"))
    return found


def test_no_eval_exec_pickle_on_model_text():
    sites = dynamic_code_sites(PACKAGE)
    assert sites <= ALLOWED_DYNAMIC, sorted(sites - ALLOWED_DYNAMIC)
    # the scan finds what it looks for
    probe = dynamic_code_sites_text("import pickle\nx = eval(s)\npickle.loads(b)\n"
                                    "np.load(f, allow_pickle=True)\n__import__('os')\n")
    assert probe == {"import pickle", "eval", "pickle.loads", "np.load(allow_pickle=True)",
                     "__import__"}


def dynamic_code_sites_text(source: str) -> set[str]:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "m.py").write_text(source)
        return {what for _, what in dynamic_code_sites(Path(d))}


def _code_without_comments(source: str) -> list[tuple[int, str]]:
    toks = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(t.type, t.string) for t in toks if t.type not in (tokenize.COMMENT, tokenize.NL)]


HOSTILE_NAMES = [("g2.add", "os.system"), ("g2.layernorm", "__import__.exec"),
                 ("g2.attn_decode", "eval.compile"), ("g2.gelu_new", "open.read"),
                 ("scores", "__builtins__"), ("key_cache", "globals"), ("attention", "exec_")]


def test_generated_kernels_contain_no_text_from_the_model_file(make_model):
    """The compiled engine's source depends only on the program (numbers and registers):
    renaming kernels, buffers and nodes to Python-looking names changes nothing but the
    comment naming the kernel."""
    compiled = pytest.importorskip("firscope.vm.compiled")
    plain = load_model(make_model("plain"))
    text = SEED
    for old, new in HOSTILE_NAMES:
        text = re.sub(rf"(?<![\w.@]){re.escape(old)}(?![\w])", new, text)
        text = text.replace(f"@{old}", f"@{new}")
    assert "os.system" in text and "@__builtins__" not in text  # scores is only an operand
    hostile = load_model(with_fir(make_model, text, "hostile"))
    compared = 0
    for a, b in zip(plain.nodes, hostile.nodes):
        if a.kind != "micro":
            continue
        try:
            ga = compiled.generate(a.program)
        except FirError:
            with pytest.raises(FirError):
                compiled.generate(b.program)
            continue
        gb = compiled.generate(b.program)
        assert _code_without_comments(ga.source) == _code_without_comments(gb.source)
        for _, new in HOSTILE_NAMES:
            assert new not in "".join(s for _, s in _code_without_comments(gb.source))
        compared += 1
    assert compared >= 10


def test_report_html_escapes_text_from_the_model_file(make_model, tmp_path):
    text = SEED.replace("model gpt2", "model <script>alert(1)</script>")
    path = with_fir(make_model, text)
    out = tmp_path / "rep"
    p = fs("profile", path, "--tokens", "1", "-n", "1", "-o", out, "--engine", "interp",
           timeout=300)
    assert p.returncode == 0, p.stderr
    html = (out / "report.html").read_text()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_pickled_checkpoint_is_never_opened(make_model):
    """A .bin that would run code when unpickled is refused without being read."""
    path = make_model("pk")
    folder = path.parent
    (folder / "model.safetensors").unlink()
    marker = folder / "pwned"
    evil = (b"\x80\x04cos\nsystem\n(V" + f"touch {marker}".encode() + b"\ntR.")
    (folder / "pytorch_model.bin").write_bytes(evil)
    e = load_err(path)
    assert "pickled checkpoints are refused" in str(e) and not marker.exists()


# --- the command line keeps its promise -------------------------------------------------------
@pytest.mark.parametrize("text,msg", [
    ("-(x < 0)", None),  # NumPy refuses '-' on booleans; Python's -True is -1
    ("x[1:1] ** 2", None),  # an empty exponent has no max
    ("x@1R1", "cannot parse"),
    ("int(1e400)", "int()"),
    ("((10**64)**64)**64", None),
    ("x[::0]", "bad index"),
    ("(1, 2) < x", "a tuple is only allowed as an index"),
    ("-" * 300 + "1", "nested too deeply"),
])
def test_debugger_expressions_found_by_the_fuzzer(text, msg):
    from firscope.debug.expr import DebugExpr
    x = np.linspace(-2, 2, 8, dtype=np.float32)

    def resolve(name, layer):
        return x

    if msg is None:
        value = DebugExpr(text).evaluate(resolve)
        str(value)
        assert not isinstance(value, complex)
    else:
        with pytest.raises(FirError, match=re.escape(msg)):
            DebugExpr(text).evaluate(resolve)


@pytest.mark.parametrize("text", ["std(x[0:0])", "mean(x[0:0])", "log(x - 2)", "x / 0"])
def test_debugger_expressions_print_no_numpy_warnings(text):
    """'Mean of empty slice' and friends went to stderr past the session's output (found by
    the fuzzer's script cases); the value (nan, inf) says it."""
    import warnings
    from firscope.debug.expr import DebugExpr
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        DebugExpr(text).evaluate(lambda name, layer: x)
    assert [str(w.message) for w in seen] == []


def test_hostile_inputs_on_the_command_line_exit_1_without_traceback(make_model):
    text = SEED.replace("sym mlp = 4*hidden", "sym mlp = " + "(" * 2000 + "4" + ")" * 2000)
    p = fs("check", with_fir(make_model, text))
    assert p.returncode == 1 and "nested too deeply" in p.stderr
