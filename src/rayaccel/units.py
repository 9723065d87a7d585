"""Parsing and formatting of byte sizes ("20GiB", "512MB", 1 << 30).

Binary (KiB, MiB, GiB, TiB, PiB, EiB) and decimal (KB, MB, GB, TB, PB, EB) suffixes
are accepted, case-insensitively; a bare number is bytes. Every size is bounded by
:data:`MAX_BYTES`, so no input can overflow a float, an int64 counter or Ray's resources.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from .errors import RequestError

#: The largest size any rayaccel field accepts: 2**63 - 1 bytes (8 EiB, the int64 limit).
MAX_BYTES = (1 << 63) - 1
#: Longest size string read; anything longer is rejected without being parsed.
MAX_SIZE_TEXT = 1024

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4, "p": 1000**5, "pb": 1000**5, "e": 1000**6, "eb": 1000**6,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4, "pi": 1024**5, "pib": 1024**5, "ei": 1024**6, "eib": 1024**6,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_ALLOWED = "bytes as an int, or e.g. '20GiB', '512MiB', '1.5GB'"


def shorten(value: object, limit: int = 40, *, quote: bool = True) -> str:
    """``repr(value)`` (``str(value)`` when not ``quote``), cut to about ``limit`` characters
    (``'xxxx…' (5000 characters)``) for messages."""
    text = repr(value) if quote else str(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return text[: limit - 1] + "…" + size


def _too_large(shown: str, field: str) -> RequestError:
    return RequestError(f"{shown} is too large; the largest size is {MAX_BYTES} bytes (8 EiB)", field, _ALLOWED)


def parse_bytes(value: int | float | str, field: str = "size") -> int:
    """Return ``value`` as a whole number of bytes, ``0 <= n <= MAX_BYTES``.

    Args:
        value: an int (bytes), or a string such as ``"20GiB"``, ``"1.5 GB"``, ``"4096"``.
        field: the name used in error messages.

    Raises:
        RequestError: not a size, negative, not finite, larger than :data:`MAX_BYTES`,
            or an unknown unit (the message names ``field``).
    """
    if isinstance(value, bool):
        raise RequestError(f"expected a size, got {value!r}", field, _ALLOWED)
    if isinstance(value, int):
        if value < 0:
            raise RequestError(f"must be >= 0, got {shorten(value)}", field)
        if value > MAX_BYTES:
            raise _too_large(shorten(value), field)
        return value
    if isinstance(value, float):
        if value != value or value < 0:
            raise RequestError(f"must be >= 0, got {value!r}", field)
        if math.isinf(value) or value > MAX_BYTES:
            raise _too_large(repr(value), field)
        return int(value)
    if isinstance(value, str) and len(value) <= MAX_SIZE_TEXT:
        m = _SIZE.match(value)
        if m and m.group(2).lower() in _UNITS:
            whole = m.group(1).partition(".")[0].lstrip("0")
            if len(whole) > 20:  # more digits than MAX_BYTES has: too large, whatever the unit
                raise _too_large(shorten(value), field)
            try:
                n = int(Decimal(m.group(1)) * _UNITS[m.group(2).lower()])
            except (InvalidOperation, OverflowError):  # pragma: no cover - the regex admits plain decimals only
                raise RequestError(f"cannot read {shorten(value)} as a size", field, _ALLOWED) from None
            if n > MAX_BYTES:
                raise _too_large(shorten(value), field)
            return n
    if isinstance(value, str) and len(value) > MAX_SIZE_TEXT:
        raise RequestError(f"cannot read {shorten(value)} as a size: longer than {MAX_SIZE_TEXT} characters",
                           field, _ALLOWED)
    raise RequestError(f"cannot read {shorten(value)} as a size", field, _ALLOWED)


def format_bytes(n: int | None) -> str:
    """Human form of a byte count with binary units (``None`` -> ``"-"``; any int, however large)."""
    if n is None:
        return "-"
    if abs(n) >= 1 << 60:  # beyond EiB, or beyond what a float holds: exact, in scientific form
        return f"{Decimal(n) / (1 << 60):.3g} EiB"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(size) < 1024 or unit == "PiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover
