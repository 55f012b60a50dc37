"""The phases of loading, each run alone on frozen inputs (issue 11 §4).

The declaration phases need only a parsed file and the records before them
(no config file, no checkpoint); the layout needs only declarations; the
runtime's kernel and plan phases run on the model layer's parts.
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

from firscope.errors import FirError
from firscope.fir import SymbolTable, parse_text
from firscope.fir import syntax as S
from firscope.model import (BufferDecl, ConfigFile, Ref, Region, WeightDecl, allocate_arena,
                            check_plan_size, count_repeats, declare_buffers, declare_weights,
                            define_symbols, lay_out, load_parts, read_header, size_memory)
from firscope.model.decls import Repeats
from firscope.runtime import (NodeKind, OperandKind, assemble_kernels, check_lane_memory,
                              load_model, unroll_plan)
from conftest import REPO, SEED_FIR

SEED = SEED_FIR.read_text()
FIR = parse_text(SEED, "gpt2.fir")
CONFIG = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32,
          "vocab_size": 256, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
          "scale_attn_weights": True}


def config_file(**changes) -> ConfigFile:
    return ConfigFile(Path("/nowhere/config.json"), MappingProxyType({**CONFIG, **changes}))


def symbols_of(fir=FIR, **changes) -> SymbolTable:
    return define_symbols(fir, read_header(fir), config_file(**changes))


def test_header_phase():
    h = read_header(FIR)
    assert (h.family, h.config.text, h.epsilon.key.text, h.prefix) == \
        ("gpt2", "config.json", "layer_norm_epsilon", "transformer.")
    with pytest.raises(FirError, match="missing 'config' directive"):
        read_header(parse_text(SEED.replace("config config.json\n", ""), "f.fir"))


def test_symbol_phase_without_a_config_file():
    syms = symbols_of()
    assert syms["headdim"] == 16 and syms["mlp"] == 256 and syms["eps"] == Fraction("1e-05")
    assert syms.origin("n_embd") == "config.json" and syms.origin("pi") == "built in"
    line = SEED.splitlines().index("sym headdim = hidden/nheads") + 1
    assert syms.origin("headdim") == f"line {line}"
    assert dict(syms) == {**{k: v for k, v in CONFIG.items()
                             if isinstance(v, int) and not isinstance(v, bool)},
                          "eps": Fraction("1e-05"), "layers": 2, "positions": 32, "vocab": 256,
                          "hidden": 64, "nheads": 4, "headdim": 16, "mlp": 256}
    with pytest.raises(dataclasses.FrozenInstanceError):
        syms.values = {}
    with pytest.raises(TypeError):
        syms.values["x"] = 1  # read-only mapping
    with pytest.raises(FirError, match="config check failed: activation_function must be "
                                       'gelu_new, config.json has "relu"'):
        symbols_of(activation_function="relu")


def test_buffer_phase_on_a_hand_made_symbol_table():
    """No config, no checkpoint: the buffer phase sees only the file and the symbols."""
    syms = SymbolTable({"n_embd": 8, "n_head": 2, "n_positions": 4, "vocab": 10, "mlp": 32,
                        "layers": 3})
    repeats = count_repeats(FIR, syms)
    assert repeats == Repeats((3,)) and repeats.layers == 3
    bufs = declare_buffers(FIR, syms, repeats)
    assert list(bufs.decls)[:3] == ["token_id", "position", "x"]
    assert bufs.decls["qkv"].size == 24 and bufs.decls["scores"].size == 8
    assert bufs.decls["key_cache"].per_layer and bufs.decls["key_cache"].size == 32
    assert bufs.inputs["token"].name == "token_id" and bufs.outputs["logits"].size == 10
    no_input = parse_text(SEED.replace(" input:position", ""), "f.fir")
    with pytest.raises(FirError, match="no buffer is marked input:position"):
        declare_buffers(no_input, syms, repeats)


@pytest.mark.parametrize("old,new,msg,at", [
    ("buf x f32 n_embd", "buf x f32 n_embd input:tok", "unknown input key 'tok' (token, position)",
     "buf x "),
    ("buf x f32 n_embd", "buf x f32 n_embd input:token", "two buffers are input:token", "buf x "),
    ("buf token_id f32 1 input:token", "buf token_id f32 0 input:token",
     "input buffer 'token_id' must hold at least 1 element and not be per_layer", "buf token_id"),
    ("buf token_id f32 1 input:token", "buf token_id f32 1 per_layer input:token",
     "input buffer 'token_id' must hold at least 1 element and not be per_layer", "buf token_id"),
    ("buf x f32 n_embd", "buf x f32 n_embd output:x", "unknown output key 'x' (logits)", "buf x "),
    ("buf x f32 n_embd", "buf x f32 n_embd output:logits", "two buffers are output:logits",
     "buf logits"),
    ("buf logits f32 vocab output:logits", "buf logits f32 vocab per_layer output:logits",
     "output buffer 'logits' cannot be per_layer", "buf logits"),
    ("buf x f32 n_embd", "buf x f32 n_embd\nbuf x f32 1", "buffer 'x' is declared twice",
     "buf x f32 1"),
])
def test_buffer_phase_errors(old, new, msg, at):
    fir = parse_text(SEED.replace(old, new, 1), "f.fir")
    syms = symbols_of(fir)
    with pytest.raises(FirError) as e:
        declare_buffers(fir, syms, count_repeats(fir, syms))
    assert msg in e.value.message and e.value.loc.text.startswith(at), str(e.value)


def test_weight_phase_and_plan_size():
    syms = symbols_of()
    repeats = count_repeats(FIR, syms)
    bufs = declare_buffers(FIR, syms, repeats)
    weights = declare_weights(FIR, syms, repeats, bufs)
    assert weights["qkvw"].shape == (64, 192) and weights["qkvw"].dtype == "q4"
    assert not weights["qkvw"].in_arena and weights["wte"].in_arena
    assert weights["ln1w"].per_layer and weights["ln1w"].source(3) == "h.3.ln_1.weight"
    assert weights["wte"].source(None) == "wte.weight"
    check_plan_size(FIR, repeats)
    with pytest.raises(FirError, match="unrolls to 1400005 nodes"):
        check_plan_size(FIR, Repeats((100_000,)))


def test_memory_and_layout_phases_without_a_checkpoint():
    syms = symbols_of()
    repeats = count_repeats(FIR, syms)
    bufs = declare_buffers(FIR, syms, repeats)
    weights = declare_weights(FIR, syms, repeats, bufs)
    budget = size_memory(FIR, bufs, weights, repeats.layers, 32, None, "dequant")
    packed = size_memory(FIR, bufs, weights, repeats.layers, 32, None)
    buf_elems = sum(b.size * (2 if b.per_layer else 1) for b in bufs.decls.values())
    f32_elems = sum(np.prod(w.shape) * (2 if w.per_layer else 1) for w in weights.values()
                    if w.in_arena)
    assert budget.arena_bytes == 4 * (buf_elems + f32_elems)
    # q4, two layers of four matrices: packed codes, a scale and a min per group of 32,
    # and the dequantized f32 copy
    # (on the dequant path; the default packed path keeps no f32 copy)
    sizes = (2 * 64 * 192, 2 * 64 * 64, 2 * 64 * 256, 2 * 256 * 64)
    assert budget.q4_bytes == sum(n // 2 + 8 * (n // 32 + 1) + 4 * n for n in sizes)
    assert packed.q4_bytes == sum(n // 2 + 8 * (n // 32 + 1) for n in sizes)
    assert packed.arena_bytes == budget.arena_bytes
    with pytest.raises(FirError, match="the largest is weight 'fcw' with 0.1 MiB") as e:
        size_memory(FIR, bufs, weights, repeats.layers, 32, budget.need - 1, "dequant")
    assert e.value.loc.line == SEED.splitlines().index(
        "weight fcw q4 h.{i}.mlp.c_fc.weight tensor [n_embd,mlp]") + 1

    layout = lay_out(bufs, weights, repeats.layers)
    regions = list(layout.regions.values())
    assert [r.base for r in regions] == list(np.cumsum([0] + [r.size for r in regions[:-1]]))
    assert layout.arena_size == buf_elems + f32_elems == regions[-1].stop
    assert all(r.is_buffer for r in regions[:len([r for r in regions if r.is_buffer])])
    kc = layout.regions["key_cache@1"]
    assert kc.decl is bufs.decls["key_cache"] and kc.layer == 1 and kc.ref == Ref("key_cache", 1)
    ln = layout.regions["ln1w@0"]
    assert ln.is_weight and not ln.is_buffer and ln.decl is weights["ln1w"]
    assert "qkvw@0" not in layout.regions  # q4 weights live beside the arena
    slots = {s.name: s for s in layout.slots}
    assert slots["qkvw@1"].region is None and slots["ln1w@1"].region is layout.regions["ln1w@1"]
    assert allocate_arena(layout).shape == (layout.arena_size,)


def test_parts_then_runtime_phases(random_model):
    parts = load_parts(random_model)
    assert parts.arena is not None and set(parts.weights) == {s.name for s in parts.layout.slots}
    kernels = assemble_kernels(parts.fir, parts.buffers, parts.weight_decls)
    assert list(kernels) == ["g2.add", "g2.gelu_new", "g2.layernorm", "g2.attn_decode"]
    nodes = unroll_plan(parts, kernels)
    assert len(nodes) == 3 + 14 * 2 + 2 and nodes[3].full_name == "ln1@0"
    check_lane_memory(nodes, kernels, parts.budget)
    tight = dataclasses.replace(parts.budget, limit=parts.budget.need + 100)
    with pytest.raises(FirError, match="node fc_bias@0: kernel 'g2.add' dispatches 256 threads"):
        check_lane_memory(nodes, kernels, tight)


def test_model_is_built_by_keyword_and_frozen(random_model):
    m = load_model(random_model)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.nodes = ()
    assert isinstance(m.nodes, tuple)
    assert set(m.timings) == {"parse", "weights", "plan", "total"}
    assert m.timings["total"] >= m.timings["parse"] + m.timings["weights"] + m.timings["plan"]
    buffers = m.buffer_regions()
    assert {r.name for r in buffers} == {str(Ref(b.name, layer)) for b in m.buffers.values()
                                         for layer in ((0, 1) if b.per_layer else (None,))}
    assert m.buffer_elements == sum(r.size for r in buffers)


def test_node_and_operand_kinds_are_enums(random_model):
    m = load_model(random_model)
    ln1 = m.nodes[m.node_index("ln1@1")]
    assert ln1.kind is NodeKind.MICRO and ln1.ref == Ref("ln1", 1)
    assert [o.kind for o in ln1.args] == [OperandKind.BUFFER, OperandKind.WEIGHT,
                                         OperandKind.WEIGHT]
    assert m.nodes[0].kind is NodeKind.EXT and m.nodes[0].full_name == "token"
    assert f"{ln1.kind}" == "micro"  # as reports and JSON show it


def test_model_layer_never_imports_the_vm():
    """The layer order of DESIGN.md, at run time: loading the model layer's parts needs no vm."""
    code = ("import sys, firscope.model\n"
            "bad = sorted(m for m in sys.modules\n"
            "             if m.startswith(('firscope.vm', 'firscope.runtime')))\n"
            "print(bad)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_region_without_a_declaration_names_itself():
    r = Region("scratch", 4, 8)
    assert r.ref == Ref("scratch") and not r.is_buffer and not r.is_weight and r.stop == 12
    d = BufferDecl("kc", 8, True, None, None, FIR.directives[0].loc)
    assert Region.of(d, 2, 0, 8) == Region("kc@2", 0, 8, d, 2)
    w = WeightDecl("wte", "f32", (2, 3), FIR.of(S.Weight)[0])
    assert Region.of(w, None, 0, 6).name == "wte" and Region.of(w, None, 0, 6).is_weight
