#!/usr/bin/env python3
"""Generate the catalog of real machines (``src/rayaccel/catalog/*.json``).

Each machine is a compact Python definition below that names where its facts
come from (``NodeTopology.sources``); this script expands it into a full,
validated ``rayaccel.topology/1`` JSON file, one per machine, plus
``_mig_tables.json`` (the MIG GPU-instance profile tables by GPU model).

Run from the repository root after editing a definition::

    python tools/build_catalog.py            # rewrite the JSON files
    python tools/build_catalog.py --check    # exit 1 if a JSON file is stale

The output is deterministic (UUIDs are uuid5 of machine name + index), so a
second run produces byte-identical files.

Every source a machine names is public: a URL, a public issue or document by name,
or a real capture kept in this repository under ``tests/data/captures/`` (cited by
that path, so ``rayaccel topo show`` never points outside the repository).
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from dataclasses import replace
from itertools import combinations
from pathlib import Path
from typing import Callable, Iterable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from rayaccel.topology import Device, Link, MigProfile, Nic, NodeTopology, Partition  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from catalog_mig import MIG, MIG_SOURCES  # noqa: E402  (the MIG profile tables, data only)
from catalog_nvl72 import HGX_HOPPER_FABRIC, HGX_HOPPER_FABRIC_SOURCE, NVL72_MACHINES  # noqa: E402  (NVL72 trays)

OUT = ROOT / "src" / "rayaccel" / "catalog"
MiB = 1 << 20
#: Per-lane, per-direction GB/s overriding the topology table's default (Link.lane_gbps).
NVLINK5_LANE_GBPS = 50.0  # Blackwell NVLink5: 1.8 TB/s bidirectional over 18 links
MI300X_XGMI_LANE_GBPS = 64.0  # MI300X Infinity Fabric: 128 GB/s bidirectional per link
_NS = uuid.UUID("6f1c1c2e-3b8a-4c55-9e0b-52a1d1c0a7e1")


# --------------------------------------------------------------------- helpers
def cpus(spec: str) -> tuple[int, ...]:
    """``"0-11,24-35"`` -> (0, ..., 11, 24, ..., 35)."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def gpu_uuid(machine: str, index: int, prefix: str = "GPU") -> str:
    return f"{prefix}-{uuid.uuid5(_NS, f'{machine}/{index}')}"


def devices(machine: str, n: int, *, model: str, memory_mib: int, cc: str | None, vendor: str = "nvidia",
            numa: Callable[[int], int | None], cpu: Callable[[int], str | None],
            bus: Callable[[int], str | None] = lambda i: None,
            mig: tuple[MigProfile, ...] = (), uuid_prefix: str = "GPU") -> list[Device]:
    out = []
    for i in range(n):
        spec = cpu(i)
        out.append(Device(
            index=i, vendor=vendor, model=model, uuid=gpu_uuid(machine, i, uuid_prefix), pci_bus_id=bus(i),
            memory_bytes=memory_mib * MiB, numa_node=numa(i), cpus=cpus(spec) if spec else None,
            compute_capability=cc, mig_mode=False if mig else None, mig_profiles=mig,
        ))
    return out


def links(n: int, fn: Callable[[int, int], tuple | None]) -> list[Link]:
    """One link per pair ``a < b`` from ``fn(a, b) -> (kind, count, pcie[, lane_gbps])`` (None: no record)."""
    out = []
    for a, b in combinations(range(n), 2):
        r = fn(a, b)
        if r is not None:
            out.append(Link(a, b, *r))
    return out


def nic(name: str, numa: int | None, paths: Iterable[tuple[int, str]]) -> Nic:
    return Nic(name=name, numa_node=numa, paths=tuple(sorted(paths)), rdma=Nic.guess_rdma(name))


def bus_ids(*hexes: str) -> Callable[[int], str]:
    return lambda i: f"00000000:{hexes[i]}:00.0"


# -------------------------------------------------------------------- machines
MACHINES: dict[str, Callable[[], tuple[NodeTopology, str]]] = {}


