"""Parsing and formatting of byte sizes ("20GiB", "512MB", 1 << 30).

Binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB) suffixes are accepted,
case-insensitively; a bare number is bytes.
"""

from __future__ import annotations

import re

from .errors import RequestError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str, field: str = "size") -> int:
    """Return ``value`` as a whole number of bytes.

    Args:
        value: an int (bytes), or a string such as ``"20GiB"``, ``"1.5 GB"``, ``"4096"``.
        field: the name used in error messages.

    Raises:
        RequestError: not a size, negative, or an unknown unit.
    """
    if isinstance(value, bool):
        raise RequestError(f"expected a size, got {value!r}", field, "bytes as an int, or e.g. '20GiB', '512MB'")
    if isinstance(value, (int, float)):
        if value < 0 or value != value:
            raise RequestError(f"must be >= 0, got {value!r}", field)
        return int(value)
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise RequestError(f"cannot read {value!r} as a size", field, "bytes as an int, or e.g. '20GiB', '512MiB', '1.5GB'")


def format_bytes(n: int | None) -> str:
    """Human form of a byte count with binary units (``None`` -> ``"-"``)."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover
