"""Field checks of the topology model, each error naming its field (used by
:meth:`~rayaccel.topology.node.NodeTopology.validate` and the JSON codec)."""

from __future__ import annotations

import re
from typing import Any

from ..errors import TopologyError
from .model import (
    DIRECT_KINDS, FABRIC_STATES, HEALTH_STATES, LINK_KINDS, MAX_DEVICES, MAX_INDEX, MAX_ITEMS, MAX_LANE_GBPS,
    MAX_LANES, MAX_MEMORY_BYTES, MAX_MIG_SLOTS, MAX_NVML_RETURN, MAX_PORT, MAX_TEXT, MAX_UINT32, PCIE_CLASSES,
    Device, Fabric, Slice,
)

#: A fabric cluster UUID as NVML's 16 bytes print: canonical, lower case.
UUID_FORM = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:39] + "…"


def _check_int(v: Any, where: str, lo: int, hi: int, nullable: bool = False) -> None:
    """``v`` is an int in ``[lo, hi]`` (or None when ``nullable``), else a TopologyError naming ``where``."""
    if v is None and nullable:
        return
    if not _is_int(v) or not lo <= v <= hi:
        raise TopologyError(f"must be an int in {lo}..{hi}{' or null' if nullable else ''}, got {_short(v)}", where)


def _check_text(v: Any, where: str, nullable: bool = True) -> None:
    if v is None and nullable:
        return
    if not isinstance(v, str):
        raise TopologyError(f"expected a string, got {type(v).__name__}", where)
    if len(v) > MAX_TEXT:
        raise TopologyError(f"longer than {MAX_TEXT} characters ({len(v)})", where)


def _check_len(items: Any, most: int, where: str) -> None:
    if len(items) > most:
        raise TopologyError(f"{len(items)} entries, at most {most} allowed", where)


def _check_device(d: Device, where: str) -> None:
    if not _is_int(d.index) or not 0 <= d.index < MAX_INDEX:
        raise TopologyError(f"must be an int in 0..{MAX_INDEX - 1}, got {_short(d.index)}", f"{where}.index")
    if d.health not in HEALTH_STATES:
        raise TopologyError(f"unknown health {_short(d.health)}, expected one of {', '.join(HEALTH_STATES)}",
                            f"{where}.health")
    if d.memory_bytes is not None and _is_int(d.memory_bytes) and d.memory_bytes < 0:
        raise TopologyError("must be >= 0", f"{where}.memory_bytes")
    _check_int(d.memory_bytes, f"{where}.memory_bytes", 0, MAX_MEMORY_BYTES, nullable=True)
    _check_int(d.numa_node, f"{where}.numa_node", 0, MAX_INDEX - 1, nullable=True)
    for name in ("vendor", "model", "uuid", "pci_bus_id", "compute_capability"):
        _check_text(getattr(d, name), f"{where}.{name}", nullable=name != "vendor")
    if d.cpus is not None:
        _check_len(d.cpus, MAX_INDEX, f"{where}.cpus")
        for k, c in enumerate(d.cpus):
            _check_int(c, f"{where}.cpus[{k}]", 0, MAX_INDEX - 1)
    _check_int(d.cores, f"{where}.cores", 1, MAX_ITEMS, nullable=True)
    if d.coords is not None:
        if not isinstance(d.coords, tuple) or not 1 <= len(d.coords) <= 3:
            raise TopologyError(f"expected 1 to 3 ints (x, y, z), got {_short(d.coords)}", f"{where}.coords")
        for k, c in enumerate(d.coords):
            _check_int(c, f"{where}.coords[{k}]", 0, MAX_INDEX - 1)
    if d.fabric is not None:
        _check_fabric(d.fabric, f"{where}.fabric")
    _check_len(d.partitions, MAX_ITEMS, f"{where}.partitions")
    _check_len(d.mig_profiles, MAX_ITEMS, f"{where}.mig_profiles")
    for j, p in enumerate(d.partitions):
        pw = f"{where}.partitions[{j}]"
        if p.parent != d.index:
            raise TopologyError(f"parent {_short(p.parent)} differs from device index {d.index}", f"{pw}.parent")
        _check_text(p.profile, f"{pw}.profile", nullable=False)
        _check_text(p.uuid, f"{pw}.uuid")
        for name in ("gi_id", "ci_id", "sms"):
            _check_int(getattr(p, name), f"{pw}.{name}", 0, MAX_INDEX - 1, nullable=True)
        _check_int(p.start, f"{pw}.start", 0, MAX_MIG_SLOTS - 1, nullable=True)
        _check_int(p.size, f"{pw}.size", 1, MAX_MIG_SLOTS, nullable=True)
        _check_int(p.memory_bytes, f"{pw}.memory_bytes", 0, MAX_MEMORY_BYTES, nullable=True)
    for j, m in enumerate(d.mig_profiles):
        mw = f"{where}.mig_profiles[{j}]"
        _check_text(m.name, f"{mw}.name", nullable=False)
        _check_int(m.id, f"{mw}.id", 0, MAX_INDEX - 1)
        _check_int(m.max_instances, f"{mw}.max_instances", 0, MAX_MIG_SLOTS)
        _check_int(m.memory_mib, f"{mw}.memory_mib", 0, MAX_MEMORY_BYTES >> 20, nullable=True)
        _check_int(m.slots, f"{mw}.slots", 1, MAX_MIG_SLOTS)
        _check_int(m.sms, f"{mw}.sms", 0, MAX_INDEX - 1, nullable=True)
        _check_len(m.placements, MAX_MIG_SLOTS, f"{mw}.placements")
        for k, start in enumerate(m.placements):
            _check_int(start, f"{mw}.placements[{k}]", 0, MAX_MIG_SLOTS - 1)


