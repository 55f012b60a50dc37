"""Per-weight sensitivity and a mixed-precision plan written back as a .fir.

Sensitivity, per q4-declared instance W (``fcw@3``), each a mean KLD against all-f32 over
the corpus's scored tokens:

- **alone**: every instance f32 but W, which is q4 (what quantizing W by itself costs);
- **recovered**: every instance q4 but W, which is f32 (what keeping W in f32 saves:
  ``gain`` = KLD(all q4) - recovered).

The f32 side runs once per chunk (and is cached across commands); each variant runs only
its quantized side: 2N + 2 one-sided runs per chunk for N instances, not 2N evals of both
sides. Activation importance (llama-imatrix's): the mean of x^2 per input channel of W's
linear over the f32 run; the importance-weighted error of W's q4 form is
sqrt(sum_j imp_j sum_i (w_ij - w'_ij)^2 / sum_j imp_j sum_i w_ij^2) beside the plain
relative error (imp = 1).

With ``--dtypes q4:g16,...`` each instance is also measured "recovered" at each of those
dtypes (every other instance q4): the gain of giving it that dtype instead.

A plan gives each instance one dtype: its q4 form (no gain), f32, or one of ``--dtypes``.
Its predicted KLD is KLD(all q4) - the sum of the chosen gains (floored at 0: the gains are
measured one at a time and assumed to add); its bytes are those of every q4-declared
instance as loaded. Per instance, the options that are worth their bytes form a chain of
upgrades (q4 -> q4:g16 -> f32, each more bytes for more gain at a falling gain per byte:
the upper convex hull of (bytes, gain); a dtype of fewer bytes than the q4 form is not
used); for a byte budget, upgrades are taken by gain per
extra byte (a greedy multiple-choice knapsack), an instance's in chain order; for a KLD
target, in the same order until the predicted KLD is under it, then measured, and more
taken while the measurement is above the target.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import FirError, UsageError
from ..model.ref import Ref
from ..text import json_text, printable
from .commands import Bar, EvalOptions, _check_out, _doc_head, _key, evaluate, open_bank, \
    open_corpus
from .stats import TokenStats, summarize
from .work import Runner, Setup, Task, adopt, cache_file, workers_for

PLAN_MARK = "# quant plan:"


@dataclass
class Row:
    name: str
    layer: int | None
    q4_form: str
    q4_bytes: int
    f32_bytes: int
    alone: float = 0.0
    alone_err: float = 0.0
    recovered: float = 0.0
    recovered_err: float = 0.0
    gain: float = 0.0
    weight_err: float = 0.0  # relative L2 of w' - w
    weighted_err: float = 0.0  # the same weighted by activation importance
    decl: str = ""  # the weight line's name (fcw of fcw@3)
    # --dtypes: dtype -> {"bytes", "recovered", "recovered_err", "gain"} (only this one
    # instance at that dtype, every other q4)
    other: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def options(self) -> list[tuple[str, int, float]]:
        """(dtype, bytes, gain) of every dtype the instance may take."""
        out = [(self.q4_form, self.q4_bytes, 0.0), ("f32", self.f32_bytes, self.gain)]
        out += [(dt, o["bytes"], o["gain"]) for dt, o in self.other.items()]
        return out


@dataclass
class Sensitivity:
    rows: list[Row]
    all_q4: dict  # summary of every instance q4
    chunks: int
    tokens: int
    runs: float = 0.0  # one-sided full runs of a chunk it cost (replayed ones as shares)
    replayed_layers: list = None  # layers whose variants ran from that layer on
    layers: int = 0


def sensitivity(bank, path: str, corpus, opts: EvalOptions, *, quiet=False) -> Sensitivity:
    setup = Setup(path, opts.group, opts.engine)
    adopt(setup, bank)
    names = bank.instances
    all_q4, all_f32 = bank.all_q4(), bank.all_f32()
    alone = [_key({**all_f32, n: bank.q4_form(n)}) for n in names]
    recovered = [_key({**all_q4, n: "f32"}) for n in names]
    # --dtypes: each instance alone at each other dtype, every other q4 (its own q4 form
    # skipped: that is all-q4)
    extra = [(n, dt) for dt in opts.dtypes for n in names if dt != bank.q4_form(n)]
    recovered += [_key({**all_q4, n: dt}) for n, dt in extra]
    caches = [cache_file(bank.model, c, corpus.first_scored) for c in corpus.chunks]
    replay = not getattr(opts, "full", False)
    snaps = [_snapshot_files(cache, all_q4) if replay and cache else () for cache in caches]
    # phase 1, per chunk: the f32 base with the importance taps, and all-q4; both record
    # what a suffix replay needs, and the f32 base's replay is verified per layer
    first = [Task(i, i, c, corpus.first_scored, (_key(all_q4),), caches[i], importance=True,
                  replay="record" if snaps[i] else "", snapshots=snaps[i])
             for i, c in enumerate(corpus.chunks)]
    variants = alone + recovered
    origins = ("f32",) * len(alone) + ("q4",) * len(recovered)
    n_workers, _ = workers_for(len(corpus.chunks) * len(variants))
    if opts.workers is not None:
        n_workers = max(1, opts.workers)
    bar = None if quiet else Bar("sensitivity", len(corpus.chunks) * (1 + len(variants)))
    runner = Runner(setup, workers=opts.workers, load_seconds=bank.model.timings["total"],
                    cluster=opts.cluster)
    if runner.slots is not None:
        n_workers = runner.slots
    with runner:
        return _sweep(bank, corpus, opts, runner, first, caches, snaps, variants, origins,
                      n_workers, bar, extra)


def _sweep(bank, corpus, opts, runner, first, caches, snaps, variants, origins, n_workers,
           bar, extra=()) -> Sensitivity:
    names = bank.instances
    q4_parts: list[TokenStats] = []
    imp: dict[str, list] = {}
    verified: list[tuple[int, ...]] = []
    self_steps = 0.0
    # the second phase in units of a first-phase task (2 full runs and a replay per layer;
    # a variant is about 0.6 of a run): what starting workers is weighed against
    later = len(corpus.chunks) * len(variants) * 0.6 / (2 + 0.6 * bank.model.layers)
    for r in runner.run(first, remaining=int(later)):
        q4_parts.append(r.stats[0])
        verified.append(r.verified)
        self_steps += r.steps
        for k, (s, n) in r.importance.items():
            acc = imp.setdefault(k, [np.zeros_like(s), 0])
            acc[0] += s
            acc[1] += n
        if bar:
            bar.step()
    # phase 2: chunks x slices of the variants, enough pieces to keep every worker busy
    pieces = max(1, min(len(variants), -(-2 * n_workers // max(len(corpus.chunks), 1))))
    size = -(-len(variants) // pieces)
    second = []
    for i, c in enumerate(corpus.chunks):
        for s in range(0, len(variants), size):
            second.append(Task(len(second), i, c, corpus.first_scored,
                               tuple(variants[s: s + size]), caches[i],
                               replay="replay" if snaps[i] else "", snapshots=snaps[i],
                               origins=origins[s: s + size], verified=verified[i]))
    per_variant: list[list[TokenStats]] = [[] for _ in variants]
    for r in runner.run(second):
        task = second[r.index]
        start = variants.index(task.variants[0])
        for j, st in enumerate(r.stats):
            per_variant[start + j].append(st)
        self_steps += r.steps
        if bar:
            bar.step(len(r.stats))
    self_full_steps = sum(len(c) - 1 for c in corpus.chunks)
    if bar:
        bar.clear()
    q4_summary = summarize(TokenStats.concat(q4_parts))
    rows = []
    for k, n in enumerate(names):
        e = bank.model.weights[n]
        a = summarize(TokenStats.concat(per_variant[k]))
        rc = summarize(TokenStats.concat(per_variant[len(names) + k]))
        row = Row(n, e.layer, bank.q4_form(n), bank.nbytes(n, bank.q4_form(n)),
                  bank.nbytes(n, "f32"), a["kld_mean"], a["kld_mean_err"], rc["kld_mean"],
                  rc["kld_mean_err"], q4_summary["kld_mean"] - rc["kld_mean"])
        row.weight_err, row.weighted_err = _weight_errors(bank, n, imp.get(n))
        row.decl = e.decl
        rows.append(row)
    by_name = {r.name: r for r in rows}
    for j, (n, dt) in enumerate(extra):
        o = summarize(TokenStats.concat(per_variant[2 * len(names) + j]))
        by_name[n].other[dt] = {"bytes": bank.nbytes(n, dt), "recovered": o["kld_mean"],
                                "recovered_err": o["kld_mean_err"],
                                "gain": q4_summary["kld_mean"] - o["kld_mean"]}
    return Sensitivity(rows, q4_summary, len(corpus.chunks), q4_summary["tokens"],
                       self_steps / max(self_full_steps, 1), sorted(set().union(*verified)),
                       bank.model.layers)


def _snapshot_files(cache: str, all_q4: dict) -> tuple[tuple[str, str], ...]:
    import hashlib
    stem = cache[:-len(".npy")]
    tag = hashlib.sha256(repr(sorted(all_q4.items())).encode()).hexdigest()[:12]
    return (("f32", f"{stem}-rec-f32.npz"), ("q4", f"{stem}-rec-q4-{tag}.npz"))


def _weight_errors(bank, name: str, acc) -> tuple[float, float]:
    """Relative L2 error of the q4 form, plain and weighted by importance per input channel."""
    f32 = bank.form(name, "f32").matrix.astype(np.float64)  # [out, in]
    q = bank.form(name, bank.q4_form(name)).q4.dequantize().astype(np.float64)
    d2 = ((q - f32) ** 2).sum(axis=0)  # per input channel
    w2 = (f32 ** 2).sum(axis=0)
    plain = math.sqrt(d2.sum() / w2.sum()) if w2.sum() > 0 else 0.0
    if acc is None or acc[1] == 0:
        return plain, float("nan")
    imp = acc[0] / acc[1]
    den = float((imp * w2).sum())
    return plain, (math.sqrt(float((imp * d2).sum()) / den) if den > 0 else 0.0)


# -- sensitivity command ----------------------------------------------------------------------
def table(sens: Sensitivity) -> list[str]:
    rows = sorted(sens.rows, key=lambda r: -r.alone)
    n = len(sens.rows)
    replayed = sens.replayed_layers or []
    lines = [f"KLD(f32 || q4) with every instance q4: {sens.all_q4['kld_mean']:.6f} ± "
             f"{sens.all_q4['kld_mean_err']:.6f} over {sens.tokens} scored tokens",
             f"cost: {sens.runs:.1f} one-sided runs per chunk for {n} instances (2N evals "
             f"would be {4 * n}); variants of {len(replayed)} of {sens.layers} layers ran "
             "from their layer on (suffix replay, verified per chunk)",
             "alone: only this instance q4; recovered: only this instance f32 (gain = all-q4 "
             "KLD - recovered)",
             "",
             f"{'rank':>4}  {'weight':<12} {'q4 form':<8} {'alone KLD':>10} {'recovered':>10} "
             f"{'gain':>10} {'q4 B':>9} {'f32 B':>9}  {'w err':>7} {'imp err':>7}",
             f"{'-' * 4}  {'-' * 12} {'-' * 8} {'-' * 10} {'-' * 10} {'-' * 10} {'-' * 9} "
             f"{'-' * 9}  {'-' * 7} {'-' * 7}"]
    others = list(dict.fromkeys(dt for r in sens.rows for dt in r.other))
    if others:
        lines[2] += "; gain DTYPE: only this instance at that dtype"
        lines[-2] += "".join(f" {'gain ' + dt:>14}" for dt in others)
        lines[-1] += "".join(f" {'-' * 14}" for _ in others)
    for i, r in enumerate(rows, 1):
        lines.append(f"{i:>4}  {printable(r.name):<12} {r.q4_form:<8} {r.alone:10.6f} "
                     f"{r.recovered:10.6f} {r.gain:10.6f} {r.q4_bytes:9,} {r.f32_bytes:9,}  "
                     f"{r.weight_err:7.4f} {r.weighted_err:7.4f}"
                     + "".join(f" {r.other[dt]['gain']:14.6f}" if dt in r.other
                               else f" {'-':>14}" for dt in others))
    return lines


def run_sensitivity(opts: EvalOptions) -> int:
    bank, path = open_bank(opts)
    corpus = open_corpus(bank, opts)
    out = _check_out(opts.out)
    if not bank.instances:
        raise FirError(f"{printable(bank.model.path)}: the model declares no q4 weight")
    if not opts.as_json:
        print(f"{printable(bank.model.path)}: {len(bank.instances)} q4 weight instances, "
              f"{len(corpus.chunks)} chunk(s) of {corpus.ctx} tokens from "
              f"{printable(corpus.path)}")
        for n in corpus.notes:
            print(f"  note: {n}")
    sens = sensitivity(bank, path, corpus, opts)
    doc = {**_doc_head(bank, corpus, opts), **sensitivity_doc(sens)}
    if opts.as_json:
        print(json_text(json.dumps(doc, indent=1)))
    else:
        print("\n".join(table(sens)))
    if out is not None:
        from ..runtime.opening import write_into_folder
        write_into_folder(out, "sensitivity.json", json_text(json.dumps(doc, indent=1)) + "\n")
        write_into_folder(out, "sensitivity.svg",
                          sensitivity_chart(doc["weights"], bank.model.layers))
        if not opts.as_json:
            print(f"wrote {printable(out)}/sensitivity.json and sensitivity.svg")
    return 0


def sensitivity_chart(rows: list[dict], layers: int) -> bytes:
    """Bars per layer, one per weight line: the KLD it causes alone, and the KLD keeping it
    f32 saves (gain); SVG bytes. matplotlib's object API, no pyplot: no global state, so a
    report can be drawn from a worker thread of the UI."""
    import io
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure
    decls = list(dict.fromkeys(r["decl"] for r in rows))
    fig = Figure(figsize=(10, 3.6))
    FigureCanvasSVG(fig)
    ax1, ax2 = fig.subplots(1, 2)
    width = 0.8 / max(len(decls), 1)
    for k, d in enumerate(decls):
        mine = [r for r in rows if r["decl"] == d]
        xs = [(r["layer"] or 0) + k * width for r in mine]
        ax1.bar(xs, [r["alone"] for r in mine], width, label=d)
        ax2.bar(xs, [r["gain"] for r in mine], width, label=d)
    for ax, title, ylabel in ((ax1, "alone: only this weight q4", "mean KLD(f32 || q4)"),
                              (ax2, "gain: KLD saved keeping it f32",
                               "KLD(all q4) - KLD(it f32)")):
        ax.set_xlabel("layer")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(layers)],
                      [str(i) for i in range(layers)])
    ax1.legend(fontsize=8, title="weight")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="svg")
    return buf.getvalue()


def sensitivity_doc(sens: Sensitivity) -> dict:
    """What the JSON outputs and the profiling report carry."""
    return {"all_q4": sens.all_q4, "runs_per_chunk": sens.runs,
            "replayed_layers": sens.replayed_layers, "layers": sens.layers,
            "weights": [r.as_dict() for r in sorted(sens.rows, key=lambda r: -r.alone)]}


# -- plan -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Upgrade:
    """One step of an instance's chain: from one dtype to a costlier one worth its bytes."""

    name: str
    before: str
    after: str
    extra_bytes: int
    gain: float  # KLD saved beyond ``before``'s

    @property
    def per_byte(self) -> float:
        return self.gain / max(self.extra_bytes, 1)


