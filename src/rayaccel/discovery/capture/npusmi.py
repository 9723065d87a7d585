"""``npu-smi info -t topo`` and ``npu-smi info``: Huawei Ascend NPUs.

* ``npu-smi info -t topo`` prints a matrix like ``nvidia-smi topo -m``: a header row
  ``NPU0 NPU1 ... CPU Affinity`` (read by its header: without the ``CPU Affinity`` column
  the NPUs have no CPU list), one row per NPU (``X`` on the diagonal, ``HCCS`` for a
  Huawei Cache Coherence System link, ``PIX``/``PXB``/``PHB``/``SYS`` PCIe paths, ``NA``
  unknown) ending in the NPU's CPU affinity, then a ``Legend:`` block. ``HCCS`` becomes an
  ``hccs`` link (no lane count: the matrix gives none), a PCIe class a ``pcie`` link,
  ``NA`` no record. 910B boards show HCCS between all eight; first-generation 910 boards
  are two groups of four, HCCS within a group.
* ``npu-smi info`` prints two table rows per NPU: ``| <NPU> <Name> | <Health> | <Power>
  <Temp> <Hugepages> |`` then ``| <Chip> | <Bus-Id> | <AICore> <Memory-Usage> <HBM-Usage> |``.
  They give the model (``Ascend`` + Name, the SoC name Ray reports, e.g. ``Ascend910B3``),
  the PCI bus, the HBM size (MB = MiB, as npu-smi counts) and health (OK -> ok, Warning ->
  degraded, Alarm/Critical -> failed). Boards with several chips per NPU (Atlas 300I Duo)
  are rejected: their logical ids need ``npu-smi info -m``.

Devices are vendor ``"huawei"``; a device's index is its NPU id, the id
``ASCEND_RT_VISIBLE_DEVICES`` takes on one-chip boards.
"""

from __future__ import annotations

import re

from ...topology import PCIE_CLASSES, make_link
from ._base import Fragment, Line, fail, find_hostname, parse_cpulist

FORMAT_TOPO = "npu-smi info -t topo"
FORMAT_INFO = "npu-smi info"

_TOPO_HEADER = re.compile(r"^\s*NPU0(\s+NPU\d+)*(\s+CPU Affinity)?\s*$")
_TOPO_ROW0 = re.compile(r"^\s*NPU0\s+X(\s|$)")
_INFO_HEADER = re.compile(r"^\|\s*NPU\s+Name\s*\|\s*Health\s*\|")
_ROW1 = re.compile(r"^\|\s*(\d+)\s+(\S+)\s*\|\s*(\S+)\s*\|")
_ROW2 = re.compile(r"^\|\s*(\d+)\s*\|\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*\|(.*)\|\s*$")
_PROCESS_HEADER = re.compile(r"^\|\s*NPU\s+Chip\s*\|\s*Process", re.I)
_USAGE = re.compile(r"(\d+)\s*/\s*(\d+)")
_HEALTH = {"OK": "ok", "WARNING": "degraded", "ALARM": "failed", "CRITICAL": "failed"}


def detect_topo(lines: list[Line]) -> bool:
    """True for the ``NPU0 NPU1 ... [CPU Affinity]`` header of ``npu-smi info -t topo`` (with its ``NPU0 X`` row)."""
    return _topo_start(lines) is not None


def _topo_start(lines: list[Line]) -> int | None:
    """Index of the matrix header: ``NPU0 NPU1 ...``, the ``CPU Affinity`` column optional, followed by row NPU0."""
    for k, ln in enumerate(lines):
        if _TOPO_HEADER.match(ln.text):
            nxt = next((x for x in lines[k + 1:] if x.text.strip()), None)
            if "CPU Affinity" in ln.text or (nxt is not None and _TOPO_ROW0.match(nxt.text)):
                return k
    return None


def detect_info(lines: list[Line]) -> bool:
    """True for the ``| NPU Name | Health |`` header of ``npu-smi info``."""
    return any(_INFO_HEADER.match(ln.text.strip()) for ln in lines)


