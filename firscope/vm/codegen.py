"""Per-lane Python source for a bound program, written from the opcode table.

For each :class:`Program` the generator walks its ops and writes one Python
function that runs a single lane: every op contributes the lines its row's
``render`` callable returns (:func:`template` for plain arithmetic:
``R1 = R1 + R2``); an opener (``forbegin``: a ``for`` loop over floor(count)
trips read once on entry, ``ifbegin``: ``if R[c] != 0:``) renders the block's
header and the generator indents the body under it. Registers are f32 /
int64 locals, constants are baked in as module-level ``np.float32`` values,
region bases come in at run time. vm/compiled writes the source to a file,
imports it and compiles it with numba.

A lane that faults writes a record (fault code, pc, an argument, the trip
numbers of the enclosing loops) into its row of ``rec`` and returns; the
runner rebuilds the interpreter's message from it. Every access to a region
the lane analysis (vm/lanes) sliced is checked to lie in the accessing lane's
slice (fault code ``F_OWNER``).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from ..errors import FirError
from .faults import bounds_message, loop_count_message, rtou_message
from .isa import MAX_TRIPS, FrameKind, Operand
from .lanes import Slicing, lane_partition

GENERATOR_VERSION = 5  # bump when the generated code's meaning changes
POLL = 1 << 14  # instructions between looks at the stop flag
_JIT = "error_model='numpy', fastmath=False, cache=True, nogil=True, _nrt=False"

# Fault codes written by compiled lanes into their record row. F_JOURNAL: the store
# journal is full (the runner undoes the dispatch and runs it again with a larger one).
F_LOAD, F_STORE, F_RTOU, F_COUNT, F_OWNER, F_BUDGET, F_STOP, F_JOURNAL = 1, 2, 3, 4, 5, 6, 7, 8
# ctl slots
C_ABORT, C_EPOCH, C_FAULTED = 0, 1, 2
REC_FIXED = 4  # epoch, code, pc, arg; then one trip number per enclosing loop
IND = "    "


def _f32_literal(c) -> str:
    v = float(c)
    if math.isnan(v):
        return "np.float32(np.nan)"
    if math.isinf(v):
        return "np.float32(np.inf)" if v > 0 else "np.float32(-np.inf)"
    return f"np.float32({v!r})"


@dataclass
class Generated:
    source: str
    sha: str
    slots: tuple[str, ...]  # address operand names, in bases[] order
    parallel: bool
    max_loops: int  # nesting depth of loops (trip numbers in a fault record)
    loop_pcs: dict[int, tuple[int, ...]]  # pc -> pcs of enclosing forbegins, outermost first
    fault_pcs: frozenset[int]  # ops whose code can fault (lanes.infallible_steps)


# --- renderers: the ``render`` fields of the opcode table ---------------------------------
# Each is (gen, op, ind, loops) -> lines: ``ind`` is the indentation, ``loops`` the pcs of
# the enclosing forbegins (the trip variables t0, t1, ... of gen.fault's records).
def template(text: str):
    """One statement: ``text`` formatted with the operands (register numbers, constant
    names, address slots), e.g. ``"R{0} = R{1} + R{2}"``."""
    def render(gen: "_Gen", op, ind: str, loops: tuple) -> list[str]:
        return [ind + text.format(*gen.operand_texts(op))]
    return render


def nothing(gen: "_Gen", op, ind: str, loops: tuple) -> list[str]:
    """A closer: the generator's indentation already ends the block."""
    return []


def rtou(gen: "_Gen", op, ind: str, loops: tuple) -> list[str]:
    dst, src = f"U{op.args[0]}", f"R{op.args[1]}"
    return [f"{ind}if not ({src} >= 0 and {src} < 4294967296.0):",
            f"{ind}    frec[lane] = {src}",
            *gen.fault(ind + IND, F_RTOU, op.pc, "0", loops),
            f"{ind}{dst} = int({src})"]