def chain(row: Row) -> list[Upgrade]:
    """The instance's upgrades in order: the upper convex hull of its (bytes, gain) options
    from its q4 form, so each step gains less per extra byte than the one before."""
    base, *rest = row.options()
    # a dtype of fewer bytes than the q4 form (q4:g64 under a g32 model) would trade KLD for
    # bytes: a plan here only spends bytes above all-q4, so it is not a step
    hull = [base]
    for o in sorted((o for o in rest if o[1] > base[1]), key=lambda o: (o[1], -o[2])):
        if o[2] <= hull[-1][2]:
            continue  # more bytes, no more gain
        while len(hull) >= 2:
            (_, b0, g0), (_, b1, g1) = hull[-2], hull[-1]
            # drop the middle point when going straight to o gains as much per byte
            if (g1 - g0) * (o[1] - b0) <= (o[2] - g0) * (b1 - b0):
                hull.pop()
            else:
                break
        hull.append(o)
    return [Upgrade(row.name, a[0], b[0], b[1] - a[1], b[2] - a[2])
            for a, b in zip(hull, hull[1:])]


def _open_steps(rows, done: dict[str, int]) -> list[tuple[Upgrade, int]]:
    """Every upgrade with a gain not yet taken (``done``: name -> steps of its chain taken),
    each with its place in its chain, by gain per extra byte (an instance's in chain
    order)."""
    steps = [(u, i) for r in rows for i, u in enumerate(chain(r))
             if u.gain > 0 and i >= done.get(r.name, 0)]
    steps.sort(key=lambda s: (-s[0].per_byte, s[1]))
    return steps


