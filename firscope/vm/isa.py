"""The shape of an instruction-set row, and the vm's shared constants.

:class:`OpSpec` is one row of the opcode table (vm/opcodes): everything an
engine needs to know about a mnemonic is a field here, so no engine tests
mnemonics. This module imports nothing of firscope: the table (opcodes),
the assembler, both engines and the lane analysis all read it, and it must
not pull any of them in (that was the assembler -> opcodes -> interp ->
assembler cycle).

Operand kinds (:class:`Operand`):
  ``Rd``/``Rs``  f32 register written / read (0..31)
  ``Ud``/``Us``  uint32 register written / read (0..31)
  ``K``          integer constant expression (uint32, wraps like the GPU)
  ``F``          float constant expression, rounded once to f32
  ``A``          address ``@in0``, ``@out1``, ``@buffer`` plus an offset expression
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable

NREGS = 32  # registers per file (R and U), per lane
# Loop counts are clamped here: a count this large only ends by the budget.
MAX_TRIPS = 1 << 62


class Operand(StrEnum):
    RD = "Rd"
    RS = "Rs"
    UD = "Ud"
    US = "Us"
    K = "K"
    F = "F"
    A = "A"

    @property
    def register_file(self) -> str | None:
        """The register file of a register operand ('R' or 'U'), else None."""
        return self.value[0] if self.value[0] in "RU" else None

    @property
    def is_read(self) -> bool:
        return self in (Operand.RS, Operand.US)

    @property
    def is_written(self) -> bool:
        return self in (Operand.RD, Operand.UD)


class Category(StrEnum):
    """How the profiler groups instructions."""

    ALU = "alu"
    MEM = "mem"
    CONST = "const"
    CTRL = "ctrl"


class FrameKind(StrEnum):
    """The two kinds of block: a loop (``forbegin``) and a conditional (``ifbegin``)."""

    FOR = "for"
    IF = "if"


class AccessKind(StrEnum):
    LOAD = "load"
    STORE = "store"


@dataclass(frozen=True)
class MemAccess:
    """An instruction that moves one f32 between a register and the arena:
    arena[address + U[index]] is loaded into or stored from R[value]."""

    kind: AccessKind
    address: int  # operand index of the @address
    index: int  # operand index of the U register added to it
    value: int  # operand index of the R register

    @property
    def stores(self) -> bool:
        return self.kind is AccessKind.STORE


@dataclass(frozen=True)
class OpSpec:
    """One mnemonic. The callables are the per-engine meanings of the row:

    * ``interp(dispatch, op) -> run``: for the step interpreter (vm/interp), a
      closure built once per dispatch that executes ``op`` once on every active
      lane (lane-vectorized) and returns the next pc, or None for pc + 1.
    * the code generators' meanings are not here: each backend keeps a table of
      renderers keyed by mnemonic (vm/codegen.RENDERERS for numba, vm/wgsl.RENDERERS
      for WGSL; vm/render walks the blocks for both).
    * ``lanes(analysis, op, state, record) -> state``: the transfer function
      of the lane-partition analysis (vm/lanes). None means "the registers
      this op writes hold unknown values afterwards", which is always sound.
      An opener's transfer covers its whole block.
    """

    mnemonic: str
    operands: tuple[Operand, ...]
    names: tuple[str, ...]  # operand names as the format documents them
    category: Category
    summary: str
    interp: Callable = field(compare=False, repr=False)
    lanes: Callable | None = field(default=None, compare=False, repr=False)
    # Block structure: the kind of block this op opens or closes (None: neither).
    opens: FrameKind | None = None
    closes: FrameKind | None = None
    mem: MemAccess | None = None  # set for loads and stores
    # A transcendental (exp, sigmoid, rsqrt): a GPU runs it on its special-function units;
    # the cost model (firscope/cost) counts these lane-instructions apart as sfu_ops.
    sfu: bool = False

    @property
    def reads(self) -> tuple[tuple[str, int], ...]:
        """(file, operand index) pairs of registers read."""
        return tuple((k.register_file, i) for i, k in enumerate(self.operands) if k.is_read)

    @property
    def writes(self) -> tuple[tuple[str, int], ...]:
        return tuple((k.register_file, i) for i, k in enumerate(self.operands) if k.is_written)

    @property
    def is_f32_arith(self) -> bool:
        """Arithmetic that writes an f32 register (a flop per active lane, for the cost model)."""
        return self.category is Category.ALU and any(f == "R" for f, _ in self.writes)

    @property
    def is_control(self) -> bool:
        return self.category is Category.CTRL

    @property
    def stores(self) -> bool:
        return self.mem is not None and self.mem.stores

    @property
    def usage(self) -> str:
        return " ".join((self.mnemonic,) + self.names)
