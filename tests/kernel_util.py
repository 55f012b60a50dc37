"""Run a single kernel written in .fir text on a tiny arena, without a model."""
from __future__ import annotations

import numpy as np

from firscope.fir import parse_text
from firscope.fir import syntax as S
from firscope.model import Region
from firscope.vm.assembler import bind, check_kernel
from firscope.vm.interp import Dispatch


# Two lanes, lane i loading in0[i + 5]: out of bounds for an input of fewer than 7 elements.
FAULTING = """
kernel k in=1 out=1 threads=2 tg=2 tgbytes=0
  rtou 1 0
  uaddk 1 1 5
  uloadf32 2 1 @in0
endkernel
"""


def kernel_program(src: str, operands: dict[str, int], symbols=None, buffers=None):
    """Assemble the first kernel in ``src``; operands maps in0/out0.. to sizes.

    Operands are laid out one after another in a fresh arena; ``buffers``
    maps extra @NAME buffers to sizes (placed after the operands).
    Returns (program, arena, regions by operand name).
    """
    text = "fir 1\n" + src if not src.lstrip().startswith("fir") else src
    fir = parse_text(text, "test.fir")
    k = fir.of(S.Kernel)[0]
    buffers = buffers or {}
    code = check_kernel(k, lambda name: name in buffers)
    regions, base = {}, 0
    for name, size in list(operands.items()) + list(buffers.items()):
        regions[name] = Region(name, base, size)
        base += size
    arena = np.zeros(base, dtype=np.float32)
    from fractions import Fraction
    syms = {k: Fraction(v) for k, v in (symbols or {}).items()}
    program = bind(code, symbols=syms, operands={n: regions[n] for n in operands},
                   resolve_buffer=lambda n: regions[n], node="test", layer=None)
    return program, arena, regions


def run_kernel(src: str, inputs: dict[str, np.ndarray], outputs: dict[str, int], symbols=None,
               buffers=None):
    """Run a kernel to completion; return {operand: array} for outputs (and inputs)."""
    sizes = {n: len(v) for n, v in inputs.items()}
    sizes.update(outputs)
    program, arena, regions = kernel_program(src, sizes, symbols, buffers)
    for n, v in inputs.items():
        r = regions[n]
        arena[r.base: r.base + r.size] = v
    d = Dispatch(program, arena)
    d.run()
    return {n: arena[r.base: r.base + r.size].copy() for n, r in regions.items()}, d
