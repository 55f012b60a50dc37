"""WGSL compute shaders for bound programs, written from a table of renderers.

The GPU backend's meaning of each opcode is one entry of :data:`RENDERERS`,
keyed by mnemonic (tests check that every row of the opcode table has one):
``render(gen, op) -> lines`` of WGSL, unindented. The walk every backend
shares (vm/render.Renderer) goes over a program's ops; an opener renders its
block's header and the walk indents the body under it, then closes the
brace. The runner (firscope/gpu) compiles the text with wgpu; nothing here
imports it.

Semantics, as fir-format.md defines them:

* one invocation per lane, ``@workgroup_size(tg)``; lanes at or past
  ``threads`` return at once (the grid is 2-D when one row of workgroups
  would pass the adapter's 65535);
* R0..R31 are ``f32`` and U0..U31 ``u32`` function-scope variables, R0 the
  lane id, every other register 0; ``u32`` arithmetic wraps as the format's;
* ``forbegin`` is a ``for`` over floor(R[c]) trips read once on entry (a
  non-finite count is a fault); ``ifbegin`` runs its body where R[c] != 0
  (written ``!(x == 0.0)`` so that NaN runs it, as in NumPy);
* every access is checked against the extent of the region it names, and
  ``rtou`` of a negative or non-finite value is a fault. A GPU cannot raise:
  the first lane that faults (first by the device's atomic order) writes
  (node, lane, code, pc, argument) into the fault buffer and returns; the
  host rebuilds the reference's message from it (:func:`fault_error_of`,
  vm/faults). Every lane counts its loop trips and stops at the dispatch's
  budget (a runaway loop would otherwise hang the device).
* After a loop ends, its trip counter must have reached its count: a driver
  that ends loops on its own (Mesa's llvmpipe/lavapipe keeps one loop limiter
  per shader invocation, shared by all its loops: once they have run 65535
  trips in all, every loop ends) would otherwise return a silently shortened
  result. A loop that ended early is a fault (``F_CAPPED``, its count and the
  lane's trips in all recorded); one that asked for more trips than the budget
  is reported as the reference reports a runaway loop.

Like vm/codegen, the text depends on the kernel's instructions only: the
node's bases, extents, offsets and constants are slots of a ``u32`` array
(:class:`WgslProgram.params`), so one pipeline serves every node and layer
that runs the same kernel. Each instruction is preceded by a
``// FILE:LINE`` comment.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import BudgetExceeded, FirFault
from ..fir.expr import Env, eval_int
from .faults import bounds_message, fault_error, loop_count_message, rtou_message
from .isa import FrameKind
from .render import IND, Renderer, indent

WGSL_VERSION = 3  # bump when the generated code's meaning changes
# Fault buffer (u32): [0] lanes that faulted, then the first one's record.
F_COUNT_SLOT, F_NODE, F_LANE, F_CODE, F_PC, F_ARG, F_TRIPS = 0, 1, 2, 3, 4, 5, 6
FAULT_WORDS = 8
# Fault codes (F_EMBED: fir.embedding's id outside the table, from firscope/gpu's shaders).
F_LOAD, F_STORE, F_RTOU, F_COUNT, F_BUDGET, F_EMBED, F_CAPPED = 1, 2, 3, 4, 5, 6, 7
# params[] header: threads, node index, the lane's loop-trip budget; slots follow.
P_THREADS, P_NODE, P_BUDGET, P_FIRST_SLOT = 0, 1, 2, 4
NO_INDEX = 0xFFFFFFFF  # what index() returns for U + offset outside 0..2^32-2
MAX_EXTENT = NO_INDEX  # extents must stay below it (the arena is far smaller)
MAX_GROUPS_X = 65535  # workgroups per dimension every WebGPU adapter offers


@dataclass(frozen=True)
class WgslProgram:
    """One node's shader: the text (shared by every node of the kernel) and its numbers."""

    source: str
    params: np.ndarray  # uint32: header + slots
    threads: int
    tg: int
    slots: int  # number of slots (for a test's eyes)


# --- renderers ------------------------------------------------------------------------------
# Each is (gen, op) -> lines of WGSL, unindented (vm/render indents them).
def template(text: str):
    """One statement from the operand texts (register numbers, slot names)."""
    def render(gen: "_Gen", op) -> list[str]:
        return [text.format(*gen.operand_texts(op))]
    return render


def closer(gen: "_Gen", op) -> list[str]:
    """The generator closes the block's brace; a closer adds nothing."""
    return []


def rtou(gen: "_Gen", op) -> list[str]:
    d, s = op.args
    return [f"if (!(isfin(R{s}) && R{s} >= 0.0 && R{s} < 4294967296.0)) {{",
            f"    fault(lane, {F_RTOU}u, {op.pc}u, bitcast<u32>(R{s}));",
            "    return;",
            "}",
            f"U{d} = u32(R{s});"]