def _check_fabric(f: Any, where: str) -> None:
    if not isinstance(f, Fabric):
        raise TopologyError(f"expected a Fabric or null, got {type(f).__name__}", where)
    if f.state not in FABRIC_STATES:
        raise TopologyError(f"unknown fabric state {_short(f.state)}, expected one of {', '.join(FABRIC_STATES)}",
                            f"{where}.state")
    if f.cluster_uuid is not None and (not isinstance(f.cluster_uuid, str) or not UUID_FORM.match(f.cluster_uuid)):
        raise TopologyError(f"expected a UUID such as 9c6f5af3-53bf-49b5-a436-b66766c413c3 (lower-case hex) "
                            f"or null, got {_short(f.cluster_uuid)}", f"{where}.cluster_uuid")
    _check_int(f.clique_id, f"{where}.clique_id", 0, MAX_UINT32, nullable=True)
    _check_int(f.status, f"{where}.status", 0, MAX_NVML_RETURN, nullable=True)
    _check_int(f.health_mask, f"{where}.health_mask", 0, MAX_UINT32, nullable=True)
    if f.state != "completed" and (f.cluster_uuid is not None or f.clique_id is not None):
        raise TopologyError(f"a fabric in state {f.state} has no cluster or clique yet (NVML reports them only "
                            "once registration completed); leave cluster_uuid and clique_id null", where)