def choose(sens: Sensitivity, *, budget: int | None = None,
           kld: float | None = None) -> list[Upgrade]:
    """The upgrades taken, in the order taken (gain per extra byte; an instance's in chain
    order)."""
    used = sum(r.q4_bytes for r in sens.rows)
    predicted = sens.all_q4["kld_mean"]
    taken: list[Upgrade] = []
    at: dict[str, int] = {}  # name -> upgrades of its chain taken so far
    for u, i in _open_steps(sens.rows, {}):
        if at.get(u.name, 0) != i:
            continue  # an earlier step of its chain was not taken
        if budget is not None:
            if used + u.extra_bytes <= budget:
                taken.append(u)
                used += u.extra_bytes
                at[u.name] = i + 1
        elif predicted > kld:
            taken.append(u)
            predicted -= u.gain
            at[u.name] = i + 1
    return taken


def dtypes_of(taken: list[Upgrade]) -> dict[str, str]:
    """Instance -> its chosen dtype (instances left at their q4 form are not listed)."""
    return {u.name: u.after for u in taken}  # the last step taken of each chain


def predicted_kld(sens: Sensitivity, taken: list[Upgrade]) -> float:
    return max(sens.all_q4["kld_mean"] - sum(u.gain for u in taken), 0.0)


def plan_bytes(sens: Sensitivity, dtypes: dict[str, str]) -> int:
    total = 0
    for r in sens.rows:
        dt = dtypes.get(r.name)
        total += {o[0]: o[1] for o in r.options()}[dt] if dt else r.q4_bytes
    return total


