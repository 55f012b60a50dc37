"""The key table: one place for bindings, the footer, the help screen and the README.

Every key the app answers is a :class:`Key` row here, including the ones a
pane binds for itself (``=`` and ``h`` on a buffer element, arrows in a
pane): the help screen and the README's key table are generated from this
list, so a key cannot exist without being documented.
"""
from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True)
class Key:
    keys: str  # Textual key names, comma-separated
    action: str | None  # the app action, or None when a pane binds the key itself
    label: str  # footer label
    help: str
    footer: bool = False  # shown in the footer (kept short so 80 columns hold help and quit)


KEYS: tuple[Key, ...] = (
    Key("f5,c", "move('continue')", "cont", "continue to the next breakpoint or the end", True),
    Key("f10,n", "move('next')", "next", "run the current node, stop before the next", True),
    Key("f11,s", "move('stepi')", "step", "execute one instruction (all active lanes)", True),
    Key("shift+f11,f", "move('finish')", "finish",
        "finish the kernel (between nodes: the token)"),
    Key("f9,b", "toggle_break", "break", "toggle a breakpoint at the cursor (node or kernel line)",
        True),
    Key("r", "move('reverse-stepi')", "rev", "reverse-stepi: undo one instruction", True),
    Key("shift+f10,R", "move('reverse-next')", "rev next", "reverse-next: undo one node"),
    Key("t", "move('token')", "token", "run to the start of the next token", True),
    Key("g", "goto", "goto", "go to the node under the cursor (or a named node)"),
    Key("l", "lane", "lane", "choose the focused lane"),
    Key("left_square_bracket", "lane_step(-1)", "lane-", "focus the previous lane"),
    Key("right_square_bracket", "lane_step(1)", "lane+", "focus the next lane"),
    Key("equals_sign", None, "set", "on a buffer element or a register: edit it in place (set)"),
    Key("h", None, "history", "on a buffer element: every write to it; Enter on one goes there"),
    Key("d", "display", "display", "add an expression to the watch list (display EXPR)"),
    Key("1", "tab('buffers')", "buffers",
        "Buffers tab (the next node's inputs); with the tab showing: type any buffer's name"),
    Key("2", "tab('attention')", "attention", "Attention tab"),
    Key("3", "tab('profile')", "profile", "Profile tab"),
    Key("4", "tab('console')", "console", "Console tab: focuses its input (escape leaves it)"),
    Key("5", "tab('lens')", "lens", "Lens tab: top-5 next tokens after each layer"),
    Key("6", "tab('regs')", "regs", "Registers tab (narrow terminals)"),
    Key("7", "tab('diff')", "diff", "Diff tab: this run against a dump (--against)"),
    Key("tab,shift+tab", None, "focus", "move focus between panes"),
    Key("m", "maximize_focused", "max", "maximize the focused pane (m again restores)"),
    Key("p", "quant", "quant err", "measure quantization error (q4 vs f32) for tokens so far"),
    Key("G", "gpu_cost", "GPU cost", "predict this step's time per node on a GPU (--device)"),
    Key("e", "export", "export", "export the profiling report (asks where; escape cancels)"),
    Key("E", "edit_kernel", "edit kernel",
        "edit the current node's kernel in place: ctrl+s assembles and replays it on this "
        "node's inputs (A/B; ctrl+g: every node running it), ctrl+t applies, ctrl+b "
        "toggles A/B, ctrl+r reverts, ctrl+e opens $EDITOR, ctrl+o writes the .fir"),
    Key("f2", "reload", "reload", "reload the model file, keeping breakpoints, displays and place"),
    Key("escape", "interrupt", "stop", "interrupt a run or an export; leave an input"),
    Key("ctrl+p", "command_palette", "palette", "command palette: every debugger command"),
    Key("question_mark", "help", "help", "this help", True),
    Key("q,ctrl+q,ctrl+c", "quit", "quit",
        "quit (asks first: q again; s saves the breakpoints first)", True),
)

# The source pane's gutter, left to right, as the help screen explains it. The cost rows
# appear once a GPU prediction exists (key G or --device; firscope cost's per-line figures).
GUTTER: tuple[tuple[str, str], ...] = (
    ("●  !", "a breakpoint; a line a sanitizer finding involves"),
    ("≠  ◌", "GPU prediction: the line wastes most of each sector (below 50% coalesced); "
             "most SIMD lanes idle when it issues (below 50% SIMD efficiency)"),
    ("▶  ▷", "the pc; the first line of the next node's kernel"),
    ("▁ … █", "GPU prediction: the line's share of its kernel's predicted time, scaled to "
              "the kernel's largest (█)"),
    ("×N", "times the line ran in this run (where the width allows)"),
    ("42% 100% 1.0", "GPU prediction, where the width allows: share of the kernel's "
                     "predicted time, active lanes per execution, sectors per memory request"),
)

_NAMES = {"question_mark": "?", "left_square_bracket": "[", "right_square_bracket": "]",
          "equals_sign": "=", "escape": "escape"}


def shown(keys: str) -> str:
    """``f5,c`` -> ``F5 / c`` as the help screen and README show it."""
    out = []
    for k in keys.split(","):
        k = _NAMES.get(k, k)
        if k[:1] == "f" and k[1:].isdigit():
            k = k.upper()
        elif k.startswith("shift+f") and k[7:].isdigit():
            k = "shift+F" + k[7:]
        out.append(k)
    return " / ".join(out)


def bindings() -> list[Binding]:
    """App-level bindings (rows a pane binds for itself are documentation only)."""
    out = []
    for key in KEYS:
        if key.action is None or key.action == "command_palette":
            continue
        plain = ",".join(k for k in key.keys.split(",") if not k.startswith("ctrl+"))
        ctrl = ",".join(k for k in key.keys.split(",") if k.startswith("ctrl+"))
        if plain:
            out.append(Binding(plain, key.action, key.label, show=key.footer))
        if ctrl:  # ctrl keys act even while an input has focus
            out.append(Binding(ctrl, key.action, key.label, show=False, priority=True))
    return out


def rows() -> list[tuple[str, str]]:
    return [(shown(k.keys), k.help) for k in KEYS]


def markdown_table() -> str:
    """The README's key table, generated from :data:`KEYS`."""
    lines = ["| keys | action |", "|---|---|"]
    lines += [f"| {k.replace('|', '/')} | {h} |" for k, h in rows()]
    return "\n".join(lines)
