"""The topology model's value types: what accelerators a node has and how they are wired.

Pure data, stdlib only.

* :class:`Device`     one accelerator (GPU, APU, Trainium/Inferentia device)
* :class:`Partition`  one MIG instance carved out of a device
* :class:`MigProfile` one row of a device's MIG GPU-instance profile table
* :class:`Link`       how two devices are connected (``kind`` + lane ``count`` +
  the PCIe path class between them)
* :class:`Nic`        a network interface and its PCIe path class to each device
* :class:`Fabric`     a GPU's NVLink fabric registration (cluster UUID, clique), as NVML reports it

:class:`~rayaccel.topology.node.NodeTopology` (in :mod:`.node`) holds all of them for one
node; its JSON form is :mod:`.codec`'s.

Link bandwidths are *modeled* from one table (:data:`LANE_BANDWIDTH_GBPS` and
:data:`PCIE_BANDWIDTH_GBPS`), per direction, in GB/s. Unknown values are
``None`` here; display placeholders belong to the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass

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
#: NVLink fabric registration states, in NVML's order (``NVML_GPU_FABRIC_STATE_*`` 0..3).
FABRIC_STATES = ("not_supported", "not_started", "in_progress", "completed")

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

#: PCIe path classes between a device and a NIC (or a peer) close enough to be "near": on the same
#: PCIe switch (PIX) or through several switches without the host bridge (PXB). GPUDirect RDMA, the
#: NIC named for a device (``UCX_NET_DEVICES``, ``near_nics``) and CUDA IPC's peer mapping use these.
NEAR_PCIE_CLASSES: tuple[str, ...] = ("PIX", "PXB")

#: Modeled per-direction bandwidth of one NIC, GB/s, by kind: an RDMA NIC at 400 Gb/s (ConnectX-7 NDR
#: InfiniBand / RoCE: the NIC of GB200 NVL72 compute trays and HGX H100 reference designs) and a plain
#: 100 Gb/s Ethernet NIC. The one figure the transfer model and the cross-node gang model both use; a
#: node whose NICs run at another rate says so (``NodePlace.network_gbps``).
NIC_BANDWIDTH_GBPS: dict[str, float] = {"rdma": 50.0, "ethernet": 12.5}

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
#: Fabric clique ids are NVML ``unsigned int`` (32 bits); so are health masks.
MAX_UINT32 = (1 << 32) - 1
#: NVML return codes (``nvmlReturn_t``) a fabric's ``status`` may hold.
MAX_NVML_RETURN = 999
#: RDMA device port numbers (UCX ``device:port``; InfiniBand ports are 1-based, 8 bits).
MAX_PORT = 255

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
class Fabric:
    """A GPU's NVLink fabric registration, as NVML reports it (``nvmlDeviceGetGpuFabricInfoV``,
    struct ``nvmlGpuFabricInfo_v2``/``_v3``; ``nvidia-smi -q`` prints it as "Fabric").

    GPUs whose fabrics name the same cluster UUID and clique id share one NVLink domain, across
    nodes too (a GB200/GB300 NVL72 rack). An all-zero cluster UUID is what a single-node NVSwitch
    system (HGX H100) reports: no multi-node domain.

    Attributes:
        state: one of :data:`FABRIC_STATES` (NVML's ``state``).
        cluster_uuid: NVML's ``clusterUuid`` in canonical lower-case form
            (``"9c6f5af3-53bf-49b5-a436-b66766c413c3"``); None unless ``state`` is completed.
        clique_id: NVML's ``cliqueId`` (the NVLink partition within the cluster); None unless completed.
        status: NVML's ``status``, the registration's ``nvmlReturn_t`` (0 = success; NVML says it is
            meaningful only once completed); None when unknown.
        health_mask: NVML's ``healthMask`` (``NVML_GPU_FABRIC_HEALTH_MASK_*`` bit fields, v2+ structs);
            None when unknown or when NVML reports no health (a mask of 0).
    """

    state: str
    cluster_uuid: str | None = None
    clique_id: int | None = None
    status: int | None = None
    health_mask: int | None = None


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
        fabric: the NVLink fabric registration (:class:`Fabric`), or None where NVML reports none
            (before Hopper, no NVSwitch, or not discovered).
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
    fabric: Fabric | None = None
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
        port: the RDMA device port traffic leaves through (UCX's ``device:port``), or None when
            no capture says; ``nvidia-smi topo -m`` names devices, not ports.
    """

    name: str
    numa_node: int | None = None
    paths: tuple[tuple[int, str], ...] = ()
    rdma: bool = False
    port: int | None = None

    @property
    def ucx_device(self) -> str:
        """UCX's ``device:port`` name (``"mlx5_0:1"``); port 1 when unknown, the first port of an
        RDMA device (each ConnectX port of a DGX/HGX is a device of its own, ``mlx5_<n>``)."""
        return f"{self.name}:{self.port if self.port is not None else 1}"

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


def make_link(a: int, b: int, kind: str, count: int | None = None, pcie: str | None = None,
              lane_gbps: float | None = None) -> Link:
    """A :class:`Link` with ``a < b`` ensured (arguments in any order)."""
    if a > b:
        a, b = b, a
    return Link(a=a, b=b, kind=kind, count=count, pcie=pcie, lane_gbps=lane_gbps)


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
