"""config.json: read as data, checked against the model file's ``require`` lines.

A model file can name any path as its config (``config /proc/self/environ``,
``config ~/.docker/config.json``), so nothing read from it is echoed beyond
what a check needs: a JSON error gives the path, line, column and reason,
never the offending line; a value is shown only when it is a number, a
boolean or a short plain word (see :func:`show_json`); otherwise its type and
length.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from ..errors import FirError, Loc
from ..fir.source import read_limited

MAX_CONFIG_BYTES = 4 * 1024 * 1024
# A number in a `require config` line: bounded exponent and length, because
# Fraction("1e999999999") would build a billion-digit integer.
_NUMBER = re.compile(r"[-+]?(\d{1,100}(\.\d{0,100})?|\.\d{1,100})([eE][-+]?\d{1,3}|/\d{1,100})?$")
# Longest string value an error message quotes from a config (HF values are short
# words like "gelu_new"; a longer one may be a secret in a file that is no config:
# AWS secret keys, GitHub classic tokens and service-account key ids are 40 characters).
MAX_SHOWN_STRING = 16
# A plain word: letters, digits and _ . - only, few digits, few case changes
# ("gelu_new", "float32", "GPT2LMHeadModel"; not "a8Fh3kLm9QzX2pR7").
_PLAIN_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
_SHORT_NUMBER = re.compile(r"[-+]?[0-9]{1,6}(\.[0-9]{0,6})?")  # "2", "0.02"
_MAX_DIGITS = 3
_MAX_CASE_CHANGES = 3


@dataclass(frozen=True)
class ConfigFile:
    path: Path
    data: Mapping[str, object]  # the top-level JSON object, read-only


def load_config(path: Path) -> dict:
    raw = read_limited(path, "a JSON config file", MAX_CONFIG_BYTES,
                       missing=f"{path}: config file not found (the model file's 'config' line "
                               "names it, relative to the .fir file's folder)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FirError(f"{path}: config file is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        # The position only: the line itself may be a secret (a model file can
        # name any readable file as its config).
        raise FirError(f"config is not valid JSON: {e.msg}",
                       Loc(str(path), e.lineno, e.colno)) from None
    except RecursionError:
        raise FirError(f"{path}: config is nested too deeply") from None
    except ValueError as e:  # e.g. an integer with more digits than Python converts
        raise FirError(f"{path}: config is not usable JSON: {e}") from None
    if not isinstance(data, dict):
        raise FirError(f"{path}: config must be a JSON object, found {type(data).__name__}")
    return data


def read_config(fir_path: Path, path_tok) -> ConfigFile:
    """The config named by the model file's ``config`` line (a syntax token with a Loc)."""
    path = fir_path.parent / path_tok.text
    try:
        data = load_config(path)
    except FirError as e:
        if e.loc is not None:  # a position inside config.json
            raise
        # a missing or unusable file: the 'config' line that names it is where to look
        raise FirError(e.message, path_tok.loc, e.hint) from None
    return ConfigFile(path, MappingProxyType(data))


def integer_symbols(config: Mapping) -> dict[str, Fraction]:
    """Every integer key of the config is a symbol (booleans are not integers)."""
    return {k: Fraction(v) for k, v in config.items()
            if isinstance(v, int) and not isinstance(v, bool) and k.isidentifier()}


def non_integer_keys(config: Mapping, file_name: str) -> dict[str, str]:
    """Why each other identifier key is not a symbol, for the error where a file uses it."""
    return {k: f"config key '{k}' is used as a symbol, so its value must be an integer; "
               f"{file_name} has {show_json(v)}"
            for k, v in config.items()
            if k.isidentifier() and (isinstance(v, bool) or not isinstance(v, int))}


def parse_require_value(text: str):
    if text == "true":
        return True
    if text == "false":
        return False
    if not _NUMBER.match(text):
        return text
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return text


def config_matches(expected, found) -> bool:
    if isinstance(expected, bool) or isinstance(found, bool):
        return isinstance(found, bool) and isinstance(expected, bool) and expected == found
    if isinstance(expected, Fraction):
        if isinstance(found, float):
            # The config holds a binary float: compare the file's number as that float
            # (1e-05 in both places must match, although 1e-05 is not exactly 1/100000).
            return _as_float(expected) == found
        if isinstance(found, int):
            return Fraction(found) == expected
        return False
    return isinstance(found, str) and found == expected


def _as_float(value: Fraction) -> float:
    try:
        return float(value)
    except OverflowError:  # beyond the f64 range: JSON's 1e999 reads as inf too
        return math.copysign(math.inf, value)


def _harmless(text: str) -> bool:
    """Whether a config string may be echoed: a short plain word, not a token-like one."""
    if len(text) <= 8 and _SHORT_NUMBER.fullmatch(text):
        return True
    if len(text) > MAX_SHOWN_STRING or not _PLAIN_WORD.fullmatch(text):
        return False
    letters = [c.isupper() for c in text if c.isalpha()]
    changes = sum(a != b for a, b in zip(letters, letters[1:]))
    return sum(c.isdigit() for c in text) <= _MAX_DIGITS and changes <= _MAX_CASE_CHANGES


def show_json(value) -> str:
    """A config value as an error message may show it: never a long string or a whole object."""
    if isinstance(value, dict):
        return f"an object with {len(value)} key{'s' if len(value) != 1 else ''}"
    if isinstance(value, list):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, str) and not _harmless(value):
        return f"a string of {len(value)} characters"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 40:
        return f"an integer of {len(str(abs(value)))} digits"
    return json.dumps(value)  # ASCII only: control and non-ASCII characters are escaped
