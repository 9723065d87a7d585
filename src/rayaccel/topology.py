"""The topology model: what accelerators a node has and how they are wired.

Pure data, stdlib only. Everything above this layer (discovery, placement, the
Ray layer, the CLI) speaks these types.

* :class:`Device`     one accelerator (GPU, APU, Trainium/Inferentia device)
* :class:`Partition`  one MIG instance carved out of a device
* :class:`MigProfile` one row of a device's MIG GPU-instance profile table
* :class:`Link`       how two devices are connected (``kind`` + lane ``count`` +
  the PCIe path class between them)
* :class:`Nic`        a network interface and its PCIe path class to each device
* :class:`Slice`      the multi-host slice a node belongs to (TPU pod slices)
* :class:`NodeTopology` all of the above for one node, with JSON I/O

Link bandwidths are *modeled* from one table (:data:`LANE_BANDWIDTH_GBPS` and
:data:`PCIE_BANDWIDTH_GBPS`), per direction, in GB/s. Unknown values are
``None`` here; display placeholders belong to the CLI.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from .errors import TopologyError

SCHEMA = "rayaccel.topology/1"

#: Direct device-to-device link kinds (each lane counted in ``Link.count``): NVIDIA NVLink,
#: AMD Infinity Fabric (xGMI), AWS NeuronLink, Google TPU ICI, Huawei Ascend HCCS, the
#: RoCE ports Intel Gaudi integrates for its scale-up all-to-all (one lane = one port), and
#: ``direct``: any other vendor's own device-to-device link (a plugin's fabric; give its
#: per-lane figure in ``Link.lane_gbps``).
DIRECT_KINDS = ("nvlink", "xgmi", "neuronlink", "ici", "hccs", "roce", "direct")
#: All link kinds.
LINK_KINDS = DIRECT_KINDS + ("pcie",)
#: PCIe path classes, best first, as ``nvidia-smi topo -m`` names them.
PCIE_CLASSES = ("PIX", "PXB", "PHB", "NODE", "SYS")
HEALTH_STATES = ("ok", "degraded", "failed", "unknown")

#: Modeled per-direction bandwidth of one lane of a direct link, GB/s.
#: NVLink gens 2-4 run 25 GB/s per link per direction (V100: 6 links = 300 GB/s
#: bidirectional; A100: 12 = 600; H100/H200: 18 = 900). One AMD Infinity Fabric
#: (xGMI) link is 50 GB/s (ROCm MI250 architecture doc). A NeuronLink-v2 lane is
#: modeled at 48 GB/s. A TPU ICI link is 100 GB/s (v5p: 1200 GB/s bidirectional per chip
#: over 6 links; v6e: 800 GB/s over 4). An Ascend HCCS link is 28 GB/s (910B: 392 GB/s
#: bidirectional per chip over 7 links). A Gaudi RoCE port is 12.5 GB/s (Gaudi 2: 100 Gb/s
#: per port; docs.habana.ai "Network Configuration").
#: This is the default; a link whose lanes are known to run faster or slower
#: (NVLink5 on GB200: 50 GB/s; MI300X Infinity Fabric: 64 GB/s) carries its own
#: per-lane figure in :attr:`Link.lane_gbps`.
LANE_BANDWIDTH_GBPS: dict[str, float] = {"nvlink": 25.0, "xgmi": 50.0, "neuronlink": 48.0, "ici": 100.0,
                                         "hccs": 28.0, "roce": 12.5, "direct": 25.0}

#: Modeled per-direction peer-to-peer bandwidth over PCIe, by path class, GB/s
#: (PCIe Gen4 x16 is ~32 GB/s per direction; ~80% is reached through one switch,
#: less through host bridges and much less across the CPU interconnect).
PCIE_BANDWIDTH_GBPS: dict[str, float] = {"PIX": 24.0, "PXB": 22.0, "PHB": 18.0, "NODE": 14.0, "SYS": 10.0}

#: Bandwidth used for a pair of devices with no link record at all, GB/s.
UNKNOWN_PAIR_BANDWIDTH_GBPS = PCIE_BANDWIDTH_GBPS["SYS"]

# Bounds of every numeric and list field (checked by NodeTopology.validate, each error naming
# its field), generous for any real machine and small enough that nothing derived from a
# topology (a float, a matrix of devices, a picture) can overflow or exhaust memory.
#: Most devices (and NICs) one node may have; device indices are below :data:`MAX_INDEX`.
MAX_DEVICES = 1024
#: Device indices, NUMA node ids, CPU ids, MIG ids and NIC path keys are ints in ``[0, MAX_INDEX)``.
MAX_INDEX = 1 << 20
#: Device memory and partition memory, bytes (the int64 limit, as :data:`rayaccel.units.MAX_BYTES`).
MAX_MEMORY_BYTES = (1 << 63) - 1
#: Lanes of one direct link.
MAX_LANES = 1024
#: Per-lane bandwidth of a direct link, GB/s.
MAX_LANE_GBPS = 1e6
#: MIG memory slices of one device (start slots and sizes are below/up to this).
MAX_MIG_SLOTS = 64
#: Longest text field (names, models, UUIDs, sources), characters.
MAX_TEXT = 4096
#: Most entries in any per-device list (CPUs: :data:`MAX_INDEX`; partitions, profiles, placements: this).
MAX_ITEMS = 1024

_RDMA_NIC_PREFIXES = ("mlx", "efa", "bnxt_re", "irdma", "ionic", "qedr", "hfi", "rdma")


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG GPU-instance profile of a device (a row of ``nvidia-smi mig -lgipp``).

    Attributes:
        name: e.g. ``"3g.40gb"``. id: NVML profile id (e.g. 9).
        max_instances: how many instances of this profile fit on an empty GPU.
        memory_mib: memory of one instance, MiB.
        placements: allowed start slots (memory slices, out of 8).
        slots: slices one instance occupies. sms: streaming multiprocessors, or None.
    """

    name: str
    id: int
    max_instances: int
    memory_mib: int | None
    placements: tuple[int, ...]
    slots: int
    sms: int | None = None


