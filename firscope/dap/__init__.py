"""Meeting users in their editor and browser: the Debug Adapter Protocol server
(``firscope dap``) over the debugger engine, and the terminal UI served to a
browser tab (``firscope serve``)."""
from .adapter import Adapter
from .server import serve_stdio, serve_tcp

__all__ = ["Adapter", "serve_stdio", "serve_tcp"]
