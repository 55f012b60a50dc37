"""Command palette: every debugger command, run through the same interpreter.

Each concrete command form is its own entry (``info breakpoints``, ``lens
--all``, ``reverse-next``): Enter runs it. A command that needs an argument
(``break LOCATION``) is a template entry: Enter puts its name into the
console input with the cursor at the end, ready for the argument.
"""
from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

# Forms that take no argument, or an optional one, and are useful bare.
EXTRA_FORMS = ("lens --all", "break nan", "info lanes", "undisplay", "delete")


def concrete_forms(table) -> list[tuple[str, str]]:
    """(command line, help) for every form that runs as it is (each info topic is one)."""
    out = []
    for cmd in table:
        name = cmd.names[0]
        if cmd.topics:
            for topic in cmd.topics:
                word = topic.names[0]
                out.append((f"info {word}", f"show state: {word}"))
            continue
        rest = cmd.usage[len(name):].strip()
        if not rest or rest.startswith("["):  # no argument, or only optional ones
            out.append((name, cmd.help))
    for form in EXTRA_FORMS:
        if form not in dict(out):
            word = form.split()[0]
            help_text = next((c.help for c in table if c.names[0] == word), "")
            out.append((form, help_text))
    return out


def templates(table) -> list[tuple[str, str, str]]:
    """(usage, prefill, help) for commands that need an argument."""
    out = []
    for cmd in table:
        name = cmd.names[0]
        rest = cmd.usage[len(name):].strip()
        if rest and not rest.startswith("[") and not cmd.topics:
            out.append((cmd.usage, name + " ", cmd.help))
    return out


class DebuggerCommands(Provider):
    async def discover(self) -> Hits:
        interp = getattr(self.app, "ci", None)
        if interp is None:
            return
        for line, help_text in concrete_forms(interp.table):
            yield DiscoveryHit(line, partial(self.app.run_command, line), help=help_text)

    async def search(self, query: str) -> Hits:
        app = self.app
        interp = getattr(app, "ci", None)
        if interp is None:
            return
        matcher = self.matcher(query)
        typed = query.strip()
        forms = concrete_forms(interp.table)
        if typed in dict(forms):
            yield Hit(1.0, typed, partial(app.run_command, typed), help=dict(forms)[typed])
        elif interp.command_for(typed) is not None and " " in typed:
            cmd = interp.command_for(typed)
            yield Hit(1.0, f"run: {typed}", partial(app.run_command, typed),
                      help=f"{cmd.usage} — {cmd.help}")
        for line, help_text in forms:
            score = matcher.match(line)
            if score > 0 and line != typed:
                yield Hit(score * 0.95, matcher.highlight(line), partial(app.run_command, line),
                          help=help_text)
        for usage, prefill, help_text in templates(interp.table):
            score = matcher.match(usage)
            if score > 0:
                yield Hit(score * 0.9, matcher.highlight(usage),
                          partial(app.prefill_console, prefill), help=help_text)
