"""``firscope.patching``: activation patching sweeps (see :mod:`firscope.api.patching`), here
so that ``import firscope.patching`` and ``from firscope import patching`` work as
TransformerLens's do."""
from __future__ import annotations

from .api.patching import PatchingResult, logit_diff, residual_targets, sweep

__all__ = ["PatchingResult", "logit_diff", "residual_targets", "sweep"]
