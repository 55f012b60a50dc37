"""What a profile holds: plain dataclasses, independent of how they were filled.

A :class:`ProfileData` can come from ``firscope profile`` (a fresh run) or
from a debugging session that already decoded some tokens (the TUI attaches
a :class:`~firscope.profile.collect.Profiler` to its machine and fills the
rest with :func:`~firscope.profile.report.complete_profile`). Every part
except the static description of the model is optional, and the report says
what is missing instead of failing.

Times are kept as integer nanoseconds relative to the profile's origin (the
first ``perf_counter_ns`` the profiler saw), so spans nest exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..runtime import Model, PlanNode
from .sites import AttentionSite  # noqa: F401 - defined there, named here as before


@dataclass(frozen=True)
class NodeInfo:
    index: int
    full_name: str  # "attention@3"
    name: str  # "attention"
    layer: int | None
    kind: str  # "ext" or "micro"
    target: str  # ext op or kernel name
    outputs: tuple[str, ...]  # display names of the output operands

    @classmethod
    def from_plan(cls, node: PlanNode) -> "NodeInfo":
        return cls(node.index, node.full_name, node.name, node.layer, node.kind, node.target,
                   tuple(o.display for o in node.outs))


@dataclass(frozen=True)
class KernelOp:
    pc: int
    line: int  # line in the model file
    depth: int  # block nesting, for indentation
    text: str  # the instruction as written
    category: str  # opcode category: alu, mem, const, ctrl


@dataclass(frozen=True)
class KernelInfo:
    name: str
    line: int  # line of the `kernel` directive
    ops: tuple[KernelOp, ...]


@dataclass
class TokenTiming:
    """One decode step of the timed run: when each node started and how long it ran."""

    step: int  # 0-based index among the timed steps
    token: int
    position: int
    node_start_ns: np.ndarray  # int64 [n_nodes], relative to the origin; -1 = not run
    node_ns: np.ndarray  # int64 [n_nodes]; -1 = not run

    @property
    def ran(self) -> np.ndarray:
        return self.node_ns >= 0

    @property
    def start_ns(self) -> int:
        return int(self.node_start_ns[self.ran].min()) if self.ran.any() else 0

    @property
    def end_ns(self) -> int:
        r = self.ran
        return int((self.node_start_ns[r] + self.node_ns[r]).max()) if r.any() else 0

    @property
    def span_ns(self) -> int:
        """Wall time from the first node's start to the last node's end."""
        return self.end_ns - self.start_ns

    @property
    def compute_ns(self) -> int:
        """Time inside nodes (excludes anything between them)."""
        return int(self.node_ns[self.ran].sum())


SIMD_WIDTH = 32  # lanes per warp for the profile's SIMD efficiency (firscope cost: per device)


@dataclass
class NodeInstructions:
    """Instruction counts of one micro node, summed over the instrumented tokens."""

    node: int  # plan index
    kernel: str
    threads: int
    dispatches: int
    steps: int  # instructions executed (one per lockstep issue)
    lane_steps: int  # sum over executed instructions of the active lanes
    line_counts: np.ndarray  # int64 [n_ops]: executions per pc
    lane_counts: np.ndarray  # int64 [n_ops]: active lanes summed per pc
    # int64 [n_ops]: warps (of SIMD_WIDTH lanes, formed inside each threadgroup) with an
    # active lane, summed per pc: the warp instructions a GPU would issue
    warp_counts: np.ndarray | None = None

    @property
    def simd_efficiency(self) -> float | None:
        """Active lane-instructions over issued warp instructions x SIMD width: 1/32 for a
        one-lane kernel, as a GPU runs it (not 'utilisation 100%')."""
        warps = int(self.warp_counts.sum()) if self.warp_counts is not None else 0
        return self.lane_steps / (warps * SIMD_WIDTH) if warps else None


@dataclass
class InstructionProfile:
    engine: str  # always the step interpreter: it is the one that counts
    tokens: list[int]  # token ids of the instrumented steps, positions 0..
    nodes: dict[int, NodeInstructions] = field(default_factory=dict)

    def by_kernel(self) -> dict[str, dict]:
        """Per kernel: summed counts per pc and the totals."""
        out: dict[str, dict] = {}
        for ni in sorted(self.nodes.values(), key=lambda n: n.node):
            k = out.setdefault(ni.kernel, {"nodes": 0, "dispatches": 0, "steps": 0,
                                           "lane_steps": 0, "lane_slots": 0,
                                           "line_counts": np.zeros_like(ni.line_counts),
                                           "lane_counts": np.zeros_like(ni.lane_counts),
                                           "warp_counts": np.zeros_like(ni.lane_counts)})
            k["nodes"] += 1
            k["dispatches"] += ni.dispatches
            k["steps"] += ni.steps
            k["lane_steps"] += ni.lane_steps
            k["lane_slots"] += ni.steps * ni.threads
            k["line_counts"] = k["line_counts"] + ni.line_counts
            k["lane_counts"] = k["lane_counts"] + ni.lane_counts
            if ni.warp_counts is not None:
                k["warp_counts"] = k["warp_counts"] + ni.warp_counts
        return out


@dataclass
class AttentionMaps:
    site: AttentionSite
    positions: list[int] = field(default_factory=list)  # query position of each row
    rows: list[np.ndarray] = field(default_factory=list)  # f32 [n_head, position + 1]

    def matrix(self) -> np.ndarray:
        """f32 [n_head, queries, keys]; NaN where a key is after the query."""
        if not self.rows:
            return np.zeros((self.site.n_head, 0, 0), dtype=np.float32)
        keys = max(p for p in self.positions) + 1
        m = np.full((self.site.n_head, len(self.rows), keys), np.nan, dtype=np.float32)
        for i, r in enumerate(self.rows):
            m[:, i, : r.shape[1]] = r
        return m


@dataclass(frozen=True)
class WeightStats:
    """Quantization error of one q4 weight, the way llama.cpp's quantize-stats reports it.

    error = original f32 weight ([out, in], read from the checkpoint) minus
    its dequantized int4 value, computed in f64.
    """

    name: str  # "qkvw@0"
    decl: str  # "qkvw"
    layer: int | None
    tensor: str
    shape: tuple[int, int]  # [out, in]
    group: int
    count: int
    rmse: float
    max_abs: float
    mean_abs: float
    p95_abs: float  # exact 95th percentile of |error|
    median_abs: float  # exact median of |error|
    p95_bucket: float  # llama.cpp style: upper edge of the histogram bucket
    median_bucket: float
    weight_rms: float  # rms of the original weight, to put rmse in scale
    hist: np.ndarray  # int64 [HIST_BUCKETS] counts of |error| (last bucket: overflow)
    hist_range: float
    scale_min: float
    scale_max: float
    scale_mean: float
    min_min: float  # range of the per-group minimums
    min_max: float
    groups: int
    flat_groups: int  # groups whose max equals their min (scale forced to 1)


@dataclass(frozen=True)
class ActivationError:
    """One node output of the q4 run against the lockstep f32 run, at one step."""

    step: int
    position: int
    node: int
    full_name: str
    output: str  # operand display name
    primary: bool  # the node's first output
    rel_l2: float  # ||q - f|| / ||f||
    max_abs: float
    cosine: float
    sqnr_db: float  # 10 log10(sum f^2 / sum (q-f)^2); inf when identical
    signal: float  # sum f^2, so aggregates can be recomputed exactly
    noise: float  # sum (q-f)^2


@dataclass(frozen=True)
class LogitStats:
    step: int
    position: int
    token: int  # the token fed at this step
    kl: float  # KL(P_f32 || P_q4) in nats
    top_f32: int
    top_q4: int
    p_top_f32: float  # P_f32(top_f32)
    p_top_q4: float  # P_q4(top_f32)

    @property
    def same_top(self) -> bool:
        return self.top_f32 == self.top_q4

    @property
    def delta_p(self) -> float:
        """Change in probability of the f32 top token: P_q4 - P_f32."""
        return self.p_top_q4 - self.p_top_f32


@dataclass
class QuantComparison:
    tokens: list[int]  # fed to both models, positions 0..
    activations: list[ActivationError]
    logits: list[LogitStats]
    logits_q4: np.ndarray  # f32 [steps, vocab]
    logits_f32: np.ndarray  # f32 [steps, vocab]


@dataclass(frozen=True)
class DivergenceRow:
    """One node output against a dump, over every compared step (issue 13)."""

    output: str  # "attention@3/attn"
    node: int
    steps: int
    max_abs: float
    rel_l2: float
    max_ulp: int
    status: str  # "exact", "within tolerance", "DIVERGED at step S"
    step: int | None  # the step shown: the first divergence, else the first difference
    index: int | None  # the element shown
    lane: int | None  # the lane that wrote it (looked up for the first divergences)


@dataclass
class Divergence:
    """The run against a dump: the report's "divergence" section (profile/divergence.py)."""

    other: str  # the dump's path
    producer: str | None
    tolerance: str
    compared: int  # node outputs compared
    possible: int  # node outputs the run produced
    first: str  # the "first divergence: ..." line
    first_step: int | None
    first_node: int | None  # plan index: the graph and timeline can mark it
    rows: list[DivergenceRow] = field(default_factory=list)
    mismatches: list[tuple[str, str]] = field(default_factory=list)  # (key, problem)
    notes: list[str] = field(default_factory=list)


