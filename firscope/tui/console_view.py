"""Console: gdb commands typed into the UI, with their output (the batch-mode table)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, RichLog

from ..text import printable


class ConsoleView(Vertical):
    DEFAULT_CSS = """
    ConsoleView RichLog { height: 1fr; }
    ConsoleView Input { height: 3; }
    """

    class Command(Message):
        def __init__(self, text: str) -> None:
            self.text = text
            super().__init__()

    def compose(self) -> ComposeResult:
        yield RichLog(id="console-log", wrap=False, markup=False, highlight=False, max_lines=2000)
        yield Input(placeholder="gdb command: break attention@1, print max(abs(x)), info lanes R3 ...",
                    id="console-input")

    def on_mount(self) -> None:
        self.history: list[str] = []  # everything written, also while the tab is hidden

    def write(self, text: str, style: str | None = None) -> None:
        from rich.text import Text
        self.history.append(text)
        del self.history[:-2000]
        self.query_one(RichLog).write(Text(printable(text, newlines=True), style=style or ""))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "console-input":
            return
        text = event.value.strip()
        event.input.value = ""
        if text:
            self.write(f"(firscope) {text}", "bold")
            self.post_message(self.Command(text))
        event.stop()
