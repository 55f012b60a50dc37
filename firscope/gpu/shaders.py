"""WGSL for the ext ops (fir.embedding, fir.linear, fir.linear_t), so a whole decode step
runs on the GPU with the arena resident there.

Each shader is a body written over named **roles** (``{out}``, ``{w}``, ...), not over
fixed bindings: the arena lies in pages and split tables (gpu/layout), so which
buffer a role reads depends on the node. :func:`compose` declares the bindings a
node needs and names each role's buffer: binding 1 is the node's params (u32),
2 the fault buffer (the layout of vm/wgsl), the role written first is binding 0
and the other buffers follow from 3. Two roles in one buffer share its binding
(declared ``read_write`` when either writes). ``xs`` is a copy of ``x`` (a
linear may write over its input: the reference reads x in full first).

Sums run in a fixed order that is not the reference's (a workgroup of
:data:`ROW_LANES` strides over a row, then a tree): docs/gpu-engine.md gives the
tolerance.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..vm.wgsl import F_EMBED

ROW_LANES = 64  # lanes of one output row's workgroup
COL_LANES = 64  # outputs per workgroup of the Conv1D (column) product
PARAMS_BINDING, FAULTS_BINDING, FIRST_EXTRA = 1, 2, 3


@dataclass(frozen=True)
class Role:
    name: str
    element: str = "f32"  # the WGSL element type
    writes: bool = False


@dataclass(frozen=True)
class ExtShader:
    roles: tuple[Role, ...]  # the first is the one written (binding 0)
    body: str  # WGSL with {role} placeholders

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)


_COMMON = f"""\
@group(0) @binding({PARAMS_BINDING}) var<storage, read> p: array<u32>;
@group(0) @binding({FAULTS_BINDING}) var<storage, read_write> faults: array<atomic<u32>>;
"""

# params: cols, node, ids base, table base, table rows (all chunks), out base, the chunk's
# first row, its rows, whether this dispatch reports a bad id (the first chunk's only)
EMBEDDING = ExtShader((Role("out", writes=True), Role("ids"), Role("tbl")), f"""
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {{{{
    let j = gid.x + gid.y * groups.x * 64u;
    if (j >= p[0]) {{{{ return; }}}}
    let raw = {{ids}}[p[2]];
    let bits = bitcast<u32>(raw);
    if ((bits & 0x7f800000u) == 0x7f800000u || !(raw >= 0.0) || u32(raw) >= p[4]) {{{{
        if (p[8] != 0u && j == 0u && atomicAdd(&faults[0], 1u) == 0u) {{{{
            atomicStore(&faults[1], p[1]);
            atomicStore(&faults[3], {F_EMBED}u);
            atomicStore(&faults[5], bits);
        }}}}
        return;
    }}}}
    let row = u32(raw);
    if (row < p[6] || row - p[6] >= p[7]) {{{{ return; }}}}
    {{out}}[p[5] + j] = {{tbl}}[p[3] + (row - p[6]) * p[0] + j];
}}}}
""")

_ROW_SUM = """
var<workgroup> part: array<f32, {lanes}>;
{extra}
// params: rows, node, cols, y base, w base, (q4: unused, bytes per row, groups per row; the
// group size is a constant of the text)
@compute @workgroup_size({lanes})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(num_workgroups) groups: vec3<u32>) {{{{
    let r = wid.x + wid.y * groups.x;
    let cols = p[2];
    var acc: f32 = 0.0;
    if (r < p[0]) {{{{
        for (var c: u32 = lid; c < cols; c = c + {lanes}u) {{{{
            acc = acc + {weight} * {{xs}}[c];
        }}}}
    }}}}
    part[lid] = acc;
    workgroupBarrier();
    for (var s: u32 = {lanes}u / 2u; s > 0u; s = s / 2u) {{{{
        if (lid < s) {{{{ part[lid] = part[lid] + part[lid + s]; }}}}
        workgroupBarrier();
    }}}}
    if (lid == 0u && r < p[0]) {{{{ {{y}}[p[3] + r] = part[0]; }}}}
}}}}
"""

# inserted as it is by _ROW_SUM's format: its braces stay doubled for compose's
_Q4 = """
fn q4_weight(r: u32, c: u32) -> f32 {{
    let b = r * p[6] + c / 2u;
    let q = ({packed}[b / 4u] >> ((b % 4u) * 8u + (c % 2u) * 4u)) & 15u;
    let g = r * p[7] + c / {group}u;
    return f32(q) * {scale}[g] + {minimum}[g];
}}
"""

# y = W x for W [rows, cols] row-major: in the arena, a table's chunk, or an f32 [out, in]
# matrix beside the arena
ROWS = ExtShader((Role("y", writes=True), Role("xs"), Role("w")), _ROW_SUM.format(
    lanes=ROW_LANES, extra="", weight="{w}[p[4] + r * cols + c]"))
# the same from q4's packed codes
ROWS_Q4 = ExtShader(
    (Role("y", writes=True), Role("xs"), Role("packed", "u32"), Role("scale"),
     Role("minimum")),
    _ROW_SUM.format(lanes=ROW_LANES, extra=_Q4, weight="q4_weight(r, c)"))

# the same a packed u32 word (8 codes) at a time, when rows and groups are whole words:
# one load of codes, scale and minimum per 8 weights instead of three per weight
_Q4_WORDS = """
var<workgroup> part: array<f32, {lanes}>;