@dataclass(frozen=True, slots=True)
class Partition:
    """One MIG instance on a device.

    Attributes:
        parent: index of the device it lives on. profile: e.g. ``"1g.10gb"``.
        uuid: ``"MIG-..."`` or None. gi_id / ci_id: GPU / compute instance ids.
        start / size: placement in memory slices. memory_bytes, sms: when known.
    """

    parent: int
    profile: str
    uuid: str | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    start: int | None = None
    size: int | None = None
    memory_bytes: int | None = None
    sms: int | None = None

    @property
    def key(self) -> str:
        """A node-unique name: ``"<parent>:mig<gi_id>"`` (or ``:uuid`` when no id)."""
        if self.gi_id is not None:
            return f"{self.parent}:mig{self.gi_id}"
        return f"{self.parent}:{self.uuid or self.profile}"


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator.

    Attributes:
        index: the vendor's device index on this node (0-based).
        vendor: ``"nvidia"``, ``"amd"``, ``"aws"``, ``"intel"`` ...
        model: marketing name, e.g. ``"NVIDIA H100 80GB HBM3"``.
        memory_bytes: device memory in bytes, or None when unknown.
        numa_node: NUMA node of the device, or None. cpus: NUMA-local CPU ids, or None.
        compute_capability: e.g. ``"9.0"`` for NVIDIA, or None.
        health: one of :data:`HEALTH_STATES`.
        mig_mode: True/False when known, else None.
        partitions: MIG instances present. mig_profiles: the MIG profile table.
        cores: schedulable compute cores on the device when Ray counts cores rather than
            devices (AWS NeuronCores, as ``neuron-ls`` counts them under the current
            logical-core configuration), else None.
        coords: the device's position ``(x, y, z)`` on its host's chip grid (TPU chips on
            the ICI grid, as libtpu numbers them), or None.
    """

    index: int
    vendor: str = "nvidia"
    model: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_bytes: int | None = None
    numa_node: int | None = None
    cpus: tuple[int, ...] | None = None
    compute_capability: str | None = None
    health: str = "ok"
    mig_mode: bool | None = None
    partitions: tuple[Partition, ...] = ()
    mig_profiles: tuple[MigProfile, ...] = ()
    cores: int | None = None
    coords: tuple[int, ...] | None = None

    def profile(self, name: str) -> MigProfile | None:
        """The MIG profile called ``name`` (``+me`` variants included), or None."""
        for p in self.mig_profiles:
            if p.name == name:
                return p
        return None


@dataclass(frozen=True, slots=True)
class Link:
    """How two devices ``a < b`` are connected.

    Attributes:
        a, b: device indices, ``a < b``.
        kind: one of :data:`LINK_KINDS`. A direct link (NVLink, xGMI, NeuronLink)
            may also record the PCIe path class underneath it in ``pcie``.
        count: lanes of a direct link (``NV12`` -> 12), or None when unknown.
        pcie: PCIe path class (PIX/PXB/PHB/NODE/SYS) or None.
        lane_gbps: per-direction bandwidth of one lane of a direct link, GB/s, when it
            differs from the default of its kind in :data:`LANE_BANDWIDTH_GBPS` (e.g. 50.0
            for NVLink5); None means that default. Only direct links may set it.
    """

    a: int
    b: int
    kind: str
    count: int | None = None
    pcie: str | None = None
    lane_gbps: float | None = None

    @property
    def direct(self) -> bool:
        """True for NVLink / xGMI / NeuronLink."""
        return self.kind in DIRECT_KINDS

    @property
    def bandwidth_gbps(self) -> float:
        """Modeled per-direction bandwidth, GB/s (from the one table in this module)."""
        if self.direct:
            lane = self.lane_gbps if self.lane_gbps is not None else LANE_BANDWIDTH_GBPS[self.kind]
            return lane * (self.count or 1)
        if self.pcie is not None:
            return PCIE_BANDWIDTH_GBPS[self.pcie]
        return UNKNOWN_PAIR_BANDWIDTH_GBPS

    @property
    def rank(self) -> tuple[int, float]:
        """A sort key: higher is a stronger link.

        Any direct link beats any PCIe path; among direct links more bandwidth
        wins; among PCIe paths PIX > PXB > PHB > NODE > SYS.
        """
        if self.direct:
            return (len(PCIE_CLASSES) + 1, self.bandwidth_gbps)
        if self.pcie is not None:
            return (len(PCIE_CLASSES) - PCIE_CLASSES.index(self.pcie), self.bandwidth_gbps)
        return (0, UNKNOWN_PAIR_BANDWIDTH_GBPS)

    @property
    def label(self) -> str:
        """Short form as ``nvidia-smi topo -m`` would print it: ``NV12``, ``XGMI2``, ``PIX``."""
        if self.kind == "nvlink":
            return f"NV{self.count}" if self.count else "NV"
        if self.kind == "xgmi":
            return f"XGMI{self.count}" if self.count and self.count > 1 else "XGMI"
        if self.kind == "neuronlink":
            return "NL"
        if self.kind in ("ici", "hccs"):
            return self.kind.upper()
        if self.kind == "roce":
            return f"RoCE{self.count}" if self.count else "RoCE"
        if self.kind == "direct":
            return f"DL{self.count}" if self.count else "DL"
        return self.pcie or "?"


#: Rank of a pair that has no link record (weaker than SYS).
NO_LINK_RANK: tuple[int, float] = (0, UNKNOWN_PAIR_BANDWIDTH_GBPS)


@dataclass(frozen=True, slots=True)
class Nic:
    """A network interface near the accelerators.

    Attributes:
        name: e.g. ``"mlx5_0"``. numa_node: or None.
        paths: ``(device index, PCIe path class)`` for each device it was measured against.
        rdma: True when it can do RDMA / GPUDirect (Mellanox, EFA, ...).
    """

    name: str
    numa_node: int | None = None
    paths: tuple[tuple[int, str], ...] = ()
    rdma: bool = False

    def path_to(self, device: int) -> str | None:
        """PCIe path class from this NIC to ``device``, or None when unknown."""
        for d, cls in self.paths:
            if d == device:
                return cls
        return None

    @staticmethod
    def guess_rdma(name: str) -> bool:
        """Whether a NIC name looks RDMA-capable (mlx5_*, efa*, bnxt_re*, ...)."""
        return name.lower().startswith(_RDMA_NIC_PREFIXES)


#: A slice topology: chips per dimension, e.g. ``"2x2x4"`` (TPU v4/v5p) or ``"4x8"`` (v5e/v6e).
_SLICE_SHAPE = re.compile(r"^[1-9][0-9]{0,4}(x[1-9][0-9]{0,4}){1,2}$")


@dataclass(frozen=True, slots=True)
class Slice:
    """The multi-host slice a node is one host of (a TPU pod slice), as its metadata names it.

    Attributes:
        name: the slice's name (the TPU name / instance id; Ray's ``ray.io/tpu-slice-name``), or None.
        worker_id: this host's index in the slice (``agent-worker-number``), or None.
        topology: the slice's chip grid, e.g. ``"2x2x4"``, or None.
        accelerator_type: the slice's type, e.g. ``"v4-32"`` (Ray's pod type), or None.
    """

    name: str | None = None
    worker_id: int | None = None
    topology: str | None = None
    accelerator_type: str | None = None


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """Everything rayaccel knows about one node's accelerators.

    Invariants (checked by :meth:`validate`, which the constructor does not run
    so that importers can build incrementally): device indices are unique;
    links join two distinct known devices with ``a < b``, one per pair.
    """

    devices: tuple[Device, ...] = ()
    links: tuple[Link, ...] = ()
    nics: tuple[Nic, ...] = ()
    hostname: str | None = None
    driver: str | None = None
    name: str | None = None
    sources: tuple[str, ...] = ()
    slice: Slice | None = None
    _link_index: dict = field(default=None, init=False, repr=False, compare=False, hash=False)  # type: ignore[assignment]

    # ----------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self.devices)

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    @property
    def indices(self) -> tuple[int, ...]:
        """Device indices, sorted."""
        return tuple(sorted(d.index for d in self.devices))

    def device(self, index: int) -> Device:
        """The device with ``index``.

        Raises:
            KeyError: no such device.
        """
        for d in self.devices:
            if d.index == index:
                return d
        raise KeyError(f"no device {index} (devices: {list(self.indices)})")

    def _links(self) -> dict[tuple[int, int], Link]:
        idx = self._link_index
        if idx is None:
            idx = {(l.a, l.b): l for l in self.links}
            object.__setattr__(self, "_link_index", idx)
        return idx

    def link(self, a: int, b: int) -> Link | None:
        """The link between devices ``a`` and ``b`` (either order), or None."""
        if a > b:
            a, b = b, a
        return self._links().get((a, b))

    def rank(self, a: int, b: int) -> tuple[int, float]:
        """:attr:`Link.rank` of the pair, or :data:`NO_LINK_RANK` when unknown."""
        l = self.link(a, b)
        return l.rank if l is not None else NO_LINK_RANK

    def bandwidth_gbps(self, a: int, b: int) -> float:
        """Modeled per-direction bandwidth between two devices, GB/s."""
        l = self.link(a, b)
        return l.bandwidth_gbps if l is not None else UNKNOWN_PAIR_BANDWIDTH_GBPS

    def numa_nodes(self) -> tuple[int | None, ...]:
        """Distinct NUMA nodes of the devices, in device order."""
        seen: dict[int | None, None] = {}
        for d in sorted(self.devices, key=lambda d: d.index):
            seen.setdefault(d.numa_node, None)
        return tuple(seen)

    def direct_domains(self) -> list[frozenset[int]]:
        """Connected components of the direct-link (NVLink/xGMI/NeuronLink) graph."""
        parent = {i: i for i in self.indices}

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for l in self.links:
            if l.direct and l.a in parent and l.b in parent:
                parent[find(l.a)] = find(l.b)
        groups: dict[int, set[int]] = {}
        for i in self.indices:
            groups.setdefault(find(i), set()).add(i)
        return sorted((frozenset(g) for g in groups.values()), key=min)

    def partitions(self) -> tuple[Partition, ...]:
        """All MIG instances of the node, by parent device."""
        return tuple(p for d in sorted(self.devices, key=lambda d: d.index) for p in d.partitions)

    def subset(self, indices: Iterable[int]) -> "NodeTopology":
        """The topology restricted to ``indices`` (links and NIC paths among them only)."""
        keep = set(indices)
        return replace(
            self,
            devices=tuple(d for d in self.devices if d.index in keep),
            links=tuple(l for l in self.links if l.a in keep and l.b in keep),
            nics=tuple(replace(n, paths=tuple(p for p in n.paths if p[0] in keep)) for n in self.nics),
        )

    # ------------------------------------------------------------- validation
    def validate(self) -> "NodeTopology":
        """Check the invariants; return self.

        Raises:
            TopologyError: naming the bad field.
        """
        _check_len(self.devices, MAX_DEVICES, "devices")
        _check_len(self.links, MAX_DEVICES * (MAX_DEVICES - 1) // 2, "links")
        _check_len(self.nics, MAX_DEVICES, "nics")
        _check_len(self.sources, MAX_ITEMS, "sources")
        for field_name in ("hostname", "driver", "name"):
            _check_text(getattr(self, field_name), field_name)
        for i, src in enumerate(self.sources):
            _check_text(src, f"sources[{i}]", nullable=False)
        seen: set[int] = set()
        coords_seen: dict[tuple[int, ...], int] = {}
        for i, d in enumerate(self.devices):
            _check_device(d, f"devices[{i}]")
            if d.index in seen:
                raise TopologyError(f"duplicate device index {d.index}", f"devices[{i}].index")
            seen.add(d.index)
            if d.coords is not None:
                if d.coords in coords_seen:
                    raise TopologyError(f"coordinates {list(d.coords)} also belong to device {coords_seen[d.coords]}",
                                        f"devices[{i}].coords")
                coords_seen[d.coords] = d.index
        _check_slice(self.slice)
        pairs: set[tuple[int, int]] = set()
        for i, l in enumerate(self.links):
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
        for i, n in enumerate(self.nics):
            _check_text(n.name, f"nics[{i}].name", nullable=False)
            _check_int(n.numa_node, f"nics[{i}].numa_node", 0, MAX_INDEX - 1, nullable=True)
            _check_len(n.paths, MAX_DEVICES, f"nics[{i}].paths")
            for j, (dev, cls) in enumerate(n.paths):
                _check_int(dev, f"nics[{i}].paths[{j}]", 0, MAX_INDEX - 1)
                if cls not in PCIE_CLASSES:
                    raise TopologyError(f"unknown PCIe class {_short(cls)}", f"nics[{i}].paths[{j}]")
        return self

    # -------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict tagged with :data:`SCHEMA`."""
        return {
            "schema": SCHEMA,
            "name": self.name,
            "hostname": self.hostname,
            "driver": self.driver,
            "sources": list(self.sources),
            "devices": [_device_to_dict(d) for d in sorted(self.devices, key=lambda d: d.index)],
            "links": [_link_to_dict(l) for l in sorted(self.links, key=lambda l: (l.a, l.b))],
            "nics": [
                {"name": n.name, "numa_node": n.numa_node, "rdma": n.rdma,
                 "paths": {str(dev): cls for dev, cls in n.paths}}
                for n in self.nics
            ],
            **({"slice": {"name": self.slice.name, "worker_id": self.slice.worker_id, "topology": self.slice.topology,
                          "accelerator_type": self.slice.accelerator_type}} if self.slice is not None else {}),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """Serialize to JSON text (see :meth:`from_json`)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NodeTopology":
        """Build and validate a topology from :meth:`to_dict` output.

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
        topo = cls(
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

    @classmethod
    def from_json(cls, text: str) -> "NodeTopology":
        """Parse JSON text.

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
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> "NodeTopology":
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
            return cls.from_json(text)
        except TopologyError as e:
            raise TopologyError(f"{p}: {e}") from None

    def save(self, path: str | Path) -> None:
        """Write this topology as JSON."""
        Path(path).write_text(self.to_json() + "\n")


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
        # written only when known, so files of machines without them stay as they were
        **({"cores": d.cores} if d.cores is not None else {}),
        **({"coords": list(d.coords)} if d.coords is not None else {}),
    }


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
    )


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


def make_link(a: int, b: int, kind: str, count: int | None = None, pcie: str | None = None,
              lane_gbps: float | None = None) -> Link:
    """A :class:`Link` with ``a < b`` ensured (arguments in any order)."""
    if a > b:
        a, b = b, a
    return Link(a=a, b=b, kind=kind, count=count, pcie=pcie, lane_gbps=lane_gbps)
