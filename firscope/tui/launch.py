"""``firscope [MODEL.fir]``: the command line's entry into the UI."""
from __future__ import annotations

from dataclasses import dataclass

from ..defaults import DEFAULT_ENGINE, DEFAULT_GROUP, UI_STEPS
from .app import FirscopeApp
from .loading import UiOptions


@dataclass(frozen=True)
class UiArgs:
    """What ``firscope ui`` was given, as typed (the prompt's ids still text)."""

    model: str | None = None
    prompt: str | None = None
    tokens: str | None = None
    n: int = UI_STEPS
    n_given: bool = False  # -n was on the command line
    fir_f32: bool = False
    group: int = DEFAULT_GROUP
    q4_path: str = "packed"
    engine: str = DEFAULT_ENGINE
    against: str | None = None
    isolate: bool = False
    device: str | None = None
    corpus: str | None = None
    ctx: int | None = None
    chunks: int | None = None


def run_app(args: UiArgs, gc_paused: bool = False) -> int:
    """``gc_paused``: the caller turned Python's collector off for the start; the app turns
    it on again once the first stop is drawn (or the load failed)."""
    from ..model.tokens import parse_token_list
    from ..runtime.opening import refuse_prompt_early, resolve_model
    ids = parse_token_list(args.tokens) if args.tokens else None
    model = resolve_model(args.model)
    refuse_prompt_early(model, args.prompt, ids)  # not after a minute of loading
    if args.corpus is not None:  # nor a corpus that is not there
        from pathlib import Path
        from ..fir.source import regular_file_size
        regular_file_size(Path(args.corpus), "a corpus file")
    app = FirscopeApp(model, UiOptions(
        prompt_ids=ids, prompt_text=args.prompt, n=ui_steps(args), fir_f32=args.fir_f32,
        group=args.group, engine=args.engine, q4_path=args.q4_path, against=args.against,
        isolate=args.isolate, device=args.device, corpus=args.corpus, corpus_ctx=args.ctx,
        corpus_chunks=args.chunks))
    app.gc_paused = gc_paused
    app.run()
    return 0


def ui_steps(args) -> int:
    """Tokens to generate: -n; against a dump without a prompt, the dump's tokens and no more
    (nothing to compare past its end) unless -n is given, as ``firscope debug`` does.
    ``args``: a :class:`UiArgs` (or anything with its fields)."""
    from ..debug.opening import steps_against_dump
    n = UI_STEPS if args.n is None else args.n
    return steps_against_dump(n, against=args.against, prompt=args.prompt, tokens=args.tokens,
                              n_given=getattr(args, "n_given", False))  # argparse: when given
