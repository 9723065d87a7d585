"""Catalog machines of the accelerators beyond GPUs (Neuron, TPU, Gaudi, Ascend), for ``build_catalog.py``.

Definitions only: each function returns ``(NodeTopology, description)`` and names its
sources (real captures in ``tests/data/captures/``, vendor documents, and the assumptions
made). ``build_catalog.py`` merges :data:`MACHINES` into its own table.
"""

from __future__ import annotations

import sys
import uuid
from itertools import combinations
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from rayaccel.discovery.capture.tpu import host_devices  # noqa: E402
from rayaccel.topology import Device, Link, NodeTopology, Slice  # noqa: E402

GiB = 1 << 30
_NS = uuid.UUID("6f1c1c2e-3b8a-4c55-9e0b-52a1d1c0a7e1")  # build_catalog.py's namespace (UUIDs stay deterministic)
#: Per-lane, per-direction GB/s overriding the topology table's defaults (Link.lane_gbps).
NEURONLINK_V3_LANE_GBPS = 128.0  # trn2: 1,024 GB/s per chip over its 4 torus neighbours, bidirectional
GAUDI3_PORT_GBPS = 25.0  # Gaudi 3: 200 Gb/s RoCE ports (Gaudi 2: 100 Gb/s, the table default 12.5)
HCCS_910A_LANE_GBPS = 15.0  # 910 (first generation): 30 GB/s per HCCS link, bidirectional

MACHINES: dict[str, Callable[[], tuple[NodeTopology, str]]] = {}


def machine(fn: Callable[[], tuple[NodeTopology, str]]) -> Callable[[], tuple[NodeTopology, str]]:
    MACHINES[fn.__name__.replace("_", "-").removeprefix("m-")] = fn
    return fn


def _uuid(name: str, i: int, prefix: str) -> str:
    return f"{prefix}-{uuid.uuid5(_NS, f'{name}/{i}')}"


def _cpus(spec: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def _torus_4x4(a: int, b: int) -> bool:
    """Neighbours on the 4x4 torus with wrap-around that neuron-ls lists (captures 68, 88, 90)."""
    ra, ca, rb, cb = a // 4, a % 4, b // 4, b % 4
    return (ra == rb and (ca - cb) % 4 in (1, 3)) or (ca == cb and (ra - rb) % 4 in (1, 3))


# ------------------------------------------------------------------- Neuron
# trn2(n).48xlarge, capture 88: device -> (PCI BDF, NUMA node); NUMA 1 = CPUs 48-95,144-191, NUMA 0 = 0-47,96-143
_TRN2 = ["cc:00.0", "b5:00.0", "b6:00.0", "cb:00.0", "6f:00.0", "58:00.0", "59:00.0", "6e:00.0",
         "9b:00.0", "84:00.0", "85:00.0", "9a:00.0", "f8:00.0", "e1:00.0", "e2:00.0", "f7:00.0"]
_TRN2_NUMA = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]


@machine
def trn2_48xlarge():
    name = "trn2-48xlarge"
    devs = tuple(Device(index=i, vendor="aws", model="Trainium2", uuid=_uuid(name, i, "NEURON"),
                        pci_bus_id=f"0000:{_TRN2[i]}", memory_bytes=96 * GiB, numa_node=_TRN2_NUMA[i],
                        cpus=_cpus("48-95,144-191" if _TRN2_NUMA[i] else "0-47,96-143"), cores=4)
                 for i in range(16))
    links = tuple(Link(a, b, "neuronlink", 1, None, NEURONLINK_V3_LANE_GBPS)
                  for a, b in combinations(range(16), 2) if _torus_4x4(a, b))
    t = NodeTopology(devices=devs, links=links, name=name, sources=(
        "real neuron-ls on a trn2n.48xlarge (Neuron SDK 2.29 docs): 16 Trainium2, 4 logical NeuronCores each (core ids "
        "0-3 .. 60-63, logical-neuroncore-config 2), 96 GB, CONNECTED DEVICES of a 4x4 torus with wrap-around, PCI BDF, "
        "CPU affinity 48-95,144-191 | 0-47,96-143 and NUMA node 1 | 0 per device "
        "(tests/data/captures/88_neuron-ls-trn2n-48xlarge-2.29-core-ids-cpu-numa.txt)",
        "AWS Trn2 architecture (aws-neuron-sdk about-neuron/arch/neuron-hardware/trn2-arch.rst): 16 Trainium2 on a 4x4 "
        "2D torus of NeuronLink-v3, 1,024 GB/s intra-instance NeuronLink per chip (4 neighbours: 128 GB/s per link "
        "per direction, links carry lane_gbps=128); 1,536 GiB device memory; 192 vCPUs",
        "AWS Logical NeuronCore configuration: each Trainium2 has 8 physical NeuronCore-v3; LNC=2 (the default) exposes 4 "
        "(Device.cores=4, what neuron-ls and Ray's neuron_cores count)",
        "assumption: the trn2.48xlarge is wired as the trn2n.48xlarge of the capture (same 16-chip torus and host)",
    ))
    return t, "AWS trn2.48xlarge (16 Trainium2, 4 NeuronCores each at LNC=2, NeuronLink-v3 4x4 torus, 2 NUMA nodes)"


