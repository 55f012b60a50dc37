"""Per-lane Python source for a bound program, written from the opcode table.

The numba backend (the compiled reference engine). For each :class:`Program`
the walk every backend shares (vm/render) goes over its ops and writes one
Python function that runs a single lane: every op contributes the lines its
row's ``render`` callable returns (:func:`template` for plain arithmetic:
``R1 = R1 + R2``); an opener (``forbegin``: a ``for`` loop over floor(count)
trips read once on entry, ``ifbegin``: ``if R[c] != 0:``) renders the block's
header and the walk indents the body under it. Registers are f32 / int64
locals. vm/compiled writes the source to a file, imports it and
compiles it with numba.

The source depends on the kernel's instructions only, never on a number the
node binds: float constants, integer constants, address offsets, extents and
the lane slices' strides come in at run time as slots of three arrays
(``bases``, ``kf``, ``ki``; :class:`Generated` holds one node's values). So
one compiled function serves every node, layer and model shape that runs the
same instructions (the seed's four kernels: four compiles for any GPT-2), and
a changed model does not recompile.

A lane that faults writes a record (fault code, pc, an argument, the trip
numbers of the enclosing loops) into its row of ``rec`` through the shared
helper ``record`` (vm/kernel_helpers, which the module imports) and returns; the runner rebuilds the
interpreter's message from it. Every access to a region the lane analysis
(vm/lanes) sliced is checked to lie in the accessing lane's slice (fault code
``F_OWNER``), without a division: ``i mod M`` comes from a float reciprocal
corrected by one step, exact for every index an arena can hold.

Two drivers run a range of lanes: ``run_lanes`` (every check, the budget, the
stop flag and the store journal) and ``run_plain`` (the same arithmetic with
only the checks that keep memory safe: bounds, rtou and loop counts), which
the runner uses only for a dispatch the lane analysis proved unable to stop
early (vm/lanes.infallible_steps, or infallible_for with the values the kernel
reads at run time) under a budget that covers it: there every index is proved
in bounds and inside the lane's slice, so no check can fire; if one ever did
(a wrong proof), run_plain returns -1 and the runner
says so. The two bodies are two passes, :class:`_Checked` and :class:`_Plain`,
which differ only in the hooks that write the checks. Each driver's arguments
and their numba types are :data:`DRIVERS`; numba compiles each driver on first
use.

run_plain keeps its checks out of the hot loops where it can, without trusting
the proof: an innermost loop whose indices are affine in its trip number is
checked once before its first trip (:meth:`_Plain.whole_block`), and a
straight kernel indexed by the lane alone checks every lane first and then runs
the lanes in a loop LLVM vectorizes (:class:`_Vector`). A loop around such an innermost
loop whose trips are independent chains (attention's dot products and weighted sums)
runs eight trips at once (vm/jam: unroll and jam).

size: the module is the numba backend's three passes (checked, plain, vector)
and the renderers whose hooks they fill; split, each pass would sit apart from
the hooks it overrides.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..errors import FirError
from .faults import bounds_message, loop_count_message, rtou_message
from .operands import Address
from . import jam, sink, split
from .isa import MAX_TRIPS, FrameKind
from .kernel_abi import (C_ABORT, C_FAULTED, F_BUDGET, F_COUNT, F_JOURNAL, F_LOAD, F_OWNER,
                         F_RTOU, F_STOP, F_STORE, POLL, TRIP_ARGS, driver_params)
from .lanes import Slicing, lane_partition
from .render import Renderer, indent

GENERATOR_VERSION = 15  # bump when the generated code's meaning changes
_JIT = "error_model='numpy', fastmath=False, cache=True, nogil=True, _nrt=False"


@dataclass
class Generated:
    source: str
    sha: str
    slots: tuple[str, ...]  # address operand names, in bases[] order
    parallel: bool  # worth spreading lanes over threads (loops, or much work)
    max_loops: int  # nesting depth of loops (trip numbers in a fault record)
    loop_pcs: dict[int, tuple[int, ...]]  # pc -> pcs of enclosing forbegins, outermost first
    fault_pcs: frozenset[int]  # ops whose code can fault (lanes.infallible_steps)
    kf: np.ndarray  # f32 constants of this node, by slot
    ki: np.ndarray  # int64 constants of this node (integers, offsets, extents, slices)
    scratch: int = 0  # f32 elements run_plain needs in sf for one range of lanes (vm/jam)
    sink_r: int = 0  # and per lane in sf, for vm/sink's saved R registers
    sink_i: int = 0  # int64 elements per lane in si (vm/sink's saved integers)


# --- renderers: the ``render`` column of the opcode table ----------------------------------
# Each is (gen, op) -> lines (vm/render): ``gen`` is the pass being written, the checked
# body of run_lanes (:class:`_Checked`) or the plain body of run_plain (:class:`_Plain`),
# whose hooks (fault, keep, owner_lines, journal) write the arithmetic with the
# memory-safety checks alone (no slices, budget or journal; a check that fires leaves
# with -1).
def template(text: str):
    """One statement: ``text`` formatted with the operands (register numbers, constant
    slots, address slots), e.g. ``"R{0} = R{1} + R{2}"``."""
    def render(gen: "_Checked", op) -> list[str]:
        return [text.format(*gen.operand_texts(op))]
    return render


def nothing(gen: "_Checked", op) -> list[str]:
    """A closer: the generator's indentation already ends the block."""
    return []


