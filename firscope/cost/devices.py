"""Device profiles: the numbers the speed-of-light model needs, read from TOML data files.

The shipped file (``devices.toml`` beside this module) names the devices and
gives a source for every figure. A user adds or replaces devices in
``$XDG_CONFIG_HOME/firscope/devices.toml`` (default ``~/.config``), same
format. A bad file is a :class:`~firscope.errors.FirError` at ``FILE:LINE:COL``;
an unknown name suggests the closest known one.
"""
from __future__ import annotations

import difflib
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FirError, Loc
from ..text import printable

SHIPPED = Path(__file__).with_name("devices.toml")
DEFAULT_DEVICE = "h200"
# field -> (type, unit for messages); every one is required
NUMBERS: dict[str, tuple[type, str]] = {
    "compute_units": (int, ""), "simd_width": (int, "lanes"), "max_lanes_per_cu": (int, "lanes"),
    "max_threadgroups_per_cu": (int, ""), "tg_memory_per_cu": (int, "bytes"),
    "clock_ghz": (float, "GHz"), "dram_bandwidth_gbs": (float, "GB/s"),
    "f32_tflops": (float, "TFLOP/s"), "l2_mb": (float, "MiB"),
    "alu_latency_cycles": (float, "cycles"), "memory_latency_ns": (float, "ns"),
    "cache_latency_ns": (float, "ns"), "launch_overhead_us": (float, "us"),
    "registers_per_cu": (int, "registers"),
    "max_registers_per_lane": (int, "registers"),
    "register_alloc_granularity": (int, "registers"),
}
# field -> (least, most) a profile may give: wide around every device made or imagined (an
# integrated GPU of 1 CU at 0.1 GHz, a thousand-CU part at 10 TB/s), and narrow enough that
# the model's products and quotients stay finite and above the smallest normal f64
# (1e308 GHz once gave "inf us" and a division by zero; 5e-324 TFLOP/s, NaN).
RANGES: dict[str, tuple[float, float]] = {
    "compute_units": (1, 100_000), "simd_width": (1, 1024), "max_lanes_per_cu": (1, 1 << 20),
    "max_threadgroups_per_cu": (1, 100_000), "tg_memory_per_cu": (1, 1 << 30),
    "clock_ghz": (0.01, 100.0), "dram_bandwidth_gbs": (0.01, 1e6),
    "f32_tflops": (1e-4, 1e5), "l2_mb": (1e-3, 1e5), "alu_latency_cycles": (0.1, 1e4),
    "memory_latency_ns": (0.1, 1e6), "cache_latency_ns": (0.01, 1e6),
    "launch_overhead_us": (1e-3, 1e6),
    "registers_per_cu": (1, 1 << 24), "max_registers_per_lane": (1, 4096),
    "register_alloc_granularity": (1, 4096),
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")


@dataclass(frozen=True)
class Device:
    key: str  # what --device takes
    name: str
    compute_units: int
    simd_width: int
    max_lanes_per_cu: int
    max_threadgroups_per_cu: int
    tg_memory_per_cu: int
    clock_ghz: float
    dram_bandwidth_gbs: float
    f32_tflops: float
    l2_mb: float
    alu_latency_cycles: float
    memory_latency_ns: float
    cache_latency_ns: float
    launch_overhead_us: float
    registers_per_cu: int
    max_registers_per_lane: int
    register_alloc_granularity: int
    sources: dict = field(default_factory=dict, compare=False)
    origin: str = ""  # the file it came from

    @property
    def f32_lanes_per_cu(self) -> float:
        """f32 lanes one compute unit issues per cycle (peak / (2 flops x clock x units))."""
        return self.f32_tflops * 1e12 / (2 * self.clock_ghz * 1e9 * self.compute_units)

    def as_dict(self) -> dict:
        out = {"key": self.key, "name": self.name}
        out.update({k: getattr(self, k) for k in NUMBERS})
        out["sources"] = dict(self.sources)
        out["origin"] = self.origin
        return out


def user_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "firscope" / "devices.toml"


def _line_of(lines: list[str], table: str, key: str | None) -> Loc | None:
    """Where ``[table]`` (or ``key =`` inside it) is written, for a message."""
    head = re.compile(r"\s*\[\s*" + re.escape(table) + r"\s*\]")
    start = next((i for i, t in enumerate(lines) if head.match(t)), None)
    if start is None:  # a quoted or escaped name (["\u0000x"]): read each header as TOML
        start = next((i for i, t in enumerate(lines) if t.lstrip().startswith("[")
                      and _header_key(t) == table), None)
    if start is None:
        return None
    if key is not None:
        pat = re.compile(r"\s*" + re.escape(key) + r"\s*=")
        for i in range(start + 1, len(lines)):
            if lines[i].lstrip().startswith("["):
                break
            if pat.match(lines[i]):
                return i, lines[i].index(key) + 1
    return start, lines[start].index("[") + 1


def _header_key(line: str) -> str | None:
    try:
        keys = list(tomllib.loads(line.strip()))
    except (tomllib.TOMLDecodeError, RecursionError):
        return None
    return keys[0] if len(keys) == 1 else None


def _error(path: Path, lines: list[str], table: str, key: str | None, message: str):
    at = _line_of(lines, table, key)
    if at is None:
        return FirError(f"{path}: {message}")
    line, col = at
    return FirError(message, Loc(str(path), line + 1, col, lines[line]))


def _device(path: Path, lines: list[str], key: str, table) -> Device:
    if not _NAME.fullmatch(key):
        raise _error(path, lines, key, None, f"device name '{printable(key)}': give a name "
                                             "--device can take (letters, digits, . _ + -; "
                                             "at most 64)")
    if not isinstance(table, dict):
        raise _error(path, lines, key, None, f"'{key}' must be a table ([{key}]) of numbers")
    values = {}
    for name, (kind, unit) in NUMBERS.items():
        if name not in table:
            raise _error(path, lines, key, None, f"device '{key}' has no '{name}' "
                                                 f"({unit or 'a count'})")
        v = table[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                (kind is int and not isinstance(v, int)):
            want = "a whole number" if kind is int else "a number"
            raise _error(path, lines, key, name, f"'{name}' of device '{key}' must be {want}, "
                                                 f"not {v!r}")
        if not v > 0 or v != v or v == float("inf"):
            raise _error(path, lines, key, name, f"'{name}' of device '{key}' must be more "
                                                 f"than 0 (got {v!r})")
        least, most = RANGES[name]
        if not least <= v <= most:
            raise _error(path, lines, key, name, f"'{name}' of device '{key}' must be "
                                                 f"between {least:g} and {most:g}"
                                                 f"{' ' + unit if unit else ''} (got {v!r})")
        values[name] = kind(v)
    if values["register_alloc_granularity"] > values["max_registers_per_lane"]:
        raise _error(path, lines, key, "register_alloc_granularity",
                     f"'register_alloc_granularity' of device '{key}' must not be more than "
                     f"its 'max_registers_per_lane' ({values['max_registers_per_lane']})")
    unknown = sorted(set(table) - set(NUMBERS) - {"name", "sources"})
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(NUMBERS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise _error(path, lines, key, unknown[0],
                     f"device '{key}' has an unknown field '{unknown[0]}'{hint}")
    name = table.get("name", key)
    sources = table.get("sources", {})
    if not isinstance(name, str) or not isinstance(sources, dict):
        raise _error(path, lines, key, "name" if not isinstance(name, str) else "sources",
                     f"device '{key}': 'name' must be text and 'sources' a table")
    return Device(key, name, sources={str(k): str(v) for k, v in sources.items()},
                  origin=str(path), **values)


def read_file(path: Path) -> tuple[dict[str, Device], str | None]:
    """Every device in one TOML file and its ``default``; a bad file is a FirError at its
    line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise FirError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise FirError(f"{path}: cannot read: {e.strerror or e}") from None
    lines = text.split("\n")
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise FirError(f"{path}: not valid TOML for devices: arrays or tables nested too "
                       "deeply") from None
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e)) or "not valid TOML"
        if m:
            line, col = int(m.group(1)), int(m.group(2))
            src = lines[line - 1] if 0 < line <= len(lines) else ""
            raise FirError(f"not valid TOML: {msg}", Loc(str(path), line, col, src)) from None
        raise FirError(f"{path}: not valid TOML: {msg}") from None
    default = data.pop("default", None)
    if default is not None and not isinstance(default, str):
        raise _error_at_key(path, lines, "default", "'default' must be a device name (text)")
    devices = {key: _device(path, lines, key, table) for key, table in data.items()}
    return devices, default


def _error_at_key(path: Path, lines: list[str], key: str, message: str) -> FirError:
    for i, text in enumerate(lines):
        if re.match(r"\s*" + re.escape(key) + r"\s*=", text):
            return FirError(message, Loc(str(path), i + 1, text.index(key) + 1, text))
    return FirError(f"{path}: {message}")


_DEFAULT: dict[str, str] = {}


def load_devices(user: Path | None = None) -> dict[str, Device]:
    """The shipped devices, then the user's file (when it exists) on top. A top-level
    ``default = "NAME"`` in the user's file is the device used when none is named."""
    devices, _ = read_file(SHIPPED)
    path = user_file() if user is None else user
    _DEFAULT.pop("name", None)
    if path.is_file():
        mine, default = read_file(path)
        devices.update(mine)
        if default is not None:
            _DEFAULT["name"] = default
    return devices


def default_device() -> str:
    """The user's ``default`` (read by the last :func:`load_devices`), else H200."""
    return _DEFAULT.get("name", DEFAULT_DEVICE)


def find_device(name: str | None, devices: dict[str, Device] | None = None) -> Device:
    """The device ``name`` (a key, or a device's full name, any case); None: the default."""
    devices = load_devices() if devices is None else devices
    want = (name or default_device()).strip()
    for d in devices.values():
        if want.lower() in (d.key.lower(), d.name.lower()):
            return d
    close = difflib.get_close_matches(want.lower(), [k.lower() for k in devices], n=1,
                                      cutoff=0.5)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise FirError(f"unknown device '{want}': {hint}known: {', '.join(devices)} "
                   "(firscope cost --device list shows them)")


def device_table(devices: dict[str, Device]) -> str:
    """``--device list``: one line per device with the numbers that matter most, then every
    figure of every device with its unit and where it comes from (``sources``)."""
    rows = [("device", "name", "CUs", "SIMD", "GB/s", "TFLOP/s", "launch us", "from")]
    for d in devices.values():
        origin = "shipped" if d.origin == str(SHIPPED) else d.origin
        rows.append((d.key, d.name, str(d.compute_units), str(d.simd_width),
                     f"{d.dram_bandwidth_gbs:g}", f"{d.f32_tflops:g}",
                     f"{d.launch_overhead_us:g}", origin))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(printable(c).ljust(w) for c, w in zip(r, widths)).rstrip()
             for r in rows]
    width = max(len(k) for k in NUMBERS)
    for d in devices.values():
        lines += ["", f"{printable(d.key)}: {printable(d.name)}"]
        for key, (_, unit) in NUMBERS.items():
            value = f"{getattr(d, key):g}{' ' + unit if unit else ''}"
            source = d.sources.get(key, "(no source given)")
            lines.append(f"  {key:<{width}}  {value:<14}  {printable(source)}")
    return "\n".join(lines)


def devices_json(devices: dict[str, Device]) -> list[dict]:
    """``--device list --json``: every device with each figure and its source."""
    return [d.as_dict() for d in devices.values()]
