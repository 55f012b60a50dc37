"""config.json: read as data, checked against the model file's ``require`` lines."""
from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

from ..errors import FirError, Loc
from ..fir.source import read_limited

MAX_CONFIG_BYTES = 4 * 1024 * 1024
# A number in a `require config` line: bounded exponent and length, because
# Fraction("1e999999999") would build a billion-digit integer.
_NUMBER = re.compile(r"[-+]?(\d{1,100}(\.\d{0,100})?|\.\d{1,100})([eE][-+]?\d{1,3}|/\d{1,100})?$")


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
        lines = text.split("\n")  # as json numbers them (splitlines also breaks at \x0c...)
        line = lines[e.lineno - 1] if 0 < e.lineno <= len(lines) else ""
        raise FirError(f"config is not valid JSON: {e.msg}",
                       Loc(str(path), e.lineno, e.colno, line[:300])) from None
    except RecursionError:
        raise FirError(f"{path}: config is nested too deeply") from None
    except ValueError as e:  # e.g. an integer with more digits than Python converts
        raise FirError(f"{path}: config is not usable JSON: {e}") from None
    if not isinstance(data, dict):
        raise FirError(f"{path}: config must be a JSON object, found {type(data).__name__}")
    return data


def integer_symbols(config: dict) -> dict[str, Fraction]:
    """Every integer key of the config is a symbol (booleans are not integers)."""
    return {k: Fraction(v) for k, v in config.items()
            if isinstance(v, int) and not isinstance(v, bool) and k.isidentifier()}


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
        if isinstance(found, (int, float)):
            try:
                return Fraction(found) == expected
            except (ValueError, OverflowError):
                return False
        return False
    return isinstance(found, str) and found == expected


def show_json(value) -> str:
    return json.dumps(value)