def access(gen: "_Gen", op, ind: str, loops: tuple) -> list[str]:
    """A load or store (the row's ``mem``), bounds- and (sliced regions) owner-checked."""
    mem = op.spec.mem
    addr = op.args[mem.address]
    slot = gen.slot(addr)
    ureg, reg = f"U{op.args[mem.index]}", f"R{op.args[mem.value]}"
    off = addr.offset
    out = [f"{ind}i = {ureg} + {off}" if off else f"{ind}i = {ureg}",
           f"{ind}if i < 0 or i >= {addr.extent}:"]
    out += gen.fault(ind + IND, F_STORE if mem.stores else F_LOAD, op.pc, "i", loops)
    sl = gen.slicing.get(addr.region.base)
    if sl is not None:
        owner = f"(i % {sl.modulus}) // {sl.stride}" if sl.modulus else f"i // {sl.stride}"
        out.append(f"{ind}if {owner} != lane:")
        out += gen.fault(ind + IND, F_OWNER, op.pc, "i", loops)
    if mem.stores:
        out += gen.journal(ind, op.pc, f"B{slot} + i", loops)
        out.append(f"{ind}arena[B{slot} + i] = {reg}")
    else:
        out.append(f"{ind}{reg} = arena[B{slot} + i]")
    return out


def for_header(gen: "_Gen", op, ind: str, loops: tuple) -> list[str]:
    """floor(R[c]) trips, the count read once on entry; a non-finite count is a fault."""
    depth = len(loops)
    v, n = f"v{depth}", f"n{depth}"
    return [f"{ind}{v} = R{op.args[0]}",
            f"{ind}if not np.isfinite({v}):",
            f"{ind}    frec[lane] = {v}",
            *gen.fault(ind + IND, F_COUNT, op.pc, "0", loops),
            f"{ind}{n} = int(np.floor({v})) if {v} < 4.0e18 else {MAX_TRIPS}",
            f"{ind}for t{depth} in range({n}):"]


def if_header(gen: "_Gen", op, ind: str, loops: tuple) -> list[str]:
    return [f"{ind}if R{op.args[0]} != 0:"]


def fault_message(code: int, op, lane: int, arg: int, value) -> tuple[str, int | None]:
    """The interpreter's message (and arena address) for a lane's fault record: the
    renderers above decide what ``arg`` (an index) and ``value`` (frec: an f32) hold."""
    if code in (F_LOAD, F_STORE):
        addr = op.args[op.spec.mem.address]
        return bounds_message(op, addr, arg), addr.base + arg
    if code == F_RTOU:
        return rtou_message(op.args[1], value, lane), None
    return loop_count_message(op.args[0], value, lane), None


