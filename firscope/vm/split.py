"""Loop distribution for ``run_plain``: an in-order sum split from the work that feeds it.

Attention's softmax (``g2.attn_decode``) runs, per score, a load, a subtraction, an exp,
a store and ``add sum sum x``: the sum is a chain of dependent adds in the program's
order, so LLVM may not vectorize the loop, and each exp (vm/handlers: an f64 polynomial
written with selects so that it can vectorize) runs one at a time (6.1 ns each on a
Zen 4, scalar). Split in two, in chunks of SPLIT trips, the first loop runs every op
but the sum and keeps each trip's ``x`` in the runner's scratch (``sf``), and LLVM
vectorizes it (its stride versioned at run time); the second adds them up in the
program's order (2.6 ns a score in all). Each trip runs its own ops in its own order
and the sum its adds in trip order, so the bits are the loop's as written.

A loop is split (:func:`plan`) on run_plain's fast path (its accesses proved in bounds
before it, vm/codegen ``affine``), when its body holds a transcendental op (``sfu``:
the work worth vectorizing; elsewhere the chain's latency bounds the loop either way)
and one op ``A = f(A, X)`` rendered as one line (no check, no memory access) is the only
op of the body that reads or writes A, and reads one register X that the body writes
(others it reads the body does not write).
"""
from __future__ import annotations

from dataclasses import dataclass

from .jam import REGISTER, regs
from .render import indent

SPLIT = 256  # trips in one chunk; sf holds SPLIT floats (Generated.scratch)


@dataclass
class SplitPlan:
    at: int  # the chain op's index in the body
    chain: str  # A
    fed: str  # X


def plan(body: list, rendered: list[list[str]]) -> SplitPlan | None:
    """How to split the innermost loop of ``body`` (its ops; ``rendered``: each op's lines
    on the fast path), or None."""
    if not any(op.spec.sfu for op in body):
        return None
    written = set().union(set(), *(regs(op, op.spec.writes) for op in body))
    for k, op in enumerate(body):
        w, r = regs(op, op.spec.writes), regs(op, op.spec.reads)
        if len(w) != 1 or len(rendered[k]) != 1 or op.spec.mem is not None:
            continue
        a = next(iter(w))
        others = [o for i, o in enumerate(body) if i != k]
        if a[0] != "R" or a not in r or any(
                a in regs(o, o.spec.reads) | regs(o, o.spec.writes) for o in others):
            continue
        fed = (r - {a}) & written
        if len(fed) == 1 and set(REGISTER.findall(rendered[k][0])) == r | w:
            return SplitPlan(k, a, next(iter(fed)))
    return None


def lines(sp: SplitPlan, d: int, fast: list[list[str]]) -> list[str]:
    """The loop at depth ``d`` (``n{d}`` trips; ``fast``: its fast path's ops) split."""
    left, w, j = f"sn{d}", f"sw{d}", f"sj{d}"
    work = [ln for k, op in enumerate(fast) for ln in
            (op if k != sp.at else [f"sf[{j}] = {sp.fed}"])]
    chain = REGISTER.sub(lambda m: f"sf[{j}]" if m[1] == sp.fed else m[1], fast[sp.at][0])
    return [f"{left} = n{d}",
            f"while {left} > 0:",
            *indent([f"{w} = {left} if {left} <= {SPLIT} else {SPLIT}",
                     f"for {j} in range({w}):", *indent(work),
                     f"for {j} in range({w}):", f"    {chain.strip()}",
                     f"{left} -= {w}"])]
