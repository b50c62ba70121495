"""Parsing and formatting of sizes ("8GiB") and durations ("2h")."""

from __future__ import annotations

import math
import re

from .errors import SpecError

_SIZE_UNITS: dict[str, float] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}
_DURATION_UNITS: dict[str, float] = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")

#: The largest size and duration anything accepts: far beyond any machine or job, and
#: well inside what the ledger (64-bit integers) and a float's exact integers hold.
MAX_SIZE = 2**60  # 1 EiB
MAX_DURATION = 100 * 365 * 86400.0  # a century

SIZE_HELP = 'a size such as "512MiB", "8GiB", "8G" or a number of bytes (at most 1 EiB)'
DURATION_HELP = 'a duration such as "90s", "30m", "2h" or a number of seconds (at most 100 years)'


def parse_size(value: object, field: str = "size") -> int:
    """Return a size in bytes.

    >>> parse_size("8GiB"), parse_size("512MiB"), parse_size("8G"), parse_size(1024)
    (8589934592, 536870912, 8000000000, 1024)
    """
    number = _number_with_unit(value, _SIZE_UNITS)
    if number is None or not 0 <= number <= MAX_SIZE:
        raise SpecError(field, value, SIZE_HELP)
    return int(number)


def parse_size_exact(value: object, field: str = "size") -> float:
    """A size in bytes as written, not rounded (``"1.5"`` is 1.5): whoever needs whole
    bytes compares it with ``parse_size``.

    >>> parse_size_exact("1.5"), parse_size_exact("0.5KiB")
    (1.5, 512.0)
    """
    parse_size(value, field)
    number = _number_with_unit(value, _SIZE_UNITS)
    assert number is not None
    return number


def parse_duration(value: object, field: str = "duration") -> float:
    """Return a duration in seconds.

    >>> parse_duration("90s"), parse_duration("30m"), parse_duration("2h"), parse_duration(5)
    (90.0, 1800.0, 7200.0, 5.0)
    """
    number = _number_with_unit(value, _DURATION_UNITS)
    if number is None or not 0 <= number <= MAX_DURATION:
        raise SpecError(field, value, DURATION_HELP)
    return float(number)


def _number_with_unit(value: object, units: dict[str, float]) -> float | None:
    """``value`` times its unit as a finite float, or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        # compare as an integer: float() of a huge int raises OverflowError
        return float(value) if abs(value) <= 2**1000 else math.inf
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match:
            unit = match.group(2).lower()
            if unit in units:
                number = float(match.group(1)) * units[unit]
                return number if math.isfinite(number) else None
    return None


def format_size(n: float | None) -> str:
    """Human-readable binary size: ``format_size(8 * 2**30) == '8 GiB'``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.0f} TiB"


def format_duration(seconds: float | None) -> str:
    """Compact duration: ``format_duration(724) == '12m 04s'``."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {(s % 3600) // 60:02d}m"
    return f"{s // 86400}d {(s % 86400) // 3600:02d}h"