# --- the generator -------------------------------------------------------------------------
class _Gen:
    def __init__(self, program, slicing: dict[int, Slicing]):
        self.p = program
        self.ops = program.ops
        self.slicing = slicing
        self.consts: dict[str, str] = {}
        self.slots: dict[str, int] = {}
        self.max_loops = 0
        self.loop_pcs: dict[int, tuple[int, ...]] = {}
        self.fault_pcs: set[int] = set()

    def const(self, c) -> str:
        lit = _f32_literal(c)
        if lit not in self.consts:
            self.consts[lit] = f"C{len(self.consts)}"
        return self.consts[lit]

    def slot(self, addr) -> int:
        return self.slots.setdefault(addr.operand, len(self.slots))

    def operand_texts(self, op) -> list[str]:
        """Each operand as a template sees it: constant name, address slot or number."""
        out = []
        for kind, a in zip(op.spec.operands, op.args):
            if kind is Operand.F:
                out.append(self.const(a))
            elif kind is Operand.A:
                out.append(str(self.slot(a)))
            else:
                out.append(str(int(a)))
        return out

    def fault(self, ind: str, code: int, pc, arg: str, loops: tuple,
              flag: int = C_FAULTED) -> list[str]:
        """Record (code, pc, arg, trip numbers) in this lane's row and leave the lane."""
        if code not in (F_BUDGET, F_STOP, F_JOURNAL):
            self.fault_pcs.add(pc)
        out = [f"{ind}rec[lane, 1] = {code}", f"{ind}rec[lane, 2] = {pc}",
               f"{ind}rec[lane, 3] = {arg}"]
        for i in range(len(loops)):
            out.append(f"{ind}rec[lane, {REC_FIXED + i}] = t{i} + 1")
        out += [f"{ind}rec[lane, 0] = ctl[{C_EPOCH}]", f"{ind}ctl[{flag}] = 1",
                f"{ind}return j"]
        return out

    def journal(self, ind: str, pc: int, where: str, loops: tuple) -> list[str]:
        """Before a store: append (arena address, old value) to the journal at j, so the
        runner can undo the dispatch. A full journal (j == jend) aborts the dispatch at once,
        with everything stored so far journaled; jend < 0: no journal (the runner took a
        copy of the written regions instead)."""
        return [f"{ind}if j >= jend:",
                f"{ind}    if jend >= 0:",
                *self.fault(ind + IND * 2, F_JOURNAL, pc, "0", loops, C_ABORT),
                f"{ind}else:",
                f"{ind}    jaddr[j] = {where}",
                f"{ind}    jval[j] = arena[{where}]",
                f"{ind}    j += 1"]

    def registers(self, file: str) -> list[int]:
        return sorted({op.args[i] for op in self.ops for i, k in enumerate(op.spec.operands)
                       if k.register_file == file})

    def generate(self) -> Generated:
        body = self.seq(0, len(self.ops), IND, ())
        regs_r = sorted(set(self.registers("R")) | {0})
        regs_u = self.registers("U")
        p = self.p
        has_loops = any(op.spec.opens is FrameKind.FOR for op in self.ops)
        parallel = p.threads >= 2 and (has_loops or p.threads * len(self.ops) >= 200_000)
        head = [f"# Generated by firscope.vm.codegen (generator {GENERATOR_VERSION}) from kernel "
                f"'{p.name}' ({len(self.ops)} ops); do not edit.",
                "import numpy as np",
                "from numba import njit, prange",
                "from firscope.vm.compiled import poll",
                "",
                "ONE = np.float32(1.0)",
                "ZERO = np.float32(0.0)",
                "M32 = 0xFFFFFFFF"]
        head += [f"{name} = {lit}" for lit, name in self.consts.items()]
        # Region bases are scalar arguments (kept in registers across lanes); no
        # NRT: nothing here allocates, and its reference counting of the array
        # arguments on every early return cost more than the kernels themselves.
        bnames = [f"B{i}" for i in range(len(self.slots))]
        blist = "".join(f"{b}, " for b in bnames)
        # The journal (jaddr, jval from j up to jend) is threaded through the lanes: one
        # after the other they fill one journal in store order; in parallel each lane
        # has its own segment (lanes store only to their own slices, so the order in
        # which the runner undoes different lanes' entries does not matter).
        fn = ["", "",
              f"@njit({_JIT}, inline='always')",
              f"def lane_fn(lane, arena, {blist}budget, ctl, rec, frec, stop, jaddr, jval, j, "
              "jend):"]
        fn.append("    R0 = np.float32(lane)")
        fn += [f"    R{r} = ZERO" for r in regs_r if r != 0]
        fn += [f"    U{u} = 0" for u in regs_u]
        fn += ["    cnt = 0", f"    lim = budget if budget < {POLL} else {POLL}"]
        fn += body
        fn.append("    return j")
        args = ("arena, bases, threads, budget, ctl, rec, frec, stop, jaddr, jval, jn, jend, "
                "written, saved")
        common = "budget, ctl, rec, frec, stop, jaddr, jval"
        # Without a journal (jend < 0) the runner wants the written regions saved instead.
        save = ["    k = 0",
                "    for w in range(written.shape[0]):",
                "        for a in range(written[w, 0], written[w, 1]):",
                "            saved[k] = arena[a]",
                "            k += 1"]
        entry = ["", "",
                 f"@njit({_JIT})",
                 f"def run_serial({args}):",
                 *[f"    {b} = bases[{i}]" for i, b in enumerate(bnames)],
                 *save,
                 "    j = 0",
                 "    for lane in range(threads):",
                 f"        j = lane_fn(lane, arena, {blist}{common}, j, jend)",
                 "    jn[0] = j",
                 "", "",
                 f"@njit({_JIT}, parallel=True)",
                 f"def run_parallel({args}):",
                 *[f"    {b} = bases[{i}]" for i, b in enumerate(bnames)],
                 *save,
                 "    seg = jend // threads if jend >= 0 else -1",
                 "    for lane in prange(threads):",
                 "        ln = np.int64(lane)",
                 "        start = ln * seg if seg >= 0 else 0",
                 "        end = start + seg if seg >= 0 else -1",
                 f"        jn[ln] = lane_fn(ln, arena, {blist}{common}, start, end)",
                 ""]
        source = "\n".join(head + fn + entry)
        sha = hashlib.sha256(source.encode()).hexdigest()[:24]
        slots = tuple(sorted(self.slots, key=self.slots.get))
        return Generated(source, sha, slots, parallel, self.max_loops, self.loop_pcs,
                         frozenset(self.fault_pcs))

    # A block is a run of ops that always execute together; its size is
    # charged to the lane's instruction count before it runs.
    def seq(self, a: int, b: int, ind: str, loops: tuple) -> list[str]:
        out: list[str] = []
        block: list[int] = []
        stmts: list[str] = []

        def flush():
            if block:
                out.extend(self.block_check(block, ind, loops))
                out.extend(stmts)
                block.clear()
                stmts.clear()

        pc = a
        while pc < b:
            op = self.ops[pc]
            spec = op.spec
            self.loop_pcs[pc] = loops
            block.append(pc)
            if spec.opens is None:
                stmts.extend(spec.render(self, op, ind, loops))
                pc += 1
                continue
            flush()
            out.extend(spec.render(self, op, ind, loops))
            inner = loops + (pc,) if spec.opens is FrameKind.FOR else loops
            self.max_loops = max(self.max_loops, len(inner))
            out.extend(self.seq(pc + 1, op.match + 1, ind + IND, inner))
            self.loop_pcs[op.match] = inner
            pc = op.match + 1
        flush()
        if not out:
            out.append(f"{ind}pass")
        return out

    def block_check(self, block: list[int], ind: str, loops: tuple) -> list[str]:
        n = len(block)
        first = block[0]
        i2 = ind + IND
        i3 = i2 + IND
        # Over budget: the interpreter would stop before the (budget+1)-th instruction,
        # which is this block's op number budget - cnt (blocks are consecutive pcs).
        out = [f"{ind}if cnt + {n} > lim:",
               f"{i2}if cnt + {n} > budget:",
               *self.fault(i3, F_BUDGET, f"{first} + (budget - cnt)", "0", loops, C_ABORT),
               f"{i2}if poll(stop) != 0:",
               *self.fault(i3, F_STOP, first, "0", loops, C_ABORT),
               f"{i2}if poll(ctl) != 0:",  # ctl[0]: another lane aborted the dispatch
               f"{i3}return j",
               f"{i2}lim = budget if budget - cnt < {POLL} else cnt + {POLL}",
               f"{ind}cnt += {n}"]
        return out


def generate(program, slicing: dict[int, Slicing] | None = None) -> Generated:
    """Per-lane source for ``program`` (see the module docstring)."""
    if slicing is None:
        slicing, why = lane_partition(program)
        if slicing is None:
            raise FirError(f"kernel '{program.name}' at node {program.node} cannot be compiled: "
                           f"{why}")
    return _Gen(program, slicing).generate()
