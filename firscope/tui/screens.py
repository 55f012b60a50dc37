"""Modal screens: help, a one-line prompt, an element's write history, quit confirmation."""
from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from .keys import GUTTER, rows


def help_table(commands: list[tuple[str, str]]) -> Group:
    """Every key from the key table, then every console / palette command."""
    keys = Table(title="firscope keys", box=None, padding=(0, 2), title_style="bold",
                 expand=True, title_justify="left")
    keys.add_column("keys", style="bold cyan", max_width=20)
    keys.add_column("action", ratio=1)
    for k, help_text in rows():
        keys.add_row(Text(k), Text(help_text))  # Text: no markup ([i] is not italics)
    gutter = Table(title="\nthe kernel source's gutter", box=None, padding=(0, 2),
                   title_style="bold", expand=True, title_justify="left")
    gutter.add_column("mark", style="bold dark_orange", max_width=20)
    gutter.add_column("meaning", ratio=1)
    for mark, meaning in GUTTER:
        gutter.add_row(Text(mark), Text(meaning))
    if not commands:
        return Group(keys, gutter)
    cmds = Table(title="\ncommands: the console (4) and the palette (ctrl+p) take every "
                 "batch-mode command", box=None, padding=(0, 2), title_style="bold",
                 expand=True, title_justify="left")
    cmds.add_column("command", style="green", max_width=32, overflow="fold")
    cmds.add_column("what it does", ratio=1)
    for usage, help_text in commands:
        cmds.add_row(Text(usage), Text(help_text))
    return Group(keys, gutter, cmds)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 100; max-width: 100%; height: 95%;
                                  border: thick $accent; background: $surface; padding: 0 1; }
    """

    def __init__(self, commands: list[tuple[str, str]] = ()) -> None:
        super().__init__()
        self.commands = list(commands)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(help_table(self.commands), id="help-table")
            yield Static("↑/↓ PgUp/PgDn scroll · escape closes", id="help-foot")

    def on_mount(self) -> None:
        self.query_one("#help-body").focus()


class PromptScreen(ModalScreen[str | None]):
    """A one-line box. A pre-filled value is selected, so typing replaces it (as an
    editor's rename box does) and the old value stays in view as a hint; Enter keeps it.
    Keys that arrive before the box has focus (typed right after the key that opened it)
    go into the box, in order (:meth:`type_ahead`): never to the debugger's own bindings,
    never lost."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]
    AUTO_FOCUS = "#prompt-input"
    DEFAULT_CSS = """
    PromptScreen { align: center middle; }
    PromptScreen > Vertical { width: 72; max-width: 100%; height: auto; border: thick $accent;
                              background: $surface; padding: 0 1; }
    PromptScreen #prompt-hint { color: $text-muted; }
    """

    def __init__(self, question: str, value: str = "") -> None:
        super().__init__()
        self.question = question
        self.value = value
        self._pending: list | None = []  # keys typed ahead before the box was mounted

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question)
            yield Input(value=self.value, placeholder=self.value, id="prompt-input")
            if self.value:
                yield Label(f"now {self.value}: typing replaces it, Enter keeps it",
                            id="prompt-hint")

    def on_mount(self) -> None:
        inp = self.query_one(Input)
        self.set_focus(inp)
        inp.select_all()
        pending, self._pending = self._pending, None
        for key in pending:
            self.type_ahead(key)

    def type_ahead(self, event) -> bool:
        """A key typed before the box had focus (the app hands it over, see
        FirscopeApp._on_key): a character goes into the box, replacing a selected value;
        Enter submits. False for any other key (the bindings take it)."""
        if self._pending is not None:  # not mounted yet: in order, once it is
            if event.key == "enter" or (event.is_printable and event.character):
                self._pending.append(event)
                return True
            return False
        inp = self.query_one(Input)
        if event.key == "enter":
            self.dismiss(inp.value.strip())
            return True
        if event.is_printable and event.character:
            self.set_focus(inp)
            if inp.selected_text:
                inp.delete_selection()
            inp.insert_text_at_cursor(event.character)
            return True
        return False

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)


class HistoryScreen(ModalScreen[object]):
    """Every recorded write to one element; Enter goes to the node that made it."""

    BINDINGS = [Binding("escape", "cancel", "close")]
    DEFAULT_CSS = """
    HistoryScreen { align: center middle; }
    HistoryScreen > Vertical { width: 110; max-width: 100%; height: auto; max-height: 90%;
                               border: thick $accent; background: $surface; padding: 0 1; }
    HistoryScreen OptionList { height: auto; max-height: 30; }
    """

    def __init__(self, title: str, writes: list) -> None:
        super().__init__()
        self.title_text = title
        self.writes = list(writes)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(self.title_text, style="bold"))
            if self.writes:
                yield OptionList(*[Option(f"#{i:<3} {w.describe()}", id=str(i))
                                   for i, w in enumerate(self.writes)], id="history-list")
                yield Label("Enter: go to the node that wrote it · escape closes", classes="dim")
            else:
                yield Label("no write to this element in the recorded history")

    def on_mount(self) -> None:
        for w in self.query(OptionList):
            w.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self.writes[int(event.option.id)])

    def action_cancel(self) -> None:
        self.dismiss(None)


class QuitScreen(ModalScreen[object]):
    """True: quit; "save": save the breakpoints first (offered with ``save=True``); False: stay."""

    BINDINGS = [Binding("q,y,enter", "quit", "quit"), Binding("n,escape", "stay", "stay"),
                Binding("s", "save", "save breakpoints first", show=False)]
    DEFAULT_CSS = """
    QuitScreen { align: center middle; }
    QuitScreen > Label { border: thick $warning; background: $surface; padding: 1 2; }
    """

    def __init__(self, save: bool = False) -> None:
        super().__init__()
        self.save = save

    def compose(self) -> ComposeResult:
        text = "Quit firscope?  q / y / Enter: quit · n / escape: stay"
        if self.save:
            text += "\ns: save breakpoints first (breakpoints, watchpoints, displays)"
        yield Label(text)

    def action_quit(self) -> None:
        self.dismiss(True)

    def action_stay(self) -> None:
        self.dismiss(False)

    def action_save(self) -> None:
        if self.save:
            self.dismiss("save")