def rtou(gen: "_Checked", op) -> list[str]:
    dst, src = f"U{op.args[0]}", f"R{op.args[1]}"
    if gen.is_lane(op.args[1]):
        return [f"{dst} = lane"]
    return [*gen.guard((f"not ({src} >= 0 and {src} < 4294967296.0)",),
                       gen.keep(src) + gen.fault(F_RTOU, op.pc, "0")),
            f"{dst} = int({src})"]


def access(gen: "_Checked", op) -> list[str]:
    """A load or store (the row's ``mem``), bounds- and (sliced regions) owner-checked."""
    mem = op.spec.mem
    addr = op.args[mem.address]
    # Slots are taken in the same order whether or not the checks are written, so the
    # checked and the plain body name the same numbers alike.
    slot, owner = gen.slot(addr), gen.owner(addr)
    # A zero offset (most of them) takes no slot: one value fewer live in the loops.
    offset = f" + {gen.kslot(addr.offset)}" if addr.offset else ""
    ureg, reg = f"U{op.args[mem.index]}", f"R{op.args[mem.value]}"
    gen.index(op, ureg, offset[3:], slot)
    out = [f"i = {ureg}{offset}",
           *gen.guard(("i < 0", f"i >= E{slot}"),
                      gen.fault(F_STORE if mem.stores else F_LOAD, op.pc, "i"), bounds=True)]
    if owner is not None:
        out += gen.owner_lines(owner, op.pc)
    if mem.stores:
        out += gen.journal(op.pc, f"B{slot} + i")
        out += gen.memory(f"arena[np.uint64(B{slot} + i)] = {reg}")
    else:
        out += gen.memory(f"{reg} = arena[np.uint64(B{slot} + i)]")
    return out


def owner_check(gen: "_Checked", r: int, pc: int) -> list[str]:
    """Index ``i`` (in bounds, so >= 0) must be in this lane's slice of sliced region r:
    ``(i mod M) div S == lane``, i.e. ``0 <= (i mod M) - lane * S < S``. ``i mod M``
    without a division (an idiv in attention's inner loops cost it a third of its time):
    for i below 2^32 the quotient is ``(i * m) >> (32 + s)`` with Granlund and
    Montgomery's magic number m = ceil(2^(32+s) / M), s = ceil(log2 M) (33 bits, so the
    product is taken as ``i + ((i * (m - 2^32)) >> 32)`` in uint64: exact), which is
    what a compiler emits for a constant divisor, with M an argument; larger i use ``%``.
    (Remembering the row each access last touched, to skip even that, was slower: one
    more live value per access spills registers in the inner loops.)"""
    if not gen.modulus[r]:
        out = [f"d = i - L{r}"]
    else:
        out = ["if i < 4294967296:",
               "    u = np.uint64(i)",
               f"    d = i - np.int64((u + ((u * ML{r}) >> U32)) >> SS{r}) * M{r} - L{r}",
               "else:",
               f"    d = i % M{r} - L{r}"]
    return out + [f"if d < 0 or d >= S{r}:", *indent(gen.fault(F_OWNER, pc, "i"))]


