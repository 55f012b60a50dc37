"""Arena, unrolled node plan, ext ops, decode step, event hooks."""
from .machine import Engine, Hooks, Machine, StepResult

__all__ = ["Engine", "Hooks", "Machine", "StepResult"]
