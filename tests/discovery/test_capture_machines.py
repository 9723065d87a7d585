"""Named real machines: what their captures must say."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayaccel.discovery.capture import import_captures

CAPTURES = Path(__file__).parent.parent / "data" / "captures"


def load(prefix: str):
    (path,) = CAPTURES.glob(f"{prefix}_*.txt")
    return import_captures([path])


@pytest.mark.parametrize("prefix", ["13", "25"], ids=["dgx1v-microway", "dgx1v-pytorch-spaces"])
def test_dgx1_volta_hybrid_cube_mesh(prefix):
    t = load(prefix).topology
    assert len(t) == 8
    assert (t.link(0, 3).kind, t.link(0, 3).count) == ("nvlink", 2)
    assert (t.link(0, 1).kind, t.link(0, 1).count) == ("nvlink", 1)
    assert (t.link(0, 5).kind, t.link(0, 5).pcie) == ("pcie", "SYS")
    # each GPU: 4 NVLink peers carrying 6 lanes
    for i in range(8):
        peers = [l for l in t.links if i in (l.a, l.b) and l.direct]
        assert len(peers) == 4 and sum(l.count for l in peers) == 6
    assert t.device(0).cpus == tuple(range(0, 20)) + tuple(range(40, 60))
    assert {n.name for n in t.nics} == {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}
    # odd NIC column order in 25 (mlx5_2, mlx5_0, ...) still maps names to the right paths
    mlx5_0 = next(n for n in t.nics if n.name == "mlx5_0")
    assert mlx5_0.path_to(0) == "PIX" and mlx5_0.path_to(4) == "SYS" and mlx5_0.rdma


def test_dgx_a100():
    t = load("01").topology
    assert sum(1 for l in t.links if l.kind == "nvlink" and l.count == 12) == 28
    assert [n.name for n in t.nics] == [f"mlx5_{k}" for k in range(10)]
    assert [t.device(i).numa_node for i in range(8)] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert t.nics[0].path_to(0) == "PXB" and t.nics[0].path_to(2) == "SYS"


def test_h100_nv18_space_aligned():
    t = load("74").topology
    assert sum(1 for l in t.links if l.kind == "nvlink" and l.count == 18) == 28
    assert [d.numa_node for d in t.devices] == [0] * 4 + [1] * 4
    assert t.device(7).cpus[0] == 48


def test_headerless_h100_excerpt_is_imported_with_a_warning():
    r = load("15")
    assert len(r.topology) == 8 and len(r.topology.links) == 28
    assert any("no header row" in w for w in r.warnings)
    assert r.topology.device(5).numa_node == 1


def test_partial_dgx2_imports_the_intact_part_and_says_what_is_missing():
    r = load("72")
    t = r.topology
    assert len(t) == 16
    assert all(l.kind == "nvlink" and l.count == 6 for l in t.links)
    assert t.link(0, 15) is not None and t.link(4, 9) is not None
    assert t.link(5, 6) is None  # rows GPU5.. are missing
    assert any("GPU5..GPU15" in w for w in r.warnings)
    assert any("0-23,4" in w for w in r.warnings)  # the cut affinity cell is reported, not used
    assert t.device(4).cpus is None and t.device(3).cpus is not None


def test_k80_old_soc_legend_and_k40_soc_cells():
    t = load("14").topology
    assert t.link(0, 1).pcie == "PIX" and t.link(0, 2).pcie == "PHB"
    k40 = load("42").topology
    assert k40.link(0, 2).pcie == "SYS"  # SOC == SYS
    assert k40.nics[0].path_to(0) == "SYS"


def test_truncated_dgx_h100_keeps_nics_from_gpu_rows():
    r = load("02")
    t = r.topology
    assert [n.name for n in t.nics] == [f"NIC{k}" for k in range(12)]
    assert t.nics[11].path_to(7) == "PXB"
    assert any("NIC6..NIC11" in w for w in r.warnings)
    assert t.device(0).numa_node == 0  # GPU NUMA ID is N/A, NUMA Affinity wins


@pytest.mark.parametrize("prefix,cpus0,numa", [
    ("08", (44, 45, 46, 47, 48, 49, 50, 51, 148, 149, 150, 151, 152, 153, 154, 155), [0, 1, 1, 1]),
    ("27", None, [0, 0, 0, 0, 1, 1, 1, 1]),
    ("78", (0,), [None, None]),   # NUMA affinity "0-1": no single node
    ("04", (0, 1, 2, 3), [None]),  # "0,8,252-255"
], ids=["brev-empty-affinity", "della-blank-affinity", "numa-range", "power9-numa-list"])
def test_affinity_cells(prefix, cpus0, numa):
    t = load(prefix).topology
    assert t.device(0).cpus == cpus0
    assert [d.numa_node for d in t.devices] == numa
    if prefix == "08":
        assert t.device(1).cpus is None


def test_prompt_reveals_hostname():
    assert load("03").topology.hostname == "adroit-h11g2"
    assert load("26").topology.hostname == "tpgds-aihub0007"


def test_topo_mp_is_pcie_only_with_a_warning():
    r = load("38")
    assert all(l.kind == "pcie" for l in r.topology.links)
    assert any("PCIe paths only" in w for w in r.warnings)


@pytest.mark.parametrize("prefix,gpus,parts,profiles", [
    ("44", 2, [1, 1], {"1g.10gb"}),
    ("45", 1, [7], {"1g.10gb"}),
    ("46", 2, [2, 2], {"1g.10gb"}),
    ("47", 1, [1], {"3g.40gb"}),
    ("49", 5, [0, 0, 2, 0, 2], {"3g.40gb"}),
    ("54", 1, [3], {"2g.12gb", "1g.6gb"}),
], ids=["jasmin", "h100pcie-7x1g", "yandex-indented", "k8s-pod", "dgx-station-display", "a30"])
def test_nvidia_smi_L(prefix, gpus, parts, profiles):
    t = load(prefix).topology
    assert len(t) == gpus
    assert [len(d.partitions) for d in t.devices] == parts
    assert {p.profile for p in t.partitions()} == profiles
    assert all(p.uuid.startswith("MIG-") for p in t.partitions())
    assert all(d.uuid.startswith("GPU-") for d in t.devices)


def test_dgx_display_is_imported_faithfully():
    r = load("49")
    assert r.topology.device(3).model == "NVIDIA DGX Display"
    assert r.topology.device(2).partitions[1].uuid == "MIG-80f109f6-aa75-51f9-9909-42ad8029df93"  # `` stripped
    assert any("display adapter" in w for w in r.warnings)


def test_lgip_a100_two_gpus():
    t = load("57").topology
    assert len(t) == 2
    for d in t.devices:
        by = {m.name: m for m in d.mig_profiles}
        assert list(by) == ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
        assert (by["1g.5gb"].id, by["1g.5gb"].max_instances, by["1g.5gb"].memory_mib) == (19, 7, 4864)
        assert by["1g.5gb"].placements == (0, 1, 2, 3, 4, 5, 6) and by["1g.5gb"].slots == 1
        assert by["3g.20gb"].placements == (0, 4) and by["3g.20gb"].slots == 4 and by["3g.20gb"].sms == 42
        assert by["7g.40gb"].slots == 8 and by["7g.40gb"].memory_mib == 40192


def test_lgip_a30_and_gh200():
    a30 = {m.name: m for m in load("51").topology.device(0).mig_profiles}
    assert a30["4g.24gb"].slots == 4 and a30["2g.12gb"].placements == (0, 2)
    assert a30["1g.6gb"].placements == (0, 1, 2, 3)
    gh = {m.name: m for m in load("55").topology.device(0).mig_profiles}
    assert gh["7g.96gb"].memory_mib == 93 * 1024 and gh["7g.96gb"].sms == 132
    assert gh["1g.24gb"].placements == (0, 2, 4, 6)


def test_lgi_gives_gpu_instances():
    parts = load("52").topology.device(0).partitions
    assert [(p.profile, p.gi_id, p.start, p.size) for p in parts] == [
        ("1g.6gb", 3, 0, 1), ("1g.6gb", 4, 1, 1), ("2g.12gb", 2, 2, 2)]


def test_rocm_mi300_all_xgmi():
    t = load("59").topology
    assert len(t) == 8 and len(t.links) == 28
    assert all(l.kind == "xgmi" and l.count is None for l in t.links)
    assert all(d.vendor == "amd" for d in t.devices)
    assert [d.numa_node for d in t.devices] == [0] * 4 + [1] * 4


def test_rocm_two_xgmi_hives_with_pcie_between():
    t = load("63").topology
    assert [sorted(g) for g in t.direct_domains()] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (t.link(0, 4).kind, t.link(0, 4).pcie) == ("pcie", "SYS")
    assert t.link(5, 6).kind == "xgmi"


def test_rocm_mi50_pcie_only():
    t = load("60").topology
    assert all(l.kind == "pcie" and l.pcie == "PHB" for l in t.links)


def test_amd_smi_truncated():
    r = load("64")
    assert all(l.kind == "xgmi" for l in r.topology.links)
    assert r.topology.device(0).pci_bus_id == "0000:05:00.0"
    assert any("truncated" in w for w in r.warnings)


def test_neuron_trn1_2d_torus():
    t = load("68").topology
    assert len(t) == 16 and len(t.links) == 32
    assert all(l.kind == "neuronlink" for l in t.links)
    for i in range(16):
        assert sum(1 for l in t.links if i in (l.a, l.b)) == 4
    assert t.device(0).model == "Trainium" and t.device(0).vendor == "aws"
    assert t.device(0).memory_bytes == 32 << 30


def test_neuron_inf2_ring_and_inf1_chain():
    ring = load("67").topology
    assert len(ring) == 12 and len(ring.links) == 12 and ring.link(0, 11) is not None
    assert ring.device(0).model == "Inferentia2"
    chain = load("69").topology
    assert [(l.a, l.b) for l in chain.links] == [(0, 1), (1, 2), (2, 3)]
    assert chain.device(0).model == "Inferentia"


def test_gaudi_affinity_only():
    r = load("66")
    t = r.topology
    assert len(t) == 8 and not t.links
    assert t.device(4).numa_node == 1 and t.device(4).cpus[0] == 40
    assert t.device(0).vendor == "habana" and t.device(0).model == "Gaudi"