// params: rows, node, cols, y base, 0, (unused), bytes per row, groups per row
@compute @workgroup_size({lanes})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(num_workgroups) groups: vec3<u32>) {{{{
    let r = wid.x + wid.y * groups.x;
    var acc: f32 = 0.0;
    if (r < p[0]) {{{{
        let words = p[2] / 8u;
        let first = r * (p[6] / 4u);
        for (var w: u32 = lid; w < words; w = w + {lanes}u) {{{{
            let bits = {{packed}}[first + w];
            let c0 = w * 8u;
            let g = r * p[7] + c0 / {{group}}u;
            let s = {{scale}}[g];
            let m = {{minimum}}[g];
            for (var k: u32 = 0u; k < 8u; k = k + 1u) {{{{
                let q = (bits >> (k * 4u)) & 15u;
                acc = acc + (f32(q) * s + m) * {{xs}}[c0 + k];
            }}}}
        }}}}
    }}}}
    part[lid] = acc;
    workgroupBarrier();
    for (var t: u32 = {lanes}u / 2u; t > 0u; t = t / 2u) {{{{
        if (lid < t) {{{{ part[lid] = part[lid] + part[lid + t]; }}}}
        workgroupBarrier();
    }}}}
    if (lid == 0u && r < p[0]) {{{{ {{y}}[p[3] + r] = part[0]; }}}}
}}}}
"""
ROWS_Q4_WORDS = ExtShader(ROWS_Q4.roles, _Q4_WORDS.format(lanes=ROW_LANES))


def q4_by_words(cols: int, row_bytes: int, group: int) -> bool:
    """Whether a q4 weight's rows and groups are whole u32 words of codes (ROWS_Q4_WORDS)."""
    return cols % 8 == 0 and row_bytes % 4 == 0 and group % 8 == 0


# y = x W for W declared [in, out] (Conv1D) in the arena: one lane per output, in order
COLS = ExtShader((Role("y", writes=True), Role("xs"), Role("w")), f"""
// params: outputs, node, inputs, y base, w base
@compute @workgroup_size({COL_LANES})
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {{{{
    let j = gid.x + gid.y * groups.x * {COL_LANES}u;
    let outs = p[0];
    if (j >= outs) {{{{ return; }}}}
    var acc: f32 = 0.0;
    for (var i: u32 = 0u; i < p[2]; i = i + 1u) {{{{
        acc = acc + {{xs}}[i] * {{w}}[p[4] + i * outs + j];
    }}}}
    {{y}}[p[3] + j] = acc;
}}}}
""")

SHADERS = {"embedding": EMBEDDING, "rows": ROWS, "rows_q4": ROWS_Q4,
           "rows_q4_words": ROWS_Q4_WORDS, "cols": COLS}


def binding_of(slot: int) -> int:
    """The binding of the slot-th distinct buffer of a node: 0, then 3, 4, ..."""
    return 0 if slot == 0 else slot + FIRST_EXTRA - 1


def compose(shader: ExtShader, slots: dict[str, int],
            constants: dict[str, int] | None = None) -> tuple[str, tuple[bool, ...]]:
    """The shader's text with each role in the buffer ``slots[role]`` (0, 1, ...: distinct
    buffers in binding order), and per slot whether it is bound writable. ``constants``:
    numbers written into the text (q4's ``group``: a division by a constant is a shift or a
    multiply, where one by a parameter is a long sequence on a GPU and a scalar loop on a
    CPU's SIMD lanes)."""
    count = max(slots.values()) + 1
    writable = [False] * count
    element = ["f32"] * count
    for r in shader.roles:
        writable[slots[r.name]] |= r.writes
        element[slots[r.name]] = r.element
    names = [""] * count
    for r in shader.roles:  # a shared buffer is named after the first role in it
        names[slots[r.name]] = names[slots[r.name]] or f"{r.name}_buf"
    decls = [f"@group(0) @binding({binding_of(k)}) var<storage, "
             f"{'read_write' if writable[k] else 'read'}> {names[k]}: array<{element[k]}>;"
             for k in range(count)]
    body = shader.body.format(**{r.name: names[slots[r.name]] for r in shader.roles},
                              **(constants or {}))
    return "\n".join(decls) + "\n" + _COMMON + body, tuple(writable)


def default_text(name: str) -> str:
    """An op's shader with every role in a buffer of its own (what `firscope wgsl` prints);
    an arena-resident operand shares the arena's binding in a real node."""
    shader = SHADERS[name]
    return compose(shader, {r.name: k for k, r in enumerate(shader.roles)},
                   {"group": 32})[0]
