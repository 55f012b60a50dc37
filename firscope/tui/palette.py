"""Command palette: every batch-mode command, run through the same interpreter."""
from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

NO_ARGS = ["continue", "next", "stepi", "finish", "token", "reverse-stepi", "reverse-next",
           "info registers", "info breakpoints", "info lanes", "info node", "where", "list",
           "delete", "break nan", "help"]


class DebuggerCommands(Provider):
    async def discover(self) -> Hits:
        app = self.app
        for cmd in NO_ARGS:
            yield DiscoveryHit(cmd, partial(app.run_command, cmd), help="debugger command")

    async def search(self, query: str) -> Hits:
        app = self.app
        interp = getattr(app, "ci", None)
        if interp is None:
            return
        matcher = self.matcher(query)
        word = query.strip().split(" ", 1)[0]
        if word in interp.by_name and query.strip():
            cmd = interp.by_name[word]
            yield Hit(1.0, f"run: {query.strip()}", partial(app.run_command, query.strip()),
                      help=f"{cmd.usage} — {cmd.help}")
        for c in interp.table:
            score = matcher.match(c.usage)
            if score > 0:
                yield Hit(score * 0.9, matcher.highlight(c.usage),
                          partial(app.prefill_console, c.names[0] + " "), help=c.help)
