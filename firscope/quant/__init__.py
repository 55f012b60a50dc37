"""The quantization workbench: what int4 costs over a corpus, per weight, and a plan.

- :mod:`.stats`: per-token figures (NLL, KLD, Δp, same top-1) and their summary, defined as
  llama.cpp's ``llama-perplexity --kl-divergence`` defines them (docs/quant.md).
- :mod:`.corpus`: a corpus file as token chunks.
- :mod:`.variants`: one loaded model with any weight instance swapped for its f32 or q4 form.
- :mod:`.work`: chunks and variants run in worker processes (every core), the f32 side cached.
- :mod:`.commands`: ``firscope eval``, ``firscope quant sensitivity``, ``firscope quant plan``.
"""
from __future__ import annotations

# commands are reached through the command line (cli.cmd_eval, cmd_quant)
__all__ = []
