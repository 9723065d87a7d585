"""Named real machines for the placement tests (built here so the tests need nothing else).

* DGX-1 (V100 x8): the ``nvidia-smi topo -m`` matrix quoted in the research note
  (OneFlow DLPerf; equal to go-gpuallocator's ``NewDGX1VoltaNode``).
* 8x PCIe, two sockets with switches (lattice/quda#669).
* HGX H100: all pairs NV18, GPUs 0-3 on NUMA 0, 4-7 on NUMA 1, one PIX NIC per GPU.
* DGX-2 (V100 x16): all pairs NV6 (NVSwitch), two NUMA nodes.
* A100-80GB / H100-80GB with the MIG profile table (research note, section 5).
"""

from __future__ import annotations

import random

from rayaccel.topology import Device, Link, MigProfile, Nic, NodeTopology, Partition, make_link

GiB = 1024**3

DGX1V_MATRIX = """
G0 X NV1 NV1 NV2 NV2 SYS SYS SYS
G1 NV1 X NV2 NV1 SYS NV2 SYS SYS
G2 NV1 NV2 X NV2 SYS SYS NV1 SYS
G3 NV2 NV1 NV2 X SYS SYS SYS NV1
G4 NV2 SYS SYS SYS X NV1 NV1 NV2
G5 SYS NV2 SYS SYS NV1 X NV2 NV1
G6 SYS SYS NV1 SYS NV1 NV2 X NV2
G7 SYS SYS SYS NV1 NV2 NV1 NV2 X
"""


def _from_matrix(text: str, **dev) -> list[Link]:
    rows = [line.split()[1:] for line in text.strip().splitlines()]
    links = []
    for i, row in enumerate(rows):
        for j, cell in enumerate(row):
            if j <= i:
                continue
            if cell.startswith("NV"):
                links.append(make_link(i, j, "nvlink", int(cell[2:]), "SYS" if (i < 4) != (j < 4) else "PHB"))
            else:
                links.append(make_link(i, j, "pcie", None, cell))
    return links


def dgx1v() -> NodeTopology:
    devs = tuple(Device(i, model="Tesla V100-SXM2-32GB", memory_bytes=32 * GiB, numa_node=0 if i < 4 else 1)
                 for i in range(8))
    nic = Nic("mlx5_0", 0, tuple((i, {0: "NODE", 1: "NODE", 2: "PIX", 3: "PIX"}.get(i, "SYS")) for i in range(8)), True)
    return NodeTopology(devs, tuple(_from_matrix(DGX1V_MATRIX)), (nic,), name="dgx1-v100").validate()


def pcie8() -> NodeTopology:
    devs = tuple(Device(i, model="NVIDIA A40", memory_bytes=48 * GiB, numa_node=0 if i < 4 else 1) for i in range(8))
    links = []
    for a in range(8):
        for b in range(a + 1, 8):
            if (a < 4) != (b < 4):
                cls = "SYS"
            elif a // 2 == b // 2:
                cls = "PIX"
            else:
                cls = "PXB"
            links.append(make_link(a, b, "pcie", None, cls))
    nic = Nic("mlx5_0", 1, tuple((i, "SYS" if i < 4 else "PHB") for i in range(8)), True)
    return NodeTopology(devs, tuple(links), (nic,), name="pcie-8gpu-2socket").validate()


def uniform(n: int, lanes: int, name: str, model: str, mem: int, numa_split: int, nics: bool = False) -> NodeTopology:
    devs = tuple(Device(i, model=model, memory_bytes=mem * GiB, numa_node=i // numa_split) for i in range(n))
    links = tuple(make_link(a, b, "nvlink", lanes, "NODE" if a // numa_split == b // numa_split else "SYS")
                  for a in range(n) for b in range(a + 1, n))
    nic = tuple(Nic(f"mlx5_{i}", i // numa_split, tuple((j, "PIX" if j == i else ("NODE" if j // numa_split == i // numa_split else "SYS"))
                                                         for j in range(n)), True) for i in range(n)) if nics else ()
    return NodeTopology(devs, links, nic, name=name).validate()


def hgx_h100() -> NodeTopology:
    return uniform(8, 18, "hgx-h100", "NVIDIA H100 80GB HBM3", 80, 4, nics=True)


def dgx2() -> NodeTopology:
    return uniform(16, 6, "dgx2-v100", "Tesla V100-SXM3-32GB", 32, 8)


def mig_profiles(big: bool = True) -> tuple[MigProfile, ...]:
    """A100-80GB / H100-80GB names (big) or A100-40GB names."""
    names = (["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"] if big
             else ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"])
    mib = [9856, 19968, 19968, 40192, 40192, 80384] if big else [4864, 9856, 9856, 19968, 19968, 40192]
    rows = [(19, 7, (0, 1, 2, 3, 4, 5, 6), 1), (15, 4, (0, 2, 4, 6), 2), (14, 3, (0, 2, 4), 2), (9, 2, (0, 4), 4),
            (5, 1, (0,), 4), (0, 1, (0,), 8)]
    return tuple(MigProfile(n, pid, mx, m, pl, sl) for n, m, (pid, mx, pl, sl) in zip(names, mib, rows))


def mig_gpu(index: int = 0, partitions: tuple[Partition, ...] = (), model: str = "NVIDIA H100 80GB HBM3") -> Device:
    return Device(index, model=model, memory_bytes=80 * GiB, numa_node=0, mig_mode=True,
                  partitions=partitions, mig_profiles=mig_profiles())


def random_topology(rng: random.Random, n: int) -> NodeTopology:
    """A random node: NVLink islands (with or without the PCIe path under them), PCIe classes, NUMA split,
    memory sizes, some failed devices."""
    numa_split = rng.choice([n, max(1, n // 2)])
    devs = tuple(Device(i, memory_bytes=rng.choice([16, 24, 40, 80]) * GiB, numa_node=i // numa_split,
                        health="failed" if rng.random() < 0.05 else "ok") for i in range(n))
    links = []
    for a in range(n):
        for b in range(a + 1, n):
            r = rng.random()
            if r < 0.3:
                links.append(make_link(a, b, rng.choice(["nvlink", "xgmi"]), rng.randint(1, 12),
                                       rng.choice([None, "PIX", "PXB", "PHB", "NODE", "SYS"])))
            elif r < 0.9:
                links.append(make_link(a, b, "pcie", None, rng.choice(["PIX", "PXB", "PHB", "NODE", "SYS"])))
    nics = (Nic("mlx5_0", 0, tuple((i, rng.choice(["PIX", "PXB", "SYS"])) for i in range(n)), True),)
    return NodeTopology(devs, tuple(links), nics, name=f"random-{n}").validate()


MACHINES = {"DGX-1V": dgx1v, "8x PCIe two sockets": pcie8, "HGX H100": hgx_h100, "DGX-2": dgx2}
