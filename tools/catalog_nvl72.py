"""NVL72 compute trays for ``build_catalog.py``: ``gb200-nvl72-tray`` and ``gb300-nvl72-tray``.

A GB200 / GB300 NVL72 rack is 18 compute trays (one OS each: 4 GPUs, 2 Grace CPUs, their NICs)
joined by 9 NVLink switch trays into one NVLink domain. The catalog holds ONE tray; a rack is
``rayaccel.catalog.rack(name, trays=18, rack=r)``, which gives each tray its hostname, GPU UUIDs
and the rack's fabric cluster UUID and clique. The tray's own fabric carries a placeholder cluster
UUID (:data:`PLACEHOLDER_CLUSTER_UUID`) for that helper to replace.

Every fact names its source (``NodeTopology.sources``); what is modeled or assumed says so.
"""

from __future__ import annotations

import uuid
from itertools import combinations
from typing import Callable

from rayaccel.topology import Device, Fabric, Link, Nic, NodeTopology

MiB = 1 << 20
#: NVLink5 per link, per direction, GB/s (Link.lane_gbps): 1.8 TB/s bidirectional over 18 links.
NVLINK5_LANE_GBPS = 50.0
_NS = uuid.UUID("6f1c1c2e-3b8a-4c55-9e0b-52a1d1c0a7e1")  # build_catalog.py's namespace
#: The cluster UUID a catalog tray's fabric carries until ``rayaccel.catalog.rack`` names its rack.
PLACEHOLDER_CLUSTER_UUID = str(uuid.uuid5(_NS, "nvl72-tray/placeholder-rack"))
#: The placeholder's clique (NVML reports one clique per NVLink partition; a rack's default partition).
PLACEHOLDER_CLIQUE_ID = 1

_NVLINK_SOURCES = (
    "NVLink 5: 18 links per Blackwell GPU, 1.8 TB/s bidirectional per GPU (NVIDIA GB200 NVL72 / GB300 NVL72 pages); "
    "every GPU reaches every other of the rack through the 9 NVLink switch trays, so every pair on a tray is NV18 as "
    "nvidia-smi shows (tests/data/captures/114_gb200-tray-4gpu-nv18-8nic-all-sys-rhel4nv.txt); links carry "
    "lane_gbps=50 (1.8 TB/s / 18 / 2; the table default of 25 GB/s is NVLink 2-4)",
    "NVIDIA/k8s-test-infra issue #371: `nvidia-smi nvlink -s` on a GB200 tray, 18 links of 53.125 GB/s per GPU "
    "(H100: 26.562 GB/s) -- twice the NVLink 4 lane",
    "fabric: NVML reports a cluster UUID and clique per GPU once registration completes "
    "(nvmlDeviceGetGpuFabricInfoV; tests/data/captures/112_nvsmi-q-grep-gb200-fabric-completed-unhealthy.txt); "
    f"the tray carries a placeholder cluster UUID ({PLACEHOLDER_CLUSTER_UUID}, clique {PLACEHOLDER_CLIQUE_ID}) that "
    "rayaccel.catalog.rack() replaces per rack",
)


def _uuid(machine: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_NS, f'{machine}/{index}')}"


def _fabric() -> Fabric:
    return Fabric(state="completed", cluster_uuid=PLACEHOLDER_CLUSTER_UUID, clique_id=PLACEHOLDER_CLIQUE_ID, status=0)


def _devices(machine: str, *, model: str, memory_mib: int, cc: str, bus: tuple[str, ...]) -> tuple[Device, ...]:
    cpus = {0: tuple(range(0, 72)), 1: tuple(range(72, 144))}
    return tuple(Device(index=i, vendor="nvidia", model=model, uuid=_uuid(machine, i), pci_bus_id=bus[i],
                        memory_bytes=memory_mib * MiB, numa_node=i // 2, cpus=cpus[i // 2], compute_capability=cc,
                        fabric=_fabric()) for i in range(4))


def _nvlinks() -> tuple[Link, ...]:
    # PCIe class under the NVLinks: not shown by `topo -m` (NV18 only) and unknown, so None.
    return tuple(Link(a, b, "nvlink", 18, None, NVLINK5_LANE_GBPS) for a, b in combinations(range(4), 2))