def check_topology(topo: Any) -> None:
    """Check the invariants of a :class:`~rayaccel.topology.node.NodeTopology`.

    Raises:
        TopologyError: naming the bad field.
    """
    _check_len(topo.devices, MAX_DEVICES, "devices")
    _check_len(topo.links, MAX_DEVICES * (MAX_DEVICES - 1) // 2, "links")
    _check_len(topo.nics, MAX_DEVICES, "nics")
    _check_len(topo.sources, MAX_ITEMS, "sources")
    for field_name in ("hostname", "driver", "name"):
        _check_text(getattr(topo, field_name), field_name)
    for i, src in enumerate(topo.sources):
        _check_text(src, f"sources[{i}]", nullable=False)
    seen: set[int] = set()
    coords_seen: dict[tuple[int, ...], int] = {}
    for i, d in enumerate(topo.devices):
        _check_device(d, f"devices[{i}]")
        if d.index in seen:
            raise TopologyError(f"duplicate device index {d.index}", f"devices[{i}].index")
        seen.add(d.index)
        if d.coords is not None:
            if d.coords in coords_seen:
                raise TopologyError(f"coordinates {list(d.coords)} also belong to device {coords_seen[d.coords]}",
                                    f"devices[{i}].coords")
            coords_seen[d.coords] = d.index
    _check_slice(topo.slice)
    pairs: set[tuple[int, int]] = set()
    for i, l in enumerate(topo.links):
        where = f"links[{i}]"
        if l.kind not in LINK_KINDS:
            raise TopologyError(f"unknown kind {_short(l.kind)}, expected one of {', '.join(LINK_KINDS)}", f"{where}.kind")
        if l.pcie is not None and l.pcie not in PCIE_CLASSES:
            raise TopologyError(f"unknown PCIe class {_short(l.pcie)}, expected one of {', '.join(PCIE_CLASSES)} or null", f"{where}.pcie")
        if l.kind == "pcie" and l.pcie is None:
            raise TopologyError("a pcie link needs its path class", f"{where}.pcie")
        _check_int(l.a, f"{where}.a", 0, MAX_INDEX - 1)
        _check_int(l.b, f"{where}.b", 0, MAX_INDEX - 1)
        if l.count is not None and (not _is_int(l.count) or not 1 <= l.count <= MAX_LANES):
            raise TopologyError(f"lane count must be an int in 1..{MAX_LANES} or null, got {_short(l.count)}",
                                f"{where}.count")
        if l.lane_gbps is not None:
            if (isinstance(l.lane_gbps, bool) or not isinstance(l.lane_gbps, (int, float))
                    or not 0 < l.lane_gbps <= MAX_LANE_GBPS):
                raise TopologyError(f"must be a number > 0 and <= {MAX_LANE_GBPS:g} (GB/s per lane) or null, "
                                    f"got {_short(l.lane_gbps)}", f"{where}.lane_gbps")
            if l.kind not in DIRECT_KINDS:
                raise TopologyError(f"only direct links ({', '.join(DIRECT_KINDS)}) have lanes; "
                                    f"a {l.kind} link must leave it null", f"{where}.lane_gbps")
        if l.a not in seen or l.b not in seen:
            raise TopologyError(f"link {l.a}-{l.b} names an unknown device", where)
        if not l.a < l.b:
            raise TopologyError(f"expected a < b, got a={l.a}, b={l.b}", where)
        if (l.a, l.b) in pairs:
            raise TopologyError(f"second link for pair {l.a}-{l.b}", where)
        pairs.add((l.a, l.b))
    for i, n in enumerate(topo.nics):
        _check_text(n.name, f"nics[{i}].name", nullable=False)
        _check_int(n.numa_node, f"nics[{i}].numa_node", 0, MAX_INDEX - 1, nullable=True)
        _check_int(n.port, f"nics[{i}].port", 1, MAX_PORT, nullable=True)
        _check_len(n.paths, MAX_DEVICES, f"nics[{i}].paths")
        for j, (dev, cls) in enumerate(n.paths):
            _check_int(dev, f"nics[{i}].paths[{j}]", 0, MAX_INDEX - 1)
            if cls not in PCIE_CLASSES:
                raise TopologyError(f"unknown PCIe class {_short(cls)}", f"nics[{i}].paths[{j}]")


#: A slice topology: chips per dimension, e.g. ``"2x2x4"`` (TPU v4/v5p) or ``"4x8"`` (v5e/v6e).
_SLICE_SHAPE = re.compile(r"^[1-9][0-9]{0,4}(x[1-9][0-9]{0,4}){1,2}$")


def _check_slice(sl: Any) -> None:
    if sl is None:
        return
    if not isinstance(sl, Slice):
        raise TopologyError(f"expected a Slice or null, got {type(sl).__name__}", "slice")
    _check_text(sl.name, "slice.name")
    _check_text(sl.accelerator_type, "slice.accelerator_type")
    _check_int(sl.worker_id, "slice.worker_id", 0, MAX_INDEX - 1, nullable=True)
    if sl.topology is not None and (not isinstance(sl.topology, str) or not _SLICE_SHAPE.match(sl.topology)):
        raise TopologyError(f"expected chips per dimension such as '2x2x4' or '4x8', got {_short(sl.topology)}",
                            "slice.topology")
