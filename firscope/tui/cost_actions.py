"""The GPU prediction of the Profile tab (``--device``, key G): a mixin of the app."""
from __future__ import annotations

from .console_view import ConsoleView
from .jobs import Job, measure_cost
from .profile_view import ProfileView
from .source_pane import SourcePane, cost_lines, cost_marks


class CostActions:
    """``action_gpu_cost`` (key G) and the refresh that keeps it current with --device."""

    def action_gpu_cost(self, auto: bool = False) -> None:
        """Predict the current step's time per node on the GPU (--device, else the default)."""
        s = self.session
        if s is None:
            return
        m = s.machine
        self._cost_key = (m.position, m.current_token, len(m.history))
        device = self.device_name

        def shown(report):
            pv = self.query_one(ProfileView)
            if report is None:
                self.query_one(ConsoleView).write("GPU cost: no token has run yet")
                return
            pv.cost = report  # each redraws itself with the prediction
            pane = self.query_one(SourcePane)
            pane.set_reactive(SourcePane.cost_lines, cost_lines(report))
            pane.cost_marks = cost_marks(report)  # redraws with both

        if not auto:
            self.query_one("#bottom").active = "profile"
        self.submit(Job("GPU cost", lambda: measure_cost(s, device), then=shown, quiet=True))

    def _refresh_cost(self) -> None:
        """With --device and the Profile tab showing: predict again when the step changed."""
        s = self.session
        if self.device_name is None or s is None or self.busy or self.pending:
            return
        if self.query_one("#bottom").active != "profile":
            return
        m = s.machine
        if (m.position, m.current_token, len(m.history)) != self._cost_key:
            self.action_gpu_cost(auto=True)

