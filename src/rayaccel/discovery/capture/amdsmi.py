"""``amd-smi topology``: ACCESS / WEIGHT / HOPS / LINK TYPE tables keyed by PCI BDF.

Devices are numbered in the order of the table columns (amd-smi's GPU order)
and keep their BDF as ``pci_bus_id``. Links follow :func:`._grid.amd_link`;
without a LINK TYPE table the kind is inferred from weights, with a warning.
A capture that ends in ``[output truncated]`` or with missing rows imports what
is there, with a warning naming what is missing. Tables other than these four (later
releases add e.g. ``NUMA BW TABLE``) are skipped unread: their cells need not be a matrix.
"""

from __future__ import annotations

import re

from ._base import Fragment, Line, fail, find_hostname
from ._grid import Grid, add_amd_links, read_grid

FORMAT = "amd-smi topology"

_TABLE = re.compile(r"^\s*([A-Z][A-Z _]*?)\s+TABLE\s*:?\s*$")
_BDF = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_KEYS = {"ACCESS": "access", "WEIGHT": "weight", "HOPS": "hops", "LINK TYPE": "type"}


def detect(lines: list[Line]) -> bool:
    """True for amd-smi ``... TABLE:`` sections."""
    return any((m := _TABLE.match(ln.text)) and m.group(1) in _KEYS for ln in lines)


def parse(lines: list[Line], path: str) -> list[Fragment]:
    """Devices (with BDFs) and links.

    Raises:
        CaptureError: no table, tables that disagree on the GPUs, or a damaged row.
    """
    frag = Fragment(FORMAT, path, hostname=find_hostname(lines))
    grids: dict[str, Grid] = {}
    i = 0
    while i < len(lines):
        ln = lines[i]
        m = _TABLE.match(ln.text)
        if m and m.group(1) not in _KEYS:  # a table topology does not need (NUMA BW, FB SHARING ...): not read
            i += 1
            while i < len(lines) and not _TABLE.match(lines[i].text):
                i += 1
            continue
        if m:
            grid, i = read_grid(lines, i + 1, f"{m.group(1)} TABLE", path)
            if grid is not None and m.group(1) in _KEYS:
                grids[_KEYS[m.group(1)]] = grid
                frag.first_line = frag.first_line or grid.header_line
            continue
        if "truncated" in ln.text.lower():
            frag.warn(f"the capture says {ln.text.strip()!r}; tables after this point are missing", ln.no)
        i += 1
    if not grids:
        raise fail("no amd-smi topology table found (expected 'ACCESS TABLE:', 'WEIGHT TABLE:', "
                   "'HOPS TABLE:' or 'LINK TYPE TABLE:' followed by a matrix)", path)
    first = next(iter(grids.values()))
    for g in grids.values():
        if g.labels != first.labels:
            raise fail(f"{g.title} has columns {g.labels}, but {first.title} has {first.labels}", path, g.header_line)
        missing = [lab for lab in g.labels if lab not in g.rows]
        if missing:
            frag.warn(f"{g.title}: no rows for {', '.join(missing)} (the table looks cut)", g.last_line)
    for lab in first.labels:
        if not _BDF.match(lab):
            raise fail(f"column {lab!r} is not a PCI bus id (expected e.g. 0000:05:00.0)", path, first.header_line)
    for k, bdf in enumerate(first.labels):
        frag.device(k, vendor="amd", pci_bus_id=bdf.lower())
    absent = [t for t in ("hops", "type") if t not in grids]
    if absent:
        names = {"hops": "HOPS", "type": "LINK TYPE"}
        frag.warn(f"no {' or '.join(names[t] + ' TABLE' for t in absent)} in the capture")
    add_amd_links(frag, len(first.labels), grids.get("type"), grids.get("weight"), grids.get("hops"), {})
    return [frag]
