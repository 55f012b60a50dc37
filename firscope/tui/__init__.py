"""The Textual UI: ``firscope [MODEL.fir]`` (imports textual; nothing below imports this)."""
__all__ = ["run_app", "FirscopeApp"]


def __getattr__(name):  # importing the app pulls in textual: only when asked
    if name == "run_app":
        from .launch import run_app
        return run_app
    if name == "FirscopeApp":
        from .app import FirscopeApp
        return FirscopeApp
    raise AttributeError(name)
