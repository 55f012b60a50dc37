"""The engines, declared once: what each one is, whether a debugger can stop inside its
kernels, and the one constructor that builds a machine for any of them
(:func:`make_machine`). The command line, the DAP launch and the Python API read
``ENGINES`` and ``STEPPING_ENGINES`` from here (through firscope.defaults), and refuse a
non-stepping engine with its own words (:func:`require_stepping`).

It imports nothing (layer 0): the command line builds its parsers from it before NumPy
loads, and each spec names the ``module:Class`` of its machine, which
:func:`make_machine` imports when it builds one (tests/test_structure.py checks each
name resolves to a Machine).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineSpec", "ENGINE_SPECS", "ENGINES", "STEPPING_ENGINES", "engine_spec",
           "machine_class", "make_machine", "require_stepping"]


@dataclass(frozen=True)
class EngineSpec:
    name: str  # what --engine takes
    summary: str
    steps: bool  # a debugger can stop at an instruction (per-instruction hooks run)
    reference: bool  # computes the reference's bits (the same on every CPU)
    machine: str  # "module:Class" of its machine, imported when one is made
    why_not: str = ""  # for an engine that cannot step: why, and what to do instead


ENGINE_SPECS: dict[str, EngineSpec] = {s.name: s for s in (
    EngineSpec("compiled", "the reference, each kernel compiled with numba", True, True,
               "firscope.runtime.machine:Machine"),
    EngineSpec("interp", "the reference's step interpreter (NumPy, lane-vectorized)", True,
               True, "firscope.runtime.machine:Machine"),
    EngineSpec("gpu", "the kernels as WGSL compute shaders through wgpu (firscope[gpu])",
               False, False, "firscope.gpu.engine:GpuMachine",
               "the GPU engine cannot stop at an instruction (a dispatch runs to its end on "
               "the device): step on the reference (--engine compiled or interp) and "
               "compare with the GPU with `firscope diff MODEL --engine gpu`"),
)}
ENGINES = tuple(ENGINE_SPECS)
STEPPING_ENGINES = tuple(n for n, s in ENGINE_SPECS.items() if s.steps)


def engine_spec(name: str) -> EngineSpec:
    spec = ENGINE_SPECS.get(str(name))
    if spec is None:
        from .errors import FirError
        raise FirError(f"unknown engine {name!r}: one of {', '.join(ENGINES)}")
    return spec


def require_stepping(name: str, where: str) -> None:
    """A FirError in the engine's own words when ``where`` (a command, 'launch') needs to
    stop inside kernels and the engine cannot."""
    spec = engine_spec(name)
    if not spec.steps:
        from .errors import FirError
        raise FirError(f"{where} --engine {name}: {spec.why_not}")


def machine_class(name: str) -> type:
    """The class that runs engine ``name`` (imported now; this module imports no engine)."""
    import importlib
    module, _, cls = engine_spec(name).machine.partition(":")
    return getattr(importlib.import_module(module), cls)


def make_machine(model, engine: str, *, hooks=None, budget=None, **options):
    """A machine running ``model`` on ``engine``: one constructor for every engine (each
    machine class takes ``engine``, ``hooks`` and ``budget``; ``options`` are its own, as
    the GPU engine's page and table caps). ``budget`` None: the default loop budget."""
    cls = machine_class(engine)
    if budget is not None:  # else the machine's own default
        options["budget"] = budget
    return cls(model, engine=engine, hooks=hooks, **options)
