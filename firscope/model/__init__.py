"""Config checks, symbols, buffers, weights (prefix, {i}, transpose, Q4), the arena layout.

The model layer's phases of loading, each a function from frozen inputs to a
frozen result (see :mod:`.decls`, :mod:`.layout`, :mod:`.weights`), run in
order by :func:`load_parts`. Kernels and the unrolled node plan are the
runtime's: the full entry point is :func:`firscope.runtime.load_model`.
:mod:`.threads` is the pool that compiled kernels of every layer share.
"""
from .checkpoint import Checkpoint
from .config import ConfigFile, read_config
from .decls import (BufferDecl, Buffers, Header, Repeats, WeightDecl, check_plan_size,
                    count_repeats, declare_buffers, declare_weights, define_symbols, read_header)
from .layout import (Layout, MemoryBudget, Region, WeightSlot, allocate_arena, lay_out,
                     size_memory)
from .loader import Declarations, ModelParts, declare, load_parts
from .ref import Ref
from .weights import WeightEntry, find_tensors, read_weights

__all__ = [
    "BufferDecl", "Buffers", "Checkpoint", "ConfigFile", "Declarations", "Header", "Layout",
    "MemoryBudget", "ModelParts", "Ref", "Region", "Repeats", "WeightDecl", "WeightEntry",
    "WeightSlot", "allocate_arena", "check_plan_size", "count_repeats", "declare",
    "declare_buffers", "declare_weights", "define_symbols", "find_tensors", "lay_out",
    "load_parts", "read_config", "read_header", "read_weights", "size_memory",
]
