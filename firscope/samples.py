"""Where the bundled sample models are, in a checkout and in an installed wheel."""
from __future__ import annotations

from pathlib import Path

from .errors import FirError

DEFAULT_SAMPLE = "tiny-gpt2"


def samples_root() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "sample_models", here.parent / "sample_models"):
        if (candidate / DEFAULT_SAMPLE / "gpt2.fir").exists():
            return candidate
    raise FirError("the bundled sample model is missing from this installation; "
                   "give a MODEL.fir path")


def default_model() -> Path:
    return samples_root() / DEFAULT_SAMPLE / "gpt2.fir"
