"""The Profile tab's measurements and the report export (keys p and e): a mixin of the app."""
from __future__ import annotations

import threading
from pathlib import Path

from .console_view import ConsoleView
from .jobs import Job, JobProgress, default_report_dir, export_session, measure_quant
from .profile_view import ProfileView

__all__ = ["ReportActions"]


class ReportActions:
    """``action_quant`` (p: quantization error so far) and ``action_export`` (e: the report)."""

    def action_quant(self) -> None:
        if self.model is None:
            return
        if self.model.fir_f32:
            self.notify("loaded with --fir-f32: nothing is quantized", severity="warning")
            return
        s = self.session

        def measure():
            return measure_quant(s)

        def shown(out):
            self.query_one(ProfileView).set_quant(out[0], out[1])
            self.query_one(ProfileView).show(self.model, self.view)
            self.query_one(ConsoleView).write(f"quantization error measured over {out[2]} "
                                              "token(s)")

        self.query_one("#bottom").active = "profile"  # the app's tabs
        self.submit(Job("quantization error", measure, then=shown, quiet=True))

    def action_export(self) -> None:
        if self.session is None:
            return
        s, tok = self.session, self.tokenizer
        default = str(default_report_dir(self.model.name))

        def chosen(value: str) -> None:
            out = Path(value).expanduser().resolve()
            cancel = threading.Event()
            job = Job(f"export to {out}", lambda: export_session(
                s, tok, out, JobProgress(self.probe, cancel), self.device_name),
                cancel=cancel, quiet=True,
                then=lambda done: self._exported(done))
            self.submit(job)

        self._ask("export the report to folder (new, empty or a previous report):", default,
                  chosen)

    def _exported(self, done) -> None:
        self.query_one(ConsoleView).write(done.text())
        self.set_status(f"report written to {done.folder}")
        self.notify(f"report written to {done.folder}", timeout=8)
