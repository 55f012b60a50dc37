""":class:`Run`: what one :meth:`firscope.Model.run` fed, generated, computed and recorded."""
from __future__ import annotations

import os

import numpy as np

from ..errors import FirError
from ..model.ref import every_layer
from .record import Key

__all__ = ["Run"]


class Run:
    """One decode: ``tokens`` (every fed and generated id), ``logits`` (float32
    ``[steps, vocab]``, the logits of every step, prompt steps included), and the recorded
    node outputs (:meth:`value`). Shown as a table in Jupyter."""

    def __init__(self, model, prompt: list[int], generated: list[int], logits: np.ndarray,
                 values: dict[Key, np.ndarray], recorded: frozenset[tuple[str, str]],
                 patched: tuple[str, ...] = ()):
        self.model = model
        self.prompt = list(prompt)
        self.generated = list(generated)
        self.tokens = self.prompt + self.generated
        logits.setflags(write=False)
        self.logits = logits
        self._values = values
        self.recorded = recorded  # (node, buffer) recorded at every step
        self.patched = patched  # the patch keys, as given

    @property
    def steps(self) -> int:
        return int(self.logits.shape[0])

    @property
    def fed(self) -> list[int]:
        """The token fed at each step (the last generated one is not fed)."""
        return self.tokens[: self.steps]

    @property
    def text(self) -> str:
        """Every token, decoded."""
        return self.model.decode(self.tokens)

    def __repr__(self) -> str:
        rec = f", recorded {len(self.recorded)} outputs" if self.recorded else ""
        pat = f", patched {', '.join(self.patched)}" if self.patched else ""
        return (f"<firscope.Run {self.steps} steps, {len(self.prompt)} prompt + "
                f"{len(self.generated)} generated tokens{rec}{pat}: {self.text!r}>")

    def _repr_html_(self) -> str:
        from .display import run_html
        return run_html(self)

    # ---------------------------------------------------------------- values
    def value(self, buffer: str, node: str, step: int) -> np.ndarray:
        """The contents of ``buffer`` right after ``node`` ran at ``step`` (f32, flat): what a
        dump of this run holds under ``step{S}/{node}/{buffer}``. Negative steps count from
        the end. The logits (``value("logits", "head", s)``) are always there; anything else
        must have been recorded (``record=``)."""
        names = self.model.names
        s = names.step(step, self.steps)
        n = names.node(node)
        buffer = names.buffer(buffer)
        got = self._values.get((s, n.full_name, buffer))
        if got is not None:
            return got
        if self._is_logits(n, buffer):
            return self.logits[s]
        outs = [o.name for o in n.outs]
        if buffer not in outs:
            raise FirError(f"{n.full_name} does not write '{buffer}' (it writes "
                           f"{', '.join(outs)}); record the output of a node that writes it")
        every = (f" (or record='{every_layer(n.name)}/{buffer}' for every layer)"
                 if n.layer is not None else "")
        raise FirError(f"{n.full_name}/{buffer} was not recorded in this run: run it with "
                       f"record='{n.full_name}/{buffer}'{every}")

    def values(self) -> dict[str, np.ndarray]:
        """Every recorded value by its dump key ``step{S}/{node}/{buffer}``."""
        from ..dump import dump_key
        return {dump_key(*k): v for k, v in sorted(self._values.items())}

    def _is_logits(self, node, buffer: str) -> bool:
        out = self.model.names.model.outputs["logits"]
        return any(o.name == buffer and o.region == out for o in node.outs)

    def _head(self):
        out = self.model.names.model.outputs["logits"]
        writers = [n for n in self.model.names.model.nodes
                   if any(o.region == out for o in n.outs)]
        return writers[-1]

    def save(self, path: str | os.PathLike) -> str:
        """Write this run as a dump (docs/dump-format.md) that ``firscope diff --against``
        reads: every recorded value and every step's logits. ``path`` must be new or a
        previous dump (the rule of ``run --dump``); the file appears only when complete.
        Returns the path."""
        from .. import __version__
        from ..compare.record import check_replaceable
        from ..dump import DumpWriter, file_sha256
        from ..text import printable
        head = self._head()
        logits_name = next(o.name for o in head.outs
                           if o.region == self.model.names.model.outputs["logits"])
        check_replaceable(path)
        entries = dict(self._values)
        for s in range(self.steps):
            entries.setdefault((s, head.full_name, logits_name), self.logits[s])
        order = {n.full_name: n.index for n in self.model.names.model.nodes}
        try:
            with DumpWriter(path, model=file_sha256(self.model.path), tokens=self.fed,
                            producer=f"firscope {__version__} Python API (engine "
                                     f"{self.model.engine})",
                            expected_keys=len(entries)) as w:
                for (s, node, buffer), v in sorted(entries.items(),
                                                   key=lambda kv: (kv[0][0], order[kv[0][1]])):
                    w.add(s, node, buffer, v)
        except OSError as e:
            raise FirError(f"{printable(os.fspath(path))}: cannot write the dump: "
                           f"{e.strerror or e}") from None
        return os.fspath(path)

    # ---------------------------------------------------------------- views
    def attention(self, layer: int):
        """The attention probabilities of ``layer``'s heads at every step (needs the
        attention node's scores recorded: ``record='attention@*/scores'``); a heatmap per
        head in Jupyter, ``.figure()`` for matplotlib, ``.probs`` [head, query, key]."""
        from .display import attention_of
        return attention_of(self, layer)

    def lens(self, step: int = -1, k: int = 5):
        """The logit lens at ``step``: the top-``k`` next tokens read from the residual
        stream after the embeddings and after each layer, through the model's own final
        norm and head (needs the residual recorded at those nodes; the error says which)."""
        from .display import lens_of
        return lens_of(self, step, k)
