"""Trust, fourth round (issue 39): each defect's reproducer, failing before its fix."""
from __future__ import annotations

import subprocess
import sys

import pytest

import model_util
from probe_util import probe_model


def firscope(*args, cwd=None, env=None, input=None, timeout=600) -> subprocess.CompletedProcess:
    """The command line (tests/model_util.firscope: in this process; with ``env``, in a fresh
    one)."""
    return model_util.firscope(*args, cwd=cwd, env=env, input=input, timeout=timeout)


# -- 1. the GPU engine never returns a loop the driver cut short -----------------------------
def test_a_gpu_run_whose_loop_a_driver_ends_early_exits_1_and_writes_no_dump(tmp_path):
    from gpu_util import device_or_skip
    device_or_skip()
    fir = probe_model(tmp_path, ["loadconstf32 15 70000", "loadconstf32 1 0", "forbegin 15",
                                 "addconst 1 1 1", "forend", "uconst 0 0", "ustoref32 1 0 @out0"])
    dump = tmp_path / "o.safetensors"
    done = firscope("run", fir, "--engine", "gpu", "--tokens", "3", "-n", "1", "--dump", dump)
    if done.returncode == 0:  # a driver without the limit: then the value must be right
        from safetensors.numpy import load_file
        assert load_file(str(dump))["step0/probe/mix"][0] == 70000.0
        return
    assert done.returncode == 1, done.stderr
    assert "the GPU driver ended lane 0's loop" in done.stderr and "70000 trips" in done.stderr
    assert f"{fir}:" in done.stderr and "Traceback" not in done.stderr
    assert not dump.exists()


