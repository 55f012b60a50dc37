"""A DAP ``launch`` request's arguments -> a debugger session.

The arguments are the command line's, spelt as JSON (launch.json):
``model`` (a .fir file or a folder holding one; default: the bundled sample),
``prompt`` (text) or ``tokens`` (ids, a list or "1,2,3"), ``steps`` (tokens to
generate after the prompt, the command line's ``-n``; default 16),
``fir_f32``, ``group``, ``engine`` ("compiled" or "interp"), ``stopOnEntry``
(default true, as the VS Code extension's schema says: a configuration without
it stops before the first node instead of running to the end and closing).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..debug.commands import CommandInterpreter
from ..debug.opening import open_session
from ..defaults import DEFAULT_ENGINE, DEFAULT_GROUP, DEFAULT_STEPS, STEPPING_ENGINES
from ..engines import ENGINE_SPECS
from ..errors import FirError
from ..runtime.opening import RunInput

DEFAULT_STOP_ON_ENTRY = True
# What a launch configuration may say (editors add their own keys, type/name/request...,
# which are ignored); editors/vscode/package.json documents the same keys.
LAUNCH_KEYS = ("model", "prompt", "tokens", "steps", "fir_f32", "group", "engine",
               "stopOnEntry")


@dataclass(frozen=True)
class LaunchConfig:
    model: str | None
    prompt: str | None
    tokens: str | None
    steps: int
    fir_f32: bool
    group: int
    engine: str
    stop_on_entry: bool


def _bool(args: dict, key: str, default: bool = False) -> bool:
    v = args.get(key, default)
    if not isinstance(v, bool):
        raise FirError(f"launch: '{key}' must be true or false, found {v!r}")
    return v


def _int(args: dict, key: str, default: int, low: int, high: int) -> int:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise FirError(f"launch: '{key}' must be a whole number in {low}..{high}, found {v!r}")
    return v


def parse_launch(args: dict) -> LaunchConfig:
    """Check a launch request's arguments; FirError names the first bad one."""
    if not isinstance(args, dict):
        raise FirError("launch: the arguments must be an object")
    model = args.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise FirError(f"launch: 'model' must be the path of a .fir file, found {model!r}")
    prompt, tokens = args.get("prompt"), args.get("tokens")
    if prompt is not None and tokens is not None:
        raise FirError("launch: give 'prompt' or 'tokens', not both")
    if prompt is not None and not isinstance(prompt, str):
        raise FirError(f"launch: 'prompt' must be text, found {prompt!r}")
    if tokens is not None:
        if isinstance(tokens, list):
            if not tokens or not all(isinstance(t, int) and not isinstance(t, bool)
                                     for t in tokens):
                raise FirError("launch: 'tokens' must be a non-empty list of token ids")
            tokens = ",".join(str(t) for t in tokens)
        elif not isinstance(tokens, str):
            raise FirError(f"launch: 'tokens' must be a list of ids or '1,2,3', found {tokens!r}")
    engine = args.get("engine", DEFAULT_ENGINE)
    if engine in ENGINE_SPECS and not ENGINE_SPECS[engine].steps:  # a debugger steps
        raise FirError(f"launch: 'engine' {engine}: {ENGINE_SPECS[engine].why_not}")
    if engine not in STEPPING_ENGINES:
        raise FirError(f"launch: 'engine' must be one of {', '.join(STEPPING_ENGINES)}, "
                       f"found {engine!r}")
    return LaunchConfig(model=model, prompt=prompt, tokens=tokens,
                        steps=_int(args, "steps", DEFAULT_STEPS, 0, 1 << 20),
                        fir_f32=_bool(args, "fir_f32"),
                        group=_int(args, "group", DEFAULT_GROUP, 1, 1 << 20),
                        engine=engine, stop_on_entry=_bool(args, "stopOnEntry",
                                                            DEFAULT_STOP_ON_ENTRY))


def start_session(config: LaunchConfig, progress=None) -> CommandInterpreter:
    """``progress(message)`` hears each stage (the DAP adapter sends progress events)."""
    def loaded(model) -> None:
        if progress is not None:
            progress(f"{model.path.name}: {len(model.nodes)} nodes loaded; starting the engine")
    source = RunInput(model=config.model, fir_f32=config.fir_f32, group=config.group,
                      prompt=config.prompt, tokens=config.tokens)
    return open_session(source, n=config.steps, engine=config.engine, loaded=loaded).ci


def model_path(ci: CommandInterpreter) -> Path:
    return ci.model.path.resolve()
