"""Run-time error messages of a dispatch, shared by both engines so they read the same.

The step interpreter (vm/interp) raises these as it executes; the compiled
runner (vm/compiled) rebuilds them from a lane's fault record. Programs and
ops are only read here (duck-typed), so this module depends on no other vm
module.
"""
from __future__ import annotations

from ..errors import BudgetExceeded, FirFault, Interrupted


def fault_error(program, op, lane: int, message: str, address: int | None = None) -> FirFault:
    p = program
    layer = f", layer {p.layer}" if p.layer is not None else ""
    return FirFault(
        f"fault in kernel '{p.name}' at node {p.node}{layer}, lane {lane}, pc {op.pc} "
        f"(line {op.loc.line}: {op.text}): {message}", op.loc,
        kernel=p.name, node=p.node, layer=p.layer, lane=lane, pc=op.pc, address=address)


def budget_error(program, pc: int, budget) -> BudgetExceeded:
    op = program.ops[min(pc, len(program.ops) - 1)]
    return BudgetExceeded(
        f"kernel '{program.name}' at node {program.node} executed more than "
        f"{budget} instructions; stopped at pc {pc} (line {op.loc.line}: {op.text})", op.loc)


def interrupted_error(program, op, *, lane: int | None = None,
                      steps: int | None = None) -> Interrupted:
    """The user stopped a dispatch inside a kernel, before ``op``. The interpreter runs its
    lanes in lockstep and says how many instructions it executed; a compiled lane names
    itself."""
    p = program
    who = f", lane {lane}" if lane is not None else ""
    after = f" after {steps} instructions" if steps is not None else ""
    return Interrupted(f"interrupted in kernel '{p.name}' at node {p.node}{who}, pc {op.pc} "
                       f"(line {op.loc.line}: {op.text}){after}", op.loc)


def bounds_message(op, addr, index: int) -> str:
    kind = "store to" if op.spec.stores else "load from"
    return (f"{kind} {addr} index {index} is outside {addr.region.name}[0:{addr.extent}] "
            f"(arena address {addr.base + index})")


def rtou_message(src: int, value, lane: int) -> str:
    return (f"rtou of R{src} = {float(value)!r} in lane {lane}: "
            "needs a finite value in 0..2^32-1")


def loop_count_message(reg: int, value, lane: int) -> str:
    return f"loop count R{reg} = {float(value)!r} in lane {lane} is not finite"


def stopped_before(node) -> Interrupted:
    """The user stopped a run between nodes, before ``node`` started."""
    return Interrupted(f"stopped by the user before node {node.full_name} (line {node.loc.line})",
                       node.loc)