def run_plan(opts: EvalOptions, *, budget: int | None, kld: float | None, out: str,
             baseline: bool = False) -> int:
    bank, path = open_bank(opts)
    target = _check_plan_out(out, bank.model.path)
    corpus = open_corpus(bank, opts)
    if not bank.instances:
        raise FirError(f"{printable(bank.model.path)}: the model declares no q4 weight")
    names = bank.instances
    all_q4_bytes = sum(bank.nbytes(n, bank.q4_form(n)) for n in names)
    all_f32_bytes = sum(bank.nbytes(n, "f32") for n in names)
    if budget is not None and budget < all_q4_bytes:
        raise UsageError(f"--budget {budget:,} is below the all-q4 size of the q4-declared "
                         f"weights, {all_q4_bytes:,} bytes (all f32: {all_f32_bytes:,})")
    print(f"{printable(bank.model.path)}: {len(names)} q4 weight instances: all q4 "
          f"{all_q4_bytes:,} B, all f32 {all_f32_bytes:,} B; {len(corpus.chunks)} chunk(s) of "
          f"{corpus.ctx} tokens from {printable(corpus.path)}")
    sens = sensitivity(bank, path, corpus, opts)
    taken = choose(sens, budget=budget, kld=kld)
    quiet_opts = EvalOptions(**{**opts.__dict__, "as_json": True})
    measured, _ = evaluate(bank, path, corpus, quiet_opts, dtypes_of(taken), quiet=True)
    if kld is not None:  # the gains need not add: measure, and keep going while above
        for _ in range(3):
            if measured["kld_mean"] <= kld:
                break
            more = _more(sens, taken)[:max(1, len(taken) // 4)]
            if not more:
                break
            taken += more
            measured, _ = evaluate(bank, path, corpus, quiet_opts, dtypes_of(taken),
                                   quiet=True)
        taken, measured = _prune(bank, path, corpus, quiet_opts, taken, measured, kld)
    chosen = dtypes_of(taken)
    nbytes = plan_bytes(sens, chosen)
    why = (f"budget {budget:,} B" if budget is not None else f"KLD target {kld:g}")
    text = write_plan_text(bank.model, chosen, why, corpus, sens)
    kinds: dict[str, list[str]] = {}
    for n in sorted(chosen, key=names.index):
        kinds.setdefault(chosen[n], []).append(n)
    lines = [
        f"plan ({why}): {len(chosen)} of {len(names)} instances change"
        + "".join(f"; {dt}: {', '.join(ns)}" for dt, ns in kinds.items()),
        f"  bytes of the q4-declared weights as loaded: {nbytes:,} (all q4 {all_q4_bytes:,}, "
        f"all f32 {all_f32_bytes:,})",
        f"  KLD against f32: all q4 {sens.all_q4['kld_mean']:.6f}, plan predicted "
        f"{predicted_kld(sens, taken):.6f}, measured {measured['kld_mean']:.6f} ± "
        f"{measured['kld_mean_err']:.6f}",
    ]
    if kld is not None and measured["kld_mean"] > kld:
        lines.append(f"  note: measured KLD is still above the target {kld:g}")
    if baseline:
        by_size = by_size_alone(sens, nbytes)
        b, _ = evaluate(bank, path, corpus, quiet_opts, {n: "f32" for n in by_size}, quiet=True)
        lines.append(f"  by size alone (largest first, "
                     f"{plan_bytes(sens, dict.fromkeys(by_size, 'f32')):,} B): "
                     f"measured KLD {b['kld_mean']:.6f} ± {b['kld_mean_err']:.6f}")
    from ..runtime.opening import write_output
    write_output(target, text.encode("utf-8"), "the plan")
    lines.append(f"wrote {printable(target)}")
    print("\n".join(lines))
    return 0


def _more(sens: Sensitivity, taken: list[Upgrade]) -> list[Upgrade]:
    """The next upgrades after ``taken``, by gain per byte (each instance's chain in order)."""
    at: dict[str, int] = {}
    for u in taken:
        at[u.name] = at.get(u.name, 0) + 1
    out = []
    for u, i in _open_steps(sens.rows, dict(at)):
        if at.get(u.name, 0) == i:
            out.append(u)
            at[u.name] = i + 1
    return out


MAX_PRUNE = 3  # measured tries to give instances back to q4 under a KLD target


def _prune(bank, path, corpus, opts, taken: list[Upgrade], measured: dict, kld: float):
    """The gains are measured one at a time and need not add (on the sample the plan often
    measures well under what it predicted): give back, one at a time, the upgrades taken
    last (the least gain per byte), as long as the measurement stays under the target; at
    most MAX_PRUNE evals."""
    for _ in range(MAX_PRUNE):
        if measured["kld_mean"] > kld or not taken:
            break
        trial = taken[:-1]
        got, _ = evaluate(bank, path, corpus, opts, dtypes_of(trial), quiet=True)
        if got["kld_mean"] > kld:
            break
        taken, measured = trial, got
    return taken, measured


def by_size_alone(sens: Sensitivity, nbytes: int) -> list[str]:
    """f32 instances chosen by size alone (largest f32 first) within ``nbytes``."""
    used = sum(r.q4_bytes for r in sens.rows)
    out = []
    for r in sorted(sens.rows, key=lambda r: (-r.f32_bytes, r.name)):
        extra = r.f32_bytes - r.q4_bytes
        if used + extra <= nbytes:
            out.append(r.name)
            used += extra
    return out


def _check_plan_out(out: str, original: Path) -> Path:
    """``-o``: a new file, or one a plan wrote before (never the original or another file)."""
    from ..runtime.opening import check_output_file
    target = check_output_file(out, "-o")
    if target.parent.resolve() != original.parent.resolve():
        raise FirError(f"{printable(target)}: a plan is written beside the model it changes "
                       f"(in {printable(original.parent)}), where its config, checkpoint and "
                       "tokenizer are found")
    if target.exists():
        if target.resolve() == original.resolve():
            raise FirError(f"{printable(target)}: is the model file itself; write the plan "
                           "to a new file")
        try:
            head = target.read_bytes()[:1 << 20].decode("utf-8", errors="replace")
        except OSError as e:
            raise FirError(f"{printable(target)}: cannot read it: {e.strerror}") from None
        if PLAN_MARK not in head and "# written by firscope quant plan" not in head:
            raise FirError(f"{printable(target)}: exists and was not written by firscope quant "
                           "plan; choose a new name (or remove it)")
    return target


_WEIGHT = re.compile(r"^(\s*weight\s+(\S+)\s+\S+\s.*?)(\s+except\s[^#]*?)?(\s*)(#.*)?$")


def write_plan_text(model, chosen: dict[str, str], why: str, corpus,
                    sens: Sensitivity) -> str:
    """The model file with the plan applied (``chosen``: instance -> dtype): each weight line
    whose instances change gets an ``except`` clause and a comment saying why; every other
    line is the original's."""
    gains = {r.name: {dt: g for dt, _, g in r.options()} for r in sens.rows}
    by_decl: dict[str, dict[int, str]] = {}
    for n, dt in chosen.items():
        e = model.weights[n]
        by_decl.setdefault(e.decl, {})[e.layer] = dt
    src = model.path.read_text(encoding="utf-8")
    out = []
    for line in src.split("\n"):
        m = _WEIGHT.match(line)
        name = m.group(2) if m else None
        d = model.weight_decls.get(name) if name else None
        if d is None or d.dtype != "q4" or not d.per_layer:
            out.append(line)
            continue
        wanted = by_decl.get(name, {})
        # what the plan gives each layer: its chosen dtype, the q4 form otherwise
        groups: dict[str, list[int]] = {}
        for layer in range(model.layers):
            kind, group = d.precision(layer)
            q4 = d.dtype_at(layer, None) if kind == "q4" else d.dtype_at(None, None)
            dtype = wanted.get(layer, q4)
            if dtype != d.dtype_at(None, None):
                groups.setdefault(dtype, []).append(layer)
        old_clause = (m.group(3) or "").strip()
        new_clause = ("except " + " ".join(f"{_spans(ls)}:{dt}" for dt, ls in groups.items())
                      if groups else "")
        if new_clause == old_clause:
            out.append(line)
            continue
        kept = ", ".join(f"{layer} {dt} (gain {gains[str(Ref(name, layer))][dt]:.2e})"
                         for layer, dt in sorted(wanted.items()))
        note = (f"{PLAN_MARK} {why}, {corpus.path.name} ctx {corpus.ctx}: "
                + (f"layers changed: {kept}" if wanted else "every layer q4"))
        comment = m.group(5) or ""
        body = m.group(1) + (" " + new_clause if new_clause else "")
        out.append(f"{body}  {note}" + (f" {comment}" if comment else ""))
    return "\n".join(out)


def _spans(layers: list[int]) -> str:
    parts, i = [], 0
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        parts.append(str(layers[i]) if i == j else f"{layers[i]}-{layers[j]}")
        i = j + 1
    return ",".join(parts)
