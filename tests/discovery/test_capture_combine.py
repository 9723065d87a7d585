"""Several captures of one machine combine into one topology; mismatches are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayaccel.discovery.capture import import_captures, parse_capture
from rayaccel.errors import CaptureError

CAPTURES = Path(__file__).parent.parent / "data" / "captures"


def cap(prefix: str) -> Path:
    (path,) = CAPTURES.glob(f"{prefix}_*.txt")
    return path


# Synthetic but format-faithful: `topo -m` and `topo -mp` of one 4-GPU NV4 pair box.
TOPO_M = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV4\tSYS\tSYS\t0-15\t0
GPU1\tNV4\t X \tSYS\tSYS\t0-15\t0
GPU2\tSYS\tSYS\t X \tNV4\t16-31\t1
GPU3\tSYS\tSYS\tNV4\t X \t16-31\t1
"""
TOPO_MP = """\
$ nvidia-smi topo -mp
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tPIX\tSYS\tSYS\t0-15\t0
GPU1\tPIX\t X \tSYS\tSYS\t0-15\t0
GPU2\tSYS\tSYS\t X \tPXB\t16-31\t1
GPU3\tSYS\tSYS\tPXB\t X \t16-31\t1
"""
LIST = """\
GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-00000000-0000-0000-0000-000000000000)
  MIG 3g.40gb     Device  0: (UUID: MIG-00000000-0000-0000-0000-00000000000a)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-00000000-0000-0000-0000-000000000001)
GPU 2: NVIDIA A100-SXM4-80GB (UUID: GPU-00000000-0000-0000-0000-000000000002)
GPU 3: NVIDIA A100-SXM4-80GB (UUID: GPU-00000000-0000-0000-0000-000000000003)
"""
LGIPP = """\
GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 15 Placements: {0,2,4,6}:2
GPU  0 Profile ID 14 Placements: {0,2,4}:2
GPU  0 Profile ID  9 Placements: {0,4}:4
GPU  0 Profile ID  5 Placement : {0}:4
GPU  0 Profile ID  0 Placement : {0}:8
"""


def test_topo_m_plus_mp_sets_pcie_under_nvlink():
    r = import_captures([TOPO_M, TOPO_MP], name="box")
    t = r.topology
    assert (t.link(0, 1).kind, t.link(0, 1).count, t.link(0, 1).pcie) == ("nvlink", 4, "PIX")
    assert (t.link(2, 3).kind, t.link(2, 3).pcie) == ("nvlink", "PXB")
    assert (t.link(0, 2).kind, t.link(0, 2).pcie) == ("pcie", "SYS")
    assert t.name == "box" and t.sources == ("capture:<text>", "capture:<text>")


def test_topo_L_and_mig_profiles_merge_by_index():
    lgip = cap("57").read_text()
    # the -lgip file covers GPUs 0 and 1; -L lists four GPUs
    r = import_captures([TOPO_M, LIST, lgip, LGIPP])
    t = r.topology
    d0 = t.device(0)
    assert d0.model == "NVIDIA A100-SXM4-80GB" and d0.numa_node == 0 and d0.cpus == tuple(range(16))
    assert d0.mig_mode is True and d0.partitions[0].profile == "3g.40gb"
    by = {m.name: m for m in d0.mig_profiles}
    assert by["1g.5gb+me"].placements == (0, 1, 2, 3, 4, 5, 6)  # exact from -lgipp, not inferred
    assert not any("GPU 0: `mig -lgip` has no placements" in w for w in r.warnings)
    assert any("GPU 1: `mig -lgip` has no placements" in w for w in r.warnings)
    assert t.device(3).mig_profiles == ()


def test_lgip_and_lgipp_in_one_text():
    text = cap("57").read_text() + "\n$ nvidia-smi mig -lgipp\n" + LGIPP
    t = parse_capture(text).topology
    assert {m.name: m.placements for m in t.device(0).mig_profiles}["1g.5gb+me"] == (0, 1, 2, 3, 4, 5, 6)


def test_a30_lgip_lgi_L_of_one_host():
    r = import_captures([cap("51"), cap("52"), cap("54")])
    t = r.topology
    assert t.hostname == "5002544" and t.name == cap("51").stem
    parts = t.device(0).partitions
    assert len(parts) == 3 and all(p.uuid and p.gi_id is not None for p in parts)
    two = next(p for p in parts if p.profile == "2g.12gb")
    assert two.uuid == "MIG-1b8509c0-e60d-502d-8263-d434867998aa" and (two.start, two.size) == (2, 2)
    assert two.memory_bytes == round(11.69 * 1024) << 20 and two.sms == 28
    assert any("by order" in w for w in r.warnings)  # two 1g.6gb instances cannot be told apart