# inf2.48xlarge, capture 67: device -> neighbours (a ring of 12) and PCI BDF
_INF2_BDF = ["80:1e.0", "90:1e.0", "80:1d.0", "90:1f.0", "80:1f.0", "90:1d.0", "20:1e.0", "20:1f.0",
             "10:1e.0", "10:1f.0", "10:1d.0", "20:1d.0"]


@machine
def inf2_48xlarge():
    name = "inf2-48xlarge"
    devs = tuple(Device(index=i, vendor="aws", model="Inferentia2", uuid=_uuid(name, i, "NEURON"),
                        pci_bus_id=f"0000:{_INF2_BDF[i]}", memory_bytes=32 * GiB,
                        numa_node=0 if _INF2_BDF[i][:2] in ("10", "20") else 1, cores=2) for i in range(12))
    links = tuple(Link(a, b, "neuronlink", 1, None) for a, b in combinations(range(12), 2) if (b - a) % 12 in (1, 11))
    t = NodeTopology(devices=devs, links=links, name=name, sources=(
        "real neuron-ls on an inf2.48xlarge: 12 Inferentia2, 2 NeuronCores and 32 GB each, CONNECTED DEVICES = a ring "
        "0-1-...-11-0, PCI BDFs (tests/data/captures/67_neuron-ls-inf2.48xlarge-12dev-ring.txt)",
        "AWS Inf2 architecture (aws-neuron-sdk about-neuron/arch/neuron-hardware/inf2-arch.rst): Inf2.48xlarge has 12 "
        "Inferentia2, 384 GiB device memory, 192 vCPUs, NeuronLink-v2 192 GiB/s per chip (2 ring neighbours: the table "
        "default of 48 GB/s per link per direction)",
        "assumption: PCI buses 0x10/0x20 on NUMA node 0, 0x80/0x90 on NUMA node 1; CPU affinity not known (None)",
    ))
    return t, "AWS inf2.48xlarge (12 Inferentia2, 2 NeuronCores each, NeuronLink-v2 ring)"


# --------------------------------------------------------------------- TPU
_TPU_SOURCES = (
    "Cloud TPU docs 'TPU v4' / 'TPU v5p' / 'TPU v5e' / 'TPU v6e': a v4 / v5p host (tray) has 4 chips as a 2x2x1 ICI mesh; "
    "v5e and v6e hosts have 1, 4 or 8 chips (1x1, 2x2, 2x4); 8-chip hosts only as single-host slices, multi-host "
    "slices of v5e/v6e use 4-chip hosts",
    "libtpu's variables (tpu-env metadata, tests/data/captures/99_tpu-env-metadata-v4-256-worker0-python-literal.txt): "
    "CHIPS_PER_HOST_BOUNDS '2,2,1' is the host's chip grid, HOST_BOUNDS the hosts' grid, TOPOLOGY the slice's; Ray writes "
    "TPU_VISIBLE_CHIPS (chip indices) and TPU_CHIPS_PER_HOST_BOUNDS / TPU_HOST_BOUNDS for sub-host grants",
    "chip i of a host sits at (i % x, i // x, 0), as JAX lists the devices of single-host v4-8 and v6e-8 slices "
    "(coords (1,0,0) for device 1, (0,1,0) for device 2)",
    "ICI per link per direction: v5p 1,200 GB/s and v6e 800 GB/s bidirectional per chip over 6 / 4 ports = 100 GB/s "
    "(table default); v5e 1,600 Gb/s per chip over 4 ports = 50 GB/s; v4 400 Gb/s per link per direction = 50 GB/s",
)