def gb200_nvl72_tray() -> tuple[NodeTopology, str]:
    name = "gb200-nvl72-tray"
    devs = _devices(name, model="NVIDIA GB200", memory_mib=189471, cc="10.0",
                    bus=("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0"))
    # capture 114: 8 mlx5 devices, every one SYS from every GPU; mlx5_2/3 and mlx5_6/7 are PIX to each other.
    nics = tuple(Nic(f"mlx5_{k}", None, tuple((g, "SYS") for g in range(4)), rdma=True) for k in range(8))
    t = NodeTopology(devices=devs, links=_nvlinks(), nics=nics, name=name, sources=(
        "NVIDIA DGX GB200 user guide, Hardware (docs.nvidia.com/dgx/dgxgb200-user-guide/hardware.html): a rack is 18x 1RU "
        "compute trays, each 2 Grace CPUs and 4 Blackwell GPUs, and 9x NVLink switch trays; a compute tray runs one OS "
        "image and has 4x ConnectX-7 single-port 400G OSFP (cluster network) and 2x BlueField-3 (storage/management)",
        "real nvidia-smi and `nvidia-smi topo -m` of a GB200 tray: 4x NVIDIA GB200 at 00000008/00000009/00000018/"
        "00000019:01:00.0, 189471 MiB each, NV18 all pairs, CPU affinity 0-71 (GPU0-1) | 72-143 (GPU2-3), NUMA affinity "
        "'0,2-17' | '1,18-33', 8 NICs mlx5_0..7 all SYS from every GPU "
        "(tests/data/captures/114_gb200-tray-4gpu-nv18-8nic-all-sys-rhel4nv.txt)",
        "modeled: GPU NUMA node = its Grace's (0 for GPU0-1, 1 for GPU2-3; the first node of the capture's NUMA "
        "affinity), one Grace of 72 cores per GPU pair (NVIDIA Grace: 72 Arm Neoverse V2 cores)",
        "inference from capture 114: mlx5_2/3 and mlx5_6/7 (PIX to each other) are the two dual-port BlueField-3, "
        "mlx5_0/1/4/5 the four single-port ConnectX-7; NIC NUMA nodes are not in the capture (null); no NIC is PIX/PXB "
        "from a GPU, so near_nics() names none (the GPUs reach PCIe through their Grace over NVLink-C2C)",
        "sglang issue #11208: `GPU 0,1,2,3: NVIDIA GB200, Compute Capability: 10.0`",
        *_NVLINK_SOURCES,
        "no MIG table attached (no published GB200 MIG profile table was found)",
    ))
    return t, "one GB200 NVL72 compute tray (4x GB200 NVLink5 NV18 to the switch trays, 2 Grace, 4x CX-7 + 2x BF-3); " \
              "a rack is 18: rayaccel.catalog.rack()"


def gb300_nvl72_tray() -> tuple[NodeTopology, str]:
    name = "gb300-nvl72-tray"
    devs = _devices(name, model="NVIDIA GB300", memory_mib=274658, cc="10.3",
                    bus=("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0"))
    nics = tuple(Nic(f"mlx5_{k}", None, (), rdma=True) for k in range(6))
    t = NodeTopology(devices=devs, links=_nvlinks(), nics=nics, name=name, sources=(
        "NVIDIA Enterprise RA, NVL72 AI factory, System Hardware & Components (docs.nvidia.com/enterprise-reference-"
        "architectures/nvl72-ai-factory/latest/components.html): a GB300 NVL compute tray has 4 Blackwell Ultra GPUs and "
        "2 Grace CPUs; 2 mezzanine network boards with 2 ConnectX-8 each, 4 ConnectX-8 HCAs per tray (compute fabric); "
        "the CPU converged (north/south) network uses two 400 Gb/s ports per node",
        "NVIDIA GB300 NVL72: 72 Blackwell Ultra GPUs and 36 Grace CPUs, 288 GB HBM3e per GPU (20.7 TB per rack)",
        "assumption: memory 288 GB = 288e9 bytes (274658 MiB); what nvidia-smi reports on GB300 was not found",
        "assumption: model string 'NVIDIA GB300', compute capability 10.3 as NVIDIA B300 (Blackwell Ultra) reports it "
        "(sglang issue #28659: `NVIDIA B300 SXM6 AC, Compute Capability: 10.3`)",
        "assumption: the tray's PCI bus ids, CPUs (0-71 | 72-143) and NUMA nodes as the GB200 tray (capture 114), same "
        "Grace and board layout",
        "assumption: mlx5_0..3 are the four ConnectX-8, mlx5_4/5 the two north/south 400G ports (BlueField-3); their PCIe "
        "class to each GPU is unknown (no GB300 `nvidia-smi topo -m` was found), so no paths and near_nics() names none",
        *_NVLINK_SOURCES,
        "no MIG table attached (no published GB300 MIG profile table was found)",
    ))
    return t, "one GB300 NVL72 compute tray (4x GB300 NVLink5 NV18 to the switch trays, 2 Grace, 4x ConnectX-8; " \
              "partly assumed); a rack is 18: rayaccel.catalog.rack()"


#: Machine name -> builder, merged into build_catalog.py's MACHINES.
NVL72_MACHINES: dict[str, Callable[[], tuple[NodeTopology, str]]] = {
    "gb200-nvl72-tray": gb200_nvl72_tray,
    "gb300-nvl72-tray": gb300_nvl72_tray,
}

#: The fabric an HGX H100/H200 (single-node NVSwitch) reports: completed, clique 0, cluster UUID all zeros
#: (tests/data/captures/110_nvsmi-q-h100-sxm-8gpu-fabric-completed-zero-uuid.txt): no NVLink domain beyond the node.
HGX_HOPPER_FABRIC = Fabric(state="completed", cluster_uuid="00000000-0000-0000-0000-000000000000", clique_id=0, status=0)
HGX_HOPPER_FABRIC_SOURCE = ("NVLink fabric: real `nvidia-smi -q` of an 8x H100 SXM host: every GPU Completed / Success / "
                            "CliqueId 0 / ClusterUUID all zeros "
                            "(tests/data/captures/110_nvsmi-q-h100-sxm-8gpu-fabric-completed-zero-uuid.txt)")
