"""The key table: one place for bindings, the footer and the help screen."""
from __future__ import annotations

from textual.binding import Binding

# (keys, action, footer label, help text)
KEYS = [
    ("f5,c", "cont", "continue", "continue to the next breakpoint or the end"),
    ("f10,n", "next", "next", "run the current node, stop before the next"),
    ("f11,s", "stepi", "step", "execute one instruction (all active lanes)"),
    ("shift+f11,f", "finish", "finish", "finish the kernel (between nodes: the token)"),
    ("f9,b", "toggle_break", "break", "toggle a breakpoint at the cursor (node or kernel line)"),
    ("r", "reverse_stepi", "reverse", "reverse-stepi: undo one instruction"),
    ("shift+f10,R", "reverse_next", "rev next", "reverse-next: undo one node"),
    ("l", "lane", "lane", "choose the focused lane"),
    ("g", "goto", "goto", "go to the node under the cursor (or a named node)"),
    ("t", "token", "token", "run to the start of the next token"),
    ("e", "export", "export", "export the profiling report for this session"),
    ("p", "quant", "quant err", "measure quantization error (q4 vs f32) for tokens so far"),
    ("escape", "interrupt", "stop", "interrupt a long run"),
    ("f2", "reload", "reload", "reload the model file from disk"),
    ("question_mark", "help", "help", "this help"),
    ("q", "quit", "quit", "quit"),
]

SHOWN_IN_FOOTER = {"cont", "next", "stepi", "finish", "toggle_break", "reverse_stepi", "lane",
                   "token", "export", "help", "quit"}


def bindings() -> list[Binding]:
    return [Binding(keys, action, label, show=action in SHOWN_IN_FOOTER)
            for keys, action, label, _ in KEYS]
