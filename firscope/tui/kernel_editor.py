"""Edit a kernel where the debugger stands (key E): the kernel's text in an editor inside
the app, with the model file's line numbers; ctrl+s assembles it and replays it on the
current node's inputs (the A/B report below the text; ctrl+g: at every node that runs the
kernel, over the tokens so far), ctrl+t applies it to the session,
ctrl+r reverts an applied edit, ctrl+b toggles A/B (the model's own code or the kept edit),
ctrl+e hands the draft to ``$VISUAL``/``$EDITOR`` and reads it back when that editor exits
(and checks it), ctrl+o writes it into the model file (after a y/n prompt, keeping a
backup), escape closes the editor and keeps the draft for the next E. The setting
``FIRSCOPE_EDITOR=external`` (environment) makes E go straight to ``$EDITOR``.

An edit that does not assemble says where (line and column of the model file, the cursor
moved there) and stays open: nothing typed is lost. The engine work runs as a job (the
session's own queue); the editor never touches the session itself.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static, TextArea

from ..errors import FirError
from ..fir import syntax as S
from ..text import printable
from .console_view import ConsoleView
from .jobs import Job


def kernel_block(session, name: str) -> tuple[int, str]:
    """(first line in the model file, text) of kernel ``name`` as it runs now: the model
    file's block, or the applied edit's."""
    edits = getattr(session, "kernel_edits", None)
    original = edits.original if edits is not None else session.model
    k = next(d for d in original.fir.of(S.Kernel) if d.name.text == name)
    if edits is not None and name in edits.blocks:
        e = edits.blocks[name]
        lines = Path(edits.files[name]).read_text(encoding="utf-8").split("\n")
        return k.loc.line, "\n".join(lines[e.loc.line - 1: e.end.line])
    return k.loc.line, "\n".join(original.fir.lines[k.loc.line - 1: k.end.line])


class KernelEditScreen(ModalScreen[None]):
    # ctrl+y and ctrl+w are the text area's redo and delete-word
    BINDINGS = [Binding("ctrl+s", "check", "assemble + replay", priority=True),
                Binding("ctrl+g", "check_all", "every node", priority=True),
                Binding("ctrl+t", "apply", "apply", priority=True),
                Binding("ctrl+r", "revert", "revert", priority=True),
                Binding("ctrl+b", "toggle", "A/B", priority=True),
                Binding("ctrl+e", "external", "$EDITOR", priority=True),
                Binding("ctrl+o", "write", "write into the .fir", priority=True),
                Binding("escape", "close", "close (keeps the draft)")]
    DEFAULT_CSS = """
    KernelEditScreen { align: center middle; }
    KernelEditScreen > Vertical { width: 100%; height: 100%; border: thick $accent;
                                  background: $surface; }
    KernelEditScreen TextArea { height: 1fr; }
    KernelEditScreen #edit-result { height: auto; max-height: 40%; overflow-y: auto; }
    KernelEditScreen #edit-keys { color: $text-muted; }
    """

    def __init__(self, name: str, first_line: int, text: str, folder: Path):
        super().__init__()
        self.kernel = name
        self.first_line = first_line
        self.text = text
        self.folder = folder
        self.checked: Path | None = None  # the file of the last text that assembled

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"kernel {printable(self.kernel)} (lines from {self.first_line} of the "
                        "model file)", id="edit-title")
            yield TextArea(self.text, show_line_numbers=True,
                           line_number_start=self.first_line, id="edit-text")
            yield Static(Text("ctrl+s: assemble and replay on this node's inputs", style="dim"),
                         id="edit-result")
            yield Label("ctrl+s check · ctrl+g every node · ctrl+t apply · ctrl+b A/B · "
                        "ctrl+r revert · ctrl+e $EDITOR · ctrl+o write · esc", id="edit-keys")

    def on_mount(self) -> None:
        self.set_focus(self.query_one(TextArea))
        if os.environ.get("FIRSCOPE_EDITOR", "").strip().lower() == "external":
            self.call_after_refresh(self.action_external)

    def on_text_area_changed(self, _event) -> None:
        self.checked = None  # ctrl+t applies only what ctrl+s assembled

    @property
    def draft(self) -> str:
        return self.query_one(TextArea).text

    @property
    def file_stem(self) -> str:
        """The kernel's name as a file name: drafts are named after it, so the report,
        history and `where` name a draft by its file."""
        return re.sub(r"[^A-Za-z0-9_.-]", "_", self.kernel)

    def _file(self) -> Path:
        """The draft as a file whose lines are numbered as the model file's: an error in it
        is positioned where the user sees it."""
        f = Path(tempfile.mkstemp(prefix=f"{self.file_stem}-draft-", suffix=".fir",
                                  dir=self.folder)[1])
        f.write_text("\n" * (self.first_line - 1) + self.draft + "\n", encoding="utf-8")
        return f

    def show(self, text: Text | str, error: bool = False) -> None:
        self.query_one("#edit-result", Static).update(
            Text(text, style="bold red") if error and isinstance(text, str) else text)

    def action_check(self) -> None:
        app = self.app
        path = self._file()
        name = self.kernel

        def work():
            from ..debug.kernel_edits import preview
            return preview(app.session, name, str(path))

        def done(report):
            self.checked = path
            self.show(Text(report))

        app.submit(Job("kernel replay", work, then=done, quiet=True, on_error=self.failed))

    def action_check_all(self) -> None:
        """The same A/B at every node that runs the kernel, over the tokens so far."""
        app = self.app
        path = self._file()
        name = self.kernel

        def work():
            from ..debug.kernel_edits import preview_all
            return preview_all(app.session, name, str(path))

        def done(report):
            self.checked = path
            self.show(Text(report))

        app.submit(Job("kernel replay --all", work, then=done, quiet=True,
                       on_error=self.failed))

    def failed(self, e: FirError) -> None:
        loc = e.loc
        if loc is not None:
            self.show(f"line {loc.line}, column {loc.col}: {e.message}", error=True)
            row = loc.line - self.first_line
            if row >= 0:
                self.query_one(TextArea).move_cursor((row, max(loc.col - 1, 0)))
        else:
            self.show(e.message, error=True)

    def action_apply(self) -> None:
        if self.checked is None:
            self.show("assemble it first (ctrl+s)", error=True)
            return
        app, name, path = self.app, self.kernel, str(self.checked)
        app.submit(Job("kernel edit", lambda: app.ci.kernel_edit(name, path),
                       then=lambda text: self._said(text), quiet=True, on_error=self.failed))

    def action_revert(self) -> None:
        app, name = self.app, self.kernel
        app.submit(Job("kernel revert", lambda: app.ci.kernel_revert(name),
                       then=lambda text: self._said(text), quiet=True, on_error=self.failed))

    def action_toggle(self) -> None:
        """A/B: the model's own code or the kept edit, from now on (the edit is kept)."""
        app, name = self.app, self.kernel
        app.submit(Job("kernel toggle", lambda: app.ci.kernel_toggle(name),
                       then=lambda text: self._said(text), quiet=True, on_error=self.failed))

    def action_external(self) -> None:
        """The draft in ``$VISUAL`` or ``$EDITOR`` (the app hands it the terminal); what that
        editor saved comes back into the text area and is checked (ctrl+s)."""
        from textual.app import SuspendNotSupported
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
        if not editor:
            self.show("set $VISUAL or $EDITOR to edit in your own editor", error=True)
            return
        f = self.folder / f"{self.file_stem}.edit.fir"
        f.write_text(self.draft + "\n", encoding="utf-8")
        try:
            with self.app.suspend():
                rc = subprocess.call([*shlex.split(editor), str(f)])
        except SuspendNotSupported:
            self.show("this terminal cannot be handed to $EDITOR (in a browser tab, for "
                      "one): edit here", error=True)
            return
        except (OSError, ValueError) as e:
            self.show(f"cannot run $EDITOR ({printable(editor)}): {e}", error=True)
            return
        try:
            text = f.read_text(encoding="utf-8").rstrip("\n")
        except (OSError, UnicodeDecodeError) as e:
            self.show(f"cannot read what the editor saved ({e}): the draft here is kept",
                      error=True)
            return
        if rc != 0:
            self.show(f"$EDITOR exited with status {rc}: the draft here is kept (its file: "
                      f"{printable(str(f))})", error=True)
            return
        if text != self.draft:
            self.query_one(TextArea).load_text(text)
        self.action_check()

    def action_write(self) -> None:
        from .screens import PromptScreen
        app = self.app

        def answered(value: str | None) -> None:
            if value is None or value.strip().lower() not in ("y", "yes"):
                self.show("not written")
                return
            app.submit(Job("kernel write", lambda: app.ci.kernel_write(),
                           then=lambda text: self._said(text), quiet=True,
                           on_error=self.failed))

        app.push_screen(PromptScreen(f"write the applied edits into "
                                     f"{printable(app.model.path.name)}? A backup of the "
                                     "original is kept beside it. y/n"), answered)

    def _said(self, text: str) -> None:
        self.show(Text(text))
        self.app.query_one(ConsoleView).write(text)
        self.app.refresh_view()  # the header says which kernels are edited

    def action_close(self) -> None:
        self.app.kernel_drafts[self.kernel] = self.draft
        self.dismiss(None)


class KernelEditActions:
    """``action_edit_kernel`` (E): the editor on the current node's kernel."""

    def action_edit_kernel(self) -> None:
        s = self.session
        if s is None:
            return
        node = s.node
        if node is None or node.program is None:
            self.notify("E edits the kernel of a micro node: go to one (g)", severity="warning")
            return
        if not hasattr(self, "kernel_drafts"):
            self.kernel_drafts = {}
            self._edit_folder = Path(tempfile.mkdtemp(prefix="firscope-edits-"))
        first, text = kernel_block(s, node.target)
        text = self.kernel_drafts.get(node.target, text)
        self.push_screen(KernelEditScreen(node.target, first, text, self._edit_folder))
