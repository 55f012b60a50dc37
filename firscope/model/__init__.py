"""Config checks, symbols, buffers, weights (prefix, {i}, transpose, Q4)."""
from .loader import Model, PlanNode, load_model

__all__ = ["Model", "PlanNode", "load_model"]