@dataclass
class ProfileData:
    """Everything a report shows. Only ``meta``, ``nodes`` and ``kernels`` are required."""

    meta: dict  # model, path, family, engine, ...; "created" is the one timestamp
    nodes: list[NodeInfo]
    kernels: dict[str, KernelInfo]
    prompt: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    pieces: dict[int, str] = field(default_factory=dict)  # token id -> display text
    tokens: list[TokenTiming] = field(default_factory=list)
    instructions: InstructionProfile | None = None
    attention: list[AttentionMaps] = field(default_factory=list)
    weights: list[WeightStats] | None = None
    comparison: QuantComparison | None = None
    quant_note: str | None = None  # why there are no quantization numbers
    divergence: Divergence | None = None  # against a dump, when one was given
    sanitizer: dict | None = None  # `profile --sanitize`: the sanitizer's JSON report
    gpu: dict | None = None  # `profile --device`: the cost analysis (firscope/cost) as JSON
    corpus: dict | None = None  # `profile --corpus`: eval and sensitivity (firscope/quant)

    @classmethod
    def for_model(cls, model: Model, **meta) -> "ProfileData":
        """The static part of a profile: the model's nodes and kernels, and metadata."""
        base = describe_model(model)
        base.update(meta)
        kernels = {}
        for k in model.kernels.values():
            kernels[k.name] = KernelInfo(k.name, k.syntax.loc.line, tuple(
                KernelOp(o.pc, o.loc.line, o.depth, o.text, o.spec.category) for o in k.ops))
        data = cls(base, [NodeInfo.from_plan(n) for n in model.nodes], kernels)
        if model.fir_f32:
            data.quant_note = ("This run loaded every q4 weight as f32 (--fir-f32): there is no "
                               "quantization to measure.")
        elif not any(w.q4 is not None for w in model.weights.values()):
            data.quant_note = ("The model declares no q4 weights: there is no quantization to "
                               "measure.")
        return data

    @property
    def fed(self) -> list[int]:
        return [t.token for t in self.tokens]

    def node_ns(self) -> np.ndarray:
        """int64 [steps, n_nodes] node durations; -1 where a node did not run."""
        if not self.tokens:
            return np.zeros((0, len(self.nodes)), dtype=np.int64)
        return np.stack([t.node_ns for t in self.tokens])

    def timing_stats(self, *, by: str = "node", warmup: int | None = None) -> "TimingStats":
        """Robust per-node (``by="node"``) or per-name (``by="name"``: all layers of a node
        together) timing statistics; see :func:`timing_stats`."""
        return timing_stats(self, by=by, warmup=warmup)