def access(gen: "_Gen", op) -> list[str]:
    """A load or store (the row's ``mem``): U[u] + offset checked against the extent; a
    fault records U[u] (the host adds the offset back for the message)."""
    mem = op.spec.mem
    addr = op.args[mem.address]
    base, extent = gen.address_slots(addr)
    ureg, reg = f"U{op.args[mem.index]}", f"R{op.args[mem.value]}"
    if addr.offset:
        mag, neg = gen.slot(abs(addr.offset)), gen.slot(1 if addr.offset < 0 else 0)
        index = f"index({ureg}, {mag}, {neg})"
    else:
        index = ureg
    code = F_STORE if mem.stores else F_LOAD
    arena = gen.window_name(addr)
    move = f"{arena}[{base} + i] = {reg};" if mem.stores else f"{reg} = {arena}[{base} + i];"
    return ["{",
            f"    let i = {index};",
            f"    if (i >= {extent}) {{",
            f"        fault(lane, {code}u, {op.pc}u, {ureg});",
            "        return;",
            "    }",
            f"    {move}",
            "}"]


def for_header(gen: "_Gen", op) -> list[str]:
    """floor(R[c]) trips, read once on entry; each trip counts against the lane's budget."""
    v, n, t = f"v{op.pc}", f"n{op.pc}", f"t{op.pc}"  # names by pc: sibling loops differ
    return [f"let {v} = R{op.args[0]};",
            f"if (!isfin({v})) {{",
            f"    fault(lane, {F_COUNT}u, {op.pc}u, bitcast<u32>({v}));",
            "    return;",
            "}",
            f"var {n}: u32 = 0u;",
            f"if ({v} >= 4294967295.0) {{ {n} = 0xffffffffu; }} "
            f"else if ({v} >= 1.0) {{ {n} = u32(floor({v})); }}",
            # declared outside the for: the check after the loop reads how far it got
            f"var {t}: u32 = 0u;",
            f"for (; {t} < {n}; {t} = {t} + 1u) {{",
            "    trips = trips + 1u;",
            "    if (trips > budget) {",
            f"        fault(lane, {F_BUDGET}u, {op.pc}u, 0u);",
            "        return;",
            "    }"]


def if_header(gen: "_Gen", op) -> list[str]:
    return [f"if (!(R{op.args[0]} == 0.0)) {{"]


# The table: one renderer per mnemonic of vm/opcodes.OPCODES (tests/test_gpu_wgsl.py checks
# that none is missing). {i} is operand i: a register number, or a slot's value for K / F.
RENDERERS = {
    "rtou": rtou,
    "uconst": template("U{0} = {1};"),
    "uaddk": template("U{0} = U{1} + {2};"),
    "umulk": template("U{0} = U{1} * {2};"),
    "uadd": template("U{0} = U{1} + U{2};"),
    "uloadf32": access,
    "ustoref32": access,
    "loadconstf32": template("R{0} = {1};"),
    "add": template("R{0} = R{1} + R{2};"),
    "sub": template("R{0} = R{1} - R{2};"),
    "mul": template("R{0} = R{1} * R{2};"),
    "div": template("R{0} = R{1} / R{2};"),
    "mulconst": template("R{0} = R{1} * {2};"),
    "addconst": template("R{0} = R{1} + {2};"),
    "sigmoid": template("R{0} = 1.0 / (1.0 + exp(-R{1}));"),
    "exp": template("R{0} = exp(R{1});"),
    "rsqrt": template("R{0} = 1.0 / sqrt(R{1});"),  # the reference's two roundings
    "cmplt": template("R{0} = select(0.0, 1.0, R{1} < R{2});"),
    "forbegin": for_header,
    "forend": closer,
    "ifbegin": if_header,
    "ifend": closer,
}

PRELUDE = """\
@group(0) @binding(0) var<storage, read_write> arena: array<f32>;
@group(0) @binding(1) var<storage, read> p: array<u32>;
@group(0) @binding(2) var<storage, read_write> faults: array<atomic<u32>>;

// The first lane to fault writes its record; every faulting lane is counted.
fn fault(lane: u32, code: u32, pc: u32, arg: u32) {
    fault_trips(lane, code, pc, arg, 0u);
}

// ... with the loop trips the lane had run in all
fn fault_trips(lane: u32, code: u32, pc: u32, arg: u32, trips: u32) {
    if (atomicAdd(&faults[0], 1u) == 0u) {
        atomicStore(&faults[1], p[1]);
        atomicStore(&faults[2], lane);
        atomicStore(&faults[3], code);
        atomicStore(&faults[4], pc);
        atomicStore(&faults[5], arg);
        atomicStore(&faults[6], trips);
    }
}

// u + offset (offset = neg ? -mag : mag), or 0xffffffff when that is outside 0..2^32-2.
fn index(u: u32, mag: u32, neg: u32) -> u32 {
    if (neg != 0u) {
        if (u < mag) { return 0xffffffffu; }
        return u - mag;
    }
    let i = u + mag;
    if (i < u) { return 0xffffffffu; }
    return i;
}

fn isfin(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}
"""


