"""``firscope.open`` and :class:`Model`: a loaded .fir model for scripts and notebooks.

A :class:`Model` keeps one loaded model, its tokenizer and one machine (the
compiled kernels are made once, at the first run). :meth:`Model.run` decodes
on that machine from position 0 each time, so runs never see each other;
:meth:`Model.debug` opens a gdb-style session on a copy of the arena, so a
paused session and later runs do not disturb each other either.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from ..defaults import DEFAULT_ENGINE, DEFAULT_GROUP, STEPPING_ENGINES
from ..errors import FirError
from .names import Names
from .record import PatchFn

if TYPE_CHECKING:
    from .run import Run

__all__ = ["open", "Model"]

_open = open  # the builtin, before this module's own open shadows it


def open(model: str | os.PathLike | None = None, *, fir_f32: bool = False,
         group: int = DEFAULT_GROUP, engine: str = DEFAULT_ENGINE) -> "Model":  # noqa: A001
    """Load a ``.fir`` model (with the ``config.json`` and ``model.safetensors`` beside it)
    and quantize its q4 weights.

    ``model``: a .fir file, a folder holding one (its ``gpt2.fir`` or its only .fir), or
    None for the bundled sample. ``fir_f32``: load every q4 weight as f32 instead (the
    model without quantization). ``group``: the q4 group size. ``engine``: ``"compiled"``
    (numba) or ``"interp"`` (the step interpreter); both give the same bits.

    Raises :class:`firscope.FirError` for anything wrong with the files; its ``str()`` is
    the message the command line prints (``FILE:LINE:COL: message`` with the line)."""
    if engine not in STEPPING_ENGINES:
        raise FirError(f"unknown engine {engine!r}: the Python API runs "
                       f"{' or '.join(STEPPING_ENGINES)} (the GPU engine: firscope run "
                       "--engine gpu)")
    if not isinstance(fir_f32, (bool, np.bool_)):
        raise FirError(f"fir_f32 must be True or False, not {fir_f32!r}")
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)):
        raise FirError(f"group must be an integer, not {group!r}")
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise FirError(f"model must be a path or None, not {type(model).__name__}")
    from ..model.tokens import load_tokenizer
    from ..runtime.opening import open_model
    loaded = open_model(model, fir_f32=bool(fir_f32), group=int(group))
    return Model(loaded, load_tokenizer(loaded.folder, loaded.vocab), engine)


class Model:
    """A loaded model: run it, record and patch what it computes, debug it.

    Made by :func:`firscope.open`. Attributes: ``path`` (the .fir file), ``engine``,
    ``fir_f32``, ``group``, ``vocab``, ``n_layers``, ``n_positions``, ``nodes`` (the node
    instances in the order they run: ``token``, ``attention@0``, ``head``), ``buffers``
    (buffer names), ``weights`` (weight instances: ``qkvw@0``), ``tokenizer``."""

    def __init__(self, model, tokenizer, engine: str = DEFAULT_ENGINE):
        self._model = model
        self.tokenizer = tokenizer
        self.engine = engine
        self.names = Names(model)
        self._machine = None

    # ---------------------------------------------------------------- what it is
    @property
    def path(self):
        return self._model.path

    @property
    def fir_f32(self) -> bool:
        return self._model.fir_f32

    @property
    def group(self) -> int:
        return self._model.group

    @property
    def vocab(self) -> int:
        return self._model.vocab

    @property
    def n_layers(self) -> int:
        return self._model.layers

    @property
    def n_positions(self) -> int | None:
        return self._model.n_positions

    @property
    def config(self) -> Mapping[str, object]:
        return self._model.config

    @property
    def nodes(self) -> list[str]:
        return [n.full_name for n in self._model.nodes]

    @property
    def buffers(self) -> list[str]:
        return list(self._model.buffers)

    @property
    def weights(self) -> list[str]:
        return list(self._model.weights)

    def outputs(self, node: str) -> list[str]:
        """The buffers ``node`` writes (``attention@0`` -> attn, key_cache, ...)."""
        return [o.name for o in self.names.node(node).outs]

    def encode(self, text: str) -> list[int]:
        """``text`` as token ids, with the model's tokenizer."""
        from ..runtime.opening import check_text
        if not isinstance(text, str):
            raise FirError(f"encode takes text, not {type(text).__name__}")
        return list(self.tokenizer.encode(check_text(text, "prompt")))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def __repr__(self) -> str:
        precision = "f32" if self.fir_f32 else f"q4 (group {self.group})"
        return (f"<firscope.Model {self.path.name} in {self.path.parent}: {self.n_layers} "
                f"layers, {len(self.nodes)} nodes per token, {precision}, engine "
                f"{self.engine}>")

    def _repr_html_(self) -> str:
        from .display import model_html
        return model_html(self)

    # ---------------------------------------------------------------- running
    def warmup(self) -> "Model":
        """Make the machine and compile its kernels now (the first run does it otherwise:
        seconds on a cold cache); returns the model."""
        self._machine_for_run()
        return self

    def _machine_for_run(self):
        if self._machine is None:
            from ..runtime import Machine
            machine = Machine(self._model, engine=self.engine)
            if machine.kernel_runner is not None:
                machine.kernel_runner.warmup()
            self._machine = machine
        return self._machine

    def run(self, prompt: str | None = None, *, tokens: Sequence[int] | str | None = None,
            n: int = 0, record: str | Sequence[str] | None = None,
            patch: Mapping[tuple[str, str], PatchFn] | None = None) -> "Run":
        """Feed the prompt one token per step from position 0, then generate ``n`` tokens
        greedily; returns a :class:`~firscope.api.run.Run`.

        ``prompt`` (text) or ``tokens`` (ids, or text like ``"3,7,9"``); the run takes
        ``len(prompt) + n - 1`` steps when ``n`` > 0 (the last generated token is not fed
        back), ``len(prompt)`` steps when ``n`` is 0, as ``firscope run`` does.

        ``record``: globs over node outputs, as ``--dump-nodes`` takes them
        (``"attention@*/attn"``, ``"head"``, ``["ln1@0", "*/x"]``); their values are kept for
        :meth:`Run.value` and :meth:`Run.save`.

        ``patch``: ``{(node, buffer): fn}``; ``fn(value, step)`` is called right after
        ``node`` ran, at every step, with the buffer's contents (a read-only copy, f32, flat);
        an array it returns replaces the contents for every later node, None keeps them.
        ``node`` may be a glob (``"attention@*"``). Errors in names are raised before anything
        runs."""
        from .run import Run
        from .record import Recording
        ids = self._ids(prompt, tokens)
        n = _count(n)
        steps = len(ids) + max(n - 1, 0)
        taps = Recording(self, record, patch)
        limit = self.n_positions
        if limit is not None and steps > limit:
            raise FirError(f"{len(ids)} prompt tokens and n={n} take {steps} steps: past "
                           f"n_positions {limit} (positions 0..{limit - 1})")
        machine = self._machine_for_run()
        machine.reset()  # every run from a clean machine: one that failed half way included
        taps.attach(machine)
        try:
            generated, logits = machine.generate(ids, n)
        finally:
            taps.detach(machine)
        return Run(self, ids, generated, np.stack(logits).astype(np.float32, copy=False),
                   taps.values, taps.recorded_outputs, patched=taps.describe_patches())

    def _ids(self, prompt, tokens) -> list[int]:
        if prompt is not None and tokens is not None:
            raise FirError("give prompt= or tokens=, not both")
        if tokens is None:
            if prompt is None:
                raise FirError("give a prompt (text) or tokens= (ids)")
            ids = self.encode(prompt)
            if not ids:
                raise FirError("the prompt encodes to no tokens")
        elif isinstance(tokens, str):
            from ..model.tokens import parse_token_list
            ids = parse_token_list(tokens)
        else:
            try:
                ids = [_token(t) for t in tokens]
            except TypeError:
                raise FirError(f"tokens must be a sequence of ids, not "
                               f"{type(tokens).__name__}") from None
        if not ids:
            raise FirError("tokens: no token ids given")
        for t in ids:
            if not 0 <= t < self.vocab:
                raise FirError(f"token id {t} is outside the vocabulary 0..{self.vocab - 1}")
        return ids

    def debug(self, prompt: str | None = None, *, tokens: Sequence[int] | str | None = None,
              n: int = 0):
        """A gdb-style session (:class:`firscope.debug.debugger.Debugger`) fed ``prompt`` (or
        ``tokens``) and generating ``n`` tokens, stopped before the first node: ``step``,
        ``next``, ``cont``, ``goto``, ``break_at``, ``watch``, ``set``, ``evaluate``,
        ``reverse_step``... each returning typed values. It runs on its own copy of the
        arena: runs of this model meanwhile do not disturb it."""
        from ..debug.opening import session_on
        ids = self._ids(prompt, tokens)
        return session_on(self._model.with_own_arena(), ids, self.tokenizer, n=_count(n),
                          engine=self.engine)

    # ---------------------------------------------------------------- weights
    def weight(self, name: str, layer: int | None = None):
        """One weight instance (``weight("qkvw", 0)`` or ``weight("qkvw@0")``): its values as
        the model computes with them, and for a q4 weight its quantization error against the
        checkpoint (:class:`~firscope.api.display.Weight`, shown as a table in Jupyter)."""
        from .display import Weight
        return Weight(self, self.names.weight(name, layer))


def _count(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise FirError(f"n must be an integer >= 0, not {n!r}")
    if n < 0:
        raise FirError(f"n must be 0 or more, not {n}")
    return int(n)


def _token(t) -> int:
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
        raise FirError(f"token ids are integers, found {t!r}")
    return int(t)

