"""Offering ``save breakpoints FILE`` when the session ends (q) or is replaced (F2).

The quit confirmation says ``s: save breakpoints first`` when the session has
breakpoints, watchpoints, catchpoints, log points or displays; ``s`` asks for a
file and writes it through the typed debugger API (an error is reported like
any command's and the app stays), then quits. A mixin of the app.
"""
from __future__ import annotations

from pathlib import Path

from .jobs import state_dir
from .screens import QuitScreen

__all__ = ["SaveActions", "default_breakpoints_file"]


def default_breakpoints_file(model_folder: str) -> Path:
    """Where ``s`` at the quit prompt offers to save (XDG state: one file per model)."""
    return state_dir() / "breakpoints" / f"{model_folder}.gdb"


class SaveActions:
    """``action_quit`` (q: confirm, with ``s`` to save first) and the reload's save note."""

    def _saveable(self) -> int:
        """How many breakpoints and displays a save would write (0 while a run is going:
        the live session is the worker's then)."""
        if self.ci is None or self.busy:
            return 0
        return len(self.ci.breakpoints) + len(self.ci.displays)

    def action_quit(self) -> None:
        if isinstance(self.screen, QuitScreen):
            self.screen.dismiss(True)
        elif self.session is None:
            self.exit()
        else:
            self.push_screen(QuitScreen(save=self._saveable() > 0), self._quit_chosen)

    def _quit_chosen(self, choice) -> None:
        if choice == "save":
            self._save_then_quit()
        elif choice:
            self._quit()

    def _save_then_quit(self) -> None:
        default = default_breakpoints_file(self.model.name)
        ci = self.ci

        def chosen(value: str) -> None:
            path = Path(value.strip()).expanduser()
            if path == default:  # the offered folder may not exist yet; one typed must
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError:
                    pass  # the save below says why it cannot write
            self.call(f"save breakpoints {path}", lambda: ci.save_breakpoints(path),
                      then=lambda out: self._quit(message=out))

        self._ask("save breakpoints, then quit (source FILE reads them back):", str(default),
                  chosen)

    def _save_note(self, carried) -> str | None:
        """The console line after F2 when something was carried into the new session."""
        if carried is None or not (carried.breaks or carried.displays):
            return None
        return ("breakpoints and displays are carried over while firscope runs; to keep "
                "them for another session: save breakpoints FILE (then source FILE), or s "
                "at the quit prompt")