def describe_model(model: Model) -> dict:
    q4 = [w for w in model.weights.values() if w.q4 is not None]
    return {
        "model_path": str(model.path),
        "model_folder": model.name,
        "model_file": model.path.name,
        "family": model.family,
        "config_model": str(model.config.get("model", "")) if "model" in model.config else None,
        "fir_f32": bool(model.fir_f32),
        "group": int(model.group),
        "layers": int(model.layers),
        "nodes": len(model.nodes),
        "vocab": int(model.vocab),
        "n_positions": model.n_positions,
        "q4_weights": len(q4),
        "q4_bytes": int(sum(w.nbytes for w in q4)),
        # how q4 linears ran: on the packed codes, or on f32 copies made at load
        "q4_path": "dequant" if any(w.matrix is not None for w in q4) else "packed",
    }


# -- robust timing statistics -------------------------------------------------------------
# A call is an outlier when it is beyond Tukey's far-out fence (Q3 + 3 IQR) of its
# node's calls *and* more than twice their median (a tight IQR alone would flag
# nanosecond jitter). With fewer than OUTLIER_MIN_SAMPLES calls nothing is marked.
OUTLIER_IQR = 3.0
OUTLIER_MEDIAN_FACTOR = 2.0
OUTLIER_MIN_SAMPLES = 4