def test_device_count_disagreement_is_refused():
    with pytest.raises(CaptureError, match="disagree on the devices"):
        import_captures([cap("01"), cap("44")])


def test_mig_table_naming_an_unknown_gpu_is_refused():
    with pytest.raises(CaptureError, match=r"names device\(s\) \[1\]"):
        import_captures([cap("45"), cap("57")])


def test_different_hosts_are_refused():
    with pytest.raises(CaptureError, match="different hosts"):
        import_captures([cap("03"), cap("05")])


def test_different_vendors_are_refused():
    with pytest.raises(CaptureError, match="is 'nvidia' here but 'amd'"):
        import_captures([cap("60"), cap("22")])


def test_conflicting_pcie_classes_warn_and_keep_the_first():
    other = TOPO_M.replace("SYS", "NODE")
    r = import_captures([TOPO_M, other])
    assert r.topology.link(0, 2).pcie == "SYS"
    assert any("kept PCIe SYS" in w for w in r.warnings)


def test_inputs_paths_strings_and_texts():
    p = cap("05")
    a = import_captures([str(p)]).topology
    b = import_captures([p]).topology
    c = import_captures(p).topology
    d = import_captures([p.read_text()]).topology
    assert a == b == c
    assert d.devices == a.devices and d.name is None
    single_line = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-950792bf-a01c-3f1a-e122-3473e67f54b2)"
    assert len(import_captures([single_line]).topology) == 1


def test_missing_file_and_empty_list():
    with pytest.raises(CaptureError, match="no such file"):
        import_captures(["/nonexistent/topo.txt"])
    with pytest.raises(CaptureError, match="no capture given"):
        import_captures([])
    with pytest.raises(CaptureError, match="not a file"):
        import_captures([str(CAPTURES)])


def test_mp_warning_only_when_nothing_shows_nvlink():
    assert any("PCIe paths only" in w for w in import_captures([TOPO_MP]).warnings)
    assert not any("PCIe paths only" in w for w in import_captures([TOPO_M, TOPO_MP]).warnings)


def test_lgipp_alone_keeps_per_profile_id_placements_unnamed():
    r = import_captures([cap("86")])
    profiles = r.topology.device(0).mig_profiles
    assert [(m.name, m.id, m.placements, m.slots) for m in profiles] == [
        ("#19", 19, (0, 1, 2, 3, 4, 5, 6), 1), ("#14", 14, (0, 2, 4), 2), ("#9", 9, (0, 4), 4),
        ("#5", 5, (0,), 4), ("#0", 0, (0,), 8)]
    assert all(m.memory_mib is None for m in profiles)
    assert any("names no profile for id(s) 19, 14, 9, 5, 0" in w for w in r.warnings)


@pytest.mark.parametrize("order", [("86", "87"), ("87", "86")])
def test_lgipp_profiles_are_named_by_the_model_from_nvidia_smi_L(order):
    """ThetaGPU's `-lgipp` + `-L` (A100-SXM4-40GB): ids named from the catalog, placements from -lgipp."""
    r = import_captures([cap(o) for o in order])
    d = r.topology.device(0)
    by = {m.name: m for m in d.mig_profiles}
    assert list(by) == ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    assert by["3g.20gb"].placements == (0, 4) and by["3g.20gb"].memory_mib == 19968 and by["1g.5gb"].sms == 14
    assert any("named from the catalog's MIG table for 'A100-SXM4-40GB'" in w for w in r.warnings)
    assert r.topology.hostname == "thetagpu05"


def test_lgipp_names_from_the_lgip_table_when_both_are_there():
    text = cap("57").read_text() + "\n$ nvidia-smi mig -lgipp\n" + LGIPP
    names = [m.name for m in parse_capture(text).topology.device(0).mig_profiles]
    assert "#19" not in names and "1g.5gb" in names


def test_catalog_id_with_another_slot_size_is_not_trusted():
    """Profile ids are device- and driver-specific: a catalog id with a different size does not name it."""
    lgipp = "GPU  0 Profile ID 14 Placements: {0,4}:4\n"
    lst = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-00000000-0000-0000-0000-000000000000)\n"
    d = import_captures([lgipp, lst]).topology.device(0)
    assert [m.name for m in d.mig_profiles] == ["#14"]
