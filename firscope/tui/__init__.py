"""The Textual UI: ``firscope [MODEL.fir]`` (imports textual; nothing below imports this)."""
__all__ = ["run_app", "FirscopeApp"]


def __getattr__(name):  # importing the app pulls in textual: only when asked
    if name in __all__:
        from . import app
        return getattr(app, name)
    raise AttributeError(name)
