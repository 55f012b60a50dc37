"""WGSL for the ext ops (fir.embedding, fir.linear, fir.linear_t), so a whole decode step
runs on the GPU with the arena resident there.

Bindings (every ext shader): 0 the arena, 1 the node's params (u32), 2 the fault buffer
(the layout of vm/wgsl), then per op: 3 a copy of ``x`` (a linear may write over its
input: the reference reads x in full first), 4 the weight when it is not in the arena
(an f32 ``[out, in]`` matrix, or q4's packed codes as u32), 5 and 6 q4's scales and
minimums. Sums run in a fixed order that is not the reference's (a workgroup of
:data:`ROW_LANES` strides over a row, then a tree): docs/gpu-engine.md gives the tolerance.
"""
from __future__ import annotations

from ..vm.wgsl import F_EMBED

ROW_LANES = 64  # lanes of one output row's workgroup
COL_LANES = 64  # outputs per workgroup of the Conv1D (column) product

_HEAD = """\
@group(0) @binding(0) var<storage, read_write> arena: array<f32>;
@group(0) @binding(1) var<storage, read> p: array<u32>;
@group(0) @binding(2) var<storage, read_write> faults: array<atomic<u32>>;
"""

EMBEDDING = _HEAD + f"""
// params: cols, node, ids base, table base, table rows, out base
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {{
    let j = gid.x + gid.y * groups.x * 64u;
    if (j >= p[0]) {{ return; }}
    let raw = arena[p[2]];
    let bits = bitcast<u32>(raw);
    if ((bits & 0x7f800000u) == 0x7f800000u || !(raw >= 0.0) || u32(raw) >= p[4]) {{
        if (j == 0u && atomicAdd(&faults[0], 1u) == 0u) {{
            atomicStore(&faults[1], p[1]);
            atomicStore(&faults[3], {F_EMBED}u);
            atomicStore(&faults[5], bits);
        }}
        return;
    }}
    arena[p[5] + j] = arena[p[3] + u32(raw) * p[0] + j];
}}
"""

_ROW_SUM = """
var<workgroup> part: array<f32, {lanes}>;

// params: rows, node, cols, y base, w base (arena), group, bytes per row, groups per row
@compute @workgroup_size({lanes})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(num_workgroups) groups: vec3<u32>) {{
    let r = wid.x + wid.y * groups.x;
    let cols = p[2];
    var acc: f32 = 0.0;
    if (r < p[0]) {{
        for (var c: u32 = lid; c < cols; c = c + {lanes}u) {{
            acc = acc + {weight} * xs[c];
        }}
    }}
    part[lid] = acc;
    workgroupBarrier();
    for (var s: u32 = {lanes}u / 2u; s > 0u; s = s / 2u) {{
        if (lid < s) {{ part[lid] = part[lid] + part[lid + s]; }}
        workgroupBarrier();
    }}
    if (lid == 0u && r < p[0]) {{ arena[p[3] + r] = part[0]; }}
}}
"""

_XS = "@group(0) @binding(3) var<storage, read> xs: array<f32>;\n"
_WBUF = "@group(0) @binding(4) var<storage, read> wbuf: array<f32>;\n"
_Q4 = """\
@group(0) @binding(4) var<storage, read> packed: array<u32>;
@group(0) @binding(5) var<storage, read> scale: array<f32>;
@group(0) @binding(6) var<storage, read> minimum: array<f32>;

fn q4_weight(r: u32, c: u32) -> f32 {
    let b = r * p[6] + c / 2u;
    let q = (packed[b / 4u] >> ((b % 4u) * 8u + (c % 2u) * 4u)) & 15u;
    let g = r * p[7] + c / p[5];
    return f32(q) * scale[g] + minimum[g];
}
"""

# y = W x for W [rows, cols] row-major, W in the arena (fir.linear_t on an arena weight)
ROWS_ARENA = _HEAD + _XS + _ROW_SUM.format(lanes=ROW_LANES, weight="arena[p[4] + r * cols + c]")
# the same with W in its own buffer (an f32 [out, in] matrix beside the arena)
ROWS_BUFFER = _HEAD + _XS + _WBUF + _ROW_SUM.format(lanes=ROW_LANES, weight="wbuf[r * cols + c]")
# the same from q4's packed codes
ROWS_Q4 = _HEAD + _XS + _Q4 + _ROW_SUM.format(lanes=ROW_LANES, weight="q4_weight(r, c)")

# y = x W for W declared [in, out] (Conv1D) in the arena: one lane per output, in order
COLS_ARENA = _HEAD + _XS + f"""
// params: outputs, node, inputs, y base, w base
@compute @workgroup_size({COL_LANES})
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {{
    let j = gid.x + gid.y * groups.x * {COL_LANES}u;
    let outs = p[0];
    if (j >= outs) {{ return; }}
    var acc: f32 = 0.0;
    for (var i: u32 = 0u; i < p[2]; i = i + 1u) {{
        acc = acc + xs[i] * arena[p[4] + i * outs + j];
    }}
    arena[p[3] + j] = acc;
}}
"""

# name -> (text, extra bindings after the fault buffer: kinds of 3, 4, ...)
EXT_SHADERS = {
    "embedding": (EMBEDDING, ()),
    "rows_arena": (ROWS_ARENA, ("read",)),
    "rows_buffer": (ROWS_BUFFER, ("read", "read")),
    "rows_q4": (ROWS_Q4, ("read", "read", "read", "read")),
    "cols_arena": (COLS_ARENA, ("read",)),
}
