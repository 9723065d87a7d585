"""``hl-smi topo -c -N`` (and ``-c`` or ``-N`` alone): Intel Gaudi modules with their CPU and NUMA affinity.

This view has no device-to-device links, so it imports devices only (vendor
``"habana"`` (Ray: "Intel Habana (HPU)"), model ``"Gaudi"``: the table does not name the generation) with
``cpus`` and ``numa_node``, plus a warning that no links were imported.

The table is read by its header: ``modID`` and whichever of ``CPU Affinity`` (``-c``) and
``NUMA Affinity`` (``-N``) the command was asked for, in any order. A CPU list may hold
spaces (``0-39, 80-119``): a cell ending in ``,`` continues in the next word, and a row
with an empty cell is matched to the header by column offsets.
"""

from __future__ import annotations

import re

from ._base import Fragment, Line, fail, find_hostname, parse_cpulist, parse_numa

FORMAT = "hl-smi topo -c -N"

_COLUMNS = {"modid": "mod", "cpu affinity": "cpus", "numa affinity": "numa"}
_HEADER = re.compile(r"^\s*modID(\s+(CPU|NUMA) Affinity)+\s*$", re.I)


def detect(lines: list[Line]) -> bool:
    """True for a ``modID  CPU Affinity  NUMA Affinity`` header (either affinity column alone too)."""
    return any(_HEADER.match(ln.text) for ln in lines)


def _header(text: str) -> list[tuple[str, int]]:
    """(field, start offset) of each header column."""
    return [(_COLUMNS[" ".join(m.group().lower().split())], m.start())
            for m in re.finditer(r"modID|CPU\s+Affinity|NUMA\s+Affinity", text, re.I)]


def _cells(text: str) -> list[tuple[str, int]]:
    """(cell, start offset): words, a word ending in ``,`` joined with the next (``0-39, 80-119``)."""
    out: list[tuple[str, int]] = []
    for m in re.finditer(r"\S+", text):
        if out and out[-1][0].endswith(","):
            out[-1] = (out[-1][0] + " " + m.group(), out[-1][1])
        else:
            out.append((m.group(), m.start()))
    return out


def _row(cells: list[tuple[str, int]], cols: list[tuple[str, int]]) -> dict[str, str] | None:
    """The row's cells by field: in order when every column has one, else each to the nearest column start."""
    if len(cells) == len(cols):
        return {f: c for (f, _), (c, _) in zip(cols, cells)}
    if not cells or len(cells) > len(cols):
        return None
    out: dict[str, str] = {}
    for c, off in cells:
        f = min(cols, key=lambda col: abs(col[1] - off))[0]
        if f in out:
            return None
        out[f] = c
    return out if "mod" in out else None


def parse(lines: list[Line], path: str) -> list[Fragment]:
    """Devices with CPU and/or NUMA affinity.

    Raises:
        CaptureError: no header, or a row that does not fit the header's columns.
    """
    frag = Fragment(FORMAT, path, hostname=find_hostname(lines))
    start = next((k for k, ln in enumerate(lines) if _HEADER.match(ln.text)), None)
    if start is None:
        raise fail("no hl-smi header 'modID  CPU Affinity  NUMA Affinity' found", path)
    frag.first_line = lines[start].no
    cols = _header(lines[start].text)
    shape = "  ".join({"mod": "<modID>", "cpus": "<CPU list>", "numa": "<NUMA node>"}[f] for f, _ in cols)
    for ln in lines[start + 1:]:
        t = ln.text.rstrip()
        if not t.strip() or set(t.strip()) <= set("- "):
            continue
        row = _row(_cells(t), cols)
        if row is None or not row.get("mod", "").isdigit():
            raise fail(f"cannot read {t.strip()!r} (expected '{shape}')", path, ln.no)
        idx = int(row["mod"])
        fields = {}
        if row.get("cpus"):
            try:
                fields["cpus"] = parse_cpulist(row["cpus"])
            except ValueError as e:
                raise fail(f"module {idx}: {e}", path, ln.no) from None
        if row.get("numa"):
            numa, ok = parse_numa(row["numa"])
            if not ok:
                raise fail(f"module {idx}: NUMA affinity {row['numa']!r} is not a node number", path, ln.no)
            fields["numa_node"] = numa
        if idx in frag.devices:
            raise fail(f"module {idx} listed twice", path, ln.no)
        frag.device(idx, vendor="habana", model="Gaudi", **fields)
    if not frag.devices:
        raise fail("the hl-smi table has no module rows", path, lines[start].no)
    frag.warn("`hl-smi topo -c -N` gives CPU/NUMA affinity only: no device links imported")
    return [frag]
