"""Arena, unrolled node plan, ext ops, decode step, event hooks."""
from .machine import Hooks, Machine, StepResult

__all__ = ["Hooks", "Machine", "StepResult"]
