"""``firscope eval``, ``firscope quant sensitivity`` and ``firscope quant plan``."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..text import json_text, printable
from .corpus import Corpus, cut
from .stats import TokenStats, summarize
from .work import Choice, Setup, Task, adopt, cache_file, run_tasks


@dataclass(frozen=True)
class EvalOptions:
    model: str | None
    corpus: str
    group: int
    engine: str = "compiled"
    ctx: int | None = None
    chunks: int | None = None
    second_half: bool = False
    as_json: bool = False
    out: str | None = None
    workers: int | None = None
    cluster: str | None = None  # a Dask scheduler's address (quant/cluster.py)
    dtypes: tuple[str, ...] = ()  # sensitivity/plan: other q4 groups an instance may take
    full: bool = False  # sensitivity: run every variant from the first node (no replay)


# -- opening -------------------------------------------------------------------------------
def open_bank(opts: EvalOptions):
    from ..runtime.opening import resolve_model
    from ..runtime import load_model
    from .variants import Bank
    path = resolve_model(opts.model)
    bank = Bank(load_model(path, group=opts.group))
    runner = bank.machine(bank.model, opts.engine).kernel_runner
    if runner is not None:  # kernels loaded now, as firscope run loads them before its steps
        runner.warmup()
    if opts.cluster:  # reached and checked before anything is printed
        from .cluster import connect
        connect(opts.cluster, Setup(str(path), opts.group, opts.engine))
    return bank, str(path)


def open_corpus(bank, opts: EvalOptions) -> Corpus:
    from ..model.tokens import load_tokenizer
    model = bank.model
    tok = load_tokenizer(model.folder, model.vocab)
    return cut(opts.corpus, tok, vocab=model.vocab, n_positions=model.n_positions,
               ctx=opts.ctx, chunks=opts.chunks, second_half=opts.second_half)


def _key(choice: dict) -> Choice:
    return tuple(sorted(choice.items()))


# -- progress ------------------------------------------------------------------------------
class Bar:
    """A progress bar on stderr when it is a terminal; nothing otherwise."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.done = what, total, 0
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self._draw()

    def _draw(self) -> None:
        if not self.tty:
            return
        frac = self.done / self.total if self.total else 1.0
        width = 24
        fill = int(frac * width)
        left = ""
        if self.done:
            rest = (time.perf_counter() - self.t0) / self.done * (self.total - self.done)
            left = f", {rest:.0f} s left"
        sys.stderr.write(f"\r\x1b[K{self.what} [{'#' * fill}{'.' * (width - fill)}] "
                         f"{self.done}/{self.total}{left}")
        sys.stderr.flush()

    def step(self, n: int = 1) -> None:
        self.done += n
        self._draw()

    def clear(self) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()

    def say(self, line: str) -> None:
        self.clear()
        print(line, flush=True)
        self._draw()


# -- eval ------------------------------------------------------------------------------------
CHUNK_HEAD = ("chunk     PPL(Q)         ln(PPL(Q)/PPL(base))   KLD                  "
              "Δp RMS           same top")


def chunk_line(i: int, s: dict) -> str:
    return (f"{i:5d}  {s['ppl_q']:8.4f} ± {s['ppl_q_err']:<7.4f}  "
            f"{s['ln_ppl_ratio']:9.5f} ± {s['ln_ppl_ratio_err']:<8.5f}  "
            f"{s['kld_mean']:9.6f} ± {s['kld_mean_err']:<8.6f}  "
            f"{100 * s['dp_rms']:6.3f} ± {100 * s['dp_rms_err']:.3f} %  "
            f"{100 * s['same_top']:6.2f} ± {100 * s['same_top_err']:.2f} %")


def summary_lines(s: dict) -> list[str]:
    cor = "n/a" if s["cor_ln_ppl"] is None else f"{100 * s['cor_ln_ppl']:6.2f}%"
    lines = [
        f"scored tokens: {s['tokens']}",
        "",
        "====== Perplexity ======",
        f"Mean PPL(Q)                   : {s['ppl_q']:10.6f} ± {s['ppl_q_err']:10.6f}",
        f"Mean PPL(base)                : {s['ppl_base']:10.6f} ± {s['ppl_base_err']:10.6f}",
        f"Cor(ln(PPL(Q)), ln(PPL(base))): {cor}",
        f"Mean ln(PPL(Q)/PPL(base))     : {s['ln_ppl_ratio']:10.6f} ± {s['ln_ppl_ratio_err']:10.6f}",
        f"Mean PPL(Q)/PPL(base)         : {s['ppl_ratio']:10.6f} ± {s['ppl_ratio_err']:10.6f}",
        f"Mean PPL(Q)-PPL(base)         : {s['ppl_diff']:10.6f} ± {s['ppl_diff_err']:10.6f}",
        "",
        "====== KL divergence KLD(f32 || q4) ======",
        f"Mean    KLD: {s['kld_mean']:10.6f} ± {s['kld_mean_err']:10.6f}",
        f"Maximum KLD: {s['kld_max']:10.6f}",
        f"99.0%   KLD: {s['kld_p99']:10.6f}",
        f"90.0%   KLD: {s['kld_p90']:10.6f}",
        f"Median  KLD: {s['kld_median']:10.6f}",
        "",
        "====== Token probability (p of the actual next token) ======",
        f"Mean    Δp: {100 * s['dp_mean']:6.3f} ± {100 * s['dp_mean_err']:5.3f} %",
        f"Median  Δp: {100 * s['dp_median']:6.3f} %",
        f"RMS Δp    : {100 * s['dp_rms']:6.3f} ± {100 * s['dp_rms_err']:5.3f} %",
        f"Same top 1: {100 * s['same_top']:6.3f} ± {100 * s['same_top_err']:5.3f} %",
    ]
    return lines


