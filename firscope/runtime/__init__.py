"""Arena, unrolled node plan, ext ops, decode step, event hooks; loading a model."""
from .load import Model, load_model
from .machine import BoundCall, Engine, Hooks, Machine, StepResult
from .plan import (NodeKind, Operand, OperandKind, PlanNode, assemble_kernels,
                   check_lane_memory, unroll_plan)

__all__ = ["BoundCall", "Engine", "Hooks", "Machine", "Model", "NodeKind", "Operand", "OperandKind",
           "PlanNode", "StepResult", "assemble_kernels", "check_lane_memory", "load_model",
           "unroll_plan"]