class _Gen(Renderer):
    """The WGSL backend: its renderers are :data:`RENDERERS`; node numbers go into u32
    slots of the params array, in the order the ops use them."""

    code_for_op = RENDERERS

    def __init__(self, program, path: str, place=None):
        super().__init__(program)
        self.path = path
        self.place = place or whole_arena
        self.values: list[int] = []  # slot values (u32), in the order the ops use them
        self.addr: dict[str, tuple[str, str]] = {}
        self.windows: dict[str, int] = {}  # operand -> the window (binding) it lies in

    def slot(self, value: int) -> str:
        self.values.append(int(value) & 0xFFFFFFFF)
        return f"s{len(self.values) - 1}"

    def fslot(self, value) -> str:
        return f"bitcast<f32>({self.slot(int(np.float32(value).view(np.uint32)))})"

    def address_slots(self, addr) -> tuple[str, str]:
        got = self.addr.get(addr.operand)
        if got is None:
            if addr.extent >= MAX_EXTENT:
                raise ValueError(f"region {addr.region.name} has {addr.extent} elements: "
                                 "more than a GPU index can address")
            window, base = self.place(addr.region)
            self.windows[addr.operand] = window
            got = self.addr[addr.operand] = (self.slot(base), self.slot(addr.extent))
        return got

    def window_name(self, addr) -> str:
        return window_name(self.windows[addr.operand])

    uint32_text = slot
    f32_text = fslot

    def lines_of(self, op) -> list[str]:
        """Each instruction after a comment naming its source line (a closer's goes on the
        brace that :meth:`close` writes)."""
        if op.spec.closes is not None:
            return super().lines_of(op)
        return [f"// {self.path}:{op.loc.line}  {op.text}", *super().lines_of(op)]

    def close(self, opener, closer) -> list[str]:
        brace = [f"}}  // {self.path}:{closer.loc.line}  {closer.text}"]
        if opener.spec.opens is not FrameKind.FOR:
            return brace
        n, t = f"n{opener.pc}", f"t{opener.pc}"  # as for_header named them
        return brace + [f"if ({t} < {n}) {{  // the driver ended the loop early",
                        f"    fault_trips(lane, {F_CAPPED}u, {opener.pc}u, {n}, trips);",
                        "    return;",
                        "}"]

    def generate(self, tg: int, budget: int) -> WgslProgram:
        body = indent(self.block(0, len(self.p.ops)))
        regs_r = sorted(set(self.registers("R")) | {0})
        init = [f"{IND}var R0: f32 = f32(lane);"]
        init += [f"{IND}var R{r}: f32 = 0.0;" for r in regs_r if r]
        init += [f"{IND}var U{u}: u32 = 0u;" for u in self.registers("U")]
        slots = [f"{IND}let s{i} = p[{P_FIRST_SLOT + i}];" for i in range(len(self.values))]
        k = self.p.kernel.syntax
        head = [f"// Generated by firscope.vm.wgsl (version {WGSL_VERSION}) from kernel "
                f"'{self.p.name}' ({self.path}:{k.loc.line}), {len(self.p.ops)} instructions; "
                "do not edit.", PRELUDE]
        head += [f"@group(0) @binding({window_binding(w)}) var<storage, read_write> "
                 f"{window_name(w)}: array<f32>;" for w in sorted(set(self.windows.values()))
                 if w]
        main = [f"@compute @workgroup_size({tg})",
                "fn main(@builtin(global_invocation_id) gid: vec3<u32>,",
                "        @builtin(num_workgroups) groups: vec3<u32>) {",
                f"{IND}let lane = gid.x + gid.y * groups.x * {tg}u;",
                f"{IND}if (lane >= p[{P_THREADS}]) {{ return; }}",
                f"{IND}let budget = p[{P_BUDGET}];",
                f"{IND}var trips: u32 = 0u;",
                *slots, *init, *body, "}", ""]
        header = [0] * P_FIRST_SLOT
        header[P_THREADS] = self.p.threads
        header[P_BUDGET] = min(int(budget), 0xFFFFFFFF)
        params = np.array(header + self.values, dtype=np.uint32)
        return WgslProgram("\n".join(head + main), params, self.p.threads, tg,
                           len(self.values))