def parse_topo(lines: list[Line], path: str) -> list[Fragment]:
    """NPUs, their links and CPU affinity from the matrix.

    Raises:
        CaptureError: a row with the wrong number of cells, an unknown cell, or a matrix
            that is not square.
    """
    frag = Fragment(FORMAT_TOPO, path, hostname=find_hostname(lines))
    start = _topo_start(lines)
    if start is None:
        raise fail("no npu-smi topology header found (expected 'NPU0  NPU1 ...  CPU Affinity')", path)
    frag.first_line = lines[start].no
    header = lines[start].text.split()
    affinity = header[-2:] == ["CPU", "Affinity"]  # read by the header: the column may be absent
    labels = header[:-2] if affinity else header
    n = len(labels)
    if labels != [f"NPU{i}" for i in range(n)]:
        raise fail(f"header columns {' '.join(labels)} are not NPU0..NPU{n - 1}", path, lines[start].no)
    seen: dict[int, list[str]] = {}
    for ln in lines[start + 1:]:
        tok = ln.text.split()
        if not tok:
            continue
        if not re.fullmatch(r"NPU\d+", tok[0]):
            break  # the Legend block (or the end of the matrix)
        idx = int(tok[0][3:])
        if idx >= n:
            raise fail(f"row {tok[0]} has no column in the header (NPU0..NPU{n - 1})", path, ln.no)
        if idx in seen:
            raise fail(f"row {tok[0]} listed twice", path, ln.no)
        cells = tok[1:]
        if len(cells) not in ((n, n + 1) if affinity else (n,)):
            want = f"{n} and the CPU affinity" if affinity else f"{n} (the header has no CPU Affinity column)"
            raise fail(f"row {tok[0]} has {len(cells)} cells, expected {want}; cells merged or cut?", path, ln.no)
        if cells[idx] != "X":
            raise fail(f"row {tok[0]} should have X (self) under {tok[0]}, got {cells[idx]!r}; cells shifted?",
                       path, ln.no)
        cpus = None
        if len(cells) == n + 1:
            try:
                cpus = parse_cpulist(cells[n])
            except ValueError as e:
                raise fail(f"{tok[0]}: CPU Affinity: {e}", path, ln.no) from None
        seen[idx] = cells[:n]
        frag.device(idx, vendor="huawei", cpus=cpus)
    if len(seen) != n:
        missing = [f"NPU{i}" for i in range(n) if i not in seen]
        raise fail(f"the matrix has no row for {', '.join(missing)}", path, lines[start].no)
    for a in range(n):
        for b in range(a + 1, n):
            va, vb = seen[a][b], seen[b][a]
            if va != vb:
                frag.warn(f"NPU{a}-NPU{b} reads {va!r} one way and {vb!r} the other; kept {va!r}")
            link = _link(a, b, va, path)
            if link is not None:
                frag.links[(a, b)] = link
    return [frag]


def _link(a: int, b: int, cell: str, path: str):
    c = cell.upper()
    if c == "HCCS":
        return make_link(a, b, "hccs")
    if c in PCIE_CLASSES:
        return make_link(a, b, "pcie", pcie=c)
    if c == "NA":
        return None
    raise fail(f"NPU{a}-NPU{b}: unknown connection {cell!r} (expected HCCS, PIX, PXB, PHB, SYS or NA)", path)


def parse_info(lines: list[Line], path: str) -> list[Fragment]:
    """Models, PCI bus ids, HBM size and health from the ``npu-smi info`` table.

    Raises:
        CaptureError: an NPU row without its chip row, several chips on one NPU, or a damaged row.
    """
    frag = Fragment(FORMAT_INFO, path, hostname=find_hostname(lines))
    start = next(k for k, ln in enumerate(lines) if _INFO_HEADER.match(ln.text.strip()))
    frag.first_line = lines[start].no
    pending: tuple[int, str, str, int] | None = None
    for ln in lines[start + 2:]:
        t = ln.text.strip()
        if not t.startswith("|"):
            continue
        if _PROCESS_HEADER.match(t):
            break  # the process table that follows the devices
        if _INFO_HEADER.match(t) or t.startswith("| Chip") or set(t) <= set("|+=-"):
            continue
        m2 = _ROW2.match(t)
        if m2 and pending is not None:
            npu, name, health, no = pending
            if int(m2.group(1)) != 0:
                raise fail(f"NPU {npu} shows chip {m2.group(1)}: boards with several chips per NPU need "
                           "'npu-smi info -m' for their logical ids", path, ln.no)
            usages = _USAGE.findall(m2.group(3))
            hbm = int(usages[-1][1]) if usages else 0
            frag.device(npu, vendor="huawei", model=f"Ascend{name}" if not name.lower().startswith("ascend") else name,
                        pci_bus_id=m2.group(2), memory_bytes=hbm << 20 if hbm > 0 else None,
                        health=_HEALTH.get(health.upper(), "unknown"))
            pending = None
            continue
        m1 = _ROW1.match(t)
        if m1 and pending is None:
            npu = int(m1.group(1))
            if npu in frag.devices:
                raise fail(f"NPU {npu} listed twice", path, ln.no)
            pending = (npu, m1.group(2), m1.group(3), ln.no)
            continue
        if m2 and pending is None and frag.devices:
            raise fail("chip row without its NPU row (several chips per NPU need 'npu-smi info -m')", path, ln.no)
        if pending is not None:
            raise fail(f"NPU {pending[0]}: expected its chip row ('| 0 | <Bus-Id> | ...'), got {t[:60]!r}", path, ln.no)
    if pending is not None:
        raise fail(f"NPU {pending[0]} has no chip row (the table is cut?)", path, pending[3])
    if not frag.devices:
        raise fail("the npu-smi info table has no NPU rows", path, lines[start].no)
    return [frag]
