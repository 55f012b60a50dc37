"""Modal screens: help, and a one-line prompt (lane, node)."""
from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from .keys import KEYS


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 96; height: auto; max-height: 90%; border: thick $accent;
                            background: $surface; padding: 1 2; }
    """

    def compose(self) -> ComposeResult:
        t = Table(title="firscope keys", box=None, padding=(0, 2), title_style="bold")
        t.add_column("keys", style="bold cyan")
        t.add_column("action")
        for keys, _action, label, help_text in KEYS:
            shown = keys.replace("question_mark", "?").replace(",", " / ")
            t.add_row(shown, help_text or label)
        with Vertical():
            yield Static(t)
            yield Static("\nThe command palette (ctrl+p) and the Console tab take every batch-mode "
                         "command: break, tbreak, watch, condition, ignore, delete, continue, "
                         "stepi, next, finish, until, reverse-stepi, reverse-next, lane, print, "
                         "stats, info registers|breakpoints|lanes|node, where.\n"
                         "Press escape to close.")


class PromptScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    PromptScreen { align: center middle; }
    PromptScreen > Vertical { width: 64; height: auto; border: thick $accent; background: $surface;
                              padding: 1 2; }
    """

    def __init__(self, question: str, value: str = "") -> None:
        super().__init__()
        self.question = question
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question)
            yield Input(value=self.value, id="prompt-input")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
