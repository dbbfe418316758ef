"""Durations ("250ms", "90s", "1h30m", "7d") and sizes ("64MiB") as config strings."""

from __future__ import annotations

import re

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?")
_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}


def parse_duration(text: str) -> float:
    """Return the seconds in a duration string such as "250ms", "90s" or "1h30m".

    Raises ValueError for anything else (bare numbers included: a unit is required).
    """
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a duration string")
    s = text.strip()
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(s):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if not s or pos != len(s):
        raise ValueError(f'"{text}" is not a duration (use e.g. "250ms", "90s", "30m", "2h", "7d")')
    return total


def format_duration(seconds: float) -> str:
    """Render seconds as the shortest exact duration string ("2h", "250ms", "90s")."""
    ms = round(seconds * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def parse_size(text: str | int) -> int:
    """Return the bytes in a size: an integer, or a string like "64MiB", "1.5GB", "512B"."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a size")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"{text} is not a size (negative)")
        return text
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a size")
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f'"{text}" is not a size (use e.g. "512KiB", "64MiB", "1GiB")')
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def format_size(n: int) -> str:
    """Render bytes with the largest binary unit that divides them exactly."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        size = _SIZE_UNITS[unit]
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"
