"""What the debugger's looking commands print: where, list, info ..., values, stats.

Plain functions of a :class:`~firscope.debug.commands.CommandInterpreter`
(the session and the focused lane), so the command table stays a table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import FirError
from . import diverge
from .resolver import parse_register
from .snapshot import token_range
from ..runtime import NodeKind


def where(ci) -> str:
    s = ci.s
    if s.finished:
        return f"[finished after {s.step} steps]"
    loc = s.location()
    node = s.node
    out = []
    frame = 0
    d = s.dispatch
    if d is not None and not d.done:
        nest = " ".join(f"{f.kind}@{d.ops[f.pc].loc.line}" +
                        (f"#{f.trips}" if f.kind == "for" else "") for f in d.stack)
        from .kernel_edits import source_name
        out.append(f"#{frame}  {loc.kernel} pc {loc.pc} at {source_name(s, loc.kernel)}:"
                   f"{loc.line}  "
                   f"lane {ci.lane} of {d.lanes} ({int(d.mask.sum())} active)"
                   + (f"  in {nest}" if nest else ""))
        frame += 1
    out.append(f"#{frame}  node {loc.node} ({node.kind} {node.target}), node "
               f"{loc.node_index + 1} of {len(s.nodes)}")
    out.append(f"#{frame + 1}  token {loc.step} {ci.token_text(loc.token)} at position "
               f"{loc.position} (of tokens {token_range(s.total_steps)})")
    return "\n".join(out)

def listing(ci) -> str:
    s = ci.s
    node = s.node
    if node is None or node.kind != NodeKind.MICRO:
        raise FirError("not at a kernel")
    syntax = node.program.kernel.syntax
    from ..runtime.load import kernel_source
    text = kernel_source(s.model, syntax)  # an edited kernel: the edit's own lines
    loc = s.location()
    cur = loc.line or syntax.loc.line  # a kernel without instructions: its header
    lo = max(syntax.loc.line, cur - 5)
    hi = min(syntax.end.line, cur + 5)
    bps = s.breakpoints.lines(node.target)
    edits = getattr(s, "kernel_edits", None)
    if edits is not None:
        bps = edits.map_lines(node.target, bps)
    out = []
    for ln in range(lo, hi + 1):
        mark = ("●" if ln in bps else " ") + ("▶" if ln == cur and s.dispatch else " ")
        out.append(f"{mark}{ln:5d}  {text.get(ln, '')}")
    return "\n".join(out)


def info_display(ci) -> str:
    if not ci.displays:
        return "There are no auto-display expressions now."
    vals = ci.display_values()
    return "Auto-display expressions now in effect:\n" + "\n".join(
        f"{v.number}:   {v.expr} = {v.text}" for v in vals)


def info_patches(ci) -> str:
    patches = list(ci.s.patches)
    if not patches:
        return "No patches."
    return "Num What (made at)\n" + "\n".join(p.describe() for p in patches)

def info_checkpoints(ci) -> str:
    return ci.checkpoints.describe()


def info_registers(ci) -> str:
    s = ci.s
    d = s.dispatch
    if d is None:
        raise FirError("no kernel is running (use stepi to enter a micro node)")
    if d.lanes == 0:
        raise FirError("this dispatch has no lanes: there are no registers")
    snap = ci.last
    lane = ci.lane
    changed = snap.lane.changed if snap.lane is not None and snap.lane.lane == lane \
        else frozenset()
    out = [f"lane {lane} of {d.lanes} ({'active' if d.mask[lane] else 'inactive'}), "
           f"pc {d.pc}"]
    for i in range(32):
        r = d.R[i, lane]
        u = d.U[i, lane]
        cr = "*" if ("R", i) in changed else " "
        cu = "*" if ("U", i) in changed else " "
        out.append(f"R{i:<3}{float(r):>16.8g}{cr}   U{i:<3}{int(u):>12}{cu}")
    out.append(CHANGED_LEGEND)
    return "\n".join(out)

CHANGED_LEGEND = "* changed since the last stop (or since the kernel started)"


def info_lanes(ci, reg: str | None) -> str:
    s = ci.s
    d = s.dispatch
    if d is None:
        raise FirError("no kernel is running")
    mask = "".join("■" if m else "□" for m in d.mask[:256])
    out = [f"{d.lanes} lanes, {int(d.mask.sum())} active: {mask}"
           + ("..." if d.lanes > 256 else "")]
    if reg:
        parsed = parse_register(reg)
        if parsed is None:
            raise FirError(f"expected a register like R3 or U5, found {reg!r}")
        if parsed != ci.register:
            ci.set_register(*parsed)
        across = ci.last.across
        file, i = parsed
        vals = d.R[i] if file == "R" else d.U[i]
        for lane in range(min(d.lanes, 256)):
            mark = "*" if across is not None and across.changed[lane] else " "
            act = "■" if d.mask[lane] else "□"
            v = f"{float(vals[lane]):.8g}" if file == "R" else str(int(vals[lane]))
            focus = "  <- focused" if lane == ci.lane else ""
            out.append(f"  lane {lane:<5}{act} {reg} = {v}{mark}{focus}")
        out.append("  ■ active, □ masked off; " + CHANGED_LEGEND)
    return "\n".join(out)

def info_breakpoints(ci) -> str:
    bps = list(ci.s.breakpoints)
    if not bps:
        return "No breakpoints or watchpoints."
    out = ["Num Type       Disp Enb What"]
    out += [bp.describe() for bp in bps]
    return "\n".join(out)

def info_node(ci) -> str:
    s = ci.s
    node = s.node
    if node is None:
        return "finished"
    out = [f"node {node.full_name}: {node.kind} {node.target}  ({s.model.path.name}:"
           f"{node.loc.line})"]
    for i, o in enumerate(node.args):
        label = f"in{i}" if node.kind == NodeKind.MICRO else f"arg{i}"
        out.append(f"  {label:<5} {o.display:<16} {o.kind:<7} {o.size} elements")
    for i, o in enumerate(node.outs):
        out.append(f"  out{i:<2} {o.display:<16} {o.kind:<7} {o.size} elements")
    if node.kind == NodeKind.MICRO:
        out.append(f"  threads {node.program.threads}, {len(node.program.ops)} instructions")
    t = s.node_times.get(node.index)
    if t is not None:
        out.append(f"  last run: {t * 1e3:.3f} ms")
    return "\n".join(out)

def info_cost(ci, device: str | None) -> str:
    """``info cost [DEVICE]``: what the current node would cost on a GPU, counted from a run
    of it on a copy of the arena as it is now (firscope/cost)."""
    from ..cost import analyse_node, find_device
    from ..cost.render import node_text
    s = ci.s
    node = s.node
    if node is None:
        return "finished: no node to cost"
    dev = find_device(device or None)
    nc = analyse_node(s.model, node, dev, s.arena)
    where = "(this node's inputs as they are now)"
    if s.dispatch is not None:
        where = "(counted from its start on a copy; the live dispatch is part-way through)"
    return node_text(nc, dev, where=where)


def fmt_scalar(v, digits: int = 9) -> str:
    """One number as every front end prints it: ``true``/``false``, an integer as it is, a
    float with ``digits`` significant digits (9 give an f32 back exactly; the registers pane
    shows 6), ``nan``/``inf``/``-inf`` as Python spells them."""
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v)).lower()
    if isinstance(v, (np.integer, int)):
        return str(int(v))
    return f"{float(v):.{digits}g}"


def fmt_value(v) -> str:
    if isinstance(v, np.ndarray):
        return fmt_array(v)
    if isinstance(v, (np.floating, float, np.bool_, bool)):
        return fmt_scalar(v)
    return str(v)


def fmt_array(a: np.ndarray) -> str:
    a = np.asarray(a)
    with np.printoptions(precision=6, threshold=64, edgeitems=8, linewidth=100,
                         suppress=False):
        body = np.array2string(a, separator=", ")
    return body if a.ndim == 0 else f"{body}  (shape {list(a.shape)})"


def format_stats(name: str, a: np.ndarray) -> str:
    a = np.asarray(a, dtype=np.float64)
    finite = a[np.isfinite(a)]
    nan = int(np.isnan(a).sum())
    inf = int(np.isinf(a).sum())
    if finite.size == 0:
        return f"{name}: shape {list(a.shape)}, no finite values (NaN {nan}, Inf {inf})"
    return (f"{name}: shape {list(a.shape)}  min {finite.min():.6g}  max {finite.max():.6g}  "
            f"mean {finite.mean():.6g}  std {finite.std():.6g}  NaN {nan}  Inf {inf}")


@dataclass(frozen=True)
class InfoTopic:
    """One ``info`` topic: its names (the first is the one shown; the rest are aliases), the
    argument it takes, and its handler (``fn(interpreter, arg) -> text``). The usage line,
    Tab completion and the palette read :data:`TOPICS`."""

    names: tuple[str, ...]
    argument: str  # "" or "[REG]", as the usage line shows it
    fn: Callable[[object, str], str]

    @property
    def usage(self) -> str:
        return f"{self.names[0]} {self.argument}".strip()


TOPICS = (
    InfoTopic(("registers", "reg", "r"), "", lambda ci, arg: info_registers(ci)),
    InfoTopic(("breakpoints", "break", "b"), "", lambda ci, arg: info_breakpoints(ci)),
    InfoTopic(("watch", "watchpoints"), "", lambda ci, arg: info_breakpoints(ci)),
    InfoTopic(("lanes", "lane"), "[REG]", lambda ci, arg: info_lanes(ci, arg or None)),
    InfoTopic(("node", "n"), "", lambda ci, arg: info_node(ci)),
    InfoTopic(("patches", "patch", "set"), "", lambda ci, arg: info_patches(ci)),
    InfoTopic(("display", "displays"), "", lambda ci, arg: info_display(ci)),
    InfoTopic(("checkpoints", "checkpoint"), "", lambda ci, arg: info_checkpoints(ci)),
    InfoTopic(("diff",), "[STEP]", diverge.info_diff),
    InfoTopic(("cost",), "[DEVICE]", info_cost),
)
