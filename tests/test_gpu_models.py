"""Whole models on the GPU engine against the reference (issue 28): every kernel of every
test model in isolate mode, the sample's decode, and the CLI (diff, run --dump, profile,
a racy kernel, an out-of-bounds kernel). Skipped, saying why, without wgpu or an adapter.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import SEED_FIR, write_random_gpt2
from firscope.compare.metrics import compare_arrays, make_tolerance
from firscope.runtime import Machine, load_model
from gpu_util import gpu  # noqa: F401 - gpu is a fixture
from model_util import firscope, line_of
from test_sanitize import OOB, SMALL, SUM, fir_with

TOL = make_tolerance()  # the diff's default: docs/gpu-engine.md


def _models(root):
    """(name, path, load options) of the test models: the sample (q4 linears on packed
    codes, groups of 32 and 16; dequantized copies), a random one with its linears as f32
    arena weights (the Conv1D shader), and the same checkpoint with --fir-f32 ([out, in] matrices beside the arena)."""
    arena_f32 = SEED_FIR.read_text().replace(" q4 h.", " f32 h.")
    return [
        ("sample", SEED_FIR, {}),
        ("sample dequant", SEED_FIR, {"q4_path": "dequant"}),
        ("sample q4 group 16", SEED_FIR, {"group": 16}),  # codes a word (8) at a time
        ("sample q4 group 4", SEED_FIR, {"group": 4}),  # a group under a word: one at a time
        ("random arena-f32", write_random_gpt2(root / "a", fir_text=arena_f32), {}),
        ("random --fir-f32", write_random_gpt2(root / "b", seed=3), {"fir_f32": True}),
    ]


@pytest.fixture(scope="module")
def racy(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    sum64 = SUM.replace("threads=8", "threads=in0.size")
    return {
        "sum": write_random_gpt2(root / "sum", fir_text=fir_with(
            sum64, "node sum micro t.sum x -> total\n", "buf total f32 1\n"), **SMALL),
        "oob": write_random_gpt2(root / "oob", fir_text=fir_with(
            OOB, "node oob micro t.oob x -> res res2\n", "buf res f32 8\nbuf res2 f32 8\n"),
            **SMALL),
    }


def test_every_kernel_of_every_test_model_matches_in_isolation(gpu, tmp_path):
    from firscope.gpu.diff import gpu_lockstep
    for name, path, opts in _models(tmp_path):
        model = load_model(path, **opts)
        report = gpu_lockstep(model, [3, 7], TOL, engine="interp")
        assert report.failure is None, (name, report.failure)
        assert report.first_divergence is None, (name, report.first_divergence)
        assert report.nodes_compared == len(model.nodes)
        kinds = {model.nodes[r.node].target for r in report.results}
        assert {"g2.add", "g2.layernorm", "g2.attn_decode", "g2.gelu_new", "fir.linear",
                "fir.linear_t", "fir.embedding"} <= kinds
        # exact where the instructions are: adds, copies into the caches, embeddings
        for r in report.results:
            node = model.nodes[r.node]
            if node.target in ("g2.add", "fir.embedding") or r.buffer.endswith("_cache"):
                assert r.diff.exact, (name, r.name, r.diff)


def test_the_sample_decodes_to_the_reference_tokens(gpu):
    from firscope.gpu import GpuMachine
    model = load_model(SEED_FIR)
    ref = Machine(model, engine="compiled")
    ref.reset()
    want, want_logits = ref.generate([5, 9, 2], 10)
    machine = GpuMachine(model)
    machine.reset()
    got, got_logits = machine.generate([5, 9, 2], 10)
    assert got == want
    for a, b in zip(want_logits, got_logits):
        d = compare_arrays(a, b, TOL)
        assert not d.diverged, d.reason


def _diff(capsys, *argv):
    """``firscope diff ...`` in this process (no new interpreter and imports per call)."""
    from firscope.cli import main
    code = main(["diff", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_diff_engine_gpu_is_clean_on_the_sample_in_both_modes(gpu, capsys):
    for mode in ([], ["--chained"]):
        code, out, err = _diff(capsys, SEED_FIR, "--engine", "gpu", "--tokens", "3,7", *mode)
        assert code == 0, out + err
        assert "first divergence: none" in out
        assert "GPU " in out and ("isolate" in out) == (not mode)


def test_a_racy_kernel_diverges_on_the_gpu_and_the_sanitizer_explains_it(gpu, racy, capsys):
    code, out, err = _diff(capsys, racy["sum"], "--engine", "gpu", "--tokens", "1,2",
                           "--sanitize")
    assert code == 1, out + err
    first = out.split("first divergence:")[1]
    assert ", sum, output total" in first and "written by lane" in first, out
    assert "the race explains it" in out and "kernel 't.sum'" in out
    # without --sanitize: the same divergence, no explanation
    code, out, _ = _diff(capsys, racy["sum"], "--engine", "gpu", "--tokens", "1,2")
    assert code == 1 and ", sum, output total" in out
    assert "race" not in out


def test_an_out_of_bounds_kernel_faults_naming_lane_and_line(gpu, racy):
    path = racy["oob"]
    r = firscope("run", path, "--engine", "gpu", "--tokens", "1", "-n", "1")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    line = line_of(path.read_text(), "uloadf32 1 1 @in0")
    msg = r.stderr
    assert "fault in kernel 't.oob' at node oob" in msg, msg
    assert f"(line {line}: uloadf32 1 1 @in0)" in msg and "outside x[0:32]" in msg, msg
    lane = int(msg.split(", lane ")[1].split(",")[0])
    assert 4 <= lane <= 7  # lanes 4..7 read past x; which of them came first is the GPU's


def test_run_on_the_gpu_dumps_and_the_dump_diffs_clean(gpu, tmp_path):
    dump = tmp_path / "gpu.safetensors"
    r = firscope("run", SEED_FIR, "--engine", "gpu", "--tokens", "3,7", "-n", "2", "--dump",
                 dump)
    assert r.returncode == 0, r.stderr
    assert "engine gpu" in r.stderr
    d = firscope("diff", SEED_FIR, "--against", dump)
    assert d.returncode == 0, d.stdout
    assert "first divergence: none" in d.stdout


def test_profile_engine_gpu_times_every_kernel(gpu, tmp_path):
    import json
    r = firscope("profile", SEED_FIR, "--engine", "gpu", "--tokens", "3", "-n", "2",
                 "-o", tmp_path / "p")
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "p" / "gpu-profile.json").read_text())
    assert data["steps"] == 2 and data["gpu_ms_per_token"] > 0
    assert set(data["per_kernel_ms_per_token"]) >= {"g2.attn_decode", "fir.linear"}
    want = "timestamp queries" if gpu.timestamps else "queue completion"
    assert data["timing"].startswith(want) and "timing: " + want in r.stdout
    assert "speed of light beside the measurement" in r.stdout
    assert np.isclose(sum(data["per_kernel_ms_per_token"].values()), data["gpu_ms_per_token"])


def test_a_model_over_the_adapters_buffer_limit_is_one_clear_error(gpu):
    from dataclasses import replace

    from firscope.gpu import GpuError
    from firscope.gpu.runner import GpuRunner
    model = load_model(SEED_FIR)
    small = replace(gpu, limits={**gpu.limits, "max-storage-buffer-binding-size": 1 << 16})
    with pytest.raises(GpuError) as e:
        GpuRunner(model, small)
    msg = str(e.value)
    # the KV cache (128 KiB a layer) is read whole by the attention kernel: it cannot split
    assert msg.startswith("the arena of gpt2.fir: key_cache@0 (128.0 KiB) is over the "
                          "adapter's limit of 64.0 KiB per storage buffer"), msg
    assert "kernel g2.attn_decode reads it whole" in msg
    assert "smaller model" in msg and "\n" not in msg


def test_the_arena_split_across_pages_and_row_tables_gives_the_same_bits(gpu):
    """With pages of 200 KiB and table chunks of 40 KiB the sample's arena is spread over
    many buffers: the attention kernel binds three (activations, K, V), the embedding and
    the head run one dispatch per chunk of wte and wpe. Every region after each step is
    the same, bit for bit, as with the whole arena in one buffer."""
    from firscope.gpu import GpuMachine
    model = load_model(SEED_FIR)
    tokens = [3, 7, 250]
    runs = []
    for caps in ({}, {"page_cap": 200 << 10, "table_cap": 40 << 10}):
        machine = GpuMachine(model, gpu=gpu, **caps)
        machine.reset()
        seen = []
        for t in tokens:
            machine.step(t)
            seen.append({r.name: machine.runner.download(r) for r in model.buffer_regions()})
        runs.append((machine.runner, seen))
    (whole, a), (split, b) = runs
    assert len(whole.layout.pages) == 1 and not whole.layout.tables
    assert len(split.layout.pages) > 4
    assert {n: len(t.chunks) for n, t in split.layout.tables.items()} == {"wte": 4, "wpe": 4}
    attention = [p.passes[0].shader for p in split.prepared if p.node.target == "g2.attn_decode"]
    assert "arena1" in attention[0] and "arena2" not in attention[0]  # K@0 beside x, V@0 not
    assert "arena2" in attention[1]  # activations, K@1 and V@1: three windows
    assert len(next(p for p in split.prepared if p.node.target == "fir.linear_t").passes) == 4
    for step_a, step_b in zip(a, b):
        for name in step_a:
            assert np.array_equal(step_a[name], step_b[name]), name
    # and the reference agrees with both, within the diff's tolerance
    ref = Machine(model, engine="interp")
    ref.reset()
    for t, step in zip(tokens, b):
        ref.step(t)
        d = compare_arrays(model.view(model.outputs["logits"]), step["logits"], TOL)
        assert not d.diverged, d.reason


def test_q4_codes_are_read_a_word_at_a_time_where_rows_and_groups_allow(gpu):
    from firscope.gpu.runner import GpuRunner
    for group, words in ((32, True), (16, True), (4, False)):
        runner = GpuRunner(load_model(SEED_FIR, group=group), gpu)
        text = next(p for p in runner.prepared if p.node.target == "fir.linear").passes[0].shader
        assert ("let bits = packed_buf[first + w];" in text) == words, group
        assert ("q4_weight(r, c)" in text) == (not words), group
        assert f"c0 / {group}u" in text or f"c / {group}u" in text  # the group, a constant


def test_a_model_over_the_adapters_memory_says_what_it_needs(gpu):
    from dataclasses import replace

    from firscope.gpu import GpuError
    from firscope.gpu.runner import GpuRunner

    class Full:  # a device that runs out of memory at the tenth buffer
        def __init__(self, device):
            self.device, self.made = device, 0

        def __getattr__(self, name):
            return getattr(self.device, name)

        def create_buffer(self, **kw):
            self.made += 1
            if self.made > 10:
                raise RuntimeError("Validation Error\n\nCaused by:\n  Not enough memory left."
                                   " Out of memory")
            return self.device.create_buffer(**kw)
    model = load_model(SEED_FIR)
    want = GpuRunner(model, gpu).needed_bytes()
    # the arena in one page, every q4 weight's codes, scales and minimums
    q4 = {a.weight.name: a.weight.q4.nbytes for n in model.nodes for a in n.args
          if a.weight is not None and a.weight.q4 is not None and a.weight.matrix is None}
    assert want == model.arena.nbytes + sum(q4.values())
    with pytest.raises(GpuError) as e:
        GpuRunner(model, replace(gpu, device=Full(gpu.device)))
    msg = str(e.value)
    assert msg.startswith(f"gpt2.fir needs {want / (1 << 20):.1f} MiB on the GPU ("), msg
    assert "more than it could allocate" in msg and "\n" not in msg
    assert "WebGPU does not say how much memory an adapter has" in msg


def test_a_shader_over_more_buffers_than_the_adapter_binds_is_one_clear_error(gpu):
    from dataclasses import replace

    from firscope.gpu import GpuError
    from firscope.gpu.runner import GpuRunner
    model = load_model(SEED_FIR)
    few = replace(gpu, limits={**gpu.limits, "max-storage-buffers-per-shader-stage": 6})
    with pytest.raises(GpuError) as e:
        GpuRunner(model, few)
    msg = str(e.value)  # y, the x copy, q4's codes, scales and minimums, params, faults
    assert msg.startswith("fir.linear at node qkv_linear@0 needs 7 storage buffers at once "
                          "(its data, its params and the fault buffer); the adapter allows 6 "
                          "per shader"), msg
    assert "\n" not in msg


def test_attention_at_the_last_position_agrees_or_is_refused_in_words(gpu, tmp_path):
    """GPT-2 small's attention geometry (head_dim 64, n_positions 1024): a lane's loops
    run about 131 trips per position, and Mesa's llvmpipe ends every loop of an invocation
    once they have run 65535 in all (at position ~497). Position 400 must agree with the
    reference; the last one must agree or stop with the driver limit in words (on lavapipe
    it stops); never a silently shortened result. The KV cache's earlier rows are left
    zero: what matters here is the loops' trip counts."""
    from firscope.errors import FirFault
    from firscope.gpu import GpuMachine
    path = write_random_gpt2(tmp_path, n_layer=1, n_embd=64, n_head=1, n_positions=1024)
    model = load_model(path)

    def at(machine, position):
        machine.reset()
        machine.history, machine.position = [0] * position, position
        machine.step(5)
        return model.view(model.outputs["logits"]).copy()
    for position in (400, 1023):
        # the reference itself (the compiled engine would compile this geometry's
        # attention for this test alone, ~9 s of the suite's CPU)
        want = at(Machine(model, engine="interp"), position)
        try:
            got = at(GpuMachine(model, gpu=gpu), position)
        except FirFault as e:
            assert position == 1023, str(e)
            msg = str(e)
            assert "the GPU driver ended lane" in msg and "loop trips in all" in msg
            assert "its result would be wrong, so the run stops here" in msg
            if "llvmpipe" in gpu.name.lower():  # the limiter's 65535, as measured
                assert int(msg.split(" loop trips in all")[0].split()[-1]) <= 65535
            continue
        assert not (position == 1023 and "llvmpipe" in gpu.name.lower()), \
            "lavapipe's loop limiter ran out here when this test was written"
        d = compare_arrays(want, got, TOL)
        assert not d.diverged, (position, d.reason)


