"""``firscope debug``: gdb-style batch mode, commands from -x SCRIPT or stdin."""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import FirError
from .commands import CommandInterpreter
from .session import Session

MAX_SCRIPT_BYTES = 4 * 1024 * 1024


def run_batch(args, out=None, stdin=None) -> int:
    from ..cli import load, prompt_ids
    out = out or sys.stdout
    model = load(args)
    against = getattr(args, "against", None)
    given = args.tokens or args.prompt is not None
    if not given and not against:
        raise FirError("give the prompt: --prompt TEXT or --tokens IDS")
    ids, tok = prompt_ids(args, model)
    n = 16 if args.n is None else args.n
    if against and not given:  # the tokens the dump was fed, and no more (issue 13)
        from .diverge import dump_tokens
        ids, n = dump_tokens(against), 0 if args.n is None else n
    if n < 0:
        raise FirError("-n must be 0 or more")
    session = Session(model, ids, n, engine=args.engine)
    if against:  # compare every node with the dump
        from .diverge import attach_reference
        attach_reference(session, against)
    ci = CommandInterpreter(session, tok)
    if args.script:
        path = Path(args.script)
        try:
            if path.stat().st_size > MAX_SCRIPT_BYTES:
                raise FirError(f"{path}: script is too large")
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise FirError(f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise FirError(f"{path}: cannot read script: {e}") from None
        source = str(path)
    else:
        lines = (stdin or sys.stdin).read().splitlines()
        source = "<stdin>"
    print(f"firscope debug: {model.path.name}, {len(ids)} prompt tokens, {n} to generate, "
          f"{len(model.nodes)} nodes per token", file=out)
    print(ci.where_line(), file=out)
    errors = 0
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        print(f"(firscope) {text}", file=out)
        try:
            result = ci.execute(text)
        except FirError as e:
            errors += 1
            print(f"{source}:{number}: error: {e}", file=out)
            continue
        if result:
            print(result, file=out)
        if ci.quit:
            break
    out.flush()
    return 0
