"""Parsing and formatting of byte sizes ("8 GiB", "512MB", 4096)."""
from __future__ import annotations

import re

__all__ = ["parse_size", "format_size"]

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30, "gib": 1 << 30,
    "ti": 1 << 40, "tib": 1 << 40,
}
_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str, name: str = "size") -> int:
    """Return ``value`` as a non-negative int number of bytes.

    Accepts ints and strings such as ``"8 GiB"``, ``"512MB"``, ``"1.5GiB"`` (decimal units are
    powers of 1000, binary ``Ki/Mi/Gi/Ti`` powers of 1024). ``name`` is used in error messages.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or a size string, not bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
        return value
    if isinstance(value, str):
        m = _RE.match(value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{name}: cannot parse size {value!r} (try '8 GiB' or '512MB')")
        number = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
        result = number * _UNITS[m.group(2).lower()]
        if result != int(result):
            raise ValueError(f"{name}: size {value!r} is not a whole number of bytes")
        return int(result)
    raise TypeError(f"{name} must be an int or a size string, not {type(value).__name__}")


def format_size(n: int) -> str:
    """Human-readable size with binary units: ``format_size(3 << 30) == '3.0 GiB'``."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")