def machine(fn: Callable[[], tuple[NodeTopology, str]]) -> Callable[[], tuple[NodeTopology, str]]:
    MACHINES[fn.__name__.replace("_", "-").removeprefix("m-")] = fn
    return fn


# DGX-1V hybrid cube-mesh, NVLink lanes per pair (OneFlow DLPerf topo -m matrix; go-gpuallocator NewDGX1VoltaNode)
_DGX1V_NV = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2, (2, 6): 1,
             (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}


@machine
def dgx1_v100():
    n = 8
    sock = lambda i: i // 4  # noqa: E731
    def pcie(a, b):
        if sock(a) != sock(b):
            return "SYS"
        return "PIX" if a // 2 == b // 2 else "PHB"
    def ln(a, b):
        c = _DGX1V_NV.get((a, b))
        return ("nvlink", c, pcie(a, b)) if c else ("pcie", None, pcie(a, b))
    devs = devices("dgx1-v100", n, model="Tesla V100-SXM2-32GB", memory_mib=32768, cc="7.0", numa=sock,
                   cpu=lambda i: "0-19,40-59" if i < 4 else "20-39,60-79",
                   bus=bus_ids("06", "07", "0A", "0B", "85", "86", "89", "8A"))
    # mlx5_k sits on the PCIe switch of GPU pair k (PIX), PHB to the other pair of its socket (capture 13).
    nics = [nic(f"mlx5_{k}", k // 2, [(g, "PIX" if g // 2 == k else ("PHB" if sock(g) == k // 2 else "SYS")) for g in range(n)])
            for k in range(4)]
    t = NodeTopology(devices=tuple(devs), links=tuple(links(n, ln)), nics=tuple(nics), name="dgx1-v100", sources=(
        "NVLink matrix: real nvidia-smi topo -m of a DGX-1 V100 in OneFlow DLPerf reports (github.com/Oneflow-Inc/DLPerf)",
        "NVIDIA/go-gpuallocator gpuallocator/common_test.go NewDGX1VoltaNode (NV1/NV2 links; PIX within a GPU pair, PHB within a socket, SYS across)",
        "Microway nvidia-smi guide §3.5, DGX-1 V100 topo -m with 4 mlx5 NICs and CPU affinity 0-19,40-59 | 20-39,60-79 (tests/data/captures/13_dgx1-v100-8gpu-4mlx5-microway.txt)",
        "NVIDIA/nccl issue #671 (DGX-1V PCIe switch 10b5:8764, 8 GT/s x16)",
        "assumption: 2x Xeon E5-2698 v4 (one NUMA node per socket); GPU memory 32 GiB (V100-SXM2-32GB variant)",
    ))
    return t, "NVIDIA DGX-1 (8x V100-SXM2-32GB, NVLink2 hybrid cube-mesh NV1/NV2, 2 sockets, 4x mlx5)"


@machine
def dgx2_v100():
    n = 16
    sock = lambda i: i // 8  # noqa: E731
    def pcie(a, b):
        if sock(a) != sock(b):
            return "SYS"
        if a // 2 == b // 2:
            return "PIX"
        return "PXB" if a // 4 == b // 4 else "NODE"
    devs = devices("dgx2-v100", n, model="Tesla V100-SXM3-32GB", memory_mib=32768, cc="7.0", numa=sock,
                   cpu=lambda i: "0-23,48-71" if i < 8 else "24-47,72-95",
                   bus=bus_ids("34", "36", "39", "3B", "57", "59", "5C", "5E", "B7", "B9", "BC", "BE", "E0", "E2", "E5", "E7"))
    def nic_path(k: int, g: int) -> str:
        if k in (4, 5):  # storage NICs on socket 1 (assumption): NODE to its GPUs
            return "NODE" if sock(g) == 1 else "SYS"
        pair = k if k < 4 else k - 2  # compute NICs: mlx5_0-3 -> GPU pairs 0-3, mlx5_6-9 -> pairs 4-7
        gpair = g // 2
        if sock(g) != sock(2 * pair):
            return "SYS"
        if gpair == pair:
            return "PIX"
        return "PXB" if gpair // 2 == pair // 2 else "NODE"
    nics = [nic(f"mlx5_{k}", 0 if k < 4 else 1, [(g, nic_path(k, g)) for g in range(n)]) for k in range(10)]
    t = NodeTopology(devices=tuple(devs), links=tuple(links(n, lambda a, b: ("nvlink", 6, pcie(a, b)))), nics=tuple(nics),
                     name="dgx2-v100", sources=(
        "NVIDIA/nccl-tests issue #78: DGX-2 nvidia-smi topo -m, 16 GPUs NV6 all pairs, 10 mlx5 (tests/data/captures/72_dgx2-v100-16gpu-nv6-10mlx5-PARTIAL-issue-excerpt.txt)",
        "capture 72 rows GPU0-3: mlx5_0/1 PIX/PXB, mlx5_2/3 NODE, mlx5_4-9 SYS; CPU affinity 0-23,48-71",
        "assumption (capture is cut after GPU4): the second socket mirrors the first (GPUs 8-15, CPUs 24-47,72-95, mlx5_6-9), mlx5_4/5 are socket-1 storage NICs",
        "GPU-GPU PCIe classes inferred from the shared NIC paths (PIX within a pair, PXB within a quad, NODE within a socket)",
    ))
    return t, "NVIDIA DGX-2 (16x V100-SXM3-32GB, NVSwitch NV6 all pairs, 2 sockets, 10x mlx5)"


@machine
def dgx_a100():
    n = 8
    numa = {0: 3, 1: 3, 2: 1, 3: 1, 4: 7, 5: 7, 6: 5, 7: 5}
    cpu = {3: "48-63,176-191", 1: "16-31,144-159", 7: "112-127,240-255", 5: "80-95,208-223"}
    devs = devices("dgx-a100", n, model="NVIDIA A100-SXM4-40GB", memory_mib=40960, cc="8.0",
                   numa=lambda i: numa[i], cpu=lambda i: cpu[numa[i]],
                   bus=bus_ids("07", "0F", "47", "4E", "87", "90", "B7", "BD"), mig=MIG["A100-40GB"])
    def pcie(a, b):
        return "PXB" if a // 2 == b // 2 else "SYS"
    nics = [nic(f"mlx5_{k}", numa[2 * (k // 2)], [(g, "PXB" if g // 2 == k // 2 else "SYS") for g in range(n)]) for k in range(8)]
    nics += [nic(f"mlx5_{k}", None, [(g, "SYS") for g in range(n)]) for k in (8, 9)]
    t = NodeTopology(devices=tuple(devs), links=tuple(links(n, lambda a, b: ("nvlink", 12, pcie(a, b)))), nics=tuple(nics),
                     name="dgx-a100", sources=(
        "real nvidia-smi topo -m of a DGX A100: NV12 all pairs, 10 NICs, NUMA 3/1/7/5 (tests/data/captures/01_dgx-a100-8gpu-10nic.txt)",
        "NVIDIA/nccl issue #1505: GPU0-1 NUMA 3, GPU2-3 NUMA 1, two PXB NICs per GPU pair",
        "NVIDIA/nccl-tests issue #228: nvidia-smi nvlink, 12 links x 25 GB/s per GPU; NCCL XML count=2 to each of 6 NVSwitches",
        "NVIDIA DGX A100 user guide: 2x EPYC 7742 in NPS4 (8 NUMA nodes), 8x compute + 2x storage ConnectX-6",
        "GPU-GPU PCIe class: PXB within the pair that shares NICs (capture 01 NIC rows), SYS otherwise as capture 01 reports across NUMA nodes",
        *MIG_SOURCES,
    ))
    return t, "NVIDIA DGX A100 (8x A100-SXM4-40GB, NVSwitch NV12 all pairs, 8 NUMA nodes, 10x mlx5, MIG table)"


def _hgx_hopper(name: str, model: str, memory_mib: int, mig_key: str, extra_sources: tuple[str, ...]) -> NodeTopology:
    n = 8
    sock = lambda i: i // 4  # noqa: E731
    devs = devices(name, n, model=model, memory_mib=memory_mib, cc="9.0", numa=sock,
                   cpu=lambda i: "0-55,112-167" if i < 4 else "56-111,168-223",
                   bus=bus_ids("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"), mig=MIG[mig_key])
    devs = [replace(d, fabric=HGX_HOPPER_FABRIC) for d in devs]
    pcie = lambda a, b: "NODE" if sock(a) == sock(b) else "SYS"  # noqa: E731
    nics = [nic(f"mlx5_{k}", sock(k), [(g, "PIX" if g == k else pcie(g, k)) for g in range(n)]) for k in range(n)]
    return NodeTopology(devices=tuple(devs), links=tuple(links(n, lambda a, b: ("nvlink", 18, pcie(a, b)))), nics=tuple(nics),
                        name=name, sources=(
        "NVIDIA/nccl issue #1264: HGX H100 NV18 all pairs, GPUs 0-3 NUMA 0 / 4-7 NUMA 1, one PIX NIC per GPU",
        "real DGX H100 nvidia-smi topo -m: NV18, CPU affinity 0-55,112-167 | 56-111,168-223 (tests/data/captures/02_dgx-h100-8gpu-12nic-truncated.txt)",
        "NVLink gen4: 18 links, 900 GB/s per GPU (juejin.cn nvidia-smi nvlink article)",
        "HAMi PR #2103: go-gpuallocator finds 0 of the 28 NV18 pairs on an 8xH100 NVSwitch box",
        HGX_HOPPER_FABRIC_SOURCE,
        *extra_sources, *MIG_SOURCES,
    ))


@machine
def hgx_h100():
    t = _hgx_hopper("hgx-h100", "NVIDIA H100 80GB HBM3", 81559, "H100-80GB", (
        "GPU memory 81559 MiB as nvidia-smi reports for H100 80GB HBM3; compute capability 9.0",))
    return t, "NVIDIA HGX H100 (8x H100 80GB HBM3, NVSwitch NV18 all pairs, 2 NUMA, 8 PIX NICs, MIG table)"


@machine
def hgx_h200():
    t = _hgx_hopper("hgx-h200", "NVIDIA H200", 143771, "H200", (
        "assumption: HGX H200 baseboard wired as HGX H100 (same NVSwitch NV18 fabric and host layout)",
        "GPU memory 143771 MiB as nvidia-smi reports for H200 141GB"))
    return t, "NVIDIA HGX H200 (8x H200 141GB, NVSwitch NV18 all pairs, 2 NUMA, 8 PIX NICs, MIG table)"


@machine
def gb200_nvl4():
    n = 4
    sock = lambda i: i // 2  # noqa: E731
    devs = devices("gb200-nvl4", n, model="NVIDIA GB200", memory_mib=189471, cc="10.0", numa=sock,
                   cpu=lambda i: "0-71" if i < 2 else "72-143", bus=lambda i: ["00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0"][i])
    pcie = lambda a, b: "NODE" if sock(a) == sock(b) else "SYS"  # noqa: E731
    nics = [nic(f"mlx5_{k}", sock(k), [(g, "PIX" if g == k else pcie(g, k)) for g in range(n)]) for k in range(n)]
    t = NodeTopology(devices=tuple(devs), links=tuple(links(n, lambda a, b: ("nvlink", 18, pcie(a, b), NVLINK5_LANE_GBPS))), nics=tuple(nics),
                     name="gb200-nvl4", sources=(
        "NVIDIA GB200 NVL4 announcement: 4 Blackwell GPUs and 2 Grace CPUs on one board, NVLink-connected; Grace-GPU over NVLink-C2C",
        "NVLink 5: 18 links per Blackwell GPU, 1.8 TB/s bidirectional (NVIDIA NVLink page)",
        "assumption: every GPU pair reports NV18 (all 18 links reach every peer, as nvidia-smi shows on NVSwitch-connected GB200 trays); "
        "NVLink5 runs 50 GB/s per link per direction (1.8 TB/s / 18 links / 2): links carry lane_gbps=50 "
        "(the table default of 25 GB/s is NVLink 2-4)",
        "assumption: one Grace (72 cores) per GPU pair = one NUMA node, one ConnectX-7 per GPU (PIX); memory 189471 MiB as nvidia-smi reports on GB200",
        "no MIG table attached (no published B200-class MIG profile table was found)",
    ))
    return t, "NVIDIA GB200 NVL4 node (4x Blackwell GB200 GPUs, NVLink5 NV18 all pairs, 2 Grace CPUs; partly assumed)"


@machine
def pcie_8gpu_2socket():
    n = 8
    sock = lambda i: i // 4  # noqa: E731
    def pcie(a, b):
        if sock(a) != sock(b):
            return "SYS"
        return "PIX" if a // 2 == b // 2 else "PXB"
    devs = devices("pcie-8gpu-2socket", n, model="Tesla V100-PCIE-32GB", memory_mib=32768, cc="7.0", numa=sock,
                   cpu=lambda i: "0-13" if i < 4 else "14-27",
                   bus=bus_ids("04", "05", "08", "09", "84", "85", "88", "89"))
    nics = [nic("mlx5_0", 1, [(g, "PHB" if sock(g) == 1 else "SYS") for g in range(n)])]
    t = NodeTopology(devices=tuple(devs), links=tuple(links(n, lambda a, b: ("pcie", None, pcie(a, b)))), nics=tuple(nics),
                     name="pcie-8gpu-2socket", sources=(
        "lattice/quda issue #669: nvidia-smi topo -m, 8 PCIe GPUs: G0-G1 PIX, G0-G2/3 PXB, G0-G4..7 SYS; mlx5_0 PHB to G4-7, SYS to G0-3; CPU affinity 0-13 | 14-27",
        "assumption: the GPU model is not in the capture; modeled as Tesla V100-PCIE-32GB",
    ))
    return t, "2-socket PCIe server, 8 GPUs behind PCIe switches (PIX pairs, PXB quads, SYS across), 1x mlx5"


@machine
def l40s_4x_pcie():
    n = 4
    devs = devices("l40s-4x-pcie", n, model="NVIDIA L40S", memory_mib=46068, cc="8.9", numa=lambda i: 0,
                   cpu=lambda i: "0-15,32-47", bus=bus_ids("01", "02", "81", "82"))
    t = NodeTopology(devices=tuple(devs), links=tuple(links(n, lambda a, b: ("pcie", None, "PIX" if a // 2 == b // 2 else "NODE"))),
                     hostname="firesim2", driver="580.126.18", name="l40s-4x-pcie", sources=(
        "real nvidia-smi topo -m of host firesim2, 4x NVIDIA L40S, driver 580.126.18: PIX pairs 0-1 and 2-3, NODE between, "
        "CPU affinity 0-15,32-47, NUMA 0 (tests/data/captures/23_l40s-4gpu-pix-node-nolegend.txt)",
        "L40S: 48 GB GDDR6 (46068 MiB as nvidia-smi reports), compute capability 8.9; PCI bus ids assumed",
    ))
    return t, "4x NVIDIA L40S PCIe (PIX pairs, NODE between pairs, 1 NUMA node)"


@machine
def a100_pcie_2x_nvbridge():
    n = 2
    devs = devices("a100-pcie-2x-nvbridge", n, model="NVIDIA A100 80GB PCIe", memory_mib=81920, cc="8.0", numa=lambda i: i,
                   cpu=lambda i: "0-23" if i == 0 else "24-47", bus=bus_ids("17", "65"), mig=MIG["A100-80GB"])
    t = NodeTopology(devices=tuple(devs), links=(Link(0, 1, "nvlink", 12, "SYS"),), name="a100-pcie-2x-nvbridge", sources=(
        "nvidia-smi topo --matrix of 4x A100 80GB PCIe in NV12 bridge pairs, one NUMA node per GPU, SYS between pairs "
        "(tests/data/captures/30_a100-80gb-pcie-4gpu-nv12-pairs-4numa.txt); this machine is one such pair",
        "NVIDIA/nccl-tests issue #178: A100 PCIe NV12 pair all_reduce busbw 208 GB/s, ~20 GB/s once a non-NVLink pair is involved",
        "k8s-device-plugin issue #546: NV12 bridge pairs with SYS elsewhere",
        *MIG_SOURCES,
    ))
    return t, "2x A100 80GB PCIe joined by an NVLink bridge (NV12), one GPU per NUMA node, MIG table"


@machine
def mi300x_8x():
    n = 8
    sock = lambda i: i // 4  # noqa: E731
    devs = devices("mi300x-8x", n, vendor="amd", model="AMD Instinct MI300X", memory_mib=196608, cc=None, numa=sock,
                   cpu=lambda i: "0-95,192-287" if i < 4 else "96-191,288-383",
                   bus=lambda i: ["0000:05:00.0", "0000:26:00.0", "0000:46:00.0", "0000:65:00.0",
                                  "0000:85:00.0", "0000:a6:00.0", "0000:c6:00.0", "0000:e5:00.0"][i], uuid_prefix="GPU")
    t = NodeTopology(devices=tuple(devs), links=tuple(links(n, lambda a, b: ("xgmi", 1, None, MI300X_XGMI_LANE_GBPS))), name="mi300x-8x",
                     sources=(
        "AMD Instinct MI300X platform: 8 OAM GPUs fully connected, each GPU has 7 Infinity Fabric links, one to each peer "
        "(128 GB/s bidirectional = 64 GB/s per direction per link: links carry lane_gbps=64; the xGMI table default "
        "of 50 GB/s is MI250's)",
        "rocm-smi --showtopo of an 8-GPU MI300-class box: XGMI all pairs, weight 15, hops 1, GPUs 0-3 NUMA 0 / 4-7 NUMA 1 "
        "(tests/data/captures/59_rocm-smi-showtopo-mi300-class-8gpu-xgmi-lowpower-warning.txt)",
        "assumption: 2x EPYC 9654 (96 cores each, SMT on), 192 GB HBM3 per GPU (196608 MiB); PCIe class under xGMI unknown (null); "
        "no NICs listed (the capture shows none); no public 8x MI300X topology matrix was found",
    ))
    return t, "8x AMD Instinct MI300X (192 GB), xGMI all-to-all (1 link per pair), 2 NUMA nodes"


# trn1.32xlarge CONNECTED DEVICES column (capture 68), device -> neighbours
_TRN1_NEIGHBOURS = {
    0: (12, 3, 4, 1), 1: (13, 0, 5, 2), 2: (14, 1, 6, 3), 3: (15, 2, 7, 0), 4: (0, 7, 8, 5), 5: (1, 4, 9, 6),
    6: (2, 5, 10, 7), 7: (3, 6, 11, 4), 8: (4, 11, 12, 9), 9: (5, 8, 13, 10), 10: (6, 9, 14, 11), 11: (7, 10, 15, 8),
    12: (8, 15, 0, 13), 13: (9, 12, 1, 14), 14: (10, 13, 2, 15), 15: (11, 14, 3, 12),
}
_TRN1_BDF = ["10:1c.0", "10:1d.0", "a0:1c.0", "a0:1d.0", "20:1b.0", "20:1c.0", "90:1b.0", "90:1c.0",
             "20:1d.0", "20:1e.0", "90:1d.0", "90:1e.0", "10:1e.0", "10:1b.0", "a0:1e.0", "a0:1b.0"]


@machine
def trn1_32xlarge():
    n = 16
    numa = lambda i: 0 if _TRN1_BDF[i][:2] in ("10", "20") else 1  # noqa: E731
    devs = devices("trn1-32xlarge", n, vendor="aws", model="Trainium", memory_mib=32768, cc=None, numa=numa,
                   cpu=lambda i: "0-31,64-95" if numa(i) == 0 else "32-63,96-127",
                   bus=lambda i: f"0000:{_TRN1_BDF[i]}", uuid_prefix="NEURON")
    devs = [replace(d, cores=2) for d in devs]  # 2 NeuronCore-v2 per Trainium (neuron-ls NEURON CORES)
    def ln(a, b):
        return ("neuronlink", 1, None) if b in _TRN1_NEIGHBOURS[a] else None
    t = NodeTopology(devices=tuple(devs), links=tuple(links(n, ln)), name="trn1-32xlarge", sources=(
        "real neuron-ls on trn1.32xlarge: 16 devices, 2 NeuronCores and 32 GB each, CONNECTED DEVICES = 4 neighbours "
        "(2D 4x4 torus with wrap-around), PCI BDFs (tests/data/captures/68_neuron-ls-trn1.32xlarge-16dev-collapsed-whitespace.txt)",
        "AWS trn1 docs: 16 Trainium chips linked by NeuronLink-v2 in a 2D torus; 128 vCPUs on 2 sockets",
        "neuron-ls --topology of a Trn1.32xlarge in the Neuron 2.3.0 docs lists the same neighbours and 2 cores per device "
        "(tests/data/captures/90_neuron-ls-trn1-32xlarge-topology-diagram.txt)",
        "assumption: PCI buses 0x10/0x20 on socket 0, 0x90/0xa0 on socket 1; non-neighbour pairs have no link record",
    ))
    return t, "AWS trn1.32xlarge (16 Trainium, NeuronLink 2D torus 4x4 with wrap-around, 4 neighbours each)"


@machine
def a100_mig():
    name = "a100-mig"
    table = MIG["A100-40GB"]
    prof = {p.name: p for p in table}
    def part(profile: str, start: int, gi: int) -> Partition:
        p = prof[profile]
        return Partition(parent=0, profile=profile, uuid=gpu_uuid(name, 100 + gi, "MIG"), gi_id=gi, ci_id=0,
                         start=start, size=p.slots, memory_bytes=p.memory_mib * MiB, sms=p.sms)
    (dev,) = devices(name, 1, model="NVIDIA A100-SXM4-40GB", memory_mib=40960, cc="8.0", numa=lambda i: 0,
                     cpu=lambda i: "0-31,64-95", bus=bus_ids("07"), mig=table)
    dev = replace(dev, mig_mode=True, partitions=(part("1g.5gb", 0, 7), part("1g.5gb", 1, 8), part("3g.20gb", 4, 2)))
    t = NodeTopology(devices=(dev,), name=name, sources=(
        "demo machine: one A100-SXM4-40GB in MIG mode with 2x 1g.5gb (starts 0 and 1) and 1x 3g.20gb (start 4), all valid placements",
        "nvidia-smi -L with MIG instances on A100-SXM4-40GB (tests/data/captures/44_mig-L-jasmin-a100sxm4-40gb-2gpu-1g10gb.txt)",
        *MIG_SOURCES,
    ))
    return t, "1x A100-SXM4-40GB in MIG mode with 2x 1g.5gb + 1x 3g.20gb already created (demo)"


@machine
def nvl72():
    n = 72
    numa = lambda i: i // 2  # noqa: E731  (one Grace per GPU pair)
    def cpu(i):
        base = numa(i) * 72
        return f"{base}-{base + 71}"
    devs = devices("nvl72", n, model="NVIDIA GB200", memory_mib=189471, cc="10.0", numa=numa, cpu=cpu)
    def ln(a, b):
        if a // 4 != b // 4:
            return ("nvlink", 18, None, NVLINK5_LANE_GBPS)  # different compute trays: NVLink only, no PCIe path
        return ("nvlink", 18, "NODE" if numa(a) == numa(b) else "SYS", NVLINK5_LANE_GBPS)
    t = NodeTopology(devices=tuple(devs), links=tuple(links(n, ln)), name="nvl72", sources=(
        "NVIDIA GB200 NVL72: 72 Blackwell GPUs and 36 Grace CPUs in one NVLink domain; 18 compute trays of 4 GPUs; "
        "9 NVSwitch trays give every GPU its 18 NVLink5 links to every other GPU (NVIDIA GB200 NVL72 page); "
        "NVLink5 = 50 GB/s per link per direction (links carry lane_gbps=50)",
        "PLACEMENT-SCALE MODEL, not a machine: the whole rack as ONE node (72 devices) for placement tests at scale; a real "
        "rack runs one OS per compute tray (gb200-nvl72-tray; a rack is rayaccel.catalog.rack('gb200-nvl72-tray'))",
        "assumption: one Grace (72 cores) per GPU pair = one NUMA node; PCIe class NODE within a Grace, SYS within a tray, null across trays",
    ))
    return t, ("placement-scale model, not a real node: a GB200 NVL72 rack as ONE 72-GPU node (real racks are 18 "
               "gb200-nvl72-tray nodes)")


MACHINES.update(NVL72_MACHINES)


# Neuron, TPU, Gaudi and Ascend machines live in their own file (one concern, one file).
from catalog_accel import MACHINES as _ACCEL_MACHINES  # noqa: E402

for _name, _build in _ACCEL_MACHINES.items():
    if _name in MACHINES:
        raise SystemExit(f"catalog machine {_name!r} is defined twice (build_catalog.py and catalog_accel.py)")
    MACHINES[_name] = _build


# ------------------------------------------------------------------------ main
def _dump(data: dict) -> str:
    """JSON with one line per top-level key and one line per list item (diff-friendly, compact)."""
    lines = ["{"]
    items = list(data.items())
    for k, (key, val) in enumerate(items):
        comma = "," if k < len(items) - 1 else ""
        if isinstance(val, dict) and val and all(isinstance(v, list) for v in val.values()):
            lines.append(f"  {json.dumps(key)}: {{")
            sub = list(val.items())
            for j, (sk, sv) in enumerate(sub):
                body = ",\n".join(f"      {json.dumps(x, separators=(', ', ': '), ensure_ascii=False)}" for x in sv)
                lines.append(f"    {json.dumps(sk)}: [\n{body}\n    ]" + ("," if j < len(sub) - 1 else ""))
            lines.append("  }" + comma)
        elif isinstance(val, list) and val:
            body = ",\n".join(f"    {json.dumps(x, separators=(', ', ': '), ensure_ascii=False)}" for x in val)
            lines.append(f"  {json.dumps(key)}: [\n{body}\n  ]{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(val, ensure_ascii=False)}{comma}")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == data
    return text


def render() -> dict[str, str]:
    """File name -> JSON text for every machine and the MIG tables."""
    out: dict[str, str] = {}
    for name, build in MACHINES.items():
        topo, description = build()
        topo = replace(topo, name=name).validate()
        data = topo.to_dict()
        data["description"] = description
        out[f"{name}.json"] = _dump(data)
    tables = {
        "schema": "rayaccel.mig-tables/1",
        "sources": MIG_SOURCES,
        "tables": {k: [{"name": p.name, "id": p.id, "max_instances": p.max_instances, "memory_mib": p.memory_mib,
                        "placements": list(p.placements), "slots": p.slots, "sms": p.sms} for p in v]
                   for k, v in MIG.items()},
    }
    out["_mig_tables.json"] = _dump(tables)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a catalog file differs from what would be written")
    ap.add_argument("--out", type=Path, default=OUT, help=f"output directory (default {OUT.relative_to(ROOT)})")
    args = ap.parse_args(argv)
    files = render()
    stale = []
    for fname, text in files.items():
        path = args.out / fname
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(fname)
        else:
            path.write_text(text, encoding="utf-8")
    if args.check:
        for f in stale:
            print(f"stale: {f} (run python tools/build_catalog.py)")
        return 1 if stale else 0
    print(f"wrote {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
