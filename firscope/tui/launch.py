"""``firscope [MODEL.fir]``: the command line's entry into the UI."""
from __future__ import annotations

from .app import DEFAULT_N, FirscopeApp


def run_app(args) -> int:
    from ..model.tokens import parse_token_list
    from ..runtime.opening import resolve_model
    ids = parse_token_list(args.tokens) if getattr(args, "tokens", None) else None
    n = DEFAULT_N if args.n is None else args.n  # -n is checked by its argparse type
    app = FirscopeApp(resolve_model(args.model), prompt_ids=ids, prompt_text=args.prompt, n=n,
                      fir_f32=args.fir_f32, group=args.group, engine=args.engine,
                      q4_path=args.q4_path, against=getattr(args, "against", None),
                      isolate=getattr(args, "isolate", False))
    app.run()
    return 0
