"""``hl-smi topo -c -N``: Intel Gaudi modules with their CPU and NUMA affinity.

This view has no device-to-device links, so it imports devices only (vendor
``"habana"`` (Ray: "Intel Habana (HPU)"), model ``"Gaudi"``: the table does not name the generation) with
``cpus`` and ``numa_node``, plus a warning that no links were imported.
"""

from __future__ import annotations

import re

from ._base import Fragment, Line, fail, find_hostname, parse_cpulist, parse_numa

FORMAT = "hl-smi topo -c -N"

_HEADER = re.compile(r"^\s*modID\s+CPU Affinity\s+NUMA Affinity\s*$", re.I)
_ROW = re.compile(r"^\s*(\d+)\s+(.*?)\s*$")


def detect(lines: list[Line]) -> bool:
    """True for the ``modID  CPU Affinity  NUMA Affinity`` header."""
    return any(_HEADER.match(ln.text) for ln in lines)


def parse(lines: list[Line], path: str) -> list[Fragment]:
    """Devices with CPU and NUMA affinity.

    Raises:
        CaptureError: no header, or a row that is not ``<modID> <cpus> <numa>``.
    """
    frag = Fragment(FORMAT, path, hostname=find_hostname(lines))
    start = next((k for k, ln in enumerate(lines) if _HEADER.match(ln.text)), None)
    if start is None:
        raise fail("no hl-smi header 'modID  CPU Affinity  NUMA Affinity' found", path)
    frag.first_line = lines[start].no
    for ln in lines[start + 1:]:
        t = ln.text.strip()
        if not t or set(t) <= set("- "):
            continue
        m = _ROW.match(t)
        parts = m.group(2).rsplit(None, 1) if m else []
        if not m or len(parts) != 2:
            raise fail(f"cannot read {t!r} (expected '<modID>  <CPU list>  <NUMA node>')", path, ln.no)
        idx = int(m.group(1))
        try:
            cpus = parse_cpulist(parts[0])
        except ValueError as e:
            raise fail(f"module {idx}: {e}", path, ln.no) from None
        numa, ok = parse_numa(parts[1])
        if not ok:
            raise fail(f"module {idx}: NUMA affinity {parts[1]!r} is not a node number", path, ln.no)
        if idx in frag.devices:
            raise fail(f"module {idx} listed twice", path, ln.no)
        frag.device(idx, vendor="habana", model="Gaudi", cpus=cpus, numa_node=numa)
    if not frag.devices:
        raise fail("the hl-smi table has no module rows", path, lines[start].no)
    frag.warn("`hl-smi topo -c -N` gives CPU/NUMA affinity only: no device links imported")
    return [frag]
