"""``rayaccel doctor``'s local checks, run for real against FakeNVML / FakeAmdSmi on catalog machines.

Each check is driven to ok / warn / fail / n/a through the vendor calls it really makes;
a simulated node is n/a everywhere; a missing library is a hint, never a crash.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import replace

import pytest

from rayaccel import catalog
from rayaccel.testing import fakenvml
from rayaccel.testing.fakeamdsmi import FakeAmdSmi
from rayaccel.testing.fakenvml import FakeNVML
from rayaccel.doctor import (
    AMD_CHECKS, NVIDIA_CHECKS, STATUSES, Check, local_checks, simulated_checks, summarize, worst,
)
from rayaccel.doctor._host import _nccl_text
from rayaccel.topology import NodeTopology

DRIVER = "550.54.15"  # CUDA 12.4


def fake_torch(cuda: str | None = "12.1", hip: str | None = None, nccl=(2, 20, 5), version: str = "2.4.0") -> types.SimpleNamespace:
    def nccl_version():
        if isinstance(nccl, Exception):
            raise nccl
        return nccl

    return types.SimpleNamespace(__version__=version, version=types.SimpleNamespace(cuda=cuda, hip=hip),
                                 cuda=types.SimpleNamespace(nccl=types.SimpleNamespace(version=nccl_version)))


@pytest.fixture
def modules(tmp_path):
    """A /proc/modules with the GPUDirect module loaded."""
    p = tmp_path / "modules"
    p.write_text("nvidia_peermem 16384 0 - Live 0x0\nnvidia_uvm 1523712 2 - Live 0x0\nmlx5_ib 466944 0 - Live 0x0\n")
    return p


def run(name: str, *, fake: FakeNVML | None = None, torch=None, proc_modules=None, topology: NodeTopology | None = None,
        **fake_kw) -> dict[str, Check]:
    topo = topology or catalog.load(name)
    fake = fake or FakeNVML(catalog.load(name), **({"driver_version": DRIVER} | fake_kw))
    checks = local_checks(topo, simulated=False, nvml=fake, torch_module=torch or fake_torch(),
                          proc_modules=proc_modules or "/nonexistent/modules")
    assert [c.name for c in checks] == list(NVIDIA_CHECKS)
    return {c.name: c for c in checks}


def status(checks: dict[str, Check]) -> dict[str, str]:
    return {n: c.status for n, c in checks.items()}


# ---------------------------------------------------------------- simulated nodes
@pytest.mark.parametrize("name", catalog.names())
def test_simulated_node_is_na_everywhere(name):
    topo = catalog.load(name)
    checks = local_checks(topo, simulated=True, nvml=FakeNVML(topo) if name != "mi300x-8x" else None)
    assert checks and all(c.status == "n/a" for c in checks)
    assert all(c.detail.startswith("simulated node: no ") and c.fix is None for c in checks)
    vendors = {d.vendor for d in topo.devices}
    assert [c.name for c in checks] == list(AMD_CHECKS if vendors == {"amd"} else NVIDIA_CHECKS)


def test_simulated_checks_never_say_ok():
    for name in catalog.names():
        assert "ok" not in {c.status for c in simulated_checks(catalog.load(name))}


# ---------------------------------------------------------------- everything fine
def test_healthy_hgx_h100_is_all_ok(modules):
    checks = run("hgx-h100", proc_modules=modules)
    assert {n: v for n, v in status(checks).items() if v != "ok"} == {"imex": "n/a"}, summarize(checks.values())
    assert "no multi-node NVLink domain" in checks["imex"].detail  # an HGX's fabric is single-node
    assert checks["driver"].detail == f"NVIDIA driver {DRIVER}, all 8 GPUs of the topology found"
    assert checks["cuda"].detail == "the driver supports CUDA 12.4"
    assert checks["nvml"].detail == f"NVML 12.{DRIVER}"
    assert checks["nccl"].detail == "NCCL 2.20.5 (in torch)"
    assert checks["p2p"].detail == "P2P OK on all 28 linked GPU pairs"
    assert all(c.fix is None for c in checks.values())


@pytest.mark.parametrize("name", [n for n in catalog.names() if {d.vendor for d in catalog.load(n).devices} == {"nvidia"}])
def test_every_nvidia_machine_checks_without_a_crash(name, modules):
    checks = run(name, proc_modules=modules)
    assert "fail" not in status(checks).values(), summarize(checks.values())


# ---------------------------------------------------------------- driver / cuda / nvml
def test_lost_gpu_fails_the_driver_check():
    fake = FakeNVML(catalog.load("dgx1-v100"), driver_version=DRIVER)
    fake.lose(5)
    checks = run("dgx1-v100", fake=fake)
    assert checks["driver"].status == "fail" and "GPU 5" in checks["driver"].detail and checks["driver"].fix


def test_gpu_missing_from_nvml_fails_the_driver_check():
    topo = catalog.load("hgx-h100")
    stale = NodeTopology(devices=tuple(replace(d, uuid="GPU-old", pci_bus_id="0000:99:00.0") if d.index == 2 else d
                                       for d in topo.devices), links=topo.links, nics=topo.nics)
    checks = run("hgx-h100", topology=stale)
    assert checks["driver"].status == "fail" and "GPU 2 (GPU-old) is not visible to NVML" in checks["driver"].detail


def test_no_driver_fails_and_the_rest_is_na():
    fake = FakeNVML(catalog.load("hgx-h100"))
    fake.fail("nvmlInit", fakenvml.NVML_ERROR_DRIVER_NOT_LOADED)
    checks = run("hgx-h100", fake=fake)
    assert checks["driver"].status == "fail" and "no NVIDIA driver is loaded" in checks["driver"].detail
    assert all(checks[n].status == "n/a" for n in ("cuda", "nvml", "mig", "persistence", "fabric", "p2p"))


def test_driver_library_mismatch_says_reboot():
    fake = FakeNVML(catalog.load("hgx-h100"))
    fake.fail("nvmlInit", fakenvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    checks = run("hgx-h100", fake=fake)
    assert checks["driver"].status == "fail" and "reboot" in checks["driver"].fix


def test_unknown_driver_and_cuda_versions_warn():
    fake = FakeNVML(catalog.load("hgx-h100"))  # the catalog machine names no driver
    checks = run("hgx-h100", fake=fake)
    assert status(checks)["driver"] == "warn" and status(checks)["cuda"] == "warn" and status(checks)["nvml"] == "warn"
    assert "not compared" in checks["torch"].detail and checks["torch"].status == "ok"


def test_real_pynvml_without_a_driver():
    pytest.importorskip("pynvml")
    checks = {c.name: c for c in local_checks(catalog.load("dgx1-v100"), simulated=False, torch_module=fake_torch())}
    if checks["driver"].status == "fail":  # this machine: no NVIDIA driver
        assert "no NVIDIA driver" in checks["driver"].detail and checks["driver"].fix
        assert checks["mig"].status == "n/a"


def test_missing_pynvml_is_a_hint_not_a_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    checks = {c.name: c for c in local_checks(catalog.load("hgx-h100"), simulated=False, torch_module=fake_torch())}
    assert checks["nvml"].status == "warn" and "nvidia-ml-py" in checks["nvml"].fix
    assert checks["driver"].status == "n/a" and checks["p2p"].status == "n/a"


def test_an_nvml_error_is_reported_not_raised():
    fake = FakeNVML(catalog.load("hgx-h100"), driver_version=DRIVER)
    fake.fail("nvmlDeviceGetPersistenceMode", fakenvml.NVML_ERROR_UNKNOWN, device=4)
    fake.fail("nvmlSystemGetNVMLVersion", fakenvml.NVML_ERROR_UNKNOWN)
    checks = run("hgx-h100", fake=fake)
    assert checks["persistence"].status == "warn" and "GPU 4" in checks["persistence"].detail
    assert checks["nvml"].status == "warn"


# ---------------------------------------------------------------- torch / nccl
@pytest.mark.parametrize("cuda, expected", [("11.8", "ok"), ("12.4", "ok"), ("12.6", "warn"), ("13.0", "fail"),
                                            (None, "warn")], ids=["11.8", "12.4", "12.6", "13.0", "cpu"])
def test_torch_cuda_against_the_drivers(cuda, expected):
    checks = run("hgx-h100", torch=fake_torch(cuda=cuda))
    assert checks["torch"].status == expected
    assert (checks["torch"].fix is None) == (expected == "ok")
    if expected != "ok":
        assert "12.4" in checks["torch"].fix or "12.4" in checks["torch"].detail


def test_torch_newer_than_a_580_driver_is_fine():
    checks = run("l40s-4x-pcie", torch=fake_torch(cuda="12.8"), driver_version="580.126.18")
    assert checks["cuda"].detail == "the driver supports CUDA 13.0" and checks["torch"].status == "ok"


def test_torch_absent_is_na_with_a_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    topo = catalog.load("hgx-h100")
    checks = {c.name: c for c in local_checks(topo, simulated=False, nvml=FakeNVML(topo, driver_version=DRIVER))}
    assert checks["torch"].status == "n/a" and checks["torch"].fix
    assert checks["nccl"].status == "n/a"


def test_the_installed_torch():
    torch = pytest.importorskip("torch")
    checks = run("hgx-h100", torch=torch)
    if torch.version.cuda is None:
        assert checks["torch"].status == "warn" and "CPU-only" in checks["torch"].detail
        assert checks["nccl"].status == "n/a"


@pytest.mark.parametrize("value, text", [((2, 21, 5), "2.21.5"), (2708, "2.7.8"), (21903, "2.19.3"), ("x", "x")])
def test_nccl_version_forms(value, text):
    assert _nccl_text(value) == text


def test_nccl_missing_from_a_cuda_torch_warns():
    checks = run("hgx-h100", torch=fake_torch(nccl=RuntimeError("NCCL not built")))
    assert checks["nccl"].status == "warn" and "NCCL not built" in checks["nccl"].detail


# ---------------------------------------------------------------- mig / persistence
def test_mig_ok_and_pending():
    assert run("a100-mig")["mig"].status == "ok"
    fake = FakeNVML(catalog.load("a100-mig"), driver_version=DRIVER)
    fake.set_mig_pending(0, False)
    mig = run("a100-mig", fake=fake)["mig"]
    assert mig.status == "warn" and "after a reset" in mig.detail and "nvidia-smi -r -i 0" in mig.fix


def test_mig_disagreeing_with_the_published_topology():
    topo = catalog.load("a100-mig")
    published = NodeTopology(devices=tuple(replace(d, mig_mode=False, partitions=()) for d in topo.devices))
    mig = run("a100-mig", topology=published)["mig"]
    assert mig.status == "warn" and "published topology" in mig.detail and "restart the rayaccel node" in mig.fix


def test_mig_na_without_mig_hardware():
    assert run("dgx1-v100")["mig"].status == "n/a"


def test_persistence_off_warns():
    fake = FakeNVML(catalog.load("hgx-h100"), driver_version=DRIVER)
    fake.set_persistence(3, False)
    fake.set_persistence(6, False)
    check = run("hgx-h100", fake=fake)["persistence"]
    assert check.status == "warn" and "GPUs 3, 6" in check.detail and "nvidia-persistenced" in check.fix


# ---------------------------------------------------------------- fabric
@pytest.mark.parametrize("state, status_code, degraded, expected", [
    (fakenvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0, False, "ok"),
    (fakenvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, 0, False, "warn"),
    (fakenvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, 0, False, "fail"),
    (fakenvml.NVML_GPU_FABRIC_STATE_COMPLETED, fakenvml.NVML_ERROR_UNKNOWN, False, "fail"),
    (fakenvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0, True, "warn"),
], ids=["completed", "in-progress", "not-started", "failed", "degraded"])
def test_fabric_states(state, status_code, degraded, expected):
    fake = FakeNVML(catalog.load("hgx-h100"), driver_version=DRIVER)
    fake.set_fabric(5, state, status_code, degraded)
    check = run("hgx-h100", fake=fake)["fabric"]
    assert check.status == expected
    if expected != "ok":
        assert "GPU 5" in check.detail and check.fix


@pytest.mark.parametrize("name, words", [("dgx-a100", "NVML does not report"), ("dgx1-v100", "no NVSwitch"),
                                         ("l40s-4x-pcie", "no NVSwitch")])
def test_fabric_na(name, words):
    check = run(name)["fabric"]
    assert check.status == "n/a" and words in check.detail


def test_fabric_v1_struct_when_the_bindings_lack_v2():
    fake = FakeNVML(catalog.load("hgx-h100"), driver_version=DRIVER)
    fake.c_nvmlGpuFabricInfo_v2_t = None
    fake.set_fabric(0, fakenvml.NVML_GPU_FABRIC_STATE_NOT_STARTED)
    assert run("hgx-h100", fake=fake)["fabric"].status == "fail"
    assert "nvmlDeviceGetGpuFabricInfo" in fake.calls


def test_fabric_falls_back_when_the_driver_lacks_the_versioned_call():
    fake = FakeNVML(catalog.load("hgx-h100"), driver_version=DRIVER)
    fake.fail("nvmlDeviceGetGpuFabricInfoV", fakenvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    fake.set_fabric(1, fakenvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS)
    check = run("hgx-h100", fake=fake)["fabric"]
    assert check.status == "warn" and "GPU 1: fabric registration in progress" in check.detail


# ---------------------------------------------------------------- p2p
def test_p2p_fails_when_nvlink_p2p_is_refused():
    fake = FakeNVML(catalog.load("dgx1-v100"), driver_version=DRIVER)
    fake.set_p2p(0, 3, fakenvml.NVML_P2P_STATUS_DISABLED_BY_REGKEY, fakenvml.NVML_P2P_CAPS_INDEX_NVLINK)
    check = run("dgx1-v100", fake=fake)["p2p"]
    assert check.status == "fail" and "GPU 0-3 (NV2)" in check.detail and "disabled by regkey" in check.detail


def test_p2p_warns_on_pcie():
    assert run("l40s-4x-pcie")["p2p"].status == "ok"
    fake = FakeNVML(catalog.load("l40s-4x-pcie"), driver_version=DRIVER)
    fake.set_p2p(2, 3, fakenvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED)
    check = run("l40s-4x-pcie", fake=fake)["p2p"]
    assert check.status == "warn" and "GPU 2-3 (PIX)" in check.detail


def test_p2p_na_on_a_single_gpu():
    assert run("a100-mig")["p2p"].status == "n/a"


# ---------------------------------------------------------------- gpudirect
def test_gpudirect(tmp_path, modules):
    assert run("dgx1-v100", proc_modules=modules)["gpudirect"].status == "ok"
    old = tmp_path / "old"
    old.write_text("nv_peer_mem 16384 0 - Live 0x0\n")
    assert "nv_peer_mem" in run("dgx1-v100", proc_modules=old)["gpudirect"].detail
    none = tmp_path / "none"
    none.write_text("nvidia 1 0 - Live 0x0\n")
    check = run("dgx1-v100", proc_modules=none)["gpudirect"]
    assert check.status == "warn" and "mlx5_0" in check.detail and "modprobe nvidia_peermem" in check.fix
    assert run("a100-mig", proc_modules=none)["gpudirect"].status == "n/a"  # no RDMA NIC
    assert run("dgx1-v100", proc_modules=tmp_path / "missing")["gpudirect"].status == "n/a"


# ---------------------------------------------------------------- AMD
def amd(fake: FakeAmdSmi | None = None, torch=None) -> dict[str, Check]:
    topo = catalog.load("mi300x-8x")
    fake = fake or FakeAmdSmi(topo, driver_version="6.8.5")
    checks = local_checks(topo, simulated=False, amdsmi=fake, torch_module=torch or fake_torch(cuda=None, hip="6.2.4"))
    assert [c.name for c in checks] == list(AMD_CHECKS)
    return {c.name: c for c in checks}


def test_amd_healthy():
    checks = amd()
    assert status(checks) == {"driver": "ok", "amdsmi": "ok", "torch": "ok", "nccl": "ok", "p2p": "ok", "gpudirect": "n/a"}
    assert checks["nccl"].detail.startswith("RCCL ")


def test_amd_p2p_refused_on_xgmi_fails():
    fake = FakeAmdSmi(catalog.load("mi300x-8x"), driver_version="6.8.5")
    fake.set_p2p(1, 2, False)
    check = amd(fake)["p2p"]
    assert check.status == "fail" and "GPU 1-2" in check.detail


def test_amd_lost_gpu_and_no_driver():
    fake = FakeAmdSmi(catalog.load("mi300x-8x"), driver_version="6.8.5")
    fake.lose(4)
    assert amd(fake)["driver"].status == "fail"
    fake = FakeAmdSmi(catalog.load("mi300x-8x"))
    fake.fail("amdsmi_init", 34)
    checks = amd(fake)
    assert checks["driver"].status == "fail" and checks["p2p"].status == "n/a"


def test_amd_with_a_cuda_torch_warns():
    assert amd(torch=fake_torch(cuda="12.1"))["torch"].status == "warn"


def test_amd_without_amdsmi(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    checks = {c.name: c for c in local_checks(catalog.load("mi300x-8x"), simulated=False, torch_module=fake_torch())}
    assert checks["amdsmi"].status == "warn" and "pip install amdsmi" in checks["amdsmi"].fix


def test_no_supported_vendor():
    (check,) = local_checks(catalog.load("trn1-32xlarge"), simulated=False)
    assert check.status == "n/a" and "aws" in check.detail


# ---------------------------------------------------------------- Check, summarize, JSON
def test_check_json_round_trip():
    c = Check("p2p", "fail", "GPU 0-3 (NV2): P2P over NVLink disabled by regkey", "check the BIOS")
    d = c.to_dict()
    assert list(d) == ["name", "status", "detail", "fix"]
    assert Check.from_dict(json.loads(json.dumps(d))) == c
    assert Check.from_dict({"name": "x", "status": "ok", "detail": "y"}).fix is None


@pytest.mark.parametrize("bad", [{"name": "x", "status": "great", "detail": ""}, {"name": "", "status": "ok", "detail": ""},
                                 {"name": "x", "status": "ok"}, {"name": "x", "status": "ok", "detail": "", "fix": 3}, []])
def test_check_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        Check.from_dict(bad)


def test_summarize_and_worst():
    checks = [Check("driver", "ok", "NVIDIA driver 550"), Check("persistence", "warn", "off on GPU 1", "nvidia-smi -pm 1"),
              Check("fabric", "n/a", "no NVSwitch")]
    text = summarize(checks)
    assert text.splitlines() == [
        "ok    driver       NVIDIA driver 550",
        "warn  persistence  off on GPU 1",
        "                   fix: nvidia-smi -pm 1",
        "n/a   fabric       no NVSwitch",
        "1 ok, 1 warn, 0 fail, 1 n/a",
    ]
    assert worst(checks) == "warn" and worst([]) == "ok" and worst(checks + [Check("p2p", "fail", "")]) == "fail"
    assert STATUSES == ("ok", "n/a", "warn", "fail")
