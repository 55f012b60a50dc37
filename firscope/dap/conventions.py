"""How the client counts lines and columns and spells paths (DAP ``initialize`` arguments).

``linesStartAt1`` and ``columnsStartAt1`` default to true and ``pathFormat`` to
``"path"``; a client may ask for 0-based lines or columns and for ``file://``
URIs instead. The engine counts lines from 1 and uses native paths: every line,
column and path that crosses the wire goes through one :class:`Conventions`.
Light on purpose (no NumPy, no engine): the ``initialize`` request is answered
before anything heavy is imported.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass(frozen=True)
class Conventions:
    lines_start_at_1: bool = True
    columns_start_at_1: bool = True
    uri_paths: bool = False

    @classmethod
    def of(cls, args: dict) -> "Conventions":
        """From the ``initialize`` arguments; a value of the wrong type is the default."""
        return cls(lines_start_at_1=args.get("linesStartAt1") is not False,
                   columns_start_at_1=args.get("columnsStartAt1") is not False,
                   uri_paths=args.get("pathFormat") == "uri")

    # -- lines and columns: the engine's are 1-based ------------------------------------
    def line_out(self, line: int | None) -> int | None:
        return line if line is None or self.lines_start_at_1 else line - 1

    def line_in(self, line):
        """A client line -> the engine's (non-ints are passed through for the caller to
        refuse with its own message)."""
        if isinstance(line, bool) or not isinstance(line, int) or self.lines_start_at_1:
            return line
        return line + 1

    def column_out(self, column: int) -> int:
        return column if self.columns_start_at_1 else column - 1

    # -- paths ----------------------------------------------------------------------------
    def path_out(self, path: str) -> str:
        return Path(path).as_uri() if self.uri_paths else path

    def path_in(self, text: str) -> str:
        """A client path (or ``file://`` URI, which a client may send whatever it said) ->
        a native path."""
        if text.startswith("file:"):
            parsed = urlparse(text)
            if parsed.netloc not in ("", "localhost"):
                return text  # another host's file: never this model
            return unquote(parsed.path)
        return text

    def source(self, path: Path) -> dict:
        return {"name": path.name, "path": self.path_out(str(path))}
