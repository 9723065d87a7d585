"""Shared pieces of the CLI: the console, JSON printing, error handling, argument parsers.

Output for people never interprets data: the consoles have ``emoji=False`` (a PCI bus id
``00000000:AB:00.0`` stays text, not an emoji), and data printed inside markup goes through
:func:`plain` (a :class:`rich.text.Text`) or :func:`rich.markup.escape`, so ``[torch]`` in a
message or a device name is printed as written.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Collection, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from ..errors import RequestError

console = Console(highlight=False, emoji=False)
err_console = Console(stderr=True, highlight=False, emoji=False)

#: Longest index list (``--busy``) read, characters.
MAX_INDEX_TEXT = 4096
#: Indices a list may name when no device set bounds it.
MAX_INDEX_ITEMS = 1 << 16


def plain(value: Any, style: str = "") -> Text:
    """``value`` as a rich Text printed exactly as written: no markup, no emoji codes (None -> ``N/A``)."""
    return Text(na(value), style=style)


def print_json(obj: Any) -> None:
    """Print ``obj`` as JSON on stdout (plain, machine-readable)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def error_line(message: str) -> None:
    """Print ``error: message`` on stderr as one line (newlines in ``message`` become ``; ``).

    ``message`` is printed literally: brackets in it (``[0, 1]``, a path) are not rich markup.
    """
    one = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    err_console.print(f"[bold red]error:[/] {escape(one)}", markup=True, soft_wrap=True)


def warn_line(message: str) -> None:
    """Print ``warning: message`` on stderr (``message`` printed literally)."""
    err_console.print(f"[yellow]warning:[/] {escape(str(message))}", markup=True, soft_wrap=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr (one line, see :func:`error_line`) and exit with ``code``."""
    error_line(message)
    raise typer.Exit(code)


def connect_cluster(address: str, as_json: bool = False) -> str:
    """Resolve ``address`` (``auto``: the one Ray cluster here, see
    :func:`rayaccel.ray.driver.ops.resolve_address`), print ``cluster: <address>`` as the first
    line (not with ``--json``: its object carries ``address``), then connect; return the address.

    Raises:
        ClusterError: no cluster, several (listed), or none answering there.
    """
    from ..ray.driver import ops

    resolved = ops.resolve_address(address)
    if not as_json:
        how = " (found by --address auto)" if address == "auto" and resolved != address else ""
        console.print(Text(f"cluster: {resolved}{how}"))
    ops.connect(resolved)
    return resolved


def na(value: Any) -> str:
    """Display placeholder for unknown values (the core uses None)."""
    return "N/A" if value is None else str(value)


def _index_ranges(indices: Collection[int]) -> str:
    ordered = sorted(set(indices))
    if not ordered:
        return "none"
    out, start, prev = [], ordered[0], ordered[0]
    for i in ordered[1:] + [None]:  # type: ignore[list-item]
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}-{prev}" if prev != start else str(start))
        if i is not None:
            start = prev = i
    return ",".join(out)


def parse_index_list(text: str | None, flag: str, *, known: Collection[int] | None = None) -> set[int]:
    """Read device indices such as ``"0,3"`` or ``"4-7,9"`` (the ``--busy`` syntax).

    Ranges are checked before they are expanded, so ``0-50000000`` costs nothing: with
    ``known`` (the topology's device indices) every index must be one of them; without it
    the list may name at most :data:`MAX_INDEX_ITEMS` indices.

    Args:
        text: the option's value; None or empty is the empty set.
        flag: the option's name for messages, e.g. ``"--busy"``.
        known: the device indices that exist, or None.

    Raises:
        RequestError: unreadable, backwards range, too long, or an index not in ``known``
            (the message names ``flag``, the bad part and what is allowed).
    """
    if not text:
        return set()
    allowed = "device indices like 0,3 or 4-7"
    if len(text) > MAX_INDEX_TEXT:
        raise RequestError(f"{len(text)} characters, at most {MAX_INDEX_TEXT}", flag, allowed)
    valid = set(known) if known is not None else None
    last = max(valid) if valid else None
    where = f" (devices: {_index_ranges(valid)})" if valid is not None else ""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo_s, dash, hi_s = part.partition("-")
        lo_s, hi_s = lo_s.strip(), hi_s.strip()
        if not (lo_s.isdecimal() and (not dash or hi_s.isdecimal())) or len(lo_s) > 9 or len(hi_s) > 9:
            raise RequestError(f"cannot read {part[:40]!r}; expected {allowed}", flag)
        lo = int(lo_s)
        hi = int(hi_s) if dash else lo
        if lo > hi:
            raise RequestError(f"range {part!r} runs backwards; expected low-high like 4-7", flag)
        if valid is not None:
            if last is None or hi > last:
                what = f"range {part!r} goes past the last device" if dash else f"no device {lo}"
                raise RequestError(what + where, flag)
            missing = [i for i in range(lo, hi + 1) if i not in valid]
            if missing:
                raise RequestError(f"no device {missing[0]}{where}", flag)
        if len(out) + (hi - lo + 1) > MAX_INDEX_ITEMS:
            raise RequestError(f"names more than {MAX_INDEX_ITEMS} devices", flag, allowed)
        out.update(range(lo, hi + 1))
    return out