def evaluate(bank, model_path: str, corpus: Corpus, opts: EvalOptions, choice: dict,
             *, quiet: bool = False, label: str = "eval") -> tuple[dict, list[TokenStats]]:
    """Score the model with ``choice`` applied against all-f32 over the corpus."""
    setup = Setup(model_path, opts.group, opts.engine)
    adopt(setup, bank)
    tasks = [Task(i, i, c, corpus.first_scored, (_key(choice),),
                  cache_file(bank.model, c, corpus.first_scored))
             for i, c in enumerate(corpus.chunks)]
    bar = Bar(label, len(tasks)) if not quiet else None
    parts: list[TokenStats] = []
    if bar and not opts.as_json:
        bar.say(CHUNK_HEAD)
    for r in run_tasks(setup, tasks, workers=opts.workers, cluster=opts.cluster,
                         load_seconds=bank.model.timings["total"]):
        parts.append(r.stats[0])
        if bar:
            bar.step()
            if not opts.as_json:
                bar.say(chunk_line(r.chunk + 1, summarize(TokenStats.concat(parts))))
    if bar:
        bar.clear()
    return summarize(TokenStats.concat(parts)), parts


def _doc_head(bank, corpus: Corpus, opts: EvalOptions) -> dict:
    return {"model": str(bank.model.path), "corpus": str(corpus.path),
            "corpus_sha256": corpus.digest, "corpus_tokens": int(len(corpus.tokens)),
            "ctx": corpus.ctx, "chunks": len(corpus.chunks),
            "scored": "second half" if opts.second_half else "all but the first",
            "first_scored": corpus.first_scored, "group": bank.model.group,
            "engine": opts.engine, "notes": list(corpus.notes)}


def run_eval(opts: EvalOptions) -> int:
    bank, path = open_bank(opts)
    corpus = open_corpus(bank, opts)
    out = _check_out(opts.out)
    if not opts.as_json:
        print(f"{printable(bank.model.path)}: {len(corpus.chunks)} chunk(s) of {corpus.ctx} "
              f"tokens from {printable(corpus.path)}, {corpus.scored_per_chunk} scored per "
              f"chunk; q4 as declared against --fir-f32")
        for n in corpus.notes:
            print(f"  note: {n}")
    summary, parts = evaluate(bank, path, corpus, opts, {})
    doc = {**_doc_head(bank, corpus, opts), "summary": summary,
           "per_chunk": [summarize(p) for p in parts]}
    if opts.as_json:
        print(json_text(json.dumps(doc, indent=1)))
    else:
        print("\n".join(summary_lines(summary)))
    if out is not None:
        _write_eval_folder(out, doc, corpus, parts)
        if not opts.as_json:
            print(f"wrote {printable(out)}/eval.json and tokens.csv")
    return 0


def _check_out(out: str | None) -> Path | None:
    if out is None:
        return None
    from ..runtime.opening import check_output_folder
    return check_output_folder(out)


def _write_eval_folder(out: Path, doc: dict, corpus: Corpus, parts: list[TokenStats]) -> None:
    from ..runtime.opening import write_into_folder
    write_into_folder(out, "eval.json", json_text(json.dumps(doc, indent=1)) + "\n")
    rows = ["chunk,position,token,nll_q,nll_base,kld,p_diff,same_top"]
    for c, (chunk, s) in enumerate(zip(corpus.chunks, parts)):
        for j in range(len(s)):
            pos = corpus.first_scored + j
            rows.append(f"{c},{pos},{int(chunk[pos])},{s.nll[j]:.9g},{s.nll_base[j]:.9g},"
                        f"{s.kld[j]:.9g},{s.p_diff[j]:.9g},{int(s.same_top[j])}")
    write_into_folder(out, "tokens.csv", "\n".join(rows) + "\n")
