"""The contract between generated kernels, their shared helpers and the runner.

Generated modules (vm/codegen), the numba helpers they call (vm/kernel_helpers)
and the runner (vm/compiled) must agree on these numbers: fault codes in a
lane's record, the control slots, the record's layout, the trip arguments,
how often a lane looks at the stop flag, and each driver's arguments with
the numba type it is compiled for. They live here, once, with no import of
numba.

numba freezes a global's value into the machine code it caches, and its cache
sees only changes to the compiled function's own file, so a cached helper or
kernel would keep old values of these after an edit here: firscope/jitcache
stamps its numba cache folder with a hash of this file (and of the helpers').
"""
from __future__ import annotations

POLL = 1 << 14  # instructions between looks at the stop flag

# Fault codes written by compiled lanes into their record row. F_JOURNAL: the store
# journal is full (the runner undoes the dispatch and runs it again with a larger one).
F_LOAD, F_STORE, F_RTOU, F_COUNT, F_OWNER, F_BUDGET, F_STOP, F_JOURNAL = 1, 2, 3, 4, 5, 6, 7, 8
# ctl slots
C_ABORT, C_EPOCH, C_FAULTED = 0, 1, 2
REC_FIXED = 4  # epoch, code, pc, arg; then one trip number per enclosing loop
TRIP_ARGS = 8  # trip numbers passed to record/tick (at most 8 loops enclose an op)
# The drivers' arguments in order, each with the numba type vm/compiled compiles it for;
# the runner passes them in this order. run_plain takes the first six and its scratch:
# ``sf`` (vm/jam's wide groups, vm/sink's saved registers) and ``si`` (vm/sink's integers).
_LANES_ARGS = (("arena", "float32[::1]"), ("bases", "int64[::1]"), ("kf", "float32[::1]"),
               ("ki", "int64[::1]"), ("l0", "int64"), ("l1", "int64"), ("budget", "int64"),
               ("ctl", "int64[::1]"), ("rec", "int64[:, ::1]"), ("frec", "float32[::1]"),
               ("stop", "int64[::1]"), ("jaddr", "int64[::1]"), ("jval", "float32[::1]"),
               ("j", "int64"), ("jend", "int64"))
_SCRATCH = (("sf", "float32[::1]"), ("si", "int64[::1]"))
# run_par (vm/kernel_helpers, one for every kernel) runs the run_plain whose machine code
# is at ``addr`` on ``parts`` ranges of lanes at once; vm/kernel_cache hands it out with
# ``addr`` bound, so that the runner calls it with run_plain's arguments and ``parts``.
DRIVERS: dict[str, tuple[tuple[str, str], ...]] = {"run_lanes": _LANES_ARGS,
                                                   "run_plain": _LANES_ARGS[:6] + _SCRATCH,
                                                   "run_par": (("addr", "int64"),)
                                                   + _LANES_ARGS[:6] + _SCRATCH
                                                   + (("parts", "int64"),)}


def driver_params(name: str) -> str:
    """The driver's parameter list, as its ``def`` line writes it."""
    return ", ".join(arg for arg, _ in DRIVERS[name])


def driver_signature(name: str) -> str:
    """The one numba signature the driver is compiled for (it returns an int64)."""
    return f"int64({', '.join(kind for _, kind in DRIVERS[name])})"
