"""Opening a debug session: the one place a front end turns what the user asked for into a
:class:`~firscope.debug.session.Session` and its command interpreter.

Batch mode (``firscope debug``), the UI (its load worker) and the DAP adapter
(``launch``) all call :func:`open_session` with a typed
:class:`~firscope.runtime.opening.RunInput`, the tokens to generate, the engine
and, optionally, a dump every node is compared with (``--against``). The dump is
opened once: without a prompt it also says which tokens the session is fed.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, NamedTuple

from ..compare.dumpfile import Dump
from ..defaults import DEFAULT_ENGINE, DEFAULT_STEPS
from ..errors import FirError
from ..runtime.opening import RunInput
from .commands import CommandInterpreter
from .debugger import Debugger
from .diverge import attach_reference
from .session import Session

if TYPE_CHECKING:
    from ..runtime.load import Model

__all__ = ["OpenedSession", "open_session", "session_on", "steps_against_dump"]


class OpenedSession(NamedTuple):
    session: Session
    ci: CommandInterpreter  # its command interpreter (``ci.tok``: the model's tokenizer)


def open_session(source: RunInput, *, n: int = DEFAULT_STEPS, engine: str = DEFAULT_ENGINE,
                 against: str | os.PathLike | None = None, isolate: bool = False,
                 progress: Callable[[str, float], None] | None = None,
                 loaded: Callable[["Model"], None] | None = None,
                 warm: bool = True) -> OpenedSession:
    """Open ``source`` and start a session generating ``n`` tokens on ``engine``.

    ``against``: compare every node with this dump as the session runs it (``break
    diverge``, ``info diff``, the UI's Diff tab); without a prompt or tokens in
    ``source`` the session is fed the tokens the dump was fed. ``isolate``: also judge
    each node on its own, from the dump's inputs. ``progress(what, fraction)`` hears the
    load; ``loaded(model)`` is called once the model is open, before the engine starts.
    ``warm=False``: the compiled kernels are loaded at their first use or by
    :func:`warm_session` (the UI's first stop waits for none of them)."""
    dump = None
    if against is not None and source.prompt is None and source.tokens is None:
        dump = Dump(against)
        try:
            source = replace(source, tokens=tuple(_fed_tokens(dump, against)))
        except BaseException:
            dump.close()
            raise
    try:
        opened = source.open(progress=progress, warm=warm)
        if loaded is not None:
            loaded(opened.model)
        session = _session(opened.model, list(opened.ids), n, engine)
        if against is not None:
            attach_reference(session, dump if dump is not None else Dump(against),
                             isolate=isolate)
    except BaseException:
        if dump is not None:
            dump.close()
        raise
    return OpenedSession(session, CommandInterpreter(session, opened.tokenizer))


def warm_session(session: Session,
                 progress: Callable[[str, float], None] | None = None) -> None:
    """Load (or compile) every kernel the session's engine will call: the products'
    (runtime.load.warm) and each micro-kernel's driver on the compiled engine, reporting
    ``progress(what, fraction)`` as each driver comes; what ``open_session(warm=False)``
    left for later."""
    from ..runtime.load import warm
    if progress is not None:
        progress("loading numba and the matrix products' kernels", 0.0)
    warm(session.model)
    runner = session.machine.kernel_runner
    if runner is not None and hasattr(runner, "warmup"):
        runner.warmup(progress=progress)
    session.machine.bound_calls()  # each node's call bound now, not at the first key's node


def session_on(model: "Model", ids: list[int], tokenizer, *, n: int = 0,
               engine: str = DEFAULT_ENGINE) -> Debugger:
    """A session on a model already loaded (the Python API's ``Model.debug``), fed ``ids``
    and generating ``n`` tokens; returns its typed :class:`Debugger`. The session runs on
    ``model``'s arena: give it a model of its own (``Model.with_own_arena``) when something
    else runs on the same one."""
    return Debugger(_session(model, ids, n, engine), tokenizer)


def _session(model: "Model", ids: list[int], n: int, engine: str) -> Session:
    """The one place a :class:`Session` is made."""
    return Session(model, ids, n, engine=engine)


def steps_against_dump(n: int, *, against, prompt: str | None, tokens, n_given: bool) -> int:
    """Tokens to generate: ``n``; against a dump without a prompt, the dump's tokens and no
    more (nothing to compare past its end) unless ``-n`` was given."""
    if against and prompt is None and tokens is None and not n_given:
        return 0
    return n


def _fed_tokens(dump: Dump, path) -> list[int]:
    """The tokens a dump says it was fed (a debugging session runs exactly those)."""
    tokens = dump.tokens
    if not tokens:
        raise FirError(f"{path}: the dump does not say which tokens it was fed (no 'tokens' "
                       "metadata): give --tokens or --prompt")
    return tokens