def _tpu(name: str, gen: str, n: int, grid: tuple[int, int, int], lane: float | None, sl: Slice | None,
         extra: tuple[str, ...] = ()) -> NodeTopology:
    devs, links = host_devices(n, gen, grid=grid)
    devs = [Device(index=d.index, vendor=d.vendor, model=d.model, uuid=_uuid(name, d.index, "TPU"),
                   memory_bytes=d.memory_bytes, coords=d.coords) for d in devs]
    if lane is not None:
        links = [Link(l.a, l.b, l.kind, 1, None, lane) for l in links]
    else:
        links = [Link(l.a, l.b, l.kind, 1, None) for l in links]
    return NodeTopology(devices=tuple(devs), links=tuple(links), name=name, slice=sl, sources=(*_TPU_SOURCES, *extra))


@machine
def tpu_v4_8():
    t = _tpu("tpu-v4-8", "v4", 4, (2, 2, 1), 50.0, Slice(topology="2x2x1", accelerator_type="v4-8"), (
        "tpu-info on a v4 host: 4 chips /dev/accel0-3, 'TPU v4 chip', ~32 GiB HBM each "
        "(tests/data/captures/97_tpu-info-0.1-v4-4chip-accel-box-tables.txt)",))
    return t, "Cloud TPU v4-8: one host, 4 TPU v4 chips on a 2x2x1 ICI grid (32 GiB HBM each)"


@machine
def tpu_v5p_8():
    t = _tpu("tpu-v5p-8", "v5p", 4, (2, 2, 1), None, Slice(topology="2x2x1", accelerator_type="v5p-8"), (
        "Cloud TPU docs 'TPU v5p': 95 GiB HBM per chip, 2x2x1 slice = 1 host (ct5p-hightpu-4t)",))
    return t, "Cloud TPU v5p-8: one host, 4 TPU v5p chips on a 2x2x1 ICI grid (95 GiB HBM each)"


@machine
def tpu_v5e_8():
    t = _tpu("tpu-v5e-8", "v5e", 8, (2, 4, 1), 50.0, Slice(topology="2x4", accelerator_type="v5litepod-8"), (
        "Cloud TPU docs 'TPU v5e': 16 GB HBM per chip, 2x4 = 8 chips on one host (ct5lp-hightpu-8t); Ray names the type "
        "TPU-V5LITEPOD",))
    return t, "Cloud TPU v5e-8 (v5litepod-8): one host, 8 TPU v5e chips on a 2x4 ICI grid"


@machine
def tpu_v6e_8():
    t = _tpu("tpu-v6e-8", "v6e", 8, (2, 4, 1), None, Slice(topology="2x4", accelerator_type="v6e-8"), (
        "Cloud TPU docs 'TPU v6e': 32 GB HBM per chip, 2x4 = 8 chips on one host (ct6e-standard-8t); tpu-info on a v6e "
        "host (tests/data/captures/98_tpu-info-0.14-v6e-4chip-vfio-plain-tables.txt)",))
    return t, "Cloud TPU v6e-8: one host, 8 TPU v6e chips on a 2x4 ICI grid"


@machine
def tpu_v6e_16_worker0():
    t = _tpu("tpu-v6e-16-worker0", "v6e", 4, (2, 2, 1), None,
             Slice(name="tpu-v6e-16", worker_id=0, topology="4x4", accelerator_type="v6e-16"), (
        "Cloud TPU docs 'TPU v6e': a 4x4 slice is 4 VMs of ct6e-standard-4t (2x2 chips each); this is worker 0",
        "assumption: the slice name 'tpu-v6e-16' is an example (a real one is the TPU's name, metadata instance-id)",))
    return t, "worker 0 of a Cloud TPU v6e-16 slice (4x4 over 4 hosts): 4 chips on a 2x2 grid, pod head"


