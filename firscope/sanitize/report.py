"""The sanitizer's report: compute-sanitizer style text, and JSON for CI.

Every line of the text report starts with ``=========``, then each finding's
block, which kernels the lane analysis proved race-free and which were checked
at run time, and ``ERROR SUMMARY: N errors`` (N counts deduplicated findings).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..text import printable
from .findings import Finding, Tool

PREFIX = "========= "
FORMAT = "firscope-sanitize"
VERSION = 1


@dataclass(frozen=True)
class KernelStatus:
    kernel: str
    race_free: bool  # the lane analysis proves that no two lanes share a written element
    reason: str  # why it is checked at run time ('' when proven)
    memory_proven: bool  # every access proven inside its region
    nodes: int  # node instances that dispatch it


@dataclass(frozen=True)
class SanitizeReport:
    tools: tuple[Tool, ...]
    findings: tuple[Finding, ...]
    kernels: tuple[KernelStatus, ...]
    dispatches: int  # micro nodes run
    instrumented: int  # of which under the instrumented interpreter
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def errors(self) -> int:
        return len(self.findings)

    @property
    def stopped(self) -> str | None:
        """The fault or budget overrun that ended the run early, if one did."""
        return self.meta.get("stopped")

    @property
    def failed(self) -> bool:
        """What the exit status says: something was found, or the run could not finish."""
        return bool(self.errors or self.stopped)

    def by_tool(self, tool: Tool) -> list[Finding]:
        return [f for f in self.findings if f.tool is tool]

    def text(self) -> str:
        m = self.meta
        head = f"firscope sanitize: tools {', '.join(t.value for t in self.tools)}"
        if "steps" in m:
            head += f"; {m['steps']} decode steps"
        if "engine" in m:
            head += f", engine {m['engine']} for what is not instrumented"
        out = [head]
        for f in self.findings:
            out += f.text_lines()
            out.append("")
        if self.stopped:
            out += ["The run stopped early (what it found until then is above):",
                    *(f"    {line}" for line in self.stopped.splitlines()), ""]
        out += self.kernel_lines()
        out.append(f"{self.dispatches} dispatches, {self.instrumented} of them instrumented "
                   f"(the others run on the engine: nothing in them can be found)")
        out.append(f"ERROR SUMMARY: {self.errors} error{'s' if self.errors != 1 else ''}")
        return "\n".join(PREFIX + printable(line) if line else PREFIX.rstrip() for line in out)

    def kernel_lines(self) -> list[str]:
        proven = [k for k in self.kernels if k.race_free]
        dynamic = [k for k in self.kernels if not k.race_free]
        out = [f"Race-free by the lane analysis (not instrumented for racecheck): "
               f"{', '.join(k.kernel for k in proven) or 'none'}"]
        if dynamic:
            out.append("Checked for races at run time:")
            out += [f"    {k.kernel}: {k.reason}" for k in dynamic]
        unproven = [k.kernel for k in self.kernels if not k.memory_proven]
        out.append("Accesses proven in bounds: " + (
            "all kernels" if not unproven else
            f"all but {', '.join(unproven)} (checked at run time)"))
        return out

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION,
                "tools": [t.value for t in self.tools], "errors": self.errors,
                "stopped": self.stopped,
                "findings": [f.to_json() for f in self.findings],
                "kernels": [{"kernel": k.kernel, "race": "proven" if k.race_free else "dynamic",
                             "reason": k.reason, "memory": "proven" if k.memory_proven
                             else "dynamic", "nodes": k.nodes} for k in self.kernels],
                "dispatches": self.dispatches, "instrumented": self.instrumented,
                "meta": dict(self.meta)}

    def json_text(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True, ensure_ascii=True) + "\n"
