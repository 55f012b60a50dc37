"""The WGSL generator and the GPU engine's edges that need no GPU (issue 28): one renderer
per opcode, source lines in the shaders, and clean errors without wgpu or for stepping."""
from __future__ import annotations

import subprocess
import sys

from conftest import REPO, SEED_FIR
from firscope.runtime import load_model
from firscope.vm import OPCODES, wgsl

NO_WGPU = "import sys; sys.modules['wgpu'] = None; from firscope.cli import main; "


def test_every_opcode_has_a_wgsl_renderer():
    assert set(wgsl.RENDERERS) == set(OPCODES)


def test_each_instruction_carries_its_source_line_and_the_kernels_tg():
    model = load_model(SEED_FIR)
    lines = SEED_FIR.read_text().splitlines()
    for node in model.nodes:
        if node.kind != "micro":
            continue
        prog = wgsl.generate(node.program, symbols=model.symbols)
        for op in node.program.ops:
            tag = f"// gpt2.fir:{op.loc.line}  {op.text}"
            assert tag in prog.source, tag
            assert lines[op.loc.line - 1].strip() == op.text
        assert "@workgroup_size(1)" in prog.source  # the seed's tg=1
        assert prog.params[wgsl.P_THREADS] == node.program.threads


def test_one_shader_text_serves_every_layer():
    model = load_model(SEED_FIR)
    texts = {}
    for node in model.nodes:
        if node.kind == "micro":
            prog = wgsl.generate(node.program, symbols=model.symbols)
            texts.setdefault(node.target, set()).add(prog.source)
    assert all(len(t) == 1 for t in texts.values()), {k: len(v) for k, v in texts.items()}


def test_the_grid_covers_every_lane_within_the_per_dimension_limit():
    for threads, tg in [(1, 1), (70000, 1), (1 << 24, 1), (100, 64), (0, 1)]:
        x, y = wgsl.grid(threads, tg)
        assert x <= wgsl.MAX_GROUPS_X and y <= wgsl.MAX_GROUPS_X
        assert x * y * tg >= threads


def test_without_wgpu_the_gpu_commands_say_how_to_install_it():
    for argv in (["gpu"], ["run", "--engine", "gpu", "--tokens", "1", "-n", "1"],
                 ["diff", str(SEED_FIR), "--engine", "gpu", "--tokens", "1"]):
        r = subprocess.run([sys.executable, "-c", NO_WGPU + f"sys.exit(main({argv!r}))"],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
        assert r.returncode == 1, (argv, r.stderr)
        assert "pip install 'firscope[gpu]'" in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_import_of_the_gpu_package_needs_no_wgpu():
    r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['wgpu'] = None; "
                        "import firscope.gpu, firscope.gpu.diff, firscope.gpu.commands"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr


def _cli(capsys, *argv):
    from firscope.cli import main
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_stepping_commands_refuse_the_gpu_engine_with_a_reason(capsys):
    code, _, err = _cli(capsys, "debug", "--engine", "gpu", "--tokens", "1")
    assert code == 1
    assert "cannot stop at an instruction" in err and "diff MODEL --engine gpu" in err
    code, _, err = _cli(capsys, "sanitize", "--engine", "gpu")
    assert code == 1 and "cannot stop at an instruction" in err


def test_wgsl_command_prints_a_kernel_a_node_and_refuses_an_unknown_name(capsys):
    code, out, _ = _cli(capsys, "wgsl", "g2.add")
    assert code == 0 and "fn main" in out and "// gpt2.fir:62  rtou 0 0" in out
    code, out, _ = _cli(capsys, "wgsl", SEED_FIR, "attention@2")
    assert code == 0 and out.startswith("// node attention@2: params = [4, ")
    code, out, _ = _cli(capsys, "wgsl", SEED_FIR)
    assert code == 0 and out.count("fn main") == 4
    code, _, err = _cli(capsys, "wgsl", SEED_FIR, "nosuch")
    assert code == 1 and "g2.attn_decode" in err


def test_a_dap_launch_on_the_gpu_engine_is_refused_with_the_reason():
    import pytest

    from firscope.dap.launch import parse_launch
    from firscope.errors import FirError
    with pytest.raises(FirError) as e:
        parse_launch({"engine": "gpu"})
    assert "cannot stop at an instruction" in str(e.value)
