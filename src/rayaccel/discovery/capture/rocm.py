"""``rocm-smi --showtopo``: weight, hops and link-type matrices plus NUMA nodes.

Devices are AMD GPUs (vendor ``"amd"``, model unknown: the topology view does
not name them). xGMI pairs become ``xgmi`` links with ``count=None`` (rocm-smi
does not give lane counts); PCIe pairs become ``pcie`` links whose class comes
from hops and NUMA nodes (see :func:`._grid.amd_link`). ``Numa Node: -1``
means unknown. Trailing spaces, tabs and literal ``\\t`` (a capture pasted out
of a Python string) are tolerated.
"""

from __future__ import annotations

import re

from ._base import Fragment, Line, fail, find_hostname
from ._grid import Grid, add_amd_links, read_grid

FORMAT = "rocm-smi --showtopo"

_SECTION = re.compile(r"^\s*=+\s*(.*?)\s*=+\s*$")
_NUMA = re.compile(r"^\s*GPU\[(\d+)\]\s*:\s*\(Topology\)\s*Numa (Node|Affinity)\s*:\s*(-?\d+)\s*$")
_TITLES = {"weight": "Weight between two GPUs", "hops": "Hops between two GPUs",
           "type": "Link Type between two GPUs"}


def detect(lines: list[Line]) -> bool:
    """True for rocm-smi topology sections."""
    return any("between two GPUs" in ln.text or "ROCm System Management Interface" in ln.text
               or _NUMA.match(ln.text) for ln in lines)


def parse(lines: list[Line], path: str) -> list[Fragment]:
    """Devices, links and NUMA nodes.

    Raises:
        CaptureError: no matrix, matrices that disagree on the GPUs, or a damaged row.
    """
    frag = Fragment(FORMAT, path, hostname=find_hostname(lines))
    grids: dict[str, Grid] = {}
    numa: dict[int, int | None] = {}
    affinity: dict[int, int | None] = {}
    i = 0
    while i < len(lines):
        ln = lines[i]
        m = _SECTION.match(ln.text)
        if m:
            key = next((k for k, t in _TITLES.items() if t.lower() in m.group(1).lower()), None)
            if key is not None:
                grid, i = read_grid(lines, i + 1, m.group(1), path)
                if grid is None:
                    frag.warn(f"section {m.group(1)!r} has no table", ln.no)
                else:
                    grids[key] = grid
                    frag.first_line = frag.first_line or grid.header_line
                continue
        n = _NUMA.match(ln.text)
        if n:
            val = int(n.group(3))
            (numa if n.group(2) == "Node" else affinity)[int(n.group(1))] = val if val >= 0 else None
        i += 1
    if not grids:
        raise fail("no rocm-smi matrix found (expected sections 'Weight between two GPUs', "
                   "'Hops between two GPUs' or 'Link Type between two GPUs')", path)
    first = next(iter(grids.values()))
    for g in grids.values():
        if g.labels != first.labels:
            raise fail(f"the {g.title!r} table has columns {g.labels}, but {first.title!r} has {first.labels}",
                       path, g.header_line)
    idx = []
    for lab in first.labels:
        m = re.match(r"^GPU(\d+)$", lab)
        if not m:
            raise fail(f"column {lab!r} is not a GPU (expected GPU0, GPU1, ...)", path, first.header_line)
        idx.append(int(m.group(1)))
    if idx != list(range(len(idx))):
        raise fail(f"expected columns GPU0..GPU{len(idx) - 1} in order, got {first.labels}", path, first.header_line)
    for g in grids.values():
        missing = [lab for lab in g.labels if lab not in g.rows]
        if missing:
            frag.warn(f"{g.title!r}: no rows for {', '.join(missing)} (the table looks cut)", g.last_line)
    for k in idx:
        node = numa.get(k, affinity.get(k))
        frag.device(k, vendor="amd", numa_node=node)
    stray = sorted(set(numa) - set(idx))
    if stray:
        frag.warn(f"NUMA lines for GPUs not in the matrices ignored: {stray}")
    add_amd_links(frag, len(idx), grids.get("type"), grids.get("weight"), grids.get("hops"),
                  {k: frag.devices[k].get("numa_node") for k in idx})
    return [frag]
