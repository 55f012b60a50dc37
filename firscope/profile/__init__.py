"""Profiling, quantization error and report export.

Collect:
  Profiler(model).attach(machine) ... .data() -> ProfileData   (collect)
  run_instrumented(model, tokens) -> InstructionProfile          (collect)
  data.timing_stats(by="node"|"name") -> TimingStats             (data: min/median/p90/max,
                                                                   ranked by median x calls)
  weight_stats(model) -> [WeightStats]                           (quant)
  compare_run(model, tokens) -> QuantComparison                  (quant)
Report (figures as SVG, no plotting library):
  profile_model(model, prompt, n, ...) -> ProfileData            (report)
  complete_profile(data, model, tokens=...) -> ProfileData       (report)
  write_report(data, out_dir) -> {file name: Path}               (report)
"""
# Each name and the module it lives in, imported on first use (PEP 562): the UI imports
# firscope.profile.progress and .sites at its start, and a package that imported all of
# this eagerly took the profiler's data classes and the cost model with them (~40 ms).
_WHERE = {
    **dict.fromkeys(("Profiler", "preserved_state", "run_instrumented"), "collect"),
    "find_attention_sites": "sites", "AttentionSite": "sites",
    **dict.fromkeys(("ActivationError", "AttentionMaps", "InstructionProfile", "LogitStats",
                     "NodeInfo", "ProfileData", "QuantComparison", "TimingRow", "TimingStats",
                     "TokenTiming", "WeightStats", "timing_stats"), "data"),
    **dict.fromkeys(("compare_run", "logit_stats", "weight_stats"), "quant"),
    **dict.fromkeys(("profile_model", "complete_profile", "write_report", "report_dict"),
                    "report"),
}

__all__ = list(_WHERE)


def __getattr__(name):
    where = _WHERE.get(name)
    if where == "collect":
        from . import collect as module
    elif where == "sites":
        from . import sites as module
    elif where == "data":
        from . import data as module
    elif where == "quant":
        from . import quant as module
    elif where == "report":
        from . import report as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
