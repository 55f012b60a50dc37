"""Differential debugging: read dumps, run the reference in lockstep, find the first divergence."""
from .dumpfile import Dump, DumpEntry
from .lanes import Writer, writers
from .lockstep import DiffReport, OutputResult, run_lockstep
from .metrics import (DEFAULT_ATOL, DEFAULT_RTOL, OutputDiff, Tolerance, compare_arrays,
                      make_tolerance)
from .sources import DumpSource, Mismatch, ModelSource, Plan, Wanted, match_dump

__all__ = ["Dump", "DumpEntry", "Writer", "writers", "DiffReport", "OutputResult",
           "run_lockstep", "DEFAULT_ATOL", "DEFAULT_RTOL", "OutputDiff", "Tolerance",
           "compare_arrays", "make_tolerance", "DumpSource", "Mismatch", "ModelSource", "Plan",
           "Wanted", "match_dump"]