# -- 3. save breakpoints follows the output rule ------------------------------------------------
def test_save_breakpoints_never_replaces_a_file_it_did_not_write(tmp_path):
    (tmp_path / "victim.txt").write_text("IMPORTANT USER DATA\n")
    (tmp_path / "victim2.txt").write_text("ALSO IMPORTANT\n")
    (tmp_path / "link.txt").symlink_to("victim2.txt")
    script = ("break attention\nsave breakpoints victim.txt\nsave breakpoints link.txt\n"
              "save breakpoints new.gdb\nsave breakpoints new.gdb\nsave breakpoints /dev/null\n")
    done = firscope("debug", "--tokens", "3", "-n", "1", "--keep-going", input=script,
                    cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1
    assert "victim.txt: exists and is not a breakpoints file" in out
    assert "link.txt: cannot write the breakpoints there: is a symbolic link" in out
    assert "/dev/null: cannot write the breakpoints there: is not a regular file" in out
    assert out.count("Saved 1 breakpoint and 0 displays to new.gdb.") == 2  # a new file, then
    # replacing the file it wrote
    assert (tmp_path / "victim.txt").read_text() == "IMPORTANT USER DATA\n"
    assert (tmp_path / "victim2.txt").read_text() == "ALSO IMPORTANT\n"
    assert (tmp_path / "link.txt").is_symlink()
    assert (tmp_path / "new.gdb").read_text().splitlines()[1] == "break attention"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


# -- 4. --logits-out never overwrites the run's inputs -----------------------------------------
@pytest.mark.parametrize("victim", ["gpt2.fir", "config.json", "model.safetensors"])
def test_logits_out_refuses_the_runs_own_inputs(tmp_path, victim):
    import shutil
    from conftest import SAMPLE
    model = tmp_path / "m"
    shutil.copytree(SAMPLE, model)
    before = (model / victim).read_bytes()
    done = firscope("run", model / "gpt2.fir", "--tokens", "3", "-n", "1", "--logits-out",
                    model / victim)
    assert done.returncode == 1
    assert "exists and is not a .npy file; --logits-out replaces only a previous .npy" \
        in done.stderr
    assert (model / victim).read_bytes() == before
    ok = firscope("run", model / "gpt2.fir", "--tokens", "3", "-n", "1", "--logits-out",
                  tmp_path / "l.npy")
    again = firscope("run", model / "gpt2.fir", "--tokens", "3", "-n", "1", "--logits-out",
                     tmp_path / "l.npy")
    assert ok.returncode == 0 and again.returncode == 0, again.stderr  # a .npy is replaced


# -- 6. a hostile devices.toml -------------------------------------------------------------------
def _devices_file(folder, **changes) -> None:
    from firscope.cost.devices import SHIPPED, read_file
    shipped, _ = read_file(SHIPPED)
    figures = {k: v for k, v in shipped["a100"].as_dict().items()
               if k not in ("key", "name", "sources", "origin")}
    figures.update(changes)
    (folder / "firscope").mkdir(parents=True, exist_ok=True)
    body = "\n".join(f"{k} = {v}" for k, v in figures.items())
    (folder / "firscope" / "devices.toml").write_text(f'default = "mine"\n[mine]\n{body}\n')


EXTREMES = [("clock_ghz", "1e308"), ("clock_ghz", "5e-324"), ("alu_latency_cycles", "1e308"),
            ("f32_tflops", "5e-324"), ("f32_tflops", "1.7e308"),
            ("dram_bandwidth_gbs", "1e-320"), ("memory_latency_ns", "1e308"),
            ("launch_overhead_us", "1e308"), ("compute_units", "10000000000"),
            ("simd_width", "99999")]


@pytest.mark.parametrize("field, value", EXTREMES)
def test_a_devices_file_out_of_range_is_a_positioned_error(tmp_path, field, value):
    _devices_file(tmp_path, **{field: value})
    env = dict(__import__("os").environ, XDG_CONFIG_HOME=str(tmp_path))
    done = firscope("cost", "--tokens", "3,7", "--json", env=env)
    assert done.returncode == 1 and done.stdout == ""
    path = tmp_path / "firscope" / "devices.toml"
    assert done.stderr.startswith(f"{path}:") and f"'{field}' of device 'mine' must be " \
        "between" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_every_figure_at_its_bounds_gives_strict_json(tmp_path, monkeypatch, capsys):
    """Within the ranges, the model's figures stay finite: --json is JSON that strict
    parsers accept (no NaN or Infinity), at the least and the most of every figure."""
    import json
    import math
    from firscope.cost.devices import RANGES
    from firscope.cost.render import run_cost
    from firscope.runtime.opening import RunInput
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in --json"))

    for corner in (0, 1):
        _devices_file(tmp_path, **{k: (int(v[corner]) if isinstance(v[corner], int)
                                       else repr(float(v[corner])))
                                   for k, v in RANGES.items()})
        assert run_cost(RunInput(tokens=(3, 7)), device=None, at=None, as_json=True,
                        top=None) == 0
        report = strict(capsys.readouterr().out)
        numbers = []

        def walk(v):
            if isinstance(v, dict):
                for x in v.values():
                    walk(x)
            elif isinstance(v, list):
                for x in v:
                    walk(x)
            elif isinstance(v, float):
                numbers.append(v)
        walk(report)
        assert numbers and all(math.isfinite(x) for x in numbers)


@pytest.mark.parametrize("text, message", [
    ('["\\u0000default"]\nname = "x"\n', ":1:1: device name '\\x00default'"),
    ("a = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
])
def test_devices_file_with_hostile_names_or_nesting(tmp_path, text, message):
    (tmp_path / "firscope").mkdir()
    (tmp_path / "firscope" / "devices.toml").write_text(text)
    env = dict(__import__("os").environ, XDG_CONFIG_HOME=str(tmp_path))
    done = firscope("cost", "--tokens", "3,7", env=env)
    assert done.returncode == 1 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


# -- 9, 10. cost offers what it runs; --device list --json ---------------------------------------
def test_cost_does_not_offer_the_gpu_engine_and_lists_devices_as_json():
    import json
    done = firscope("cost", "--tokens", "3,7", "--engine", "gpu")
    assert done.returncode == 2 and "invalid choice: 'gpu'" in done.stderr
    assert "gpu" not in firscope("cost", "--help").stdout.split("--engine")[1].split("\n")[0]
    listed = firscope("cost", "--device", "list", "--json")
    assert listed.returncode == 0
    devices = json.loads(listed.stdout)
    h200 = next(d for d in devices if d["key"] == "h200")
    assert h200["dram_bandwidth_gbs"] > 0 and h200["sources"]["dram_bandwidth_gbs"]


# -- 11. --tokens with an empty item ------------------------------------------------------------
@pytest.mark.parametrize("command", ["run", "cost", "debug", "profile", "sanitize"])
@pytest.mark.parametrize("tokens, item", [("3,,7", "item 2 is empty"), ("3,7,", "item 3 is empty"),
                                          (",3", "item 1 is empty")])
def test_an_empty_token_item_is_a_usage_error(command, tokens, item):
    done = firscope(command, "--tokens", tokens)
    assert done.returncode == 2 and f"argument --tokens: {item}" in done.stderr, done.stderr


# -- 12, 13. capture: a command a shell can run, and never through a link -------------------------
def test_capture_quotes_its_run_it_line_and_escapes_control_characters(tmp_path):
    import shlex
    done = firscope("capture", "--node", "attention@0", "--step", "1", "--tokens", "3,7",
                    "-o", "odd name", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line == ("run it: firscope diff 'odd name/gpt2.fir' --against "
                    "'odd name/expected.safetensors'")
    again = firscope(*shlex.split(line.removeprefix("run it: firscope ")), cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    evil = firscope("capture", "--node", "attention@0", "--step", "1", "--tokens", "3,7",
                    "-o", "x\x1b[31m\ny", cwd=tmp_path)
    assert evil.returncode == 0 and "\x1b" not in evil.stdout
    assert "x\\x1b[31m\\ny/gpt2.fir" in evil.stdout and evil.stdout.count("\n") == 2


def test_capture_refuses_to_write_through_a_link(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to("elsewhere")
    done = firscope("capture", "--node", "attention@0", "--step", "1", "--tokens", "3,7",
                    "-o", "link", cwd=tmp_path)
    assert done.returncode == 2 and "-o link: is a symbolic link (to elsewhere)" in done.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == []


# -- 7. diff --isolate: a dump that changes on disk ends the diff as plain diff ends it ----------
@pytest.mark.parametrize("isolate", [False, True], ids=["plain", "isolate"])
def test_a_dump_rewritten_while_diff_reads_it_is_exit_2(tmp_path, monkeypatch, isolate, capsys):
    import io
    from conftest import SEED_FIR
    from firscope.compare import dumpfile
    from firscope.compare.command import DiffOptions, run_diff
    from firscope.runtime.opening import RunInput
    dump = tmp_path / "w.safetensors"
    done = firscope("run", SEED_FIR, "--tokens", "3,7,9", "-n", "6", "--dump", dump)
    assert done.returncode == 0, done.stderr
    reads = {"n": 0}
    real = dumpfile.Dump.read

    def read_then_rewrite(self, key):  # the race, made deterministic: after 20 reads
        reads["n"] += 1
        if reads["n"] == 20:
            with open(dump, "ab") as f:
                f.write(b" ")
        return real(self, key)

    monkeypatch.setattr(dumpfile.Dump, "read", read_then_rewrite)
    out, err = io.StringIO(), io.StringIO()
    code = run_diff(DiffOptions(RunInput(model=str(SEED_FIR)), against=str(dump),
                                isolate=isolate), out=out, err=err)
    assert reads["n"] >= 20
    assert code == 2, out.getvalue()
    assert "the dump changed on disk since it was opened" in err.getvalue()
    assert "wrong on their own" not in out.getvalue()


# -- 5. compiled engine: loop-carried accumulation is no proof ----------------------------------
ACCUMULATED = ["loadconstf32 15 in0.size", "uconst 0 0", "loadconstf32 1 0",
               "loadconstf32 2 2", "forbegin 15", "add 1 1 2", "forend", "uconst 0 0"]


@pytest.mark.parametrize("tail, what", [
    (["forbegin 1", "uloadf32 2 0 @in0", "uaddk 0 0 1", "forend", "uconst 0 0",
      "ustoref32 2 0 @out0"], "load from @in0 index 128 is outside x[0:128]"),
    (["forbegin 1", "ustoref32 2 0 @out0", "uaddk 0 0 1", "forend"],
     "store to @out0 index 128 is outside mix[0:128]"),
], ids=["load", "store"])
def test_a_count_accumulated_in_a_loop_faults_as_on_the_interpreter(tmp_path, tail, what):
    fir = probe_model(tmp_path, ACCUMULATED + tail)
    compiled = firscope("run", fir, "--tokens", "3", "-n", "1")
    interp = firscope("run", fir, "--tokens", "3", "-n", "1", "--engine", "interp")
    assert compiled.returncode == interp.returncode == 1
    assert "internal error" not in compiled.stderr
    assert compiled.stderr == interp.stderr and what in compiled.stderr
    stop = firscope("debug", fir, "--tokens", "3", "-n", "1", input="continue\n")
    assert "Program received a fault:" in stop.stdout and what in stop.stdout, stop.stdout


def test_the_sample_with_the_layernorm_variance_loop_counted_by_the_mean(tmp_path):
    import shutil
    from conftest import SAMPLE
    shutil.copytree(SAMPLE, tmp_path / "m")
    fir = tmp_path / "m" / "gpt2.fir"
    lines = fir.read_text().split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.startswith("kernel g2.layernorm"))
    second = [i for i in range(start, len(lines)) if lines[i].strip() == "forbegin 15"][1]
    lines[second] = "forbegin 1"
    fir.write_text("\n".join(lines))
    compiled = firscope("run", fir, "--tokens", "3", "-n", "1")
    interp = firscope("run", fir, "--tokens", "3", "-n", "1", "--engine", "interp")
    assert compiled.returncode == interp.returncode == 1
    assert compiled.stderr == interp.stderr and "fault in kernel 'g2.layernorm'" in compiled.stderr


# -- 8. a runaway loop in a 64-lane kernel is reported as fast as in one lane ---------------------
def test_a_runaway_loop_in_64_lanes_is_reported_without_running_it(tmp_path):
    """The lanes share out0[0], so there is no compiled code: the interpreter ran 25 million
    lockstep steps (33-96 s). The path to the budget is certain, so it is not run at all
    (tests/test_runaway.py checks the pc against running it); the timeout only guards."""
    from firscope.runtime import load_model
    from firscope.vm.runaway import runaway_stop
    fir = probe_model(tmp_path, ["rtou 0 0", "loadconstf32 15 1e30", "loadconstf32 1 0",
                                 "forbegin 15", "addconst 1 1 1", "forend", "uconst 0 0",
                                 "ustoref32 1 0 @out0"], threads=64)
    probe = next(n for n in load_model(fir).nodes if n.name == "probe")
    assert runaway_stop(probe.program, 50_000_000) == 4
    for engine in ("compiled", "interp"):
        done = firscope("run", fir, "--tokens", "3", "-n", "1", "--engine", engine,
                        timeout=120)
        assert done.returncode == 1
        assert "executed more than 50000000 instructions; stopped at pc 4 (line " in done.stderr


# -- 2. the DAP port asks for a token ------------------------------------------------------------
def _dap_server(env_token=None):
    import os
    import re
    env = dict(os.environ)
    env.pop("FIRSCOPE_DAP_TOKEN", None)
    if env_token is not None:
        env["FIRSCOPE_DAP_TOKEN"] = env_token
    proc = subprocess.Popen([sys.executable, "-m", "firscope", "dap", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stderr.readline()
    m = re.search(r"listening on 127\.0\.0\.1:([0-9]+); token (\S+) ", line)
    assert m, line
    return proc, int(m.group(1)), m.group(2)


def _session(port, *requests):
    import socket
    from test_dap_tcp import messages, read_all, request
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"".join(request(i + 1, c, **a) for i, (c, a) in enumerate(requests)))
    s.shutdown(socket.SHUT_WR)
    got = messages(read_all(s, 120))
    s.close()
    return got


@pytest.mark.parametrize("token", [None, "wrong-token-wrong-token", ""], ids=["none", "bad", "empty"])
def test_a_dap_client_without_the_token_is_refused_before_anything_runs(tmp_path, token):
    from netutil import stop_server
    import signal
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:the first line of a private file\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("IMPORTANT\n")
    proc, port, real = _dap_server()
    try:
        args = {"model": str(secret)} if token is None else {"model": str(secret),
                                                              "token": token}
        got = _session(port, ("initialize", {"adapterID": "x"}),
                       ("setFunctionBreakpoints", {"breakpoints": [{"name": "attention"}]}),
                       ("launch", args),
                       ("evaluate", {"expression": f"save breakpoints {victim}",
                                     "context": "repl"}))
        answers = {m["command"]: m for m in got if m["type"] == "response"}
        assert answers["initialize"]["success"]
        assert not answers["launch"]["success"]
        assert "needs the token it printed" in answers["launch"]["message"]
        assert not answers["setFunctionBreakpoints"]["success"]
        text = json_text(got)
        assert "root:x" not in text and "first line of a private file" not in text
        assert "evaluate" not in answers  # the connection was closed after the bad launch
        assert victim.read_text() == "IMPORTANT\n"
        # the real token opens a session on the same server
        ok = _session(port, ("initialize", {"adapterID": "x"}),
                      ("launch", {"model": str(secret), "token": real}),
                      ("disconnect", {}))
        launched = next(m for m in ok if m.get("command") == "launch")
        assert not launched["success"] and "unknown directive" in launched["message"]
        # (authenticated: the owner of the server is told what is wrong with the file)
    finally:
        stop_server(proc, signal.SIGTERM, wait=20)


def json_text(messages) -> str:
    import json
    return json.dumps(messages)


def test_the_dap_token_can_be_given_and_must_be_long_enough():
    proc, port, token = _dap_server("a-token-of-my-own-choosing")
    from netutil import stop_server
    import signal
    stop_server(proc, signal.SIGTERM, wait=20)
    assert token == "a-token-of-my-own-choosing"
    import os
    env = dict(os.environ, FIRSCOPE_DAP_TOKEN="short")
    done = subprocess.run([sys.executable, "-m", "firscope", "dap", "--port", "0"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and "at least 16" in done.stderr
