"""The kernel sanitizer: races, uninitialized reads and out-of-bounds accesses (issue 15).

A sequential VM hides the bugs a kernel author cannot see: lanes that race on
shared memory give one deterministic answer here and another on a GPU, the
zeroed arena hides reads of memory nothing wrote, and the first access outside
a region ends the run. The sanitizer runs a model with every lane's every
access visible (the step interpreter), skipping what the lane analysis proves:

  sanitize_run(model, prompt, n, tools=...) -> (SanitizeReport, generated)
  Sanitizer(model, tools).attach(machine) ... .report()
  facts_of(program) -> KernelFacts          what the lane analysis proves
  DispatchChecker / Collector               one dispatch's checks; dedup
  reorder_outcome(...)                       confirm a race in other lane orders
"""
from .checker import Collector, DispatchChecker, Event, site
from .confirm import lane_orders, reorder_outcome, run_in_order
from .facts import KernelFacts, facts_of
from .findings import ALL_TOOLS, Finding, Hazard, Site, Tool, parse_tools
from .report import KernelStatus, SanitizeReport
from .runner import Sanitizer, check_dispatch, sanitize_run
from .shadow import InitShadow, RaceShadow

__all__ = ["check_dispatch", "Collector", "DispatchChecker", "Event", "site", "lane_orders",
           "reorder_outcome", "run_in_order", "KernelFacts", "facts_of", "ALL_TOOLS", "Finding", "Hazard", "Site",
           "Tool", "parse_tools", "KernelStatus", "SanitizeReport", "Sanitizer", "sanitize_run",
           "InitShadow", "RaceShadow"]