def division_magic(m: int) -> tuple[int, int]:
    """(m_lo, s) for :func:`owner_check`: s = ceil(log2 M), m_lo = ceil(2^(32+s)/M) - 2^32
    (in 0..2^32-1), so that floor(i / M) = (i + ((i * m_lo) >> 32)) >> s for 0 <= i < 2^32
    (Granlund and Montgomery 1994, theorem 4.2, with N = 32)."""
    s = max(m - 1, 0).bit_length()
    magic = -(-(1 << (32 + s)) // m)
    return magic - (1 << 32), s


def for_header(gen: "_Checked", op) -> list[str]:
    """floor(R[c]) trips, the count read once on entry; a non-finite count is a fault."""
    depth = len(gen.loops)
    v, n = f"v{depth}", f"n{depth}"
    return [f"{v} = R{op.args[0]}",
            f"if not np.isfinite({v}):",
            *indent(gen.keep(v) + gen.fault(F_COUNT, op.pc, "0")),
            f"{n} = int(np.floor({v})) if {v} < 4.0e18 else {MAX_TRIPS}",
            f"for t{depth} in range({n}):"]


def if_header(gen: "_Checked", op) -> list[str]:
    return [f"if R{op.args[0]} != 0:"]


def fault_message(code: int, op, lane: int, arg: int, value) -> tuple[str, int | None]:
    """The interpreter's message (and arena address) for a lane's fault record: the
    renderers above decide what ``arg`` (an index) and ``value`` (frec: an f32) hold."""
    if code in (F_LOAD, F_STORE):
        addr = op.args[op.spec.mem.address]
        return bounds_message(op, addr, arg), addr.base + arg
    if code == F_RTOU:
        return rtou_message(op.args[1], value, lane), None
    return loop_count_message(op.args[0], value, lane), None


# The numba backend's table: one renderer per mnemonic of vm/opcodes.OPCODES (tests check
# that none is missing). Templates are per-lane Python: Rn/Un are the lane's registers
# (f32 and int64 locals), {i} is operand i (a register number, a constant's name, an
# address slot), ONE/ZERO are f32 constants, M32 masks uint32 wrap-around;
# exp_f32/sigmoid_f32 are model/numeric_kernels' (the reference's definitions, which the
# interpreter's handlers call too), so both engines round alike on every CPU.
RENDERERS = {
    "rtou": rtou,
    "uconst": template("U{0} = {1}"),
    "uaddk": template("U{0} = (U{1} + {2}) & M32"),
    "umulk": template("U{0} = (U{1} * {2}) & M32"),
    "uadd": template("U{0} = (U{1} + U{2}) & M32"),
    "uloadf32": access,
    "ustoref32": access,
    "loadconstf32": template("R{0} = {1}"),
    "add": template("R{0} = R{1} + R{2}"),
    "sub": template("R{0} = R{1} - R{2}"),
    "mul": template("R{0} = R{1} * R{2}"),
    "div": template("R{0} = R{1} / R{2}"),
    "mulconst": template("R{0} = R{1} * {2}"),
    "addconst": template("R{0} = R{1} + {2}"),
    "sigmoid": template("R{0} = sigmoid_f32(R{1})"),
    "exp": template("R{0} = exp_f32(R{1})"),
    "rsqrt": template("R{0} = ONE / np.sqrt(R{1})"),
    "cmplt": template("R{0} = ONE if R{1} < R{2} else ZERO"),
    "forbegin": for_header,
    "forend": nothing,
    "ifbegin": if_header,
    "ifend": nothing,
}


# --- the two passes -------------------------------------------------------------------------
class _Checked(Renderer):
    """The body of ``run_lanes``: every check, the budget, the stop flag and the store
    journal. Numbers the node binds go into slots, allocated in the order the instructions
    use them (never shared by equal values), so that the source depends on the
    instructions alone. Its renderers are :data:`RENDERERS`."""

    code_for_op = RENDERERS

    def __init__(self, program, slicing: dict[int, Slicing]):
        super().__init__(program)
        self.slicing = slicing
        self.fault_pcs: set[int] = set()
        self.accesses: dict[int, tuple[str, str, int]] = {}  # pc -> (index, offset, slot)
        self.fvals: list = []  # kf: C{n}
        self.kvals: list[int] = []  # ki: K{n}
        self.slots: dict[str, int] = {}  # address operand -> B{s}, E{s} (extent: K slot)
        self.extent_slot: dict[int, int] = {}
        # sliced region base -> r: S{r} (stride), L{r} (lane * stride); with a modulus
        # also M{r} and its division magic ML{r}, SS{r} (see owner_check)
        self.owners: dict[int, int] = {}
        self.stride_slot: list[int] = []
        self.modulus_slot: list[int] = []
        self.modulus: list[bool] = []
        self.magic_slot: list[tuple[int, int]] = []
        self.scratch = 0  # sf elements the plain body's wide groups use (vm/jam)

    # -- slots ------------------------------------------------------------------------------
    def fslot(self, c) -> str:
        self.fvals.append(np.float32(c))
        return f"C{len(self.fvals) - 1}"

    def kslot(self, k: int) -> str:
        self.kvals.append(int(k))
        return f"K{len(self.kvals) - 1}"

    def slot(self, addr) -> int:
        s = self.slots.get(addr.operand)
        if s is None:
            s = self.slots[addr.operand] = len(self.slots)
            self.extent_slot[s] = int(self.kslot(addr.extent)[1:])
        return s

    def owner(self, addr) -> int | None:
        """The sliced-region number of the region ``addr`` names, or None (not sliced)."""
        base = addr.region.base
        sl = self.slicing.get(base)
        if sl is None:
            return None
        r = self.owners.get(base)
        if r is None:
            r = self.owners[base] = len(self.owners)
            self.stride_slot.append(int(self.kslot(sl.stride)[1:]))
            self.modulus_slot.append(int(self.kslot(sl.modulus)[1:]))
            self.modulus.append(bool(sl.modulus))
            low, shift = division_magic(sl.modulus) if sl.modulus else (0, 0)
            self.magic_slot.append((int(self.kslot(low)[1:]), int(self.kslot(shift)[1:])))
        return r

    uint32_text = kslot
    f32_text = fslot

    def address_text(self, addr) -> str:
        return str(self.slot(addr))

    # -- code pieces --------------------------------------------------------------------------
    def fault(self, code: int, pc, arg: str, flag: int = C_FAULTED) -> list[str]:
        """Record (code, pc, arg, trip numbers) in this lane's row and leave the lane."""
        if code not in (F_BUDGET, F_STOP, F_JOURNAL):
            self.fault_pcs.add(pc)
        return [f"return record(rec, ctl, lane, j, {code}, {pc}, {arg}, {flag}, "
                f"{self.trips()})"]

    def trips(self) -> str:
        """How many loops enclose the op, then the trip variables of each (zero-padded
        to the helpers' fixed count, vm/kernel_helpers.TRIP_ARGS)."""
        names = [f"t{i}" for i in range(len(self.loops))] + ["0"] * (TRIP_ARGS - len(self.loops))
        return f"{len(self.loops)}, {', '.join(names)}"

    def keep(self, value: str) -> list[str]:
        """Before a fault: the f32 the message names goes into the lane's frec slot."""
        return [f"frec[lane] = {value}"]

    def guard(self, clauses: tuple[str, ...], lines: list[str], bounds: bool = False) -> list[str]:
        """A check: ``lines`` (a fault) run where one of ``clauses`` holds (``bounds``: an
        access's bounds check)."""
        return [f"if {' or '.join(clauses)}:", *indent(lines)]

    def index(self, op, ureg: str, offset: str, slot: int) -> None:
        """An access at ``ureg`` + ``offset`` (a K slot, or "") in region slot ``slot``
        is being rendered (for :class:`_Plain`'s loop versions)."""

    def memory(self, line: str) -> list[str]:
        """A load or store, after its checks."""
        return [line]

    def is_lane(self, r: int) -> bool:
        """Whether register R[r] holds the lane number wherever it is read (rtou of it
        is then the lane itself): only for :class:`_Vector`."""
        return False

    def owner_lines(self, r: int, pc: int) -> list[str]:
        return owner_check(self, r, pc)

    def journal(self, pc: int, where: str) -> list[str]:
        """Before a store: append (arena address, old value) to the journal at j, so the
        runner can undo the dispatch. A full journal (j == jend) aborts the dispatch at once,
        with everything stored so far journaled; jend < 0: no journal (the runner took a
        copy of the written regions instead)."""
        return ["if j >= jend:",
                "    if jend >= 0:",
                *indent(self.fault(F_JOURNAL, pc, "0", C_ABORT), 2),
                "else:",
                f"    jaddr[j] = {where}",
                f"    jval[j] = arena[np.uint64({where})]",
                "    j += 1"]

    # A straight run of ops always executes together; its size is charged to the lane's
    # instruction count before it runs.
    def straight(self, run: list[int], stmts: list[str]) -> list[str]:
        """Charge the run's ops to the lane's count; past ``lim`` the helper ``tick``
        looks at the budget (the interpreter would stop before the (budget+1)-th
        instruction, this run's op number budget - cnt: runs are consecutive pcs),
        the stop flag and the dispatch's abort flag, and says how far the lane may go
        before it looks again (-1: leave, the record is written)."""
        if not run:
            return stmts
        n = len(run)
        return [f"if cnt + {n} > lim:",
                f"    lim = tick(cnt, {n}, budget, stop, ctl, rec, lane, j, {run[0]}, "
                f"{self.trips()})",
                "    if lim < 0:",
                "        return j",
                f"cnt += {n}", *stmts]

    def empty(self) -> list[str]:
        return ["pass"]

    def lane_registers(self) -> tuple[list[int], list[int]]:
        """The R (R0, the lane, always) and U registers a lane's code holds."""
        return sorted(set(self.registers("R")) | {0}), self.registers("U")

    # -- the module -------------------------------------------------------------------------
    def module(self, checked: list[str], plain: list[str],
               vector: tuple[list[str], list[str]] | None = None) -> list[str]:
        regs_r, regs_u = self.lane_registers()
        # Every number of the node, unpacked once per dispatch into scalars (kept in
        # registers across lanes). No NRT: nothing here allocates, and its reference
        # counting of the array arguments on every early return cost more than the
        # kernels themselves.
        unpack = [f"    B{i} = bases[{i}]" for i in range(len(self.slots))]
        unpack += [f"    C{i} = kf[{i}]" for i in range(len(self.fvals))]
        unpack += [f"    K{i} = ki[{i}]" for i in range(len(self.kvals))]
        unpack += [f"    E{s} = K{k}" for s, k in self.extent_slot.items()]
        for r in range(len(self.owners)):
            unpack.append(f"    S{r} = K{self.stride_slot[r]}")
            if self.modulus[r]:
                low, shift = self.magic_slot[r]
                unpack += [f"    M{r} = K{self.modulus_slot[r]}",
                           f"    ML{r} = np.uint64(K{low})",
                           f"    SS{r} = np.uint64(K{shift})"]
        names = [f"B{i}" for i in range(len(self.slots))]
        names += [f"C{i}" for i in range(len(self.fvals))]
        names += [f"K{i}" for i in range(len(self.kvals))]
        names += [f"E{s}" for s in self.extent_slot]
        for r in range(len(self.owners)):
            names += [f"S{r}"] + ([f"M{r}", f"ML{r}", f"SS{r}"] if self.modulus[r] else [])
        # Handed to lane_fn as one tuple: a call with more than 30 arguments compiles to
        # a *args call, which numba cannot inline.
        packed = f"({', '.join(names)},)" if names else "()"
        unpacked = [f"    {', '.join(names)}, = vals"] if names else []
        init = ["R0 = np.float32(lane)", *[f"R{r} = ZERO" for r in regs_r if r != 0],
                *[f"U{u} = 0" for u in regs_u]]
        head = [f"# Generated by firscope.vm.codegen (generator {GENERATOR_VERSION}) from "
                f"{len(self.ops)} instructions; do not edit.",
                "import numpy as np",
                "from numba import njit",
                "from firscope.vm.kernel_helpers import prefetch_l1, prefetch_l2, record, tick",
                "from firscope.model.numeric_kernels import exp_f32, sigmoid_f32",
                "",
                "ONE = np.float32(1.0)",
                "ZERO = np.float32(0.0)",
                "M32 = 0xFFFFFFFF",
                "U32 = np.uint64(32)"]
        lane_fn = ["", "",
                   f"@njit({_JIT})",
                   "def lane_fn(lane, arena, vals, budget, ctl, rec, frec, stop, jaddr, jval, "
                   "j, jend):",
                   *unpacked,
                   *[f"    {line}" for line in init],
                   *[f"    L{r} = lane * S{r}" for r in range(len(self.owners))],
                   "    cnt = 0",
                   f"    lim = budget if budget < {POLL} else {POLL}",
                   *indent(checked),
                   "    return j"]
        # The journal (jaddr, jval from j up to jend) is threaded through the lanes: one
        # after the other they fill one journal in store order; a range of lanes run on
        # another thread has a segment of its own (lanes store only to their own slices,
        # so the order in which the runner undoes different ranges does not matter).
        drivers = ["", "",
                   f"@njit({_JIT})",
                   f"def run_lanes({driver_params('run_lanes')}):",
                   *unpack,
                   f"    vals = {packed}",
                   "    for lane in range(l0, l1):",
                   "        j = lane_fn(lane, arena, vals, budget, ctl, rec, frec, stop, jaddr, "
                   "jval, j, jend)",
                   "    return j",
                   "", "",
                   f"@njit({_JIT})",
                   f"def run_plain({driver_params('run_plain')}):",
                   *unpack,
                   *(self.vector_loops(init, *vector) if vector else []),
                   *self.plain_lanes(init, plain),
                   "    return 0",
                   ""]
        return head + lane_fn + drivers

    @staticmethod
    def plain_lanes(init: list[str], plain) -> list[str]:
        """run_plain's lanes: one after the other, or (``plain`` a tuple: vm/sink's three
        phases) side by side in one loop."""
        if not isinstance(plain, tuple):
            return ["    for lane in range(l0, l1):", *[f"        {line}" for line in init],
                    *indent(plain, 2)]
        a, b, c = plain
        return ["    G = 0",
                "    for lane in range(l0, l1):", *[f"        {line}" for line in init],
                *indent(a, 2),
                "    for gs in range(G):",
                "        for lane in range(l0, l1):", *indent(b, 3),
                "    for lane in range(l0, l1):", *indent(c, 2)]

    @staticmethod
    def vector_loops(init: list[str], checks: list[str], body: list[str]) -> list[str]:
        """run_plain's first part for a :class:`_Vector` kernel: every lane's checks in
        one loop (no store happens if one fails), then the lanes without a check or an
        exit, which LLVM vectorizes across lanes. For lanes up to 2^24, where the lane
        number is exact in f32 (rtou of R0 is the lane itself); past that the scalar
        loop that follows runs instead."""
        return ["    if l1 <= 16777217:",
                "        bad = False",
                "        for lane in range(l0, l1):",
                *[f"            {line}" for line in init if line.startswith("U")],
                *indent(checks, 3),
                "        if bad:",
                "            return -1",
                "        for lane in range(l0, l1):",
                *[f"            {line}" for line in init],
                *indent(body, 3),
                "        return 0"]


class _Plain(_Checked):
    """The body of ``run_plain``: the same arithmetic, with only the checks that keep memory
    safe (bounds, rtou, loop counts); one that fires leaves the driver with -1. The slots
    are taken exactly as in the checked body, so both bodies name the same numbers."""

    sunk = None  # the first top-level jammed loop without wide groups (vm/sink): its
    # (jam.Parts, JamPlan), once rendered

    def fault(self, code: int, pc, arg: str, flag: int = C_FAULTED) -> list[str]:
        return ["return -1"]

    def keep(self, value: str) -> list[str]:
        return []

    def owner_lines(self, r: int, pc: int) -> list[str]:
        return []

    def journal(self, pc: int, where: str) -> list[str]:
        return []

    def straight(self, run: list[int], stmts: list[str]) -> list[str]:
        return stmts

    # -- loop versions -----------------------------------------------------------------------
    # An innermost loop whose accesses index with registers that either stay put in its body
    # or step by a constant once a trip (uaddk U U k) is checked once, before it runs: its
    # indices are then affine in the trip number, so the first and the last trip's bound
    # every other (no uint32 wrap-around in between). If every access is in bounds on
    # every trip, the body runs without its bounds checks (attention 23 -> 15 us hot: the
    # checks, not the work, were most of its inner loops); otherwise (or with a count past
    # 2^30, or a step that wraps) the loop with its checks runs, exactly as before.
    def guard(self, clauses: tuple[str, ...], lines: list[str], bounds: bool = False) -> list[str]:
        out = super().guard(clauses, lines, bounds)
        if bounds:
            out[0] += BOUNDS_MARK
        return out

    def index(self, op, ureg: str, offset: str, slot: int) -> None:
        self.accesses[op.pc] = (ureg, offset, slot)

    def whole_block(self, opener) -> list[str] | None:
        if opener.spec.opens is not FrameKind.FOR:
            return None
        body = self.ops[opener.pc + 1: opener.match]
        if any(op.spec.opens is not None for op in body):
            plan = jam.plan(self.ops, opener)
            return None if plan is None else self.jammed(opener, plan)
        return self.affine(self.pieces(opener))

    def pieces(self, opener) -> jam.Pieces:
        """An innermost loop's header and each op's lines (rendered once), the registers
        its body steps by a constant once a trip, and its accesses."""
        body = self.ops[opener.pc + 1: opener.match]
        self.accesses = {}
        header = self.lines_of(opener)
        outer = self.loops
        self.loops = outer + (opener.pc,)
        per_op, steps, varying = [], {}, set()
        for op in body:
            self.loop_pcs[op.pc] = self.loops
            rendered = self.lines_of(op)
            per_op.append(rendered)
            for file, i in op.spec.writes:
                if file != "U":
                    continue
                reg = f"U{op.args[i]}"
                step = jam.STEP.fullmatch(rendered[0]) if len(rendered) == 1 else None
                if step and step[1] == reg and reg not in steps and reg not in varying:
                    steps[reg] = (step[2], op.pc)
                else:
                    varying.add(reg)
        self.loops = outer
        for reg in varying:
            steps.pop(reg, None)
        accesses = dict(self.accesses)
        if any(ureg in varying for ureg, _, _ in accesses.values()):
            accesses = None  # an index the trip number does not give
        return jam.Pieces(header, per_op, steps, accesses, body)

    def conditions(self, pieces: jam.Pieces, depth: int) -> list[str]:
        """What makes every trip's accesses in bounds, with no step wrapping past 2^32
        (none: no access, or one the trip number does not give)."""
        n = f"n{depth}"
        conds = []
        for pc, (ureg, offset, slot) in (pieces.accesses or {}).items():
            off = f" + {offset}" if offset else ""
            if ureg not in pieces.steps:
                conds += [f"{ureg}{off} >= 0", f"{ureg}{off} < E{slot}"]
                continue
            k, at = pieces.steps[ureg]
            after = 1 if at < pc else 0  # trips that stepped it before this access
            last = f"{ureg} + ({n} - {1 - after}) * {k}"
            first = f"{ureg} + {k}" if after else ureg
            conds += [f"{k} < 4294967296", f"{last} < 4294967296", f"{first}{off} >= 0",
                      f"{last}{off} < E{slot}"]
        if not conds:
            return []
        for ureg, (k, _) in pieces.steps.items():  # every step's value after the last trip too
            conds += [f"{k} < 4294967296", f"{ureg} + {n} * {k} < 4294967296"]
        return list(dict.fromkeys(conds))

    def fast_ops(self, pieces: jam.Pieces) -> list[list[str]]:
        """Each op's lines without bounds checks and with its steps unmasked."""
        return [_unmasked(_without_bounds(lines), pieces.steps) for lines in pieces.ops]

    def affine(self, pieces: jam.Pieces) -> list[str]:
        """An innermost loop, checked once before its first trip where its indices are
        affine in the trip number (see above)."""
        lines = [line for op in pieces.ops for line in op] or self.empty()
        depth = len(self.loops)
        conds = self.conditions(pieces, depth)
        if not conds:
            return [*pieces.header, *indent(lines)]
        loop = pieces.header[-1]
        fast_ops = self.fast_ops(pieces)
        sp = split.plan(pieces.body, fast_ops)
        if sp is not None:  # vm/split: the in-order sum apart from the work feeding it
            self.scratch = max(self.scratch, split.SPLIT)
            fast = split.lines(sp, depth, fast_ops)
        else:
            fast = [loop, *indent([line for op in fast_ops for line in op] or self.empty())]
        return [*pieces.header[:-1],
                f"if n{depth} <= 0 or (n{depth} <= 1073741824 and {' and '.join(conds)}):",
                *indent(fast),
                "else:",
                f"    {loop}",
                *indent(lines, 2)]

    def jammed(self, opener, plan: jam.JamPlan) -> list[str]:
        """``opener``'s loop with its trips run eight at a time (vm/jam). Every op is rendered
        once, in the checked pass's order (so both take the same slots), and the loop as
        written is built from the same lines for the trips left over."""
        depth = len(self.loops)
        header = self.lines_of(opener)
        outer = self.loops
        self.loops = outer + (opener.pc,)
        self.accesses = {}
        p_lines = []
        for op in plan.prologue:
            self.loop_pcs[op.pc] = self.loops
            p_lines.append(self.lines_of(op))
        loads = {slot for _, _, slot in self.accesses.values()}
        self.loop_pcs[plan.inner.pc] = self.loops
        inner = self.pieces(plan.inner)
        inner_block = self.affine(inner)
        loads |= {slot for _, _, slot in self.accesses.values()}
        self.accesses = {}
        e_lines = self.block(*plan.epilogue)
        stores = {slot for pc, (_, _, slot) in self.accesses.items() if self.ops[pc].spec.stores}
        self.loops = outer
        original = [*(line for op in p_lines for line in op), *inner_block, *e_lines]
        alias = jam.disjoint(stores, loads)
        if alias is None:
            return [*header, *indent(original)]
        conds = self.conditions(inner, depth + 1)
        fast = (self.fast_ops(inner), conds) if conds else None
        wide_plan = jam.wide_plan(plan) if conds else None
        wide = []
        if wide_plan is not None:
            wide = jam.wide_lines(wide_plan, depth, p_lines, fast[0], conds, e_lines, inner)
            self.scratch = max(self.scratch, len(wide_plan.carried) * jam.WIDE_MAX)
        jp = jam.parts(plan, depth, header, p_lines, inner, fast, e_lines, alias, original,
                       wide)
        if self.sunk is None and not outer and opener.depth == 0 and wide_plan is None:
            self.sunk = (jp, plan)  # vm/sink: this loop's lanes run side by side
            return [sink.MARK]
        return jam.lines(jp)


BOUNDS_MARK = "  # bounds"


def _without_bounds(lines: list[str]) -> list[str]:
    """``lines`` without the bounds checks (a marked ``if`` line and the lines nested
    under it)."""
    out, skip = [], None
    for line in lines:
        depth = len(line) - len(line.lstrip())
        if skip is not None and depth > skip:
            continue
        skip = None
        if line.endswith(BOUNDS_MARK):
            skip = depth
            continue
        out.append(line)
    return out


def _unmasked(lines: list[str], steps: dict) -> list[str]:
    """``lines`` with each constant step of a register in ``steps`` written without its
    uint32 wrap mask: the guard proved the register's value after every trip, the last
    included, below 2^32 (the mask would change nothing), and without it LLVM sees an
    induction variable and strength-reduces the addressing."""
    out = []
    for line in lines:
        step = jam.STEP.fullmatch(line.strip())
        if step and step[1] in steps:
            line = line[:len(line) - len(line.lstrip())] + f"{step[1]} = {step[1]} + {step[2]}"
        out.append(line)
    return out


class _Vector(_Plain):
    """run_plain's body for a straight kernel (no loop, no if) whose indices come from the
    lane number alone (every rtou reads R0, which no op writes): with ``checking``, the
    index arithmetic and the bounds checks only, each folded into ``bad`` (no branch);
    without, the arithmetic and the memory accesses, no check. Loads and stores at
    ``B + lane + k`` with no exit in the loop: LLVM vectorizes it (g2.gelu_new 5x faster;
    exp_f32 and sigmoid_f32 are written with selects for it). Rendered by the plain
    pass's renderers, so slots are taken in the same order."""

    def __init__(self, program, slicing: dict[int, Slicing], checking: bool):
        super().__init__(program, slicing)
        self.checking = checking

    @staticmethod
    def fits(program) -> bool:
        ops = program.ops
        if any(op.spec.opens is not None for op in ops):
            return False
        for op in ops:
            writes = [(file, op.args[i]) for file, i in op.spec.writes]
            if ("R", 0) in writes:
                return False  # R0 is no longer the lane
            to_u = any(file == "U" for file, _ in writes)
            if to_u and any(f == "R" and op.args[i] != 0 for f, i in op.spec.reads):
                return False  # an index from a computed value
        return True

    def lines_of(self, op) -> list[str]:
        lines = super().lines_of(op)
        if not self.checking or op.spec.mem is not None:
            return lines
        return lines if any(file == "U" for file, _ in op.spec.writes) else []

    def guard(self, clauses: tuple[str, ...], lines: list[str], bounds: bool = False) -> list[str]:
        if not self.checking:
            return []
        return [f"bad |= {' | '.join(f'({c})' for c in clauses)}"]

    def memory(self, line: str) -> list[str]:
        return [] if self.checking else [line]

    def is_lane(self, r: int) -> bool:
        return r == 0


def bound_ops(program) -> tuple[tuple, dict[int, int], list]:
    """Each op as :func:`generate` reads it, (id of its static op, its arguments), with
    region bases replaced by their order of first use; that order (base -> number); and the
    regions in it. Holds the ops' ids: keep the program alive as long as it is used."""
    alias: dict[int, int] = {}
    regions: list = []
    ops = []
    for op in program.ops:
        args = []
        for a in op.args:
            if isinstance(a, Address):
                k = alias.get(a.base)
                if k is None:
                    k = alias[a.base] = len(regions)
                    regions.append(a.region)
                args.append((a.operand, k, a.offset, a.extent))
            else:
                args.append((type(a).__name__, a))
        ops.append((id(op.static), tuple(args)))
    return tuple(ops), alias, regions


def generation_key(program, slicing: dict[int, Slicing]) -> tuple:
    """What :func:`generate` reads of ``program`` and ``slicing``, with region bases
    replaced by their order of first use (the code names regions by operand, takes
    bases as arguments, and tells regions apart only to see which operands alias): two
    nodes of one kernel with equal keys get the same Generated (GPT-2's layers). The key
    holds the ops' ids: keep the program alive as long as the key is used."""
    ops, alias, _ = bound_ops(program)
    sliced = tuple(sorted((alias.get(base, -1 - i), sl.stride, sl.modulus)
                          for i, (base, sl) in enumerate(slicing.items())))
    return program.threads, ops, sliced


def generate(program, slicing: dict[int, Slicing] | None = None) -> Generated:
    """Per-lane source for ``program`` (see the module docstring)."""
    if slicing is None:
        slicing, why = lane_partition(program)
        if slicing is None:
            raise FirError(f"kernel '{program.name}' at node {program.node} cannot be compiled: "
                           f"{why}")
    n = len(program.ops)
    checked = _Checked(program, slicing)
    checked_body = checked.block(0, n)
    plain = _Plain(program, slicing)
    plain_body = plain.block(0, n)
    sunk = (0, 0)
    if plain.sunk is not None:
        jp, jplan = plain.sunk
        *plain_body, nr, ni = sink.phases(jp, plain_body, *plain.lane_registers(),
                                          jplan.stepped)
        plain_body, sunk = tuple(plain_body), (nr, ni)
    fvals, kvals = checked.fvals, checked.kvals
    assert len(plain.fvals) == len(fvals) and plain.kvals == kvals  # the same numbering
    vector = None
    if _Vector.fits(program):
        passes = [_Vector(program, slicing, checking) for checking in (True, False)]
        vector = tuple(v.block(0, n) for v in passes)
        assert all(len(v.fvals) == len(fvals) and v.kvals == kvals for v in passes)
    big = next((k for k in kvals if not -(1 << 62) <= k < 1 << 62), None)
    if big is not None:  # a lane stride from products of large constants
        raise ValueError(f"a number of the kernel ({big}) does not fit the compiled "
                         "code's 64-bit arithmetic")
    has_loops = any(op.spec.opens is FrameKind.FOR for op in program.ops)
    parallel = program.threads >= 2 and (has_loops or program.threads * n >= 200_000)
    source = "\n".join(checked.module(checked_body, plain_body, vector))
    sha = hashlib.sha256(source.encode()).hexdigest()[:24]
    slots = tuple(sorted(checked.slots, key=checked.slots.get))
    max_loops = max((len(loops) for loops in checked.loop_pcs.values()), default=0)
    return Generated(source, sha, slots, parallel, max_loops, checked.loop_pcs,
                     frozenset(checked.fault_pcs), np.array(fvals, dtype=np.float32),
                     np.array(kvals, dtype=np.int64), plain.scratch, *sunk)
