"""``name@layer``: the one way an instance of a declaration is named.

A buffer, weight or node declared inside or for a ``repeat`` has one
instance per layer: ``key_cache@3``, ``qkvw@0``, ``attention@3``. Everything
else has one instance, named by its declaration alone (``x``, ``wte``).
The UI, breakpoints, reports and traces all print and read this form, so it
is parsed and printed here and nowhere else.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import FirError

# Repeat counts are at most 100000, so a layer has at most 5 digits; one more
# lets "layer 100000 does not exist" be said by the caller instead of here.
# ASCII digits only: int() also accepts "²" and "٣", and a 5000-digit string
# would hit Python's integer-digit limit (a ValueError, not a FirError).
MAX_LAYER_DIGITS = 6
_LAYER = re.compile(f"[0-9]{{1,{MAX_LAYER_DIGITS}}}")


@dataclass(frozen=True)
class Ref:
    """An instance: ``Ref("key_cache", 3)`` is ``key_cache@3``, ``Ref("x")`` is ``x``."""

    name: str
    layer: int | None = None

    @classmethod
    def parse(cls, text: str) -> "Ref":
        """``"key_cache@3"`` -> ``Ref("key_cache", 3)``; a bad layer is a FirError."""
        name, at, layer = text.partition("@")
        if not at:
            return cls(text)
        if not name:
            raise FirError(f"missing name before '@' in {_short(text)}")
        if not _LAYER.fullmatch(layer):
            raise FirError(f"bad layer in {_short(text)}: expected NAME@LAYER with LAYER a "
                           f"number of at most {MAX_LAYER_DIGITS} digits")
        return cls(name, int(layer))

    def __str__(self) -> str:
        return self.name + layer_suffix(self.layer)


def every_layer(name: str) -> str:
    """``"attention@*"``: the glob (``--dump-nodes``, ``record=``) over every layer's
    instance of ``name``."""
    return f"{name}@*"


def layer_suffix(layer: int | str | None) -> str:
    """``"@3"`` (``""`` for no layer): the suffix alone, where the name is said apart from it
    (a per-layer buffer's children in a debugger's variables view, "drop the @3": there the
    layer is the text typed, digits as given)."""
    return "" if layer is None else f"@{layer}"


def _short(text: str) -> str:
    """The text as a quoted, escaped excerpt (it may be 5000 digits long)."""
    return ascii(text if len(text) <= 60 else text[:57] + "...")
