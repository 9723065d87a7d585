"""Discovery fills the NVLink fabric: NVML (through FakeNVML, both calls and every struct version) and
``nvidia-smi -q`` captures (whole reports, grep excerpts, damage, combining with other captures)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rayaccel import catalog
from rayaccel.testing import fakenvml
from rayaccel.discovery.capture import import_captures, looks_like_capture, parse_capture
from rayaccel.testing.fakenvml import FakeNVML
from rayaccel.discovery.nvidia import NvidiaBackend
from rayaccel.errors import CaptureError
from rayaccel.topology import Fabric, nvlink_domain, nvlink_domain_reason

CAPTURES = Path(__file__).parent.parent / "data" / "captures"


def discover(fake: FakeNVML):
    return NvidiaBackend(nvml=fake, sysfs_root="/nonexistent").discover()


def fabrics(topology) -> list:
    return [d.fabric for d in topology.devices]


# ---------------------------------------------------------------- NVML
def test_tray_fabric_round_trips_through_the_versioned_call_with_v3():
    src = catalog.rack("gb200-nvl72-tray", trays=1, rack=2)[0]
    fake = FakeNVML(src)
    out = discover(fake)
    assert fabrics(out) == fabrics(src) and nvlink_domain(out) == nvlink_domain(src)
    assert "nvmlDeviceGetGpuFabricInfoV" in fake.calls and "nvmlDeviceGetGpuFabricInfo" not in fake.calls


def test_a_driver_that_predates_v3_answers_v2():
    src = catalog.load("gb300-nvl72-tray")
    fake = FakeNVML(src)
    fake.fabric_struct_versions = {fakenvml.nvmlGpuFabricInfo_v2}
    assert fabrics(discover(fake)) == fabrics(src)
    assert list(fake.calls).count("nvmlDeviceGetGpuFabricInfoV") == 2 * len(src.devices)  # v3 refused, then v2


def test_falls_back_to_the_original_call_when_the_versioned_one_is_missing():
    src = catalog.load("gb200-nvl72-tray")
    fake = FakeNVML(src)
    fake.fail("nvmlDeviceGetGpuFabricInfoV", fakenvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    out = discover(fake)
    assert fabrics(out) == [replace(f, health_mask=None) for f in fabrics(src)]
    assert "nvmlDeviceGetGpuFabricInfo" in fake.calls


def test_bindings_without_the_versioned_struct_use_the_original_call():
    src = catalog.load("gb200-nvl72-tray")
    fake = FakeNVML(src)
    fake.c_nvmlGpuFabricInfo_v3_t = None
    fake.c_nvmlGpuFabricInfo_v2_t = None
    assert nvlink_domain(discover(fake)) == nvlink_domain(src)


@pytest.mark.parametrize("name", ["dgx-a100", "dgx1-v100", "l40s-4x-pcie", "a100-mig"])
def test_not_supported_is_no_fabric_never_an_error(name):
    out = discover(FakeNVML(catalog.load(name)))
    assert fabrics(out) == [None] * len(out.devices)
    assert "report no NVLink fabric" in nvlink_domain_reason(out)


def test_registration_states_and_statuses_are_kept_as_nvml_reports_them():
    src = catalog.load("gb200-nvl72-tray")
    fake = FakeNVML(src)
    fake.set_fabric(1, fakenvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS)
    fake.set_fabric(2, fakenvml.NVML_GPU_FABRIC_STATE_COMPLETED, fakenvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    fake.set_fabric(3, fakenvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED)
    out = fabrics(discover(fake))
    assert out[0] == src.devices[0].fabric
    assert out[1] == Fabric("in_progress", health_mask=fakenvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE)
    assert out[2].state == "completed" and out[2].status == 23 and out[2].cluster_uuid == src.devices[2].fabric.cluster_uuid
    assert out[3] is None


def test_set_fabric_can_move_a_gpu_to_another_cluster():
    src = catalog.load("gb200-nvl72-tray")
    fake = FakeNVML(src)
    other = "dc6e40c4-d722-4357-9ba6-5291dd461278"
    fake.set_fabric(0, fakenvml.NVML_GPU_FABRIC_STATE_COMPLETED, cluster_uuid=other.upper(), clique_id=9)
    out = discover(fake)
    assert out.devices[0].fabric.cluster_uuid == other and out.devices[0].fabric.clique_id == 9
    assert "disagree" in nvlink_domain_reason(out)


def test_lost_gpu_during_the_fabric_call_is_failed_and_the_rest_discovered():
    fake = FakeNVML(catalog.load("gb200-nvl72-tray"))
    fake.fail("nvmlDeviceGetGpuFabricInfoV", fakenvml.NVML_ERROR_GPU_IS_LOST, device=1)
    out = discover(fake)
    assert out.devices[1].health == "failed" and out.devices[0].fabric is not None


def test_the_real_bindings_have_the_names_the_backend_asks_for():
    pynvml = pytest.importorskip("pynvml")
    for struct, fn in NvidiaBackend._FABRIC_CALLS:
        assert hasattr(pynvml, struct) and hasattr(pynvml, fn), (struct, fn)
    for field in ("clusterUuid", "status", "cliqueId", "state"):
        assert field in dict(pynvml.c_nvmlGpuFabricInfo_t._fields_)
    assert "healthMask" in dict(pynvml.c_nvmlGpuFabricInfo_v3_t._fields_)
    assert pynvml.c_nvmlGpuFabricInfo_v3_t().version == fakenvml.nvmlGpuFabricInfo_v3
    assert pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH == fakenvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


# ---------------------------------------------------------------- nvidia-smi -q
def test_whole_report_of_an_8_gpu_h100():
    res = import_captures([CAPTURES / "110_nvsmi-q-h100-sxm-8gpu-fabric-completed-zero-uuid.txt"])
    t = res.topology
    assert res.warnings == () and len(t.devices) == 8
    d = t.devices[0]
    assert (d.model, d.uuid, d.pci_bus_id, d.memory_bytes, d.mig_mode) == (
        "NVIDIA H100 80GB HBM3", "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1", "00000000:18:00.0", 81559 << 20, False)
    assert [x.pci_bus_id[9:11] for x in t.devices] == ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
    assert set(fabrics(t)) == {Fabric("completed", "00000000-0000-0000-0000-000000000000", 0, 0)}


def test_fabric_na_is_no_fabric():
    t = import_captures([CAPTURES / "111_nvsmi-q-h100nvl-2gpu-fabric-na.txt"]).topology
    assert fabrics(t) == [None, None] and t.devices[1].model == "NVIDIA H100 NVL"


def test_grep_excerpt_is_read_in_order_with_a_warning():
    res = import_captures([CAPTURES / "112_nvsmi-q-grep-gb200-fabric-completed-unhealthy.txt"])
    assert res.topology.devices[0].fabric == Fabric("completed", "dc6e40c4-d722-4357-9ba6-5291dd461278", 2, 0)
    assert any("without their 'GPU <bus id>' lines" in w for w in res.warnings)


def test_status_names_map_to_nvml_codes():
    t = import_captures([CAPTURES / "113_nvsmi-q-fabric-block-completed-insufficient-resources.txt"]).topology
    assert t.devices[0].fabric.status == fakenvml.NVML_ERROR_INSUFFICIENT_RESOURCES


GREP = """\
    Fabric
        State                             : {state}
        Status                            : {status}
        CliqueId                          : {clique}
        ClusterUUID                       : {uuid}
