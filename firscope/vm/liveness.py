"""Register liveness over a kernel's instructions: which R and U registers hold a value
that may still be read, at every instruction, and the most at once (register pressure).

The classic backward data-flow over the kernel's control-flow graph, which the
structured blocks give exactly:

* an instruction falls through to the next; the last one to the kernel's end;
* ``forbegin`` goes into its body or, when the count is 0, past its ``forend``;
  ``forend`` goes back to the first instruction of the body (the next trip) or
  past itself: a register read in a body before the body writes it is live around
  the back edge (the value of the trip before);
* ``ifbegin`` goes into its body or straight to its ``ifend`` (lanes where the
  condition is 0): a register written only inside an if does not kill the value
  from before it, which the lanes that skip the body still read.

``live[pc]`` is the set live on entry to the instruction at ``pc`` (what it and
what follows may read before it is written again). A register read before any
write is live from the kernel's entry: R0 (the lane id) where the kernel reads it,
and any other register the kernel reads before writing (it holds the VM's 0).

A loop also needs its trip counter while its body runs (the count is read once, on
entry, and counted down in a register on a GPU): ``loops[pc]`` is the number of
``for`` blocks around ``pc``, and ``pressure`` = the most of live R + live U + loop
counters at one instruction is the registers a lane needs at least.
"""
from __future__ import annotations

from dataclasses import dataclass

from .isa import NREGS, FrameKind

_U = NREGS  # bit of U0 in a register set (R0..R31 are bits 0..31, U0..U31 bits 32..63)


@dataclass(frozen=True)
class Liveness:
    live: tuple[int, ...]  # per pc: the live-in set, a bit mask (R n: bit n, U n: bit 32+n)
    loops: tuple[int, ...]  # per pc: for blocks around it (their trip counters are live)

    def live_r(self, pc: int) -> list[int]:
        return [r for r in range(NREGS) if self.live[pc] >> r & 1]

    def live_u(self, pc: int) -> list[int]:
        return [r for r in range(NREGS) if self.live[pc] >> (_U + r) & 1]

    def count(self, pc: int) -> tuple[int, int]:
        """(live R, live U) on entry to ``pc``."""
        m = self.live[pc]
        return (m & ((1 << _U) - 1)).bit_count(), (m >> _U).bit_count()

    @property
    def max_r(self) -> int:
        return max((self.count(pc)[0] for pc in range(len(self.live))), default=0)

    @property
    def max_u(self) -> int:
        return max((self.count(pc)[1] for pc in range(len(self.live))), default=0)

    @property
    def max_live(self) -> int:
        """The most R + U registers live at one instruction."""
        return max((m.bit_count() for m in self.live), default=0)

    @property
    def pressure(self) -> int:
        """The most live R + live U + loop trip counters at one instruction."""
        return max((m.bit_count() + n for m, n in zip(self.live, self.loops)), default=0)

    @property
    def at_entry(self) -> list[str]:
        """Registers live on entry to the kernel (read before written), e.g. ['R0']."""
        if not self.live:
            return []
        return [f"R{r}" for r in self.live_r(0)] + [f"U{r}" for r in self.live_u(0)]


def _bits(op, used: bool) -> int:
    """The register set an instruction reads (``used``) or writes, as a bit mask."""
    operands = op.operands if hasattr(op, "operands") else op.args
    out = 0
    for file, i in (op.spec.reads if used else op.spec.writes):
        out |= 1 << (operands[i] + (_U if file == "U" else 0))
    return out


def successors(ops) -> list[tuple[int, ...]]:
    """Per pc, the pcs control may go to next (``len(ops)``: the kernel's end)."""
    out = []
    for op in ops:
        pc, spec = op.pc, op.spec
        if spec.opens is not None:  # into the body, or past the block (0 trips / false)
            out.append((pc + 1, op.match if spec.opens is FrameKind.IF else op.match + 1))
        elif spec.closes is FrameKind.FOR:  # the next trip, or out
            out.append((op.match + 1, pc + 1))
        else:
            out.append((pc + 1,))
    return out


def _loop_depths(ops) -> tuple[int, ...]:
    """Per pc, the for blocks whose counter is live there: the body and the forend (which
    counts it down), not the forbegin (which sets it from the count register)."""
    depth, out = 0, []
    for op in ops:
        out.append(depth)
        if op.spec.opens is FrameKind.FOR:
            depth += 1
        elif op.spec.closes is FrameKind.FOR:
            depth -= 1
    return tuple(out)


def liveness(ops) -> Liveness:
    """Live-in register sets of every instruction of ``ops`` (a kernel's ``StaticOp``s or a
    program's ``Op``s: only register numbers, specs and block matches are read)."""
    n = len(ops)
    use = [_bits(op, True) for op in ops]
    kill = [_bits(op, False) for op in ops]
    succ = successors(ops)
    live = [0] * (n + 1)  # live[n]: the kernel's end, where nothing is read
    changed = True
    while changed:  # backward, to the fixed point (loops need a second pass or more)
        changed = False
        for pc in range(n - 1, -1, -1):
            out = 0
            for s in succ[pc]:
                out |= live[s]
            new = use[pc] | (out & ~kill[pc])
            if new != live[pc]:
                live[pc] = new
                changed = True
    return Liveness(tuple(live[:n]), _loop_depths(ops))
