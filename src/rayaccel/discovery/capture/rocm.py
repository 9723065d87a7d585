"""``rocm-smi --showtopo`` / ``--showtoponuma`` / ``--json``: link matrices and NUMA nodes.

Devices are AMD GPUs (vendor ``"amd"``, model unknown: the topology view does
not name them). xGMI pairs become ``xgmi`` links with ``count=None`` (rocm-smi
does not give lane counts); PCIe pairs become ``pcie`` links whose class comes
from hops and NUMA nodes (see :func:`._grid.amd_link`). ``Numa Node: -1``
means unknown. Trailing spaces, tabs and literal ``\\t`` (a capture pasted out
of a Python string) are tolerated.

The NUMA section comes in every form seen in public output:

* ``GPU[0]\t\t: (Topology) Numa Node: 0`` (ROCm 5-6, with the ``(Topology)`` tag);
* ``GPU 0          : (Topology) Numa Node: 0`` (no brackets; ARCHER2's MI210 nodes);
* ``HCU[0]\t\t: Numa Node:  0`` (no tag: the rocm-smi of Hygon's DTK, whose DCUs it
  calls HCU/DCU, with matrices titled "... between HCUs" and labelled ``HCU[0]``);
* the NUMA section alone (``rocm-smi --showtoponuma``): devices and NUMA nodes, no links;
* ``rocm-smi --json``: ``{"card0": {"(Topology) Numa Node": "0", ...}}`` (also PCI bus and
  VRAM size when present).
"""

from __future__ import annotations

import re

from ._base import Fragment, Line, fail, find_hostname
from ._grid import Grid, add_amd_links, read_grid

FORMAT = "rocm-smi --showtopo"

FORMAT_JSON = "rocm-smi --json"

# GPU[0] / GPU 0 / HCU[0] / DCU[0], an optional (Topology) tag, an optional colon after Node/Affinity
_NUMA = re.compile(r"^\s*(GPU|HCU|DCU)\s*\[?\s*(\d+)\s*\]?\s*:\s*(?:\(Topology\)\s*)?Numa (Node|Affinity)\s*:?\s*(-?\d+)\s*$")
# matrix titles: "Weight between two GPUs" (ROCm) or "Weight between HCUs" (Hygon DTK), as a section or a bare line
_TITLE = re.compile(r"^\s*(?:=+\s*)?(Weight|Hops|Link Type) between (?:two )?(?:GPUs|HCUs|DCUs)\s*(?:=+\s*)?$")
_KEYS = {"weight": "weight", "hops": "hops", "link type": "type"}
_LABEL = re.compile(r"^(?:GPU|HCU|DCU)\[?(\d+)\]?$")
_JSON_KEY = '"(Topology) Numa Node"'


def detect(lines: list[Line]) -> bool:
    """True for rocm-smi topology sections."""
    return any("between two GPUs" in ln.text or "ROCm System Management Interface" in ln.text
               or _NUMA.match(ln.text) or _TITLE.match(ln.text) for ln in lines)


def detect_json(lines: list[Line]) -> bool:
    """True for ``rocm-smi --json`` output that carries NUMA nodes."""
    return any(ln.text.lstrip().startswith('{"card') and _JSON_KEY in ln.text for ln in lines)


def parse_json(lines: list[Line], path: str) -> list[Fragment]:
    """Devices (``cardN``), their NUMA node, PCI bus and VRAM size from ``rocm-smi --json``.

    Raises:
        CaptureError: the JSON object does not parse, or names no card.
    """
    import json

    start = next(ln for ln in lines if ln.text.lstrip().startswith('{"card') and _JSON_KEY in ln.text)
    text = "\n".join(ln.text for ln in lines if ln.no >= start.no)
    end = text.rfind("}")
    try:
        data = json.JSONDecoder().raw_decode(text[text.index("{"):end + 1])[0]
    except ValueError as e:
        raise fail(f"rocm-smi --json: not valid JSON ({e})", path, start.no) from None
    frag = Fragment(FORMAT_JSON, path, hostname=find_hostname(lines), first_line=start.no)
    for key, val in data.items() if isinstance(data, dict) else ():
        m = re.fullmatch(r"card(\d+)", key)
        if not m or not isinstance(val, dict):
            continue
        numa = val.get("(Topology) Numa Node", val.get("(Topology) Numa Affinity"))
        node = int(numa) if isinstance(numa, str) and re.fullmatch(r"\d+", numa.strip()) else None
        vram = val.get("VRAM Total Memory (B)")
        bus = val.get("PCI Bus")
        frag.device(int(m.group(1)), vendor="amd", numa_node=node,
                    memory_bytes=int(vram) if isinstance(vram, str) and vram.isdigit() else None,
                    pci_bus_id=bus if isinstance(bus, str) and bus else None)
    if not frag.devices:
        raise fail("rocm-smi --json: no 'cardN' entry", path, start.no)
    return [frag]


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
    prefix = "GPU"
    while i < len(lines):
        ln = lines[i]
        m = _TITLE.match(ln.text)
        if m:
            title = ln.text.strip(" =\t")
            grid, i = read_grid(lines, i + 1, title, path)
            if grid is None:
                frag.warn(f"section {title!r} has no table", ln.no)
            else:
                grids[_KEYS[m.group(1).lower()]] = grid
                frag.first_line = frag.first_line or grid.header_line
            continue
        n = _NUMA.match(ln.text)
        if n:
            prefix = n.group(1)
            val = int(n.group(4))
            (numa if n.group(3) == "Node" else affinity)[int(n.group(2))] = val if val >= 0 else None
            frag.first_line = frag.first_line or ln.no
        i += 1
    vendor = "hygon" if prefix in ("HCU", "DCU") else "amd"
    if not grids:
        if not numa and not affinity:
            raise fail("no rocm-smi matrix found (expected sections 'Weight between two GPUs', "
                       "'Hops between two GPUs' or 'Link Type between two GPUs', or the Numa Nodes section)", path)
        for k in sorted(set(numa) | set(affinity)):
            frag.device(k, vendor=vendor, numa_node=numa.get(k, affinity.get(k)))
        frag.warn("no link tables (rocm-smi --showtoponuma?): devices and NUMA nodes only")
        return [frag]
    first = next(iter(grids.values()))
    for g in grids.values():
        if g.labels != first.labels:
            raise fail(f"the {g.title!r} table has columns {g.labels}, but {first.title!r} has {first.labels}",
                       path, g.header_line)
    idx = []
    for lab in first.labels:
        m = _LABEL.match(lab)
        if not m:
            raise fail(f"column {lab!r} is not a GPU (expected GPU0, GPU1, ... or HCU[0], ...)", path, first.header_line)
        idx.append(int(m.group(1)))
        if lab.startswith(("HCU", "DCU")):
            vendor = "hygon"
    if idx != list(range(len(idx))):
        raise fail(f"expected columns GPU0..GPU{len(idx) - 1} in order, got {first.labels}", path, first.header_line)
    for g in grids.values():
        missing = [lab for lab in g.labels if lab not in g.rows]
        if missing:
            frag.warn(f"{g.title!r}: no rows for {', '.join(missing)} (the table looks cut)", g.last_line)
    for k in idx:
        node = numa.get(k, affinity.get(k))
        frag.device(k, vendor=vendor, numa_node=node)
    stray = sorted(set(numa) - set(idx))
    if stray:
        frag.warn(f"NUMA lines for GPUs not in the matrices ignored: {stray}")
    add_amd_links(frag, len(idx), grids.get("type"), grids.get("weight"), grids.get("hops"),
                  {k: frag.devices[k].get("numa_node") for k in idx})
    return [frag]
