"""``neuron-ls``: AWS Inferentia / Trainium devices, in every output form of its releases.

Table forms (read by their two-line header, so columns may come and go):

* neuron-rtd era (``RUNTIME ADDRESS | RUNTIME PID | RUNTIME VERSION``), Neuron 2.x
  (``PID | COMMAND | RUNTIME VERSION``, one row per process: continuation rows have an
  empty ``NEURON DEVICE`` cell and ``+---+`` lines separate devices, as ``--wide`` and
  ``--show-all-procs`` print them), ``--topology`` (the table, then an ASCII diagram that
  repeats it and is not read), 2.21 (``NEURON CORES`` physical + ``LOGICAL NC``), 2.22+
  (``NEURON CORE IDS``, ``CPU AFFINITY``, ``NUMA NODE``), 2.34 (``PID`` before ``CPU
  AFFINITY``), whitespace-collapsed copies, single-device instances (no neighbours).
* ``neuron-ls --json-output`` / ``-j``: a JSON array of devices (``neuron_device``,
  ``nc_count``, ``neuroncore_ids``, ``connected_to`` -- null on a one-device instance --,
  ``memory_size`` in bytes, ``bdf``, ``cpu_affinity``, ``numa_node`` as a string,
  ``instance_type`` on 2.34+).

Each device becomes vendor ``"aws"`` with ``cores`` = the NeuronCores Ray counts (the
logical cores when the table shows both); the model comes from the instance type
(``instance-type:`` line or ``instance_type``: inf1 -> Inferentia, inf2 -> Inferentia2,
trn1 -> Trainium, trn2 -> Trainium2), or is Inferentia for an un-named table of 4 cores
and 8 GB per device, else None. ``32 GB`` is read as GiB (neuron-ls prints GiB). The
neighbour lists become one ``neuronlink`` link per pair (``count=None``: no lane count).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ...errors import RayaccelError
from ...topology import make_link
from ...units import parse_bytes
from ._base import Fragment, Line, fail, find_hostname, parse_cpulist, parse_numa

FORMAT = "neuron-ls"
FORMAT_JSON = "neuron-ls --json-output"

_HEADER = re.compile(r"^\s*\|\s*NEURON\s*\|")
_META = re.compile(r"^\s*(instance-type|instance-id|logical-neuroncore-config)\s*:\s*(\S+)")
_MODELS = {"inf1": "Inferentia", "inf2": "Inferentia2", "trn1": "Trainium", "trn1n": "Trainium",
           "trn2": "Trainium2", "trn2n": "Trainium2", "trn2u": "Trainium2", "trn3": "Trainium3"}
_MEM = re.compile(r"^(\d+(?:\.\d+)?)\s*([GM])i?B$", re.I)
_CORE_IDS = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")
#: Column names (the two header cells joined) -> field.
_COLUMNS = {"NEURON DEVICE": "device", "NEURON CORES": "cores", "LOGICAL NC": "logical", "NEURON CORE IDS": "core_ids",
            "NEURON MEMORY": "memory", "CONNECTED DEVICES": "connected", "PCI BDF": "bdf", "CPU AFFINITY": "cpus",
            "NUMA NODE": "numa"}


def detect(lines: list[Line]) -> bool:
    """True for a neuron-ls table header (``| NEURON | NEURON | ...``)."""
    return any(_HEADER.match(ln.text) for ln in lines)


def detect_json(lines: list[Line]) -> bool:
    """True for ``neuron-ls --json-output``: a JSON array whose objects have ``neuron_device``."""
    return _json_start(lines) is not None


def _json_start(lines: list[Line]) -> int | None:
    """Index of the line opening the JSON array (a prompt or comment may come before), or None."""
    for k, ln in enumerate(lines[:200]):
        if ln.text.lstrip().startswith("["):
            window = " ".join(x.text for x in lines[k:k + 6])
            return k if '"neuron_device"' in window else None
    return None


def _cells(text: str) -> list[str]:
    return [c.strip() for c in text.strip().strip("|").split("|")]


def _model(itype: str | None) -> str | None:
    return _MODELS.get(itype.split(".")[0].lower()) if itype else None


def parse(lines: list[Line], path: str) -> list[Fragment]:
    """Devices (cores, memory, PCI, CPU/NUMA affinity) and their neighbour links.

    Raises:
        CaptureError: no table, no DEVICE/CONNECTED column, or a damaged row.
    """
    frag = Fragment(FORMAT, path, hostname=find_hostname(lines))
    meta = {m.group(1): m.group(2) for ln in lines if (m := _META.match(ln.text))}
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
    names = [" ".join(" ".join(h[c] for h in head if h[c]).upper().split()) for c in range(ncol)]
    col = {field: names.index(name) for name, field in _COLUMNS.items() if name in names}
    if "device" not in col or "connected" not in col:
        raise fail(f"expected NEURON DEVICE and CONNECTED DEVICES columns, got {names}", path, lines[start].no)
    rows: dict[int, dict[str, Any]] = {}
    for ln in lines[k:]:
        t = ln.text.strip()
        if not t.startswith("|"):
            continue
        cells = _cells(t)
        if len(cells) != ncol:
            raise fail(f"table row has {len(cells)} cells, expected {ncol} ({', '.join(names)})", path, ln.no)
        dev = cells[col["device"]]
        if not dev:  # a continuation row: another process on the device above
            if rows and all(not cells[c] for f, c in col.items() if f != "cpus"):
                continue
            raise fail("a row without a NEURON DEVICE number carries device fields", path, ln.no)
        if not dev.isdigit():
            raise fail(f"NEURON DEVICE {dev!r} is not a device number", path, ln.no)
        idx = int(dev)
        if idx in rows:
            raise fail(f"device {idx} listed twice", path, ln.no)
        rows[idx] = {f: cells[c] for f, c in col.items()} | {"_line": ln.no}
    if not rows:
        raise fail("the neuron-ls table has no device rows", path, lines[start].no)
    infos = {idx: _row_fields(r, path) for idx, r in rows.items()}
    neighbours = {idx: (info.pop("_neighbours"), rows[idx]["_line"]) for idx, info in infos.items()}
    model = _model(meta.get("instance-type"))
    if model is None and all(i.get("cores") == 4 and i.get("memory_bytes") == 8 << 30 for i in infos.values()):
        model = "Inferentia"
    for idx, info in sorted(infos.items()):
        frag.device(idx, vendor="aws", model=model, **info)
    _check_core_ids(frag, path)
    _links(frag, neighbours)
    return [frag]


def _row_fields(r: dict[str, Any], path: str) -> dict[str, Any]:
    no = r["_line"]
    out: dict[str, Any] = {}
    conn = r["connected"].replace(" ", "")
    if conn and not re.match(r"^\d+(,\d+)*$", conn):
        raise fail(f"CONNECTED DEVICES {r['connected']!r} is not a list of device numbers", path, no)
    out["_neighbours"] = [int(x) for x in conn.split(",")] if conn else []
    cores = r.get("logical") or r.get("cores") or ""  # Ray counts the logical cores neuron-ls reports
    if cores:
        if not cores.isdigit() or not 1 <= int(cores) <= 1024:
            raise fail(f"NEURON CORES {cores!r} is not a core count (1..1024)", path, no)
        out["cores"] = int(cores)
    ids = r.get("core_ids", "").replace(" ", "")
    if ids:
        if not _CORE_IDS.match(ids):
            raise fail(f"NEURON CORE IDS {r['core_ids']!r} is not a list of core ids such as '0-3'", path, no)
        try:
            out["_core_ids"] = parse_cpulist(ids)
        except ValueError as e:
            raise fail(f"NEURON CORE IDS: {e}", path, no) from None
    mem = r.get("memory", "")
    mm = _MEM.match(mem)
    if mm:
        try:  # exact and bounded (a 400-digit size is an error, not an OverflowError)
            out["memory_bytes"] = parse_bytes(f"{mm.group(1)} {mm.group(2).upper()}iB", "memory")
        except RayaccelError as e:
            raise fail(f"MEMORY {mem!r}: {e}", path, no) from None
    bdf = r.get("bdf")
    if bdf and bdf not in ("NA", "N/A"):
        out["pci_bus_id"] = bdf
    if r.get("cpus"):
        try:
            out["cpus"] = parse_cpulist(r["cpus"])
        except ValueError as e:
            raise fail(f"CPU AFFINITY: {e}", path, no) from None
    if r.get("numa"):
        numa, ok = parse_numa(r["numa"])
        if not ok:
            raise fail(f"NUMA NODE {r['numa']!r} is not a node number", path, no)
        out["numa_node"] = numa
    return out


def _check_core_ids(frag: Fragment, path: str) -> None:
    """``NEURON CORE IDS`` must match the core count; ids not numbered device by device are reported."""
    expect = 0
    for idx in sorted(frag.devices):
        d = frag.devices[idx]
        ids = d.pop("_core_ids", None)
        if ids is None:
            expect += d.get("cores") or 0
            continue
        if d.get("cores") is not None and len(ids) != d["cores"]:
            raise fail(f"device {idx}: NEURON CORE IDS lists {len(ids)} cores but NEURON CORES says {d['cores']}",
                       path)
        d.setdefault("cores", len(ids))
        if ids != tuple(range(expect, expect + len(ids))):
            frag.warn(f"device {idx}: core ids {ids[0]}-{ids[-1]} are not numbered after the previous devices' "
                      f"(expected from {expect}); a container may see a subset of the instance's devices")
        expect = ids[-1] + 1


def _links(frag: Fragment, neighbours: dict[int, tuple[list[int], int | None]]) -> None:
    one_way = []
    for a, (nbrs, no) in neighbours.items():
        absent = [b for b in nbrs if b not in neighbours]
        if absent:
            frag.warn(f"device {a} lists neighbour{'s' if len(absent) > 1 else ''} {', '.join(map(str, absent))}, "
                      f"not in the capture (a container or a subset of the instance?); ignored", no)
        for b in nbrs:
            if b == a:
                raise fail(f"device {a} lists itself as connected", frag.path, no)
            if b not in neighbours:
                continue
            if a not in neighbours[b][0]:
                one_way.append(f"{a}->{b}")
            frag.links[(min(a, b), max(a, b))] = make_link(a, b, "neuronlink")
    if one_way:
        frag.warn(f"neighbour lists are not symmetric ({', '.join(one_way)}); linked both ways")


def parse_json(lines: list[Line], path: str) -> list[Fragment]:
    """Devices and links from ``neuron-ls --json-output``.

    Raises:
        CaptureError: not valid JSON (with its line), not an array of device objects, or a bad field.
    """
    frag = Fragment(FORMAT_JSON, path, hostname=find_hostname(lines))
    first = _json_start(lines)
    if first is None:
        raise fail("no neuron-ls JSON array found (expected '[' and objects with \"neuron_device\")", path)
    frag.first_line = lines[first].no
    text = "\n".join(ln.text for ln in lines[first:])
    try:
        data = json.JSONDecoder(parse_constant=_no_constant).raw_decode(text.lstrip())[0]  # a prompt may follow
    except json.JSONDecodeError as e:
        raise fail(f"not valid JSON: {e.msg} at column {e.colno}", path, lines[first].no + e.lineno - 1) from None
    except (ValueError, RecursionError) as e:
        raise fail(f"not valid JSON: {e}", path, lines[first].no) from None
    if not isinstance(data, list) or not data or not all(isinstance(d, dict) for d in data):
        raise fail("expected a JSON array of device objects (neuron-ls --json-output)", path, lines[first].no)
    neighbours: dict[int, tuple[list[int], int | None]] = {}
    itypes = set()
    for i, d in enumerate(data):
        where = f"device object {i}"
        idx = d.get("neuron_device")
        if type(idx) is not int or not 0 <= idx < 1 << 20:
            raise fail(f"{where}: neuron_device must be a device number, got {_short(idx)}", path)
        if idx in neighbours:
            raise fail(f"device {idx} listed twice", path)
        conn = d.get("connected_to")
        if conn is not None and (not isinstance(conn, list) or not all(type(x) is int and x >= 0 for x in conn)):
            raise fail(f"device {idx}: connected_to must be a list of device numbers or null, got {_short(conn)}", path)
        neighbours[idx] = (list(conn or []), None)
        fields: dict[str, Any] = {"vendor": "aws"}
        nc = d.get("nc_count")
        if nc is not None:
            if type(nc) is not int or not 1 <= nc <= 1024:
                raise fail(f"device {idx}: nc_count must be a core count (1..1024), got {_short(nc)}", path)
            fields["cores"] = nc
        ids = d.get("neuroncore_ids")
        if ids is not None:
            if not isinstance(ids, list) or not all(type(x) is int and x >= 0 for x in ids) or \
                    (nc is not None and len(ids) != nc):
                raise fail(f"device {idx}: neuroncore_ids must list nc_count core ids, got {_short(ids)}", path)
            fields["_core_ids"] = tuple(ids)
        mem = d.get("memory_size")
        if mem is not None:
            if type(mem) is not int or not 0 <= mem < 1 << 63:
                raise fail(f"device {idx}: memory_size must be bytes (an int), got {_short(mem)}", path)
            fields["memory_bytes"] = mem
        for key, out in (("bdf", "pci_bus_id"), ("cpu_affinity", "cpus"), ("numa_node", "numa_node")):
            val = d.get(key)
            if val is None or val == "":
                continue
            if not isinstance(val, (str, int)) or isinstance(val, bool):
                raise fail(f"device {idx}: {key} must be a string, got {_short(val)}", path)
            val = str(val)
            if key == "bdf":
                fields[out] = val
            elif key == "cpu_affinity":
                try:
                    fields[out] = parse_cpulist(val)
                except ValueError as e:
                    raise fail(f"device {idx}: cpu_affinity: {e}", path) from None
            else:
                numa, ok = parse_numa(val)
                if not ok:
                    raise fail(f"device {idx}: numa_node {val!r} is not a node number", path)
                fields[out] = numa
        if isinstance(d.get("instance_type"), str):
            itypes.add(d["instance_type"])
        frag.device(idx, **fields)
    model = _model(sorted(itypes)[0]) if len(itypes) == 1 else None
    for idx in frag.devices:
        frag.device(idx, model=model)
    _check_core_ids(frag, path)
    _links(frag, neighbours)
    return [frag]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a value neuron-ls writes")


def _short(v: Any) -> str:
    text = json.dumps(v)[:40] if not isinstance(v, str) else repr(v[:40])
    return text
