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
from .collect import Profiler, find_attention_sites, preserved_state, run_instrumented
from .data import (ActivationError, AttentionMaps, AttentionSite, InstructionProfile, LogitStats,
                   NodeInfo, ProfileData, QuantComparison, TimingRow, TimingStats, TokenTiming,
                   WeightStats, timing_stats)
from .quant import compare_run, logit_stats, weight_stats

_REPORT = ("profile_model", "complete_profile", "write_report", "report_dict")

__all__ = ["Profiler", "find_attention_sites", "preserved_state", "run_instrumented",
           "ActivationError", "AttentionMaps", "AttentionSite", "InstructionProfile",
           "LogitStats", "NodeInfo", "ProfileData", "QuantComparison", "TimingRow",
           "TimingStats", "TokenTiming", "WeightStats", "timing_stats", "compare_run",
           "logit_stats", "weight_stats", *_REPORT]


def __getattr__(name):  # the report half: load it only when asked
    if name in _REPORT:
        from . import report
        return getattr(report, name)
    raise AttributeError(name)
