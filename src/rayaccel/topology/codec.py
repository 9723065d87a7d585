"""The JSON form of a topology (``rayaccel.topology/1``): encode, decode, read and write.

Decoding validates every field and names the bad one (``devices[3].memory_bytes: ...``);
:class:`~rayaccel.topology.node.NodeTopology`'s ``to_dict`` / ``from_dict`` / ``to_json`` /
``from_json`` / ``load`` / ``save`` are these functions.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import TopologyError
from ._checks import _check_device, _short
from .model import Device, Fabric, Link, MigProfile, Nic, Partition, Slice

SCHEMA = "rayaccel.topology/1"


def to_dict(topo: Any) -> dict[str, Any]:
    """A JSON-ready dict of ``topo`` tagged with :data:`SCHEMA`."""
    return {
        "schema": SCHEMA,
        "name": topo.name,
        "hostname": topo.hostname,
        "driver": topo.driver,
        "sources": list(topo.sources),
        "devices": [_device_to_dict(d) for d in sorted(topo.devices, key=lambda d: d.index)],
        "links": [_link_to_dict(l) for l in sorted(topo.links, key=lambda l: (l.a, l.b))],
        "nics": [_nic_to_dict(n) for n in topo.nics],
        **({"slice": {"name": topo.slice.name, "worker_id": topo.slice.worker_id, "topology": topo.slice.topology,
                      "accelerator_type": topo.slice.accelerator_type}} if topo.slice is not None else {}),
    }


def to_json(topo: Any, indent: int | None = 2) -> str:
    """``topo`` as JSON text (see :func:`from_json`)."""
    return json.dumps(to_dict(topo), indent=indent)


def from_dict(data: Mapping[str, Any], factory: Callable[..., Any]) -> Any:
    """Build (with ``factory``, the topology class) and validate a topology from :func:`to_dict` output.

    Raises:
        TopologyError: naming the bad field and what was expected.
    """
    if not isinstance(data, Mapping):
        raise TopologyError(f"expected a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise TopologyError(f"expected {SCHEMA!r}, got {_short(schema)}", "schema")
    devs = _get(data, "devices", list, "")
    links = _get(data, "links", list, "", default=[])
    nics = _get(data, "nics", list, "", default=[])
    topo = factory(
        devices=tuple(_device_from_dict(d, f"devices[{i}]") for i, d in enumerate(devs)),
        links=tuple(_link_from_dict(l, f"links[{i}]") for i, l in enumerate(links)),
        nics=tuple(_nic_from_dict(n, f"nics[{i}]") for i, n in enumerate(nics)),
        hostname=_get(data, "hostname", str, "", default=None, nullable=True),
        driver=_get(data, "driver", str, "", default=None, nullable=True),
        name=_get(data, "name", str, "", default=None, nullable=True),
        sources=tuple(_get(data, "sources", list, "", default=[])),
        slice=_slice_from_dict(data.get("slice")),
    )
    return topo.validate()


def from_json(text: str, factory: Callable[..., Any]) -> Any:
    """Parse JSON text into a validated topology (built with ``factory``).

    Raises:
        TopologyError: malformed JSON (with line and column) or a bad field.
    """
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise TopologyError(f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:  # [[[[...]]]] deeper than the parser's stack: no topology nests like that
        raise TopologyError("not a topology: JSON nested too deeply (a topology nests at most 4 levels)") from None
    except ValueError as e:  # NaN / Infinity, or an integer with more than 4300 digits
        raise TopologyError(f"not valid JSON: {e}") from None
    return from_dict(data, factory)


def load(path: str | Path, factory: Callable[..., Any]) -> Any:
    """Read a topology JSON file.

    Raises:
        TopologyError: unreadable, malformed, or invalid (message names the file).
    """
    p = Path(path)
    try:
        text = p.read_text()
    except UnicodeDecodeError:
        raise TopologyError(f"{p}: not a text file; expected a topology JSON file") from None
    except OSError as e:
        raise TopologyError(f"{p}: cannot read: {e.strerror}") from None
    try:
        return from_json(text, factory)
    except TopologyError as e:
        raise TopologyError(f"{p}: {e}") from None


def save(topo: Any, path: str | Path) -> None:
    """Write ``topo`` as JSON."""
    Path(path).write_text(to_json(topo) + "\n")


# ---------------------------------------------------------------- (de)coding
_MISSING = object()


def _get(obj: Mapping, key: str, typ: type | tuple, where: str, default: Any = _MISSING, nullable: bool = False) -> Any:
    name = f"{where}.{key}" if where else key
    if key not in obj:
        if default is _MISSING:
            raise TopologyError("missing", name)
        return default
    val = obj[key]
    if val is None and (nullable or default is None):
        return None
    ok = isinstance(val, typ) and not (isinstance(val, bool) and typ in (int, (int, float)))
    if not ok:
        tname = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise TopologyError(f"expected {tname}{' or null' if nullable else ''}, got {json.dumps(val)[:40]}", name)
    return val


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a topology can hold")


def _device_to_dict(d: Device) -> dict[str, Any]:
    return {
        "index": d.index,
        "vendor": d.vendor,
        "model": d.model,
        "uuid": d.uuid,
        "pci_bus_id": d.pci_bus_id,
        "memory_bytes": d.memory_bytes,
        "numa_node": d.numa_node,
        "cpus": list(d.cpus) if d.cpus is not None else None,
        "compute_capability": d.compute_capability,
        "health": d.health,
        "mig_mode": d.mig_mode,
        "partitions": [{f.name: getattr(p, f.name) for f in fields(p)} for p in d.partitions],
        "mig_profiles": [
            {"name": m.name, "id": m.id, "max_instances": m.max_instances, "memory_mib": m.memory_mib,
             "placements": list(m.placements), "slots": m.slots, "sms": m.sms}
            for m in d.mig_profiles
        ],
        **({"fabric": _fabric_to_dict(d.fabric)} if d.fabric is not None else {}),  # only where NVML reports one
        # written only when known, so files of machines without them stay as they were
        **({"cores": d.cores} if d.cores is not None else {}),
        **({"coords": list(d.coords)} if d.coords is not None else {}),
    }


def _fabric_to_dict(f: Fabric) -> dict[str, Any]:
    out: dict[str, Any] = {"cluster_uuid": f.cluster_uuid, "clique_id": f.clique_id, "state": f.state}
    if f.status is not None:
        out["status"] = f.status
    if f.health_mask is not None:
        out["health_mask"] = f.health_mask
    return out


def _fabric_from_dict(f: Any, where: str) -> Fabric | None:
    if f is None:
        return None
    if not isinstance(f, Mapping):
        raise TopologyError(f"expected an object or null, got {json.dumps(f)[:40]}", where)
    uuid = _get(f, "cluster_uuid", str, where, default=None, nullable=True)
    return Fabric(
        state=_get(f, "state", str, where),
        cluster_uuid=uuid.lower() if uuid is not None else None,
        clique_id=_get(f, "clique_id", int, where, default=None, nullable=True),
        status=_get(f, "status", int, where, default=None, nullable=True),
        health_mask=_get(f, "health_mask", int, where, default=None, nullable=True),
    )


def _nic_to_dict(n: Nic) -> dict[str, Any]:
    out: dict[str, Any] = {"name": n.name, "numa_node": n.numa_node, "rdma": n.rdma,
                           "paths": {str(dev): cls for dev, cls in n.paths}}
    if n.port is not None:  # only where a capture named it
        out["port"] = n.port
    return out


def _int_list(val: Any, where: str) -> tuple[int, ...]:
    if not isinstance(val, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in val):
        raise TopologyError(f"expected a list of ints, got {json.dumps(val)[:40]}", where)
    return tuple(val)


def _device_from_dict(d: Any, where: str) -> Device:
    if not isinstance(d, Mapping):
        raise TopologyError("expected an object", where)
    cpus = d.get("cpus")
    coords = d.get("coords")
    dev = Device(
        index=_get(d, "index", int, where),
        vendor=_get(d, "vendor", str, where, default="nvidia"),
        model=_get(d, "model", str, where, default=None, nullable=True),
        uuid=_get(d, "uuid", str, where, default=None, nullable=True),
        pci_bus_id=_get(d, "pci_bus_id", str, where, default=None, nullable=True),
        memory_bytes=_get(d, "memory_bytes", int, where, default=None, nullable=True),
        numa_node=_get(d, "numa_node", int, where, default=None, nullable=True),
        cpus=None if cpus is None else _int_list(cpus, f"{where}.cpus"),
        compute_capability=_get(d, "compute_capability", str, where, default=None, nullable=True),
        health=_get(d, "health", str, where, default="ok"),
        mig_mode=_get(d, "mig_mode", bool, where, default=None, nullable=True),
        partitions=tuple(
            _partition_from_dict(p, f"{where}.partitions[{j}]", d.get("index"))
            for j, p in enumerate(_get(d, "partitions", list, where, default=[]))
        ),
        mig_profiles=tuple(
            _profile_from_dict(p, f"{where}.mig_profiles[{j}]")
            for j, p in enumerate(_get(d, "mig_profiles", list, where, default=[]))
        ),
        fabric=_fabric_from_dict(d.get("fabric"), f"{where}.fabric"),
        cores=_get(d, "cores", int, where, default=None, nullable=True),
        coords=None if coords is None else _int_list(coords, f"{where}.coords"),
    )
    _check_device(dev, where)
    return dev


def _partition_from_dict(p: Any, where: str, parent: Any) -> Partition:
    if not isinstance(p, Mapping):
        raise TopologyError("expected an object", where)
    return Partition(
        parent=_get(p, "parent", int, where, default=parent),
        profile=_get(p, "profile", str, where),
        uuid=_get(p, "uuid", str, where, default=None, nullable=True),
        gi_id=_get(p, "gi_id", int, where, default=None, nullable=True),
        ci_id=_get(p, "ci_id", int, where, default=None, nullable=True),
        start=_get(p, "start", int, where, default=None, nullable=True),
        size=_get(p, "size", int, where, default=None, nullable=True),
        memory_bytes=_get(p, "memory_bytes", int, where, default=None, nullable=True),
        sms=_get(p, "sms", int, where, default=None, nullable=True),
    )


def _profile_from_dict(p: Any, where: str) -> MigProfile:
    if not isinstance(p, Mapping):
        raise TopologyError("expected an object", where)
    return MigProfile(
        name=_get(p, "name", str, where),
        id=_get(p, "id", int, where),
        max_instances=_get(p, "max_instances", int, where),
        memory_mib=_get(p, "memory_mib", int, where, default=None, nullable=True),
        placements=_int_list(_get(p, "placements", list, where), f"{where}.placements"),
        slots=_get(p, "slots", int, where),
        sms=_get(p, "sms", int, where, default=None, nullable=True),
    )


def _link_to_dict(l: Link) -> dict[str, Any]:
    out: dict[str, Any] = {"a": l.a, "b": l.b, "kind": l.kind, "count": l.count, "pcie": l.pcie}
    if l.lane_gbps is not None:  # only when it overrides the table default
        out["lane_gbps"] = l.lane_gbps
    out["bandwidth_gbps"] = l.bandwidth_gbps
    return out


def _link_from_dict(l: Any, where: str) -> Link:
    if not isinstance(l, Mapping):
        raise TopologyError("expected an object", where)
    a = _get(l, "a", int, where)
    b = _get(l, "b", int, where)
    lane = _get(l, "lane_gbps", (int, float), where, default=None, nullable=True)
    return Link(
        a=a,
        b=b,
        kind=_get(l, "kind", str, where),
        count=_get(l, "count", int, where, default=None, nullable=True),
        pcie=_get(l, "pcie", str, where, default=None, nullable=True),
        lane_gbps=float(lane) if lane is not None else None,
    )


def _nic_from_dict(n: Any, where: str) -> Nic:
    if not isinstance(n, Mapping):
        raise TopologyError("expected an object", where)
    paths = _get(n, "paths", dict, where, default={})
    items = []
    for k, v in paths.items():
        try:
            dev = int(k)
        except ValueError:
            raise TopologyError(f"device key must be an integer, got {_short(k)}", f"{where}.paths") from None
        if not isinstance(v, str):
            raise TopologyError("expected a PCIe class string", f"{where}.paths.{k}")
        items.append((dev, v))
    name = _get(n, "name", str, where)
    return Nic(
        name=name,
        numa_node=_get(n, "numa_node", int, where, default=None, nullable=True),
        paths=tuple(sorted(items)),
        rdma=_get(n, "rdma", bool, where, default=Nic.guess_rdma(name)),
        port=_get(n, "port", int, where, default=None, nullable=True),
    )


def _slice_from_dict(v: Any) -> Slice | None:
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise TopologyError("expected an object or null", "slice")
    return Slice(
        name=_get(v, "name", str, "slice", default=None, nullable=True),
        worker_id=_get(v, "worker_id", int, "slice", default=None, nullable=True),
        topology=_get(v, "topology", str, "slice", default=None, nullable=True),
        accelerator_type=_get(v, "accelerator_type", str, "slice", default=None, nullable=True),
    )