--
"""


def block(state="Completed", status="Success", clique="2", uuid="dc6e40c4-d722-4357-9ba6-5291dd461278") -> str:
    return GREP.format(state=state, status=status, clique=clique, uuid=uuid)


def test_in_progress_drops_the_not_yet_meaningful_ids():
    t = parse_capture(block("In Progress", "N/A", "0", "00000000-0000-0000-0000-000000000000") + block()).topology
    assert fabrics(t) == [Fabric("in_progress"), Fabric("completed", "dc6e40c4-d722-4357-9ba6-5291dd461278", 2, 0)]
    assert "GPU 0: fabric registration in progress" in nvlink_domain_reason(t)


def test_unknown_status_text_is_a_failure_with_a_warning():
    res = parse_capture(block(status="Cable Unplugged"))
    assert res.topology.devices[0].fabric.status == 999
    assert any("'Cable Unplugged'" in w and "line 3" in w for w in res.warnings)


@pytest.mark.parametrize("text, line, words", [
    (block(state="Registering"), 2, "fabric State 'Registering' is not one of"),
    (block(uuid="rack-7"), 5, "fabric ClusterUUID 'rack-7' is not a UUID"),
    (block(clique="-3"), 4, "fabric CliqueId '-3' is not a 32-bit unsigned integer"),
    (block(clique="4294967296"), 4, "32-bit"),
    ("    Fabric\n        State : Completed\n" + "GPU 00000000:18:00.0\n    Fabric\n        Status : Success\n", 5,
     "without its 'State' line"),
], ids=["state", "uuid", "clique", "clique-big", "no-state"])
def test_damage_is_one_error_naming_the_line(text, line, words):
    with pytest.raises(CaptureError) as e:
        parse_capture(text, "fab.txt")
    assert words in str(e.value) and e.value.line == line and str(e.value).startswith("fab.txt, line")


def test_a_part_of_a_report_cannot_number_its_gpus():
    text = (CAPTURES / "110_nvsmi-q-h100-sxm-8gpu-fabric-completed-zero-uuid.txt").read_text()
    cut = text[:text.index("GPU 00000000:3A:00.0")]
    with pytest.raises(CaptureError, match="lists 2 GPU section.* 'Attached GPUs : 8'"):
        parse_capture(cut, "cut.txt")


def test_recognised_and_not_confused_with_nvidia_smi_l():
    text = (CAPTURES / "110_nvsmi-q-h100-sxm-8gpu-fabric-completed-zero-uuid.txt").read_text()
    uuids = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.strip().startswith("GPU UUID")]
    lst = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {u})\n" for i, u in enumerate(uuids))
    assert looks_like_capture(text) and looks_like_capture(block())
    res = parse_capture(lst + text)  # -L and -q of one machine in one text
    assert res.warnings == () and [d.uuid for d in res.topology.devices] == uuids
    assert all(d.fabric is not None for d in res.topology.devices)


def test_combines_with_topo_m_of_the_same_tray():
    """The mechanics: a Fabric excerpt of GPU 0 joins a ``topo -m`` of a tray (links, NICs from it,
    the fabric from the excerpt); the other GPUs' fabric is unknown, so the node has no domain."""
    res = import_captures([CAPTURES / "114_gb200-tray-4gpu-nv18-8nic-all-sys-rhel4nv.txt",
                           CAPTURES / "112_nvsmi-q-grep-gb200-fabric-completed-unhealthy.txt"])
    t = res.topology
    assert len(t.links) == 6 and len(t.nics) == 8 and t.devices[0].fabric.clique_id == 2
    assert "GPUs 1, 2, 3 report no NVLink fabric" in nvlink_domain_reason(t)


def test_two_reports_disagreeing_on_a_fabric_keep_the_first_with_a_warning():
    a = block()
    b = block(clique="3")
    res = import_captures([a, b])
    assert res.topology.devices[0].fabric.clique_id == 2 and any("fabric" in w for w in res.warnings)
