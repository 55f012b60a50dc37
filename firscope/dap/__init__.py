"""Meeting users in their editor and browser: the Debug Adapter Protocol server
(``firscope dap``) over the debugger engine, and the terminal UI served to a
browser tab (``firscope serve``).

``Adapter`` is imported on first use: ``firscope dap`` answers ``initialize``
before the engine (NumPy, numba) is loaded."""
from .server import serve_stdio, serve_tcp

__all__ = ["Adapter", "serve_stdio", "serve_tcp"]


def __getattr__(name):
    if name == "Adapter":
        from .adapter import Adapter
        return Adapter
    raise AttributeError(name)
