"""The model layer's part of loading: a .fir file -> declarations, arena and weights.

:func:`load_parts` runs the phases of :mod:`~firscope.model.decls`,
:mod:`~firscope.model.layout` and :mod:`~firscope.model.weights` in order
and returns them as one frozen :class:`ModelParts`. Kernels and the unrolled
node plan need the assembler (vm/), so they are the runtime's part:
:func:`firscope.runtime.load_model` calls this, then plans the nodes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..errors import FirError
from ..fir import syntax as S
from ..fir.expr import SymbolTable
from ..fir.parser import parse_file
from .checkpoint import Checkpoint
from .config import ConfigFile, read_config
from .decls import (Buffers, Header, Repeats, WeightDecl, check_plan_size, count_repeats,
                    declare_buffers, declare_weights, define_symbols, read_header)
from .layout import Layout, MemoryBudget, allocate_arena, available_memory, lay_out, size_memory
from .q4 import DEFAULT_GROUP, Q4_PATHS, warm_kernels
from .weights import WeightEntry, find_tensors, read_weights

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class Declarations:
    """The declaration phases' results (:func:`declare`)."""

    header: Header
    config: ConfigFile
    symbols: SymbolTable
    repeats: Repeats
    buffers: Buffers
    weight_decls: Mapping[str, WeightDecl]


@dataclass(frozen=True)
class ModelParts(Declarations):
    """Everything about a model that the model layer checks, places and reads."""

    path: Path
    fir: S.FirFile
    budget: MemoryBudget
    layout: Layout
    arena: np.ndarray  # buffers zeroed, f32 weights filled
    weights: Mapping[str, WeightEntry]  # every weight instance by display name
    fir_f32: bool
    group: int
    timings: Mapping[str, float]  # seconds: "parse", "weights", "total"


def declare(fir: S.FirFile, path: Path) -> Declarations:
    """The declaration phases, in order; ``path`` is the .fir file (the config is beside it)."""
    header = read_header(fir)
    config = read_config(path, header.config)
    symbols = define_symbols(fir, header, config)
    repeats = count_repeats(fir, symbols)
    buffers = declare_buffers(fir, symbols, repeats)
    weight_decls = declare_weights(fir, symbols, repeats, buffers)
    check_plan_size(fir, repeats)
    return Declarations(header, config, symbols, repeats, buffers, weight_decls)


def load_parts(path: str | Path, *, fir_f32: bool = False, group: int = DEFAULT_GROUP,
               progress: Progress | None = None, memory_limit: int | None = None,
               q4_path: str = "packed", warm: bool = True) -> ModelParts:
    """Parse, check and place a model and read its weights; raise FirError on any problem.

    ``q4_path``: "packed" (q4 linears multiply by the packed codes) or "dequant" (each q4
    matrix is also dequantized to f32 at load and linears multiply by that copy: the
    comparison path, 4 bytes per weight more). ``warm``: load numba's q4 kernels in the
    background meanwhile (False: left to the first use, or runtime.load.warm)."""
    t0 = time.perf_counter()
    if q4_path not in Q4_PATHS:
        raise FirError(f"unknown q4 path '{q4_path}' ({', '.join(Q4_PATHS)})")
    if warm and not fir_f32:
        # numba's import and kernel load overlap parsing and reading
        warm_kernels(matvec=q4_path == "packed")
    path = Path(path)
    report = progress or (lambda what, frac: None)
    report("parse", 0.0)
    fir = parse_file(path)
    t_parse = time.perf_counter()
    d = declare(fir, path)
    limit = memory_limit if memory_limit is not None else available_memory()
    budget = size_memory(fir, d.buffers, d.weight_decls, d.repeats.layers, group, limit,
                         q4_path)
    layout = lay_out(d.buffers, d.weight_decls, d.repeats.layers)
    report("allocate", 0.05)
    arena = allocate_arena(layout)
    ckpt = Checkpoint(d.config.path.parent)
    tensors = find_tensors(layout.slots, ckpt, d.header.prefix)
    t_w = time.perf_counter()
    weights = read_weights(layout.slots, tensors, ckpt, arena, fir_f32=fir_f32, group=group,
                           q4_path=q4_path,
                           progress=lambda frac: report("weights", 0.05 + 0.85 * frac))
    t_weights = time.perf_counter()
    declared = {f.name: getattr(d, f.name) for f in fields(Declarations)}
    return ModelParts(**declared, path=path, fir=fir, budget=budget, layout=layout, arena=arena,
                      weights=weights, fir_f32=fir_f32, group=group,
                      timings={"parse": t_parse - t0, "weights": t_weights - t_w,
                               "total": t_weights - t0})
