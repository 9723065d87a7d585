"""Shared pieces of the capture importers: cleaned lines, fragments, small parsers.

Every importer turns the text of one capture into one or more :class:`Fragment`
objects: a *partial* description of one machine (devices as field dicts,
links, NICs, warnings). :mod:`.combine` merges fragments (from one capture or
several) into a validated :class:`~rayaccel.topology.NodeTopology`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ...errors import CaptureError
from ...topology import Link, Nic, Slice

#: Shell prompt carrying ``user@host`` (``[u@h ~]$``, ``u@h:~$``, ``root@pod:/#``).
_PROMPT = re.compile(r"(?:^|[\s\[(])[\w.+-]+@([A-Za-z0-9][\w.-]*)(?:[:\s~\]]|$).*?[$#>]")


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a capture after clean-up.

    Attributes:
        no: 1-based line number in the original text.
        text: the line without ``\\r``, stray backticks, a leading ``#``/``>``
            comment or quote marker, with literal ``\\t`` turned into tabs.
        raw: the original line.
    """

    no: int
    text: str
    raw: str


@dataclass
class Fragment:
    """What one capture (or one table of it) says about the machine.

    Attributes:
        format: human name of the capture format, e.g. ``"nvidia-smi topo -m"``.
        path: the file (or ``<text>``) it came from.
        devices: device index -> ``Device`` field values known from this capture.
        links: ``(a, b)`` with ``a < b`` -> :class:`Link`.
        nics: NICs seen. hostname: from a shell prompt, or None.
        warnings: what was skipped or guessed, one sentence each.
        enumerates_devices: True when the capture lists every device of the
            machine (a topology matrix, ``nvidia-smi -L``); False for captures
            that may cover a subset (MIG tables).
        pcie_only: True for ``nvidia-smi topo -mp`` (no NVLink shown).
        placements: ``(gpu, profile id)`` -> ``(starts, slots, name or None)``
            from ``nvidia-smi mig -lgipp`` placement lines.
        slice: the multi-host slice the machine belongs to (TPU metadata), or None.
    """

    format: str
    path: str
    devices: dict[int, dict[str, Any]] = field(default_factory=dict)
    links: dict[tuple[int, int], Link] = field(default_factory=dict)
    nics: list[Nic] = field(default_factory=list)
    hostname: str | None = None
    warnings: list[str] = field(default_factory=list)
    enumerates_devices: bool = True
    pcie_only: bool = False
    placements: dict[tuple[int, int], tuple[tuple[int, ...], int, str | None]] = field(default_factory=dict)
    first_line: int | None = None
    slice: Slice | None = None

    def device(self, index: int, **fields: Any) -> dict[str, Any]:
        """The field dict of device ``index`` (created on first use), updated with ``fields``."""
        d = self.devices.setdefault(index, {"index": index})
        d.update({k: v for k, v in fields.items() if v is not None})
        return d

    def warn(self, message: str, line: int | None = None) -> None:
        """Record a warning, prefixed with the file (and line) it concerns."""
        where = self.path + (f", line {line}" if line is not None else "")
        self.warnings.append(f"{where}: {message}")


def clean_lines(text: str) -> list[Line]:
    """Split ``text`` into :class:`Line` objects, undoing common pasting damage.

    Handles ``\\r\\n``, literal ``\\t`` (text copied out of a Python string),
    stray backticks, leading ``#``/``# `` comment markers and ``> `` quote markers.
    """
    if "\\t" in text:
        text = text.replace("\\t", "\t")
    if "\n" not in text and "\\n" in text:
        text = text.replace("\\n", "\n")
    out = []
    for no, raw in enumerate(text.splitlines(), start=1):
        t = raw.replace("\r", "").replace("`", "")
        t = _strip_marker(t)
        out.append(Line(no, t, raw))
    return out


_MARKER = re.compile(r"^[ ]{0,3}(?:#(?: |(?=\t)|$)|#(?=[A-Za-z])|>(?: |(?=\t)|$))")


def _strip_marker(t: str) -> str:
    m = _MARKER.match(t)
    if m and not t.lstrip().startswith("#!"):
        return t[m.end():]
    return t


def find_hostname(lines: list[Line]) -> str | None:
    """The host named by the first shell prompt (``user@host``), or None."""
    for ln in lines:
        m = _PROMPT.search(ln.raw)
        if m:
            return m.group(1)
    return None


_CPU_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_cpulist(value: str) -> tuple[int, ...] | None:
    """``"0-11,24-35"`` -> ``(0, ..., 11, 24, ..., 35)``; empty/``N/A`` -> None.

    Raises:
        ValueError: not a CPU list (callers turn it into a CaptureError or warning).
    """
    v = value.strip().replace(" ", "")
    if v in ("", "N/A", "NA", "-"):
        return None
    cpus: list[int] = []
    for part in v.split(","):
        m = _CPU_RANGE.match(part)
        if not m:
            raise ValueError(f"{value!r} is not a CPU list (expected e.g. '0-11,24-35')")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo or hi - lo > 65536:
            raise ValueError(f"{value!r} has a bad range {part!r}")
        cpus.extend(range(lo, hi + 1))
    return tuple(sorted(set(cpus)))


def parse_numa(value: str) -> tuple[int | None, bool]:
    """A NUMA affinity cell -> ``(node, ok)``.

    ``"3"`` -> ``(3, True)``; a multi-node value (``"0-1"``, ``"0,8,252-255"``)
    -> ``(None, True)`` because the device has no single NUMA node; empty or
    ``N/A`` -> ``(None, True)``; anything else -> ``(None, False)``.
    """
    v = value.strip()
    if v in ("", "N/A", "NA", "-", "-1"):
        return None, True
    if v.isdigit():
        return int(v), True
    try:
        nodes = parse_cpulist(v)
    except ValueError:
        return None, False
    if nodes and len(nodes) == 1:
        return nodes[0], True
    return None, True


def fail(message: str, path: str, line: int | None = None) -> CaptureError:
    """A :class:`CaptureError` (to ``raise``)."""
    return CaptureError(message, path, line)


def span(names: list[str]) -> str:
    """``["GPU5", ..., "GPU15"]`` -> ``"GPU5..GPU15"`` (or the single name / a list)."""
    if not names:
        return ""
    if len(names) == 1:
        return names[0]
    if len(names) == 2:
        return f"{names[0]}, {names[1]}"
    return f"{names[0]}..{names[-1]}"
