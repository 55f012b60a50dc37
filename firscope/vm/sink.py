"""Lanes side by side in one jammed loop of ``run_plain``: the lane loop sunk into its groups.

Attention's QK loop (``g2.attn_decode``: per lane a head, per trip a key row, 64 elements
of the row a dot product) reads 256 bytes of each 3 KB row per lane, lane after lane:
every row a demand miss at a 3 KB stride, which the prefetchers do not follow across
pages (at position 1000 of GPT-2 small, 6 MB of K a layer from DRAM at a fraction of
the streaming rate). Run with its lanes side by side, group by group (eight rows of
every head of a thread, then the next eight), the rows are read whole, in order.

``run_plain`` then runs in three phases (lanes never communicate in the plain driver:
every access lies in the lane's own slice of what the kernel writes, vm/lanes):

A. each lane: the kernel up to the loop, the loop's count and the jam's run-time
   conditions (``act``: the lane's groups may run here), then its registers and the
   jam's numbers saved (sf: R registers; si: U registers, trips left, the inner count,
   the stepped registers' D, act), G = the most groups a lane has;
B. G times, each active lane in turn: its registers back, one group of JAM trips (a
   group whose accesses are not all in bounds makes the lane inactive before any store,
   as the jam leaves its groups), its registers saved;
C. each lane: its registers back, the trips left as written (fewer than JAM, or all of
   them where the jam's conditions do not hold: as the jam leaves its groups) and the
   rest of the kernel.

Each lane runs its own ops in its own order, so the bits are the loop's as written.
Phase C holds no second copy of the jam (one made GPT-2 small's first compile 4-6 s
longer: numba's time grows faster than the code). The loop taken is the first
one at the kernel's top level that vm/jam jams without wide groups (attention's QK:
its V loop goes wide, vm/jam).
"""
from __future__ import annotations

from .jam import JAM, Parts
from .render import indent

MARK = "# the sunk loop (vm/sink)"


def phases(jp: Parts, lines: list[str], regs_r: list[int], regs_u: list[int],
           stepped: list[str]) -> tuple[list[str], list[str], list[str], int, int]:
    """(phase A, B, C lines, R and integer slots per lane) for ``lines`` (run_plain's body
    with MARK where the loop ``jp`` stands)."""
    at = lines.index(MARK)
    before, after = lines[:at], lines[at + 1:]
    d = jp.d
    n, m, r = f"n{d}", f"n{d + 1}", f"r{d}"
    ints = [f"U{u}" for u in regs_u] + [r, m, *(f"D{reg}" for reg in stepped), "act"]
    reals = [f"R{k}" for k in regs_r]
    where = ["o = lane - l0", f"fo = sf.shape[0] - (o + 1) * {len(reals)}",
             f"io = o * {len(ints)}"]
    save = [f"sf[fo + {k}] = {x}" for k, x in enumerate(reals)]
    save += [f"si[io + {k}] = {x}" for k, x in enumerate(ints)]
    restore = [f"{x} = sf[fo + {k}]" for k, x in enumerate(reals)]
    restore += [f"{x} = si[io + {k}]" for k, x in enumerate(ints)]
    a = [*before, *jp.header, f"{r} = {n}", "act = 0", f"{m} = 0",
         *(f"D{reg} = 0" for reg in stepped),
         f"if {jp.entry()}:",
         *indent([*jp.inner_header, jp.inner_fits(),
                  *indent([*jp.deltas, "act = 1"])]),
         *where, *save,
         f"if act != 0 and {r} // {JAM} > G:", f"    G = {r} // {JAM}"]
    group = jp.rest if jp.checks is None else [f"if {jp.checks}:", *indent(jp.rest),
                                                "else:", "    act = 0"]
    b = [*where,
         f"if si[io + {len(ints) - 1}] != 0 and si[io + {ints.index(r)}] >= {JAM}:",
         *indent([*restore, *jp.inits, *jp.head, *group, *save])]
    c = [*where, *restore, f"for t{d} in range({r}):", *indent(jp.original or ["pass"]), *after]
    return a, b, c, len(reals), len(ints)
