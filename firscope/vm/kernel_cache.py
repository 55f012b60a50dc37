"""The generated kernels' modules: each kernel's source (vm/codegen) written once to the
kernel cache folder (firscope/jitcache chooses it: ``$XDG_CACHE_HOME/firscope/kernels``)
as ``k<sha>.py``, imported once per process, and its drivers compiled by numba with
``cache=True`` (machine code loaded from disk by a second process) for the one
signature the runner calls them with."""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import Callable

from ..jitcache import cache_dir, file_lock, prepare_numba
from .codegen import Generated
from .kernel_abi import driver_signature

_MODULES: dict[str, object] = {}
_MODULES_LOCK = threading.RLock()


def kernel_dir() -> Path:
    """Where generated kernel sources (and numba's cache of them) live: see firscope.jitcache."""
    return cache_dir("kernels")


def load_module(gen: Generated):
    """The generated module of ``gen`` (written to the cache folder if it is not there)."""
    prepare_numba()
    with _MODULES_LOCK:
        mod = _MODULES.get(gen.sha)
        if mod is not None:
            return mod
        folder = kernel_dir()
        path = folder / f"k{gen.sha}.py"
        if not path.exists() or path.read_text() != gen.source:
            tmp = folder / f".k{gen.sha}.{os.getpid()}.tmp"
            tmp.write_text(gen.source)
            os.replace(tmp, path)  # atomic: another process may be importing it
        name = f"firscope_kernel_{gen.sha}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _MODULES[gen.sha] = mod
        return mod


def compiled_driver(gen: Generated, name: str) -> Callable:
    """The module's ``run_lanes`` or ``run_plain``, compiled (or loaded from numba's cache)
    for the one signature the runner calls it with. Processes sharing the cache folder
    compile a driver one at a time (jitcache.file_lock): the second finds the first's
    machine code in numba's cache instead of compiling the same kernel beside it (a large
    kernel takes seconds; the UI and a command line, or test workers, often start
    together)."""
    if name == "run_par":
        return threaded_driver(compiled_driver(gen, "run_plain"))
    return _compiled(getattr(load_module(gen), name), f"k{gen.sha}.{name}", name)


def _compiled(fn, key: str, name: str):
    """``fn`` compiled for driver ``name``'s signature, one process at a time (``key``
    names its lock)."""
    if not fn.signatures:
        with _MODULES_LOCK:
            if not fn.signatures:
                with file_lock(kernel_dir() / f".{key}.lock"):
                    fn.compile(driver_signature(name))
    return fn


def threaded_driver(plain) -> Callable:
    """run_par for the kernel whose run_plain is ``plain`` (compiled): the one threaded
    driver of vm/kernel_helpers, compiled once for every kernel, with that run_plain's
    machine-code address bound first (the partial keeps ``plain``, and with it the code,
    alive)."""
    from . import kernel_helpers
    par = _compiled(kernel_helpers.run_par, "run_par", "run_par")
    result = plain.overloads[plain.signatures[0]]
    addr = result.library.get_pointer_to_function(result.fndesc.llvm_func_name)
    bound = functools.partial(par, addr)
    bound.plain = plain
    return bound
