"""Console: gdb commands typed into the UI, with their output (the batch-mode table).

The log wraps and keeps the whole session; the input has gdb's history
(up/down) and completion of command, buffer and weight names (Tab).
"""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, RichLog

from ..text import printable


def complete(text: str, words: list[str]) -> tuple[str, list[str]]:
    """Complete the last word of ``text``: (new text, the candidates when ambiguous)."""
    head, _, last = text.rpartition(" ")
    prefix = head + " " if head else ""
    stem = last
    cut = max(stem.rfind(c) for c in "([,+-*/ ")  # inside an expression: complete the name
    before, stem = stem[: cut + 1], stem[cut + 1:]
    found = sorted({w for w in words if w.startswith(stem)})
    if not found:
        return text, []
    if len(found) == 1:
        return prefix + before + found[0] + ("" if before else " "), []
    common = found[0]
    for w in found[1:]:
        while not w.startswith(common):
            common = common[:-1]
    return prefix + before + common, found


def completion_words(ci, model) -> list[str]:
    """Command names, info topics, buffer, weight and node names: what Tab completes."""
    names = set(ci.by_name) | set(model.buffers) | {w.decl for w in model.weights.values()}
    names |= {n.full_name for n in model.nodes} | {n.name for n in model.nodes}
    names |= {t.names[0] for c in ci.table for t in c.topics}
    names |= {"nan", "race", "uninit", "token", "--all", "--weight"}
    return sorted(names)


class CommandInput(Input):
    """The console's input: up/down walk the history, Tab completes."""

    BINDINGS = [Binding("up", "history(-1)", show=False), Binding("down", "history(1)", show=False),
                Binding("tab", "complete", show=False, priority=True),
                Binding("escape", "app.interrupt", "leave input", show=True)]

    def __init__(self, *args, **kw):
        kw.setdefault("select_on_focus", False)  # a prefilled command is extended, not replaced
        super().__init__(*args, **kw)
        self.history: list[str] = []
        self.at = 0
        self.words: list[str] = []

    def remember(self, line: str) -> None:
        if line and (not self.history or self.history[-1] != line):
            self.history.append(line)
        self.at = len(self.history)

    def action_history(self, delta: int) -> None:
        if not self.history:
            return
        self.at = min(max(self.at + delta, 0), len(self.history))
        self.value = self.history[self.at] if self.at < len(self.history) else ""
        self.cursor_position = len(self.value)

    def action_complete(self) -> None:
        new, choices = complete(self.value, self.words)
        self.value = new
        self.cursor_position = len(new)
        if choices:
            console = next(a for a in self.ancestors if isinstance(a, ConsoleView))
            console.write("  ".join(choices[:60]) + (" …" if len(choices) > 60 else ""), "dim")


class ConsoleLog(RichLog):
    """The log, wrapped at the width it has now: what was written while the tab was hidden
    (width 0) waits for it to be shown, and a new width re-wraps every line."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.texts: list[Text] = []
        self._written = 0  # texts[:_written] are in the log, wrapped at _width
        self._width = 0

    def add(self, text: Text) -> None:
        self.texts.append(text)
        self._catch_up()

    def _catch_up(self) -> None:
        width = self.scrollable_content_region.width
        if width <= 0 or not self._size_known:
            return  # hidden: wrapped once it is shown
        if width != self._width:
            self.clear()
            self._written, self._width = 0, width
        for t in self.texts[self._written:]:
            self.write(t, width=width)  # not the app console's width: this log's
        self._written = len(self.texts)

    def on_resize(self, event) -> None:
        self.call_after_refresh(self._catch_up)


class ConsoleView(Vertical):
    DEFAULT_CSS = """
    ConsoleView RichLog { height: 1fr; }
    ConsoleView CommandInput { height: 3; }
    """

    @dataclass
    class Command(Message):
        text: str

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.lines: list[str] = []  # everything written, also while the tab is hidden

    def compose(self) -> ComposeResult:
        yield ConsoleLog(id="console-log", wrap=True, markup=False, highlight=False, max_lines=None,
                      min_width=20)
        yield CommandInput(placeholder="gdb command: break attention@1, print max(abs(x)) "
                           "(Tab completes, ↑/↓ history, escape leaves)", id="console-input")

    @property
    def history(self) -> list[str]:
        return self.lines

    def set_words(self, words: list[str]) -> None:
        self.query_one(CommandInput).words = words

    def write(self, text: str, style: str | None = None) -> None:
        self.lines.append(text)
        self.query_one(ConsoleLog).add(Text(printable(text, newlines=True), style=style or ""))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "console-input":
            return
        event.stop()
        text = event.value.strip()
        event.input.value = ""
        self.query_one(CommandInput).remember(text)
        if text:
            self.write(f"(firscope) {text}", "bold")
            self.post_message(self.Command(text))