def test_a_shader_the_driver_refuses_is_one_clear_error(gpu, monkeypatch):
    from firscope.gpu import GpuError
    from firscope.gpu.runner import GpuRunner
    from firscope.vm import wgsl
    monkeypatch.setitem(wgsl.RENDERERS, "add", wgsl.template("R{0} = R{1} +* R{2};"))
    with pytest.raises(GpuError) as e:
        GpuRunner(load_model(SEED_FIR))
    msg = str(e.value)
    assert msg.startswith("the GPU driver refused the shader of kernel 'g2.add'"), msg
    assert "firscope wgsl" in msg and "\n" not in msg


def test_a_gpu_failure_in_the_lockstep_is_the_gpus_not_the_references(gpu, monkeypatch):
    from firscope.gpu import GpuError
    from firscope.gpu.diff import gpu_lockstep
    from firscope.gpu.runner import GpuRunner
    real = GpuRunner.run

    def failing(self, indexes):
        if any(self.model.nodes[i].full_name == "ln2@1" for i in indexes):
            raise GpuError("the GPU device was lost while testing")
        return real(self, indexes)
    monkeypatch.setattr(GpuRunner, "run", failing)
    report = gpu_lockstep(load_model(SEED_FIR), [3], TOL, engine="interp")
    assert report.failure.startswith("the GPU failed at step 0 at ln2@1: the GPU device was "
                                     "lost"), report.failure
    assert report.exit_code == 1 and report.first_divergence is None


BIG_ID = """kernel t.big in=0 out=1 threads=1 tg=1 tgbytes=16
loadconstf32 1 1e9
uconst 0 0
ustoref32 1 0 @out0
endkernel
"""


def test_an_embedding_id_outside_the_table_faults_as_the_reference_says(gpu, tmp_path):
    from firscope.errors import FirFault
    from firscope.gpu import GpuMachine
    path = write_random_gpt2(tmp_path / "emb", fir_text=fir_with(
        BIG_ID, "node big micro t.big -> bigid\nnode bad ext fir.embedding bigid wpe -> "
        "pos_embed\n", "buf bigid f32 1\n"), **SMALL)
    model = load_model(path)
    messages = []
    for machine in (Machine(model, engine="interp"), GpuMachine(model)):
        machine.reset()
        with pytest.raises(FirFault) as e:
            machine.step(1)
        messages.append(e.value.message)
    assert messages[1] == messages[0] + " (on the GPU)"
    assert "fir.embedding id 1000000000.0 read from 'bigid'" in messages[1]
