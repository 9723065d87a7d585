"""The nvidia backend, run for real against FakeNVML (no GPU, no patching).

Round trip: topology -> FakeNVML -> NvidiaBackend(nvml=fake).discover() -> the
same devices and links, for hand-made machines, every NVIDIA catalog machine and
every NVIDIA capture in tests/data/captures.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rayaccel.testing import fakenvml
from rayaccel.testing.fakenvml import FakeNVML, is_nvswitch_topology
from rayaccel.discovery.nvidia import NvidiaBackend
from rayaccel.errors import BackendError, BackendUnavailable
from rayaccel.topology import Device, MigProfile, NodeTopology, Partition, make_link

DATA = Path(__file__).parent.parent / "data"
GiB = 1 << 30


# ---------------------------------------------------------------- named machines
def hgx_h100() -> NodeTopology:
    """8x H100 SXM behind 4 NVSwitches: NV18 between every pair, 2 sockets."""
    devs = tuple(
        Device(index=i, model="NVIDIA H100 80GB HBM3", uuid=f"GPU-h100-{i}", pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
               memory_bytes=80 * GiB, numa_node=i // 4, cpus=tuple(range(56 * (i // 4), 56 * (i // 4) + 56)),
               compute_capability="9.0", mig_mode=False)
        for i in range(8))
    links = tuple(make_link(a, b, "nvlink", 18, "NODE" if a // 4 == b // 4 else "SYS") for a in range(8) for b in range(a + 1, 8))
    return NodeTopology(devices=devs, links=links, driver="550.54.15", name="hgx-h100-hand").validate()


DGX1V_NVLINK = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2, (2, 6): 1,
                (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}


def dgx1_v100() -> NodeTopology:
    """DGX-1 Volta hybrid cube-mesh (direct NVLink, NV1/NV2), as in go-gpuallocator's tests."""
    devs = tuple(Device(index=i, model="Tesla V100-SXM2-16GB", memory_bytes=16 * GiB, numa_node=i // 4,
                        cpus=tuple(range(20 * (i // 4), 20 * (i // 4) + 20)), compute_capability="7.0") for i in range(8))
    links = []
    for a in range(8):
        for b in range(a + 1, 8):
            pcie = ("PIX" if a // 2 == b // 2 else "PHB") if a // 4 == b // 4 else "SYS"
            n = DGX1V_NVLINK.get((a, b))
            links.append(make_link(a, b, "nvlink", n, pcie) if n else make_link(a, b, "pcie", None, pcie))
    return NodeTopology(devices=devs, links=tuple(links), name="dgx1-v100-hand").validate()


A100_PROFILES = (
    MigProfile("1g.5gb", 19, 7, 4864, (0, 1, 2, 3, 4, 5, 6), 1, 14),
    MigProfile("1g.5gb+me", 20, 1, 4864, (0, 1, 2, 3, 4, 5, 6), 1, 14),
    MigProfile("1g.10gb", 15, 4, 9856, (0, 2, 4, 6), 2, 14),
    MigProfile("2g.10gb", 14, 3, 9856, (0, 2, 4), 2, 28),
    MigProfile("3g.20gb", 9, 2, 19968, (0, 4), 4, 42),
    MigProfile("4g.20gb", 5, 1, 19968, (0,), 4, 56),
    MigProfile("7g.40gb", 0, 1, 40192, (0,), 8, 98),
)


def a100_mig() -> NodeTopology:
    """2x A100-40GB NV12: GPU 0 in MIG mode with 3g.20gb + 2g.10gb + an empty 1g.5gb instance; GPU 1 not."""
    parts = (
        Partition(0, "3g.20gb", "MIG-aaaa", gi_id=1, ci_id=0, start=4, size=4, memory_bytes=19968 << 20, sms=42),
        Partition(0, "2g.10gb", "MIG-bbbb", gi_id=5, ci_id=0, start=0, size=2, memory_bytes=9856 << 20, sms=28),
        Partition(0, "1g.5gb", None, gi_id=13, start=2, size=1),
    )
    devs = (
        Device(0, model="NVIDIA A100-SXM4-40GB", uuid="GPU-0", memory_bytes=40 * GiB, numa_node=0, compute_capability="8.0",
               mig_mode=True, partitions=parts, mig_profiles=A100_PROFILES),
        Device(1, model="NVIDIA A100-SXM4-40GB", uuid="GPU-1", memory_bytes=40 * GiB, numa_node=1, compute_capability="8.0",
               mig_mode=False, mig_profiles=A100_PROFILES),
    )
    return NodeTopology(devices=devs, links=(make_link(0, 1, "nvlink", 12, "SYS"),), driver="535.104.05").validate()


def sparse_facts() -> NodeTopology:
    """A machine NVML knows little about: no model, memory, NUMA, CPUs, links' PCIe class, ..."""
    devs = tuple(Device(index=i, health="ok") for i in range(3))
    return NodeTopology(devices=devs, links=(make_link(0, 1, "nvlink", 4, None), make_link(1, 2, "pcie", None, "PHB"))).validate()


HAND_MADE = {"hgx-h100": hgx_h100, "dgx1-v100": dgx1_v100, "a100-mig": a100_mig, "sparse": sparse_facts}


# ---------------------------------------------------------------- comparison
def _summary(t: NodeTopology) -> dict:
    """The facts NVML can report, with NVML's device numbering (0..n-1 in index order)."""
    order = {d.index: k for k, d in enumerate(sorted(t.devices, key=lambda d: d.index))}

    def part(p: Partition) -> tuple:
        return (p.profile, p.uuid, p.gi_id, p.ci_id, p.start, p.size, p.memory_bytes, p.sms)

    devices = [
        (order[d.index], d.model, d.uuid, d.memory_bytes, d.numa_node, d.cpus or None, d.compute_capability,
         "ok" if d.health == "unknown" else d.health, d.mig_mode,
         tuple(sorted((part(p) for p in d.partitions), key=repr)), tuple(sorted(d.mig_profiles, key=lambda m: m.id)),
         d.fabric)
        for d in sorted(t.devices, key=lambda d: d.index)
    ]
    links = sorted((order[l.a], order[l.b], l.kind, l.count if l.kind == "pcie" else (l.count or 1), l.pcie,
                    l.lane_gbps) for l in t.links)
    return {"devices": devices, "links": links}


def _roundtrip(t: NodeTopology) -> NodeTopology:
    fake = FakeNVML(t)
    out = NvidiaBackend(nvml=fake, sysfs_root="/nonexistent").discover()
    assert fake.initialized == 0, "discover() must pair nvmlInit with nvmlShutdown"
    return out


def _assert_same(src: NodeTopology, out: NodeTopology) -> None:
    a, b = _summary(src), _summary(out)
    for i, (x, y) in enumerate(zip(a["devices"], b["devices"])):
        assert x == y, f"device {i} differs:\n  topology: {x}\n  backend:  {y}"
    assert len(a["devices"]) == len(b["devices"])
    assert a["links"] == b["links"]


@pytest.mark.parametrize("name", sorted(HAND_MADE), ids=sorted(HAND_MADE))
def test_roundtrip_hand_made(name):
    src = HAND_MADE[name]()
    _assert_same(src, _roundtrip(src))


def _catalog_names() -> list[str]:
    try:
        from rayaccel import catalog
        return list(catalog.names())
    except ImportError:
        return []


@pytest.mark.parametrize("name", _catalog_names() or ["<empty catalog>"])
def test_roundtrip_catalog(name):
    if name == "<empty catalog>":
        pytest.skip("the catalog is empty")
    from rayaccel import catalog

    src = catalog.load(name)
    if any(d.vendor != "nvidia" for d in src.devices):
        pytest.skip(f"{name}: not an NVIDIA machine")
    _assert_same(src, _roundtrip(src))


def _captures() -> list[Path]:
    root = DATA / "captures"
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".txt", ".log")) if root.is_dir() else []


@pytest.mark.parametrize("path", _captures() or [None], ids=lambda p: p.name if p else "<no captures>")
def test_roundtrip_capture(path):
    if path is None:
        pytest.skip("no captures in tests/data/captures")
    import rayaccel.discovery.capture as capture
    from rayaccel.errors import CaptureError

    try:
        src = capture.import_captures([path]).topology
    except CaptureError as e:
        pytest.skip(f"capture rejected by the importer (tested there): {e}")
    if not src.devices or any(d.vendor != "nvidia" for d in src.devices):
        pytest.skip("not an NVIDIA capture")
    try:
        fake = FakeNVML(src)
    except ValueError as e:  # e.g. a cut DGX-2 table: NV6 to 15 peers cannot be direct links
        assert capture.import_captures([path]).warnings, "only a damaged capture may be unrepresentable"
        pytest.skip(f"not a topology NVML could report: {e}")
    _assert_same(src, NvidiaBackend(nvml=fake, sysfs_root="/nonexistent").discover())


# ---------------------------------------------------------------- NVSwitch
def test_nvswitch_all_28_pairs_found_through_switch_links():
    src = hgx_h100()
    fake = FakeNVML(src)
    assert is_nvswitch_topology(src)
    # the fake really models switches: every active link's remote end is a SWITCH whose
    # PCI id is no GPU's, so matching by bus id (go-gpuallocator) would find nothing
    fake.nvmlInit()
    gpu_buses = {fake.nvmlDeviceGetPciInfo(fake.nvmlDeviceGetHandleByIndex(i)).busId for i in range(8)}
    h = fake.nvmlDeviceGetHandleByIndex(0)
    types = {fake.nvmlDeviceGetNvLinkRemoteDeviceType(h, l) for l in range(18)}
    remote = {fake.nvmlDeviceGetNvLinkRemotePciInfo(h, l).busId for l in range(18)}
    assert fake.nvmlDeviceGetNvLinkState(h, 18) == fakenvml.NVML_FEATURE_DISABLED
    fake.nvmlShutdown()
    assert types == {fakenvml.NVML_NVLINK_DEVICE_TYPE_SWITCH}
    assert not remote & gpu_buses
    out = NvidiaBackend(nvml=fake).discover()
    nv = [l for l in out.links if l.kind == "nvlink"]
    assert len(nv) == 28 and {l.count for l in nv} == {18}
    assert out.direct_domains() == [frozenset(range(8))]


def test_direct_nvlink_topology_uses_gpu_peers():
    fake = FakeNVML(dgx1_v100())
    fake.nvmlInit()
    assert fake.nvmlDeviceGetNvLinkRemoteDeviceType(fake.nvmlDeviceGetHandleByIndex(0), 0) == fakenvml.NVML_NVLINK_DEVICE_TYPE_GPU
    fake.nvmlShutdown()
    out = NvidiaBackend(nvml=fake).discover()
    assert out.link(0, 3).count == 2 and out.link(0, 5).kind == "pcie" and out.link(0, 5).pcie == "SYS"


def test_uneven_switch_lanes_take_the_minimum():
    fake = FakeNVML(hgx_h100())
    fake._devices[2].nvlinks = fake._devices[2].nvlinks[:12]  # 6 of GPU 2's links down
    out = NvidiaBackend(nvml=fake).discover()
    assert out.link(2, 5).count == 12 and out.link(0, 1).count == 18


# ---------------------------------------------------------------- MIG
def test_mig_instances_and_profile_table():
    out = _roundtrip(a100_mig())
    d0, d1 = out.device(0), out.device(1)
    assert d0.mig_mode is True and d1.mig_mode is False and d1.partitions == ()
    assert {p.profile: (p.start, p.size) for p in d0.partitions} == {"3g.20gb": (4, 4), "2g.10gb": (0, 2), "1g.5gb": (2, 1)}
    assert d0.profile("1g.10gb").placements == (0, 2, 4, 6) and d0.profile("1g.10gb").slots == 2
    assert [p.name for p in d0.mig_profiles][:3] == ["1g.5gb", "1g.5gb+me", "1g.10gb"]


def test_mig_partition_without_profile_table_uses_the_mig_device_name():
    src = NodeTopology(devices=(Device(0, model="NVIDIA H100 PCIe", mig_mode=True, partitions=tuple(
        Partition(0, "1g.10gb", f"MIG-{k}") for k in range(7))),)).validate()
    out = _roundtrip(src)
    assert [p.profile for p in out.device(0).partitions] == ["1g.10gb"] * 7
    assert [p.gi_id for p in out.device(0).partitions] == [None] * 7


# ---------------------------------------------------------------- unknowns and errors
def test_unsupported_facts_are_none_not_crashes():
    out = _roundtrip(sparse_facts())
    d = out.device(0)
    assert (d.model, d.memory_bytes, d.numa_node, d.cpus, d.compute_capability, d.mig_mode) == (None,) * 6
    assert out.link(0, 1).kind == "nvlink" and out.link(0, 1).pcie is None
    assert out.link(0, 2) is None and out.driver is None


@pytest.mark.parametrize("call", ["nvmlDeviceGetNumaNodeId", "nvmlDeviceGetCpuAffinity", "nvmlDeviceGetMigMode",
                                  "nvmlDeviceGetGpuInstanceProfileInfo", "nvmlDeviceGetTopologyCommonAncestor",
                                  "nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlSystemGetDriverVersion"])
@pytest.mark.parametrize("code", [3, 13], ids=["NOT_SUPPORTED", "FUNCTION_NOT_FOUND"])
def test_each_optional_call_may_be_unsupported(call, code):
    fake = FakeNVML(a100_mig())
    fake.fail(call, code)
    out = NvidiaBackend(nvml=fake).discover()
    assert len(out.devices) == 2


def test_numa_falls_back_to_sysfs(tmp_path):
    src = hgx_h100()
    fake = FakeNVML(src)
    fake.fail("nvmlDeviceGetNumaNodeId", fakenvml.NVML_ERROR_NOT_SUPPORTED)
    for i, d in enumerate(src.devices):
        node = tmp_path / "bus" / "pci" / "devices" / f"0000:{0x18 + 0x10 * i:02x}:00.0"
        node.mkdir(parents=True)
        (node / "numa_node").write_text(f"{1 - d.numa_node}\n" if i != 7 else "-1\n")
    out = NvidiaBackend(nvml=fake, sysfs_root=tmp_path).discover()
    assert [d.numa_node for d in out.devices] == [1, 1, 1, 1, 0, 0, 0, None]


def test_lost_gpu_is_failed_and_others_still_discovered():
    fake = FakeNVML(hgx_h100())
    fake.fail("*", fakenvml.NVML_ERROR_GPU_IS_LOST, device=3)
    out = NvidiaBackend(nvml=fake).discover()
    assert out.device(3).health == "failed" and out.device(2).health == "ok"
    assert all(3 not in (l.a, l.b) for l in out.links)
    assert len([l for l in out.links if l.kind == "nvlink"]) == 21  # the 7 healthy GPUs, all pairs


def test_health_from_retired_pages_and_remapped_rows():
    src = hgx_h100()
    devs = list(src.devices)
    devs[1] = Device(**{**{f: getattr(devs[1], f) for f in Device.__slots__}, "health": "degraded"})
    devs[2] = Device(**{**{f: getattr(devs[2], f) for f in Device.__slots__}, "health": "failed"})
    out = NvidiaBackend(nvml=FakeNVML(NodeTopology(devices=tuple(devs), links=src.links))).discover()
    assert [d.health for d in out.devices[:3]] == ["ok", "degraded", "failed"]


def test_other_nvml_errors_raise_backend_error_naming_call_and_device():
    fake = FakeNVML(hgx_h100())
    fake.fail("nvmlDeviceGetMemoryInfo", fakenvml.NVML_ERROR_TIMEOUT, device=5)
    with pytest.raises(BackendError, match=r"nvmlDeviceGetMemoryInfo failed for device 5.*Timeout"):
        NvidiaBackend(nvml=fake).discover()
    assert fake.initialized == 0


@pytest.mark.parametrize("code", [12, 9], ids=["LIBRARY_NOT_FOUND", "DRIVER_NOT_LOADED"])
def test_no_driver_is_unavailable(code):
    fake = FakeNVML(hgx_h100())
    fake.fail("nvmlInit", code)
    b = NvidiaBackend(nvml=fake)
    info = b.available()
    assert not info.available and "no NVIDIA driver" in info.reason and info.hint
    with pytest.raises(BackendUnavailable, match="no NVIDIA driver"):
        b.discover()


def test_zero_gpus_is_unavailable_not_an_empty_topology():
    info = NvidiaBackend(nvml=FakeNVML(NodeTopology())).available()
    assert not info.available and "no GPU" in info.reason


def test_available_on_fake_machine():
    assert NvidiaBackend(nvml=FakeNVML(hgx_h100())).available().available


def test_missing_pynvml_is_unavailable_with_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    info = NvidiaBackend().available()
    assert not info.available and "pynvml" in info.reason and "nvidia-ml-py" in info.hint
    with pytest.raises(BackendUnavailable, match="pynvml"):
        NvidiaBackend().discover()


def test_import_rayaccel_without_pynvml():
    code = ("import sys; sys.modules['pynvml'] = None; import rayaccel, rayaccel.discovery as d; "
            "i = d.backends()['nvidia'].available(); assert not i.available; print('ok', i.reason)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")


def test_real_pynvml_on_this_machine_is_reported_not_crashing():
    # this CI machine has nvidia-ml-py but (normally) no driver: must be "unavailable", with a reason
    info = NvidiaBackend().available()
    assert info.available or info.reason


def test_fake_requires_init():
    fake = FakeNVML(hgx_h100())
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


# ---------------------------------------------------------------- NVLink generation (per-lane speed)
@pytest.mark.parametrize("name, lane", [("gb200-nvl4", 50.0), ("nvl72", 50.0), ("hgx-h100", None), ("dgx1-v100", None)],
                         ids=["gb200-nvl4", "nvl72", "hgx-h100", "dgx1-v100"])
def test_nvlink_version_gives_the_lane_speed(name, lane):
    from rayaccel import catalog

    src = catalog.load(name)
    fake = FakeNVML(src)
    fake.nvmlInit()
    version = fake.nvmlDeviceGetNvLinkVersion(fake.nvmlDeviceGetHandleByIndex(0), 0)
    fake.nvmlShutdown()
    assert version == (fakenvml.NVML_NVLINK_VERSION_5_0 if lane else fakenvml.NVML_NVLINK_VERSION_4_0)
    out = NvidiaBackend(nvml=fake).discover()
    nv = [l for l in out.links if l.kind == "nvlink"]
    assert nv and {l.lane_gbps for l in nv} == {lane}
    assert out.bandwidth_gbps(0, 1) == src.bandwidth_gbps(0, 1) == (lane or 25.0) * nv[0].count


def test_nvlink_version_not_supported_keeps_the_table_default():
    fake = FakeNVML(catalog_machine("gb200-nvl4"))
    fake.fail("nvmlDeviceGetNvLinkVersion", fakenvml.NVML_ERROR_NOT_SUPPORTED)
    out = NvidiaBackend(nvml=fake).discover()
    assert {l.lane_gbps for l in out.links if l.kind == "nvlink"} == {None}
    assert out.bandwidth_gbps(0, 1) == 18 * 25.0


def test_fake_rejects_a_lane_speed_no_nvlink_has():
    src = dgx1_v100()
    odd = replace(src, links=tuple(replace(l, lane_gbps=33.0) if l.kind == "nvlink" else l for l in src.links))
    with pytest.raises(ValueError, match="33.0 GB/s per lane"):
        FakeNVML(odd)


def catalog_machine(name):
    from rayaccel import catalog

    return catalog.load(name)
