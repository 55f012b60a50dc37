"""``firscope [MODEL.fir]``: the command line's entry into the UI."""
from __future__ import annotations

from .app import DEFAULT_N, FirscopeApp


def run_app(args) -> int:
    from ..model.tokens import parse_token_list
    from ..runtime.opening import refuse_prompt_early, resolve_model
    ids = parse_token_list(args.tokens) if getattr(args, "tokens", None) else None
    model = resolve_model(args.model)
    refuse_prompt_early(model, args.prompt, ids)  # not after a minute of loading
    app = FirscopeApp(model, prompt_ids=ids, prompt_text=args.prompt, n=ui_steps(args),
                      fir_f32=args.fir_f32, group=args.group, engine=args.engine,
                      q4_path=args.q4_path, against=getattr(args, "against", None),
                      isolate=getattr(args, "isolate", False),
                      device=getattr(args, "device", None))
    app.run()
    return 0


def ui_steps(args) -> int:
    """Tokens to generate: -n; against a dump without a prompt, the dump's tokens and no more
    (nothing to compare past its end) unless -n is given, as ``firscope debug`` does."""
    if getattr(args, "against", None) and args.prompt is None \
            and getattr(args, "tokens", None) is None and not getattr(args, "n_given", False):
        return 0
    return DEFAULT_N if args.n is None else args.n  # -n is checked by its argparse type
