"""One opcode table; assembler; SIMT step interpreter; compiled kernels.

isa       OpSpec (one row of the instruction set) and its enums
opcodes   the table: OPCODES, one row per mnemonic
handlers  the interpreter's lane-vectorized handlers the rows are built from
codegen   per-lane source from the rows' renderers (for the compiled engine)
lanes     the affine lane-partition analysis (the rows' transfer functions)
faults    run-time error messages both engines share
assembler kernel text -> checked code -> a Program bound to one node
interp    the SIMT step interpreter (the reference)
compiled  the numba runner; imported on demand (``firscope.vm.compiled``)
kernel_helpers  the slow paths every generated kernel calls (imports numba; on demand)
"""
from .assembler import Program, bind, check_kernel, disassemble
from .interp import Dispatch
from .isa import AccessKind, Category, FrameKind, MemAccess, Operand, OpSpec
from .opcodes import OPCODES

__all__ = ["AccessKind", "Category", "Dispatch", "FrameKind", "MemAccess", "OPCODES", "OpSpec",
           "Operand", "Program", "bind", "check_kernel", "disassemble"]
