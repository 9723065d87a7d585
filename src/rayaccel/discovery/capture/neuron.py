"""``neuron-ls`` (and ``neuron-ls --topology``): AWS Inferentia / Trainium devices.

The ``|``-separated table is read by its two-line header, so current, old
(neuron-rtd era: RUNTIME ADDRESS/PID/VERSION) and whitespace-collapsed copies
all work. Each device becomes vendor ``"aws"``; the model comes from the
``instance-type:`` line (inf1 -> Inferentia, inf2 -> Inferentia2, trn1 ->
Trainium, trn2 -> Trainium2), or is Inferentia for an un-named table with 4
cores and 8 GB per device (inf1), else None. ``NEURON MEMORY`` ``"32 GB"`` is
read as GiB. The CONNECTED DEVICES neighbour lists become one ``neuronlink``
link per neighbouring pair (``count=None``: neuron-ls gives no lane count). The
ASCII diagram printed by ``--topology`` repeats the table and is not read.
"""

from __future__ import annotations

import re

from ...errors import RayaccelError
from ...topology import make_link
from ._base import Fragment, Line, fail, find_hostname

FORMAT = "neuron-ls"

_HEADER = re.compile(r"^\s*\|\s*NEURON\s*\|")
_INSTANCE = re.compile(r"^\s*instance-type\s*:\s*(\S+)")
_MODELS = {"inf1": "Inferentia", "inf2": "Inferentia2", "trn1": "Trainium", "trn1n": "Trainium",
           "trn2": "Trainium2", "trn2u": "Trainium2"}
_MEM = re.compile(r"^(\d+(?:\.\d+)?)\s*([GM])i?B$", re.I)


def detect(lines: list[Line]) -> bool:
    """True for a neuron-ls table header (``| NEURON | NEURON | ...``)."""
    return any(_HEADER.match(ln.text) for ln in lines)


def _cells(text: str) -> list[str]:
    t = text.strip()
    return [c.strip() for c in t.strip("|").split("|")]


def parse(lines: list[Line], path: str) -> list[Fragment]:
    """Devices and their neighbour links.

    Raises:
        CaptureError: no table, no DEVICE/CONNECTED column, or a damaged row.
    """
    frag = Fragment(FORMAT, path, hostname=find_hostname(lines))
    itype = next((m.group(1) for ln in lines if (m := _INSTANCE.match(ln.text))), None)
    start = next((k for k, ln in enumerate(lines) if _HEADER.match(ln.text)), None)
    if start is None:
        raise fail("no neuron-ls table found (expected a header '| NEURON | NEURON | ...')", path)
    frag.first_line = lines[start].no
    head = [_cells(lines[start].text)]
    k = start + 1
    while k < len(lines) and lines[k].text.strip().startswith("|"):
        head.append(_cells(lines[k].text))
        k += 1
    ncol = len(head[0])
    if any(len(h) != ncol for h in head):
        raise fail("the table header rows have different numbers of columns", path, lines[start].no)
    names = [" ".join(h[c] for h in head if h[c]).upper() for c in range(ncol)]
    col = {key: next((c for c, nm in enumerate(names) if key in nm), None)
           for key in ("DEVICE", "CORES", "MEMORY", "CONNECTED", "BDF")}
    if col["DEVICE"] is None or col["CONNECTED"] is None:
        raise fail(f"expected NEURON DEVICE and CONNECTED DEVICES columns, got {names}", path, lines[start].no)
    neighbours: dict[int, tuple[list[int], int]] = {}
    info: dict[int, tuple[int | None, str | None]] = {}
    for ln in lines[k:]:
        t = ln.text.strip()
        if not t.startswith("|"):
            continue
        cells = _cells(t)
        if len(cells) != ncol:
            raise fail(f"table row has {len(cells)} cells, expected {ncol} ({', '.join(names)})", path, ln.no)
        dev = cells[col["DEVICE"]]
        if not dev.isdigit():
            raise fail(f"NEURON DEVICE {dev!r} is not a device number", path, ln.no)
        idx = int(dev)
        if idx in neighbours:
            raise fail(f"device {idx} listed twice", path, ln.no)
        conn = cells[col["CONNECTED"]].replace(" ", "")
        if conn and not re.match(r"^\d+(,\d+)*$", conn):
            raise fail(f"CONNECTED DEVICES {cells[col['CONNECTED']]!r} is not a list of device numbers",
                       path, ln.no)
        neighbours[idx] = ([int(x) for x in conn.split(",")] if conn else [], ln.no)
        cores = cells[col["CORES"]] if col["CORES"] is not None else ""
        mem = cells[col["MEMORY"]] if col["MEMORY"] is not None else ""
        mm = _MEM.match(mem)
        mem_bytes = None
        if mm:
            from ...units import parse_bytes

            try:  # exact and bounded (a 400-digit size is an error, not an OverflowError)
                mem_bytes = parse_bytes(f"{mm.group(1)} {mm.group(2).upper()}iB", "memory")
            except RayaccelError as e:
                raise fail(f"MEMORY {mem!r}: {e}", path, ln.no) from None
        info[idx] = (int(cores) if cores.isdigit() else None, mem_bytes)
        bdf = cells[col["BDF"]] if col["BDF"] is not None else None
        frag.device(idx, vendor="aws", memory_bytes=mem_bytes, pci_bus_id=bdf or None)
    if not neighbours:
        raise fail("the neuron-ls table has no device rows", path, lines[start].no)
    model = _MODELS.get(itype.split(".")[0]) if itype else None
    if model is None and all(c == 4 and m == 8 << 30 for c, m in info.values()):
        model = "Inferentia"
    for idx in frag.devices:
        frag.device(idx, model=model)
    one_way = []
    for a, (nbrs, no) in neighbours.items():
        for b in nbrs:
            if b == a:
                raise fail(f"device {a} lists itself as connected", path, no)
            if b not in neighbours:
                frag.warn(f"device {a} lists neighbour {b}, which is not in the table; ignored", no)
                continue
            if a not in neighbours[b][0]:
                one_way.append(f"{a}->{b}")
            frag.links[(min(a, b), max(a, b))] = make_link(a, b, "neuronlink")
    if one_way:
        frag.warn(f"neighbour lists are not symmetric ({', '.join(one_way)}); linked both ways")
    return [frag]