def whole_arena(region) -> tuple[int, int]:
    """The placement of a region when the whole arena is one binding: window 0, its base."""
    return 0, region.base


def window_name(window: int) -> str:
    return "arena" if window == 0 else f"arena{window}"


def window_binding(window: int) -> int:
    """Window 0 is binding 0 (before the params and the fault buffer); window k >= 1 is
    binding k + 2."""
    return 0 if window == 0 else window + 2


def generate(program, *, symbols=None, path: str = "gpt2.fir", tg: int | None = None,
             budget: int = 50_000_000, place=None) -> WgslProgram:
    """The shader of one bound program (see the module docstring). ``tg``: the workgroup
    size (default the kernel's ``tg=``, evaluated with ``symbols``); ``budget``: loop trips
    one lane may run. ``place(region) -> (window, base)``: where a region lies when the
    arena is split across bindings (firscope/gpu/layout); by default the whole arena is
    window 0 and a region's base is its arena address. Each window a region lies in is a
    binding of its own (:func:`window_binding`), named :func:`window_name`."""
    if tg is None:
        tg = kernel_tg(program, symbols or {})
    return _Gen(program, path, place).generate(max(int(tg), 1), budget)


def kernel_tg(program, symbols) -> int:
    """The kernel's ``tg=`` for this node (it may use ``in0.size`` like ``threads=``)."""
    sizes = {name: r.size for name, r in program.operands}
    return eval_int(program.kernel.syntax.tg, Env(symbols, sizes), "tg")


def grid(threads: int, tg: int) -> tuple[int, int]:
    """Workgroups (x, y) that cover ``threads`` lanes of ``tg`` each."""
    groups = max(-(-threads // tg), 1)
    x = min(groups, MAX_GROUPS_X)
    return x, -(-groups // x)


def fault_error_of(program, record, budget: int) -> Exception:
    """The reference's error for a fault record read back from the GPU: (count, node,
    lane, code, pc, arg). Loads and stores name the index and arena address exactly as
    the interpreter does (the record holds U[u]; the offset is the node's)."""
    count, lane, code, pc, arg = (int(record[F_COUNT_SLOT]), int(record[F_LANE]),
                                  int(record[F_CODE]), int(record[F_PC]), int(record[F_ARG]))
    op = program.ops[pc]
    more = f" ({count} lanes faulted on the GPU; the first recorded is shown)" if count > 1 else ""
    value = float(np.array(arg, dtype=np.uint32).view(np.float32))
    if code in (F_LOAD, F_STORE):
        addr = op.args[op.spec.mem.address]
        index = arg + addr.offset
        return fault_error(program, op, lane, bounds_message(op, addr, index) + more,
                           addr.base + index)
    if code == F_RTOU:
        return fault_error(program, op, lane, rtou_message(op.args[1], value, lane) + more)
    if code == F_COUNT:
        return fault_error(program, op, lane, loop_count_message(op.args[0], value, lane) + more)
    if code == F_CAPPED:
        return capped_error(program, op, lane, arg, budget, more,
                            trips=int(record[F_TRIPS]) if len(record) > F_TRIPS else None)
    if code == F_BUDGET:
        return BudgetExceeded(
            f"kernel '{program.name}' at node {program.node}: lane {lane} ran more than "
            f"{budget} loop trips on the GPU; stopped at pc {pc} (line {op.loc.line}: "
            f"{op.text})", op.loc)
    return FirFault(f"kernel '{program.name}' at node {program.node}: unknown GPU fault code "
                    f"{code} at pc {pc}", op.loc)


def capped_error(program, op, lane: int, count: int, budget: int, more: str,
                 trips: int | None = None) -> Exception:
    """A loop the GPU driver ended before its count (F_CAPPED): a runaway loop (more trips
    than the budget) is reported as the reference reports one; any other is a fault that
    says the result would have been wrong."""
    where = f"pc {op.pc} (line {op.loc.line}: {op.text})"
    if count > budget:
        return BudgetExceeded(
            f"kernel '{program.name}' at node {program.node}: lane {lane}'s loop at {where} "
            f"asks for {count} trips, more than the budget of {budget} (a runaway loop; the "
            f"GPU driver ended it before the budget did){more}", op.loc)
    ran = f", after {trips} loop trips in all" if trips else ""
    return FirFault(
        f"kernel '{program.name}' at node {program.node}: the GPU driver ended lane {lane}'s "
        f"loop at {where} before its {count} trips{ran} (a driver limit: Mesa's "
        "llvmpipe/lavapipe ends every loop of an invocation once its loops have run 65535 "
        "trips in all); its result would be wrong, so the run stops here (the reference "
        f"engines have no such limit){more}",
        op.loc, kernel=program.name, node=str(program.node), lane=lane, pc=op.pc)