# ------------------------------------------------------------------- Gaudi
def _gaudi(name: str, model: str, mem_gib: int, lane: float | None, extra: tuple[str, ...]) -> NodeTopology:
    devs = tuple(Device(index=i, vendor="habana", model=model, uuid=_uuid(name, i, "HPU"), memory_bytes=mem_gib * GiB,
                        numa_node=i // 4, cpus=_cpus("0-39,80-119" if i < 4 else "40-79,120-159")) for i in range(8))
    links = tuple(Link(a, b, "roce", 3, None, lane) for a, b in combinations(range(8), 2))
    return NodeTopology(devices=devs, links=links, name=name, sources=(
        "Intel Gaudi docs 'Network Configuration' (docs.habana.ai): 21 scale-up ports per accelerator connect the 8 of "
        "one HLS box all-to-all, 3 ports per peer, plus 3 scale-out ports; Gaudi 3 ports run at 200 Gb/s, Gaudi 2 at "
        "100 Gb/s (links: kind roce, count 3)",
        "hl-smi topo -c -N of an 8-module Gaudi server: modules 0-3 on NUMA 0 (CPUs 0-39,80-119), 4-7 on NUMA 1 "
        "(40-79,120-159) (tests/data/captures/66_hl-smi-topo-c-N-gaudi-8hpu.txt)",
        "device index = module id (HABANA_VISIBLE_MODULES names module ids, as hl-smi's modID)",
        *extra))


@machine
def gaudi2_hls2_8x():
    t = _gaudi("gaudi2-hls2-8x", "Gaudi2", 96, None, (
        "Gaudi 2: 96 GB HBM2e per accelerator (Intel Gaudi 2 product brief); Ray names it Intel-GAUDI2",
        "assumption: the capture 66 host layout (its generation is not printed)",))
    return t, "8x Intel Gaudi 2 (HLS-2), RoCE all-to-all 3x100GbE per pair, 2 NUMA nodes"


@machine
def gaudi3_hls3_8x():
    t = _gaudi("gaudi3-hls3-8x", "Gaudi3", 128, GAUDI3_PORT_GBPS, (
        "Gaudi 3: 128 GB HBM2e per accelerator; 525 GB/s scale-up per Gaudi 3 = 21 x 25 GB/s (links carry lane_gbps=25)",
        "assumption: the host's CPU/NUMA layout is that of capture 66",))
    return t, "8x Intel Gaudi 3 (HLS-3), RoCE all-to-all 3x200GbE per pair, 2 NUMA nodes"


# ------------------------------------------------------------------ Ascend
# capture 95: CPU affinity per NPU (8x 910B3, all pairs HCCS); PCI bus ids from its npu-smi info
_910B3_CPUS = ["144-167", "144-167", "96-119", "96-119", "0-23", "0-23", "48-71", "48-71"]
_910B3_BUS = ["C1", "C2", "81", "82", "01", "02", "41", "42"]


@machine
def atlas_800t_a2_910b3():
    name = "atlas-800t-a2-910b3"
    devs = tuple(Device(index=i, vendor="huawei", model="Ascend910B3", uuid=_uuid(name, i, "NPU"),
                        pci_bus_id=f"0000:{_910B3_BUS[i]}:00.0", memory_bytes=64 * GiB, cpus=_cpus(_910B3_CPUS[i]))
                 for i in range(8))
    links = tuple(Link(a, b, "hccs") for a, b in combinations(range(8), 2))
    t = NodeTopology(devices=devs, links=links, name=name, sources=(
        "real npu-smi info -t topo and npu-smi info of 8x Ascend 910B3 64 GB: HCCS between all pairs, CPU affinity "
        "per NPU pair, PCI bus ids, 65536 MB HBM (tests/data/captures/95_npu-smi-topo-and-info-910b3-8npu-all-hccs-valle.txt)",
        "910B HCCS: 392 GB/s per chip over 7 links (links keep the table default of 28 GB/s per link per direction)",
        "assumption: an Atlas 800T A2 training server (the capture's host is not named); NUMA nodes not in the capture",
    ))
    return t, "Atlas 800T A2 class: 8x Ascend 910B3 (64 GB), HCCS between all pairs"


@machine
def atlas_800_910a_8x():
    name = "atlas-800-910a-8x"
    devs = tuple(Device(index=i, vendor="huawei", model="Ascend910A", uuid=_uuid(name, i, "NPU"),
                        memory_bytes=32 * GiB, numa_node=i // 4) for i in range(8))
    links = tuple(Link(a, b, "hccs", 1, None, HCCS_910A_LANE_GBPS) if a // 4 == b // 4 else Link(a, b, "pcie", None, "SYS")
                  for a, b in combinations(range(8), 2))
    t = NodeTopology(devices=devs, links=links, name=name, sources=(
        "Ascend MindX DL 'NPU Affinity Scheduling Algorithm Design and Development Guide' (Ascend-volcano-plugin): an "
        "Ascend 910 server has 8 processors in two HCCS rings of 4; processors in different rings do not communicate over "
        "HCCS, so a job of up to 4 processors must stay in one ring",
        "Ascend 910 (first generation): 32 GB HBM2 per chip; each chip's 3 HCCS links reach the other 3 of its group "
        "(30 GB/s per link, lane_gbps=15 per direction)",
        "assumption: the two groups sit on two CPU sockets (PCIe path class SYS between them, NUMA node per group); Ray "
        "names the SoC Ascend910A",
    ))
    return t, "Atlas 800 training server: 8x Ascend 910 (first generation) in two HCCS groups of four, PCIe across"
