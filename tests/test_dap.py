"""`firscope dap` driven by a real DAP client: VS Code's DebugClient (npm
@vscode/debugadapter-testsupport) runs each scenario of tests/dap/scenarios.js.
The scenarios that need the adapter's own process (a broken frame written to its
stdin, its exit on a disconnect, a launch refused before any token is given) run
against a fresh adapter process over stdio, as VS Code starts it; the others are each
a fresh session of one `firscope dap --port 0` server of this module, which takes
clients one after another (a fresh process per scenario cost ~2 s of CPU each for the
interpreter's, NumPy's and numba's start). Two more run over --port against a server
of their own.

The npm package is installed by `.ci/run`; from a fresh clone the first test
here runs `npm ci` in tests/dap (the lockfile pins it). Without node or npm, or
with the npm registry out of reach, these tests are skipped with the reason,
except under CI, where that is a failure.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SEED_FIR, write_random_gpt2
from netutil import listening_addresses, stop_server

DAP_DIR = REPO / "tests" / "dap"
CLIENT = DAP_DIR / "node_modules" / "@vscode" / "debugadapter-testsupport"
FIRSCOPE = Path(sys.executable).parent / "firscope"
SCENARIO_TIMEOUT = 600


def _unavailable(message: str):
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def node() -> str:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        _unavailable("the DAP tests need node (Debian: apt-get install nodejs npm)")
    if not CLIENT.exists():
        if npm is None:
            _unavailable("the DAP tests need npm to install their client (tests/dap)")
        r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=DAP_DIR,
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            _unavailable("npm ci in tests/dap failed (is the npm registry reachable?):\n"
                         + r.stderr[-2000:])
    if not FIRSCOPE.exists():
        pytest.fail(f"{FIRSCOPE} is missing: install firscope (pip install -e .) first")
    return node


def run_scenario(node: str, name: str, model: Path, port: int | None = None,
                 token: str | None = None) -> str:
    cmd = [node, str(DAP_DIR / "scenarios.js"), "--firscope", str(FIRSCOPE),
           "--scenario", name, "--model", str(model)]
    if port is not None:
        cmd += ["--port", str(port), "--token", token]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=SCENARIO_TIMEOUT,
                       cwd=DAP_DIR)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"scenario {name} failed:\n{out[-6000:]}"
    assert f"ok {name}" in r.stdout
    return out


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory) -> Path:
    """A model whose gelu divides by zero: NaN/Inf appears in gelu@0."""
    text = SEED_FIR.read_text().replace(
        "mulconst 2 2 2*sqrt(2/pi)\nsigmoid 2 2",
        "mulconst 2 2 2*sqrt(2/pi)\nloadconstf32 9 0\ndiv 2 2 9\nsigmoid 2 2")
    assert "div 2 2 9" in text
    return write_random_gpt2(tmp_path_factory.mktemp("nan"), fir_text=text)


@pytest.fixture(scope="module")
def big_vocab_model(tmp_path_factory) -> Path:
    """GPT-2's vocabulary size, so `logits` has 50257 elements to page through."""
    return write_random_gpt2(tmp_path_factory.mktemp("vocab"), n_layer=1, n_embd=32, n_head=2,
                             n_positions=8, vocab=50257)


SAMPLE_SCENARIOS = ["entry", "line_breakpoint_every_layer", "conditions_and_hit_counts",
                    "function_breakpoint", "step_in_to_first_instruction", "lane_registers",
                    "step_back_restores_register", "evaluate_max_abs", "bad_requests",
                    "data_breakpoint", "pause", "goto_node", "log_points_and_spent_breakpoint",
                    "launch_error_is_shown", "zero_based_lines_and_uris"]


# the scenarios that write to the adapter's stdin, wait for its process to exit, or launch
# without the server's token
STDIO_SCENARIOS = {"bad_requests", "pause", "launch_error_is_shown"}


def start_server() -> tuple[subprocess.Popen, int, str]:
    """`firscope dap --port 0`: the process, its port and its token."""
    proc = subprocess.Popen([str(FIRSCOPE), "dap", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    m = re.search(r"listening on 127\.0\.0\.1:([0-9]+); token (\S+) ", line)
    if m is None:
        out, err = stop_server(proc, signal.SIGKILL)
        raise AssertionError(f"unexpected first line: {line!r}\n{err[-2000:]}")
    return proc, int(m.group(1)), m.group(2)


@pytest.fixture(scope="module")
def server(node):
    """The module's server: (port, token). It must outlive every client and stop cleanly
    on SIGTERM, having written nothing but its two lines."""
    proc, port, token = start_server()
    yield port, token
    assert proc.poll() is None, "the server outlives its clients"
    out, err = stop_server(proc, signal.SIGTERM)
    assert proc.returncode == 0, err
    assert out == "" and err == "firscope dap: stopped\n", (out, err)


def scenario(node: str, server, name: str, model: Path) -> str:
    if name in STDIO_SCENARIOS:
        return run_scenario(node, name, model)
    port, token = server
    return run_scenario(node, name, model, port=port, token=token)


@pytest.mark.parametrize("name", SAMPLE_SCENARIOS)
def test_scenario_on_the_sample_model(node, server, name):
    scenario(node, server, name, SEED_FIR)


def test_nan_exception_breakpoint(node, server, nan_model):
    scenario(node, server, "nan_exception", nan_model)


def test_paging_a_50257_element_buffer(node, server, big_vocab_model):
    scenario(node, server, "paging", big_vocab_model)


def test_scenarios_have_tests():
    """Every scenario in scenarios.js is run by a test here."""
    text = (DAP_DIR / "scenarios.js").read_text()
    defined = set(re.findall(r"^scenarios\.([a-z_]+) = ", text, re.M))
    assert defined == set(SAMPLE_SCENARIOS) | {"nan_exception", "paging"}


def test_tcp_server_takes_clients_one_after_another_and_stops_cleanly(node):
    proc, port, token = start_server()
    try:
        assert listening_addresses(port) == {"127.0.0.1"}
        run_scenario(node, "entry", SEED_FIR, port=port, token=token)
        run_scenario(node, "function_breakpoint", SEED_FIR, port=port, token=token)
        assert proc.poll() is None, "the server outlives its clients"
    finally:
        out, err = stop_server(proc, signal.SIGTERM)
    assert proc.returncode == 0, err
    assert out == "", "nothing but DAP goes to the client; the TCP server prints nothing"
