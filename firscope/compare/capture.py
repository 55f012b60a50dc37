"""``firscope capture``: one node at one step cut out as a self-contained test case.

The folder reproduces exactly that dispatch and nothing else (RenderDoc's
capture, as files a runtime author attaches to a bug report or puts in a
test suite):

* ``gpt2.fir``: the model file's header checks and symbols, the node's kernel
  copied verbatim (an ext node needs none), every buffer and weight the node
  touches at its full size, and the node itself. A buffer the node only reads
  is a ``weight`` holding the captured value; one it writes (a KV cache, a
  residual ``x``) is a buffer filled first by one ``capture.load`` node (a
  copy kernel: buffers start as zeros and weights cannot be written);
* ``config.json``: the original config (the kernel's symbols come from it);
* ``model.safetensors``: the inputs as the node saw them (the reference's own
  state, or with ``--against DUMP`` the other run's values from the dump) and
  the weights: f32 weights as the arena held them, q4 weights as the
  checkpoint's f32 tensor (the loader quantizes them as the original did);
* ``expected.safetensors``: the node's outputs as the reference computes them
  from those inputs, a dump at step 0 of the case model, so that
  ``firscope diff case/gpt2.fir --against case/expected.safetensors`` checks
  a runtime (or the reference) against them;
* ``README``: what it is and how to run it.

A ``fir.embedding`` table is sliced to the one row the node reads (its id
then reads 0). Buffers and other weights are not: kernels check their
operands' sizes (``expect=``) and a linear reads all of its matrix, so a KV
cache is captured whole (its later rows are zero).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..dump import DumpWriter, file_sha256
from ..errors import FirError
from ..model.checkpoint import Checkpoint, shown
from ..model.layout import Region
from ..runtime import Machine, Model, PlanNode
from .dumpfile import Dump
from .isolate import DumpInputs, input_regions
from .sources import DumpSource
from ..runtime import NodeKind
from ..text import printable

CASE_FIR = "gpt2.fir"
CASE_FILES = (CASE_FIR, "config.json", "model.safetensors", "expected.safetensors", "README",
              "capture.json")
HEADER_WORDS = ("require", "sym", "epsilon")
COPY_KERNEL = """# capture.load: copies a captured input (a weight) into a buffer the node writes
kernel capture.load in=1 out=1 size=in0,out0 threads=out0.size tg=1 tgbytes=16
rtou 0 0
uloadf32 1 0 @in0
ustoref32 1 0 @out0
endkernel"""


@dataclass(frozen=True)
class Capture:
    folder: Path
    node: str
    step: int
    inputs: dict[str, np.ndarray]  # captured buffer name -> values the node started from
    expected: dict[str, np.ndarray]  # output buffer name -> values the node left
    text: str  # what the command prints


def find_node(model: Model, name: str) -> PlanNode:
    for n in model.nodes:
        if n.full_name == name:
            return n
    names = ", ".join(n.full_name for n in model.nodes[:8])
    raise FirError(f"--node {shown(name)}: no such node instance in {model.path.name} "
                   f"(e.g. {names}, ...; 'firscope check' lists them)")


def start_state(model: Model, machine: Machine, tokens: list[int], step: int,
                node: PlanNode) -> None:
    """Run the reference up to the start of ``node`` at ``step``."""
    machine.reset()
    machine.check_room(step + 1)
    for token in tokens[:step]:
        machine.step(token)
    machine.begin_token(tokens[step])
    for n in model.nodes[: node.index]:
        machine.run_node(n)


def _from_dump(model: Model, dump_path, tokens, step: int, node: PlanNode) -> None:
    """Overwrite the node's inputs in the arena with the other run's values from a dump."""
    dump = Dump(dump_path)
    try:
        source = DumpSource(model, dump, len(tokens))
        loads = DumpInputs(model, source).loads(step, node)
        if isinstance(loads, str):
            raise FirError(f"{dump_path}: cannot capture {node.full_name} at step {step} from "
                           f"the dump: {loads}")
        for ld in loads:
            model.arena[ld.region.base: ld.region.stop] = ld.fetch()
    finally:
        dump.close()


def capture(model: Model, node_name: str, step: int, tokens: list[int], folder, *,
            against=None, engine: str = "compiled") -> Capture:
    node = find_node(model, node_name)
    if not 0 <= step < len(tokens):
        raise FirError(f"--step {step}: the run has steps 0..{len(tokens) - 1} "
                       f"({len(tokens)} tokens)")
    folder = Path(folder)
    _check_folder(folder)
    machine = Machine(model, engine=engine)
    start_state(model, machine, tokens, step, node)
    if against is not None:
        _from_dump(model, against, tokens, step, node)
    reads, written = input_regions(model, node)
    touched = _touched(model, node)
    inputs = {name: model.view(r).copy() for name, r in touched.items()
              if r in reads or r in written}
    machine.run_node(node)
    expected = {o.name: model.view(o.region).copy() for o in node.outs if o.region is not None}
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FirError(f"-o {folder}: cannot create the folder: {e.strerror or e}") from None
    try:
        _write_case(model, node, step, tokens, folder, touched, inputs, expected, against)
    except BaseException:
        for name in CASE_FILES:  # only what this capture wrote
            (folder / name).unlink(missing_ok=True)
        if created:
            folder.rmdir()
        raise
    # the command as a shell reads it (a path with spaces is one word); a control
    # character in the name is shown escaped, as everywhere else, never sent to the terminal
    run = (f"firscope diff {shlex.quote(str(folder / CASE_FIR))}{_load_flags(model)} --against "
           f"{shlex.quote(str(folder / 'expected.safetensors'))}")
    text = (f"captured {node.full_name} ({node.kind} {node.target}) at step {step} into "
            f"{printable(str(folder))}/: {CASE_FIR}, config.json, model.safetensors, "
            f"expected.safetensors, README\nrun it: {printable(run)}")
    return Capture(folder, node.full_name, step, inputs, expected, text)


def _check_folder(folder: Path) -> None:
    if folder.is_symlink():  # never written through: the case would land where it points
        raise FirError(f"-o {printable(str(folder))}: is a symbolic link (to "
                       f"{printable(os.readlink(folder))}); capture writes a new folder: give "
                       "the folder itself or a new name")
    if folder.exists():
        if not folder.is_dir():
            raise FirError(f"-o {folder}: exists and is not a folder")
        if any(folder.iterdir()):
            raise FirError(f"-o {folder}: the folder is not empty (capture writes a new "
                           "folder; choose another name or remove it)")


def _touched(model: Model, node: PlanNode) -> dict[str, Region]:
    """Every buffer the node touches, by its name in the model file."""
    out: dict[str, Region] = {}
    buffers = {r.base for r in model.buffer_regions()}
    for o in (*node.args, *node.outs):
        if o.region is not None and o.region.base in buffers:
            out[_decl_name(o.region)] = o.region
    for r in input_regions(model, node)[0]:
        out.setdefault(_decl_name(r), r)
    return out


def _decl_name(r: Region) -> str:
    return r.decl.name if r.decl is not None else r.name.partition("@")[0]


def _load_flags(model: Model) -> str:
    flags = " --fir-f32" if model.fir_f32 else ""
    return flags + (f" --group {model.group}" if model.group != 32 else "")


def _header(model: Model) -> list[str]:
    lines = model.path.read_text(encoding="utf-8").split("\n")
    keep = [ln for ln in lines if ln.split()[:1] and ln.split()[0] in HEADER_WORDS]
    return ["fir 1", f"model {model.family}", "config config.json", "runtime graph", *keep]


def _kernel_text(model: Model, node: PlanNode) -> str:
    k = model.kernels[node.target].syntax
    lines = model.path.read_text(encoding="utf-8").split("\n")
    return "\n".join(lines[k.loc.line - 1: k.end.line])


def _write_case(model, node, step, tokens, folder, touched, inputs, expected, against) -> None:
    tensors: dict[str, np.ndarray] = {}
    out_names = {o.name for o in node.outs}
    decls = ["buf case_token f32 1 input:token", "buf case_position f32 1 input:position",
             "buf case_logits f32 1 output:logits"]
    loads = []
    for name, r in touched.items():
        if name in out_names:
            decls.append(f"buf {name} f32 {r.size}")
            if name in inputs:
                decls.append(f"weight {name}_in f32 case.{name} tensor [{r.size}]")
                loads.append(f"node load_{name} micro capture.load {name}_in -> {name}")
                tensors[f"case.{name}"] = inputs[name]
        else:
            decls.append(f"weight {name} f32 case.{name} tensor [{r.size}]")
            tensors[f"case.{name}"] = inputs[name]
    sliced = _weights(model, node, inputs, tensors, decls)
    kernels = [COPY_KERNEL] if loads else []
    if node.kind == NodeKind.MICRO:
        kernels.append(_kernel_text(model, node))
    args = " ".join(a.name for a in node.args)
    outs = " ".join(o.name for o in node.outs)
    kind = node.kind.value
    body = [f"# captured by firscope capture: {node.full_name} ({node.target}) at step {step} "
            f"of {model.path.name}", *_header(model), *decls, *kernels, *loads,
            f"node {node.name} {kind} {node.target} {args} -> {outs}", ""]
    (folder / CASE_FIR).write_text("\n".join(body), encoding="utf-8")
    shutil.copyfile(model.config_path, folder / "config.json")
    write_checkpoint(folder / "model.safetensors", tensors)
    with DumpWriter(folder / "expected.safetensors", model=file_sha256(folder / CASE_FIR),
                    tokens=[0], producer=f"firscope capture of {node.full_name} at step "
                                         f"{step}") as w:
        for name, values in expected.items():
            w.add(0, node.name, name, values)
    _write_readme(model, node, step, tokens, folder, inputs, expected, against, sliced)


def _embedding_row(model: Model, node: PlanNode, inputs) -> int | None:
    """The table row a ``fir.embedding`` node reads (the case keeps only it), or None."""
    if node.target != "fir.embedding" or node.args[1].weight is None \
            or node.args[1].weight.dtype != "f32":
        return None
    raw = float(inputs[_decl_name(node.args[0].region)][0])
    rows = node.args[1].weight.shape[0]
    return int(raw) if raw == int(raw) and 0 <= raw < rows else None


def _weights(model, node, inputs, tensors, decls) -> str | None:
    """The node's weights into the case; a ``fir.embedding`` table sliced to the row it reads
    (its id becomes 0). Returns what was sliced, for the README."""
    row = _embedding_row(model, node, inputs)
    ckpt = None
    for a in node.args:
        if a.weight is None:
            continue
        w = a.weight
        shape = ",".join(map(str, w.shape))
        if w.region is None:  # a q4 weight, or one layer of it made f32 by 'except'
            ckpt = ckpt or Checkpoint(model.folder)
            tensors[w.tensor] = np.asarray(ckpt.read(w.tensor), dtype=np.float32)
            decls.append(f"weight {a.name} {w.declared or w.dtype} {w.tensor} tensor [{shape}]")
            continue
        values = model.view(w.region).reshape(w.shape)
        if row is not None:
            values = values[row: row + 1]
            shape = f"1,{w.shape[1]}"
        tensors[f"case.w.{a.name}"] = values.copy()
        decls.append(f"weight {a.name} f32 case.w.{a.name} tensor [{shape}]")
    if row is None:
        return None
    ids = _decl_name(node.args[0].region)
    tensors[f"case.{ids}"] = np.zeros(1, np.float32)
    return (f"sliced: `{node.args[1].name}` is only row {row} of the original table (the row "
            f"this node reads), and `{ids}` reads 0 instead of {row}")


def write_checkpoint(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors checkpoint of f32 tensors (plain names, in memory: a case is small)."""
    header: dict = {"__metadata__": {"producer": "firscope capture"}}
    blobs, offset = [], 0
    for name, values in tensors.items():
        a = np.ascontiguousarray(values, dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    head = json.dumps(header).encode()
    head += b" " * (-(8 + len(head)) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def _write_readme(model, node, step, tokens, folder, inputs, expected, against,
                  sliced: str | None) -> None:
    source = (f"the other run's values, from the dump {against}" if against is not None
              else "the reference's own state (firscope's VM)")
    flags = _load_flags(model)
    lines = [f"# {node.full_name} at step {step}, cut out of {model.path.name}", "",
             f"Node `{node.full_name}`: {node.kind} `{node.target}` "
             f"({model.path.name} line {node.loc.line}), at step {step} (token "
             f"{tokens[step]}, position {step}) of the run on tokens "
             f"{','.join(map(str, tokens[: step + 1]))}.", "",
             f"Inputs (`model.safetensors`, as `case.NAME`): {source}.",
             *[f"- `{n}`: {v.size} elements" for n, v in inputs.items()], "",
             "Expected outputs (`expected.safetensors`, keys `step0/" + node.name + "/BUFFER`): "
             "what firscope's reference computes from those inputs.",
             *[f"- `{n}`: {v.size} elements, sum {float(np.sum(v, dtype=np.float64)):.9g}"
               for n, v in expected.items()], "",
             "Run and check (the case model runs one step on token 0):", "",
             f"    firscope check {CASE_FIR}{flags}",
             f"    firscope run {CASE_FIR}{flags} --tokens 0 -n 0",
             f"    firscope diff {CASE_FIR}{flags} --against expected.safetensors", "",
             "A buffer the node writes is filled first by the `capture.load` node (a copy); "
             "every other input is a weight. The source model's sha256 is "
             f"{file_sha256(model.path)}.", "", *([sliced.capitalize() + ".", ""] if sliced
                                                  else [])]
    (folder / "README").write_text("\n".join(lines), encoding="utf-8")
    (folder / "capture.json").write_text(json.dumps(
        {"model": str(model.path), "node": node.full_name, "step": step,
         "tokens": tokens[: step + 1], "against": None if against is None else str(against),
         "fir_f32": model.fir_f32, "group": model.group}, indent=1), encoding="utf-8")
