"""firscope: a visual debugger and profiler for .fir models."""
__version__ = "0.1.0"

__all__ = ["__version__"]