@dataclass(frozen=True)
class TimingRow:
    """One node (or one node name over all layers): what its calls took, in ns."""

    key: str  # full name ("attention@3") or name ("attention")
    kind: str
    target: str
    nodes: tuple[int, ...]  # plan indices the row covers
    samples: int  # calls the figures rest on (warm-up steps excluded)
    min_ns: int
    median_ns: float
    p90_ns: float  # linear interpolation; with < 10 samples it lies between the top two
    max_ns: int
    total_ns: int
    outliers: int  # calls beyond the fence
    outlier_ns: int  # time in those calls
    fence_ns: float | None  # the outlier threshold; None when samples < OUTLIER_MIN_SAMPLES

    @property
    def cost_ns(self) -> float:
        """median x calls: the ranking key, which one slow call cannot move far."""
        return self.median_ns * self.samples


@dataclass(frozen=True)
class TimingStats:
    """Rows ranked by median x calls (largest first), and what they rest on."""

    by: str  # "node" or "name"
    rows: tuple[TimingRow, ...]
    steps: int  # timed steps the figures rest on
    warmup_discarded: int  # leading timed steps left out here
    warmup_before: int  # steps run and discarded before timing began (meta "warmup_steps")

    @property
    def cost_ns(self) -> float:
        return sum(r.cost_ns for r in self.rows)

    def share(self, row: TimingRow) -> float | None:
        total = self.cost_ns
        return row.cost_ns / total if total else None

    def note(self) -> str:
        """One sentence for a report: what each figure rests on."""
        samples = sorted({r.samples for r in self.rows})
        per = (f"{samples[0]}" if len(samples) == 1 else
               f"{samples[0]} to {samples[-1]}") if samples else "no"
        warm = []
        if self.warmup_before:
            warm.append(f"{self.warmup_before} warm-up step(s) run and discarded before timing")
        if self.warmup_discarded:
            warm.append(f"the first {self.warmup_discarded} timed step(s) left out as warm-up")
        return (f"Figures rest on {self.steps} timed step(s)"
                + (f" ({'; '.join(warm)})" if warm else "") +
                f"; each row on {per} call(s). Ranked by median x calls; a call is an outlier "
                f"beyond Q3 + {OUTLIER_IQR:g} IQR and {OUTLIER_MEDIAN_FACTOR:g}x the median "
                f"(not marked under {OUTLIER_MIN_SAMPLES} calls); p90 is interpolated.")


def _row(key: str, kind: str, target: str, nodes: tuple[int, ...], calls: np.ndarray
         ) -> TimingRow:
    calls = np.sort(calls.astype(np.int64))
    n = int(calls.size)
    if n == 0:
        return TimingRow(key, kind, target, nodes, 0, 0, 0.0, 0.0, 0, 0, 0, 0, None)
    med = float(np.median(calls))
    fence = None
    out = np.zeros(0, dtype=np.int64)
    if n >= OUTLIER_MIN_SAMPLES:
        q1, q3 = np.percentile(calls, [25, 75])
        fence = float(max(q3 + OUTLIER_IQR * (q3 - q1), OUTLIER_MEDIAN_FACTOR * med))
        out = calls[calls > fence]
    return TimingRow(key, kind, target, nodes, n, int(calls[0]), med,
                     float(np.percentile(calls, 90)), int(calls[-1]), int(calls.sum()),
                     int(out.size), int(out.sum()), fence)


def timing_stats(data: ProfileData, *, by: str = "node", warmup: int | None = None
                 ) -> TimingStats:
    """min, median, p90 and max per node, ranked by median x calls, outliers marked.

    ``warmup``: leading timed steps to leave out. By default one, unless the run
    already discarded a warm-up step before timing (``meta["warmup_steps"]``, as
    ``firscope profile`` does) -- but never every step: with one step, it stays.
    """
    if by not in ("node", "name"):
        raise ValueError(f"by must be 'node' or 'name', not {by!r}")
    before = int(data.meta.get("warmup_steps", 0) or 0)
    ns = data.node_ns()
    skip = (0 if before else 1) if warmup is None else warmup
    skip = max(0, min(skip, ns.shape[0] - 1))
    kept = ns[skip:]
    groups: dict[str, list[NodeInfo]] = {}
    for n in data.nodes:
        groups.setdefault(n.full_name if by == "node" else n.name, []).append(n)
    rows = []
    for key, members in groups.items():
        cols = kept[:, [m.index for m in members]].reshape(-1)
        rows.append(_row(key, members[0].kind, members[0].target,
                         tuple(m.index for m in members), cols[cols >= 0]))
    rows.sort(key=lambda r: (-r.cost_ns, r.nodes[0]))
    return TimingStats(by, tuple(rows), int(kept.shape[0]), skip, before)
