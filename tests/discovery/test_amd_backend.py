"""The amd backend, run for real against FakeAmdSmi."""

from __future__ import annotations

from enum import IntEnum
from pathlib import Path

import pytest

from rayaccel.discovery.amd import AmdBackend, parse_cpulist
from rayaccel.testing.fakeamdsmi import AMDSMI_STATUS_NOT_SUPPORTED, FakeAmdSmi
from rayaccel.errors import BackendError, BackendUnavailable
from rayaccel.topology import Device, NodeTopology, make_link

DATA = Path(__file__).parent.parent / "data"
GiB = 1 << 30


def mi300x() -> NodeTopology:
    """8x MI300X, every pair one xGMI link, GPUs 0-3 on NUMA 0 and 4-7 on NUMA 1."""
    devs = tuple(Device(i, vendor="amd", model="AMD Instinct MI300X", uuid=f"GPU-mi-{i}", pci_bus_id=f"0000:{0x05 + 0x20 * i:02x}:00.0",
                        memory_bytes=192 * GiB, numa_node=i // 4, cpus=tuple(range(96 * (i // 4), 96 * (i // 4) + 96)),
                        compute_capability="gfx942") for i in range(8))
    links = tuple(make_link(a, b, "xgmi", 1) for a in range(8) for b in range(a + 1, 8))
    return NodeTopology(devices=devs, links=links, driver="6.8.5").validate()


def mi50_pcie() -> NodeTopology:
    """4x MI50 on PCIe: pairs under one switch (PIX), through the root complex (PHB), across sockets (SYS)."""
    devs = tuple(Device(i, vendor="amd", model="AMD Instinct MI50", pci_bus_id=f"0000:{0x10 * (i + 1):02x}:00.0",
                        memory_bytes=32 * GiB, numa_node=i // 2, compute_capability="gfx906") for i in range(4))
    links = (make_link(0, 1, "pcie", None, "PIX"), make_link(2, 3, "pcie", None, "PHB"),
             *(make_link(a, b, "pcie", None, "SYS") for a in (0, 1) for b in (2, 3)))
    return NodeTopology(devices=devs, links=links, driver="6.3.6").validate()


def _summary(t: NodeTopology):
    devs = [(d.index, d.model, d.uuid, d.pci_bus_id, d.memory_bytes, d.numa_node, d.cpus, d.compute_capability) for d in t.devices]
    return devs, sorted((l.a, l.b, l.kind, l.count, l.pcie) for l in t.links)


def _roundtrip(t: NodeTopology, tmp_path: Path, **fake_kwargs) -> NodeTopology:
    fake = FakeAmdSmi(t, **fake_kwargs)
    out = AmdBackend(amdsmi=fake, sysfs_root=fake.write_sysfs(tmp_path)).discover()
    assert fake.initialized == 0
    return out


@pytest.mark.parametrize("make", [mi300x, mi50_pcie], ids=["mi300x-8x", "mi50-4x-pcie"])
def test_roundtrip_hand_made(make, tmp_path):
    src = make()
    out = _roundtrip(src, tmp_path)
    assert _summary(out) == _summary(src)
    assert out.driver == src.driver and out.sources == ("amdsmi",)


def test_mi300x_is_one_xgmi_domain(tmp_path):
    out = _roundtrip(mi300x(), tmp_path)
    assert out.direct_domains() == [frozenset(range(8))]
    assert len(out.links) == 28 and all(l.kind == "xgmi" and l.count == 1 for l in out.links)


def test_roundtrip_catalog_mi300x(tmp_path):
    import rayaccel.catalog as catalog
    if "mi300x-8x" not in catalog.names():
        pytest.skip("no mi300x-8x in the catalog")
    src = catalog.load("mi300x-8x")
    assert _summary(_roundtrip(src, tmp_path)) == _summary(src)


def _amd_captures():
    root = DATA / "captures"
    return sorted(root.glob("*rocm-smi*")) + sorted(root.glob("*amd-smi*")) if root.is_dir() else []


@pytest.mark.parametrize("path", _amd_captures() or [None], ids=lambda p: p.name if p else "<none>")
def test_roundtrip_rocm_captures(path, tmp_path):
    if path is None:
        pytest.skip("no AMD captures in tests/data/captures")
    import rayaccel.discovery.capture as capture
    src = capture.import_captures([path]).topology
    if not src.devices or any(d.vendor != "amd" for d in src.devices):
        pytest.skip("not an AMD topology")
    out = _roundtrip(src, tmp_path)
    want = [(l.a, l.b, l.kind, l.count, l.pcie) for l in sorted(src.links, key=lambda l: (l.a, l.b))]
    got = [(l.a, l.b, l.kind, l.count, l.pcie) for l in sorted(out.links, key=lambda l: (l.a, l.b))]
    assert got == want
    assert [d.numa_node for d in out.devices] == [d.numa_node for d in src.devices]


def test_unknown_facts_are_none(tmp_path):
    src = NodeTopology(devices=(Device(0, vendor="amd"), Device(1, vendor="amd")),
                       links=(make_link(0, 1, "xgmi", None),)).validate()
    out = _roundtrip(src, tmp_path)
    d = out.device(0)
    assert (d.model, d.uuid, d.memory_bytes, d.numa_node, d.cpus) == (None,) * 5
    assert out.link(0, 1).kind == "xgmi" and out.link(0, 1).count is None


def test_link_type_unsupported_falls_back_to_weight(tmp_path):
    fake = FakeAmdSmi(mi300x())
    fake.fail("amdsmi_topo_get_link_type", AMDSMI_STATUS_NOT_SUPPORTED)
    out = AmdBackend(amdsmi=fake, sysfs_root=tmp_path).discover()
    assert {l.kind for l in out.links} == {"xgmi"}


def test_old_io_link_type_enum(tmp_path):
    class AmdSmiIoLinkType(IntEnum):
        UNDEFINED = 0
        PCIEXPRESS = 1
        XGMI = 2

    class OldFake(FakeAmdSmi):
        AmdSmiLinkType = None  # an amdsmi that predates amdsmi_link_type_t

        def amdsmi_topo_get_link_type(self, a, b):
            new = super().amdsmi_topo_get_link_type(a, b)
            return {"hops": new["hops"], "type": {1: 2, 2: 1}[new["type"]]}

    OldFake.AmdSmiIoLinkType = AmdSmiIoLinkType
    out = AmdBackend(amdsmi=OldFake(mi50_pcie()), sysfs_root=tmp_path).discover()
    assert out.link(0, 1).pcie == "PIX" and out.link(0, 2).pcie == "SYS"


def test_partition_modes(tmp_path):
    b = AmdBackend(amdsmi=FakeAmdSmi(mi300x(), compute_partition="CPX", memory_partition="NPS4"), sysfs_root=tmp_path)
    b.discover()
    assert b.partition_modes()[0] == ("CPX", "NPS4")


def test_other_errors_raise_backend_error():
    fake = FakeAmdSmi(mi300x())
    fake.fail("amdsmi_get_gpu_device_bdf", 8)  # AMDSMI_STATUS_TIMEOUT
    with pytest.raises(BackendError, match=r"amdsmi_get_gpu_device_bdf failed for device 0.*status 8"):
        AmdBackend(amdsmi=fake).discover()
    assert fake.initialized == 0


def test_init_failure_is_unavailable():
    fake = FakeAmdSmi(mi300x())
    fake.fail("amdsmi_init", 18)
    info = AmdBackend(amdsmi=fake).available()
    assert not info.available and "amdsmi_init failed" in info.reason and info.hint
    with pytest.raises(BackendUnavailable):
        AmdBackend(amdsmi=fake).discover()


def test_no_gpus_is_unavailable():
    info = AmdBackend(amdsmi=FakeAmdSmi(NodeTopology())).available()
    assert not info.available and "no AMD GPU" in info.reason


def test_available_on_fake_machine():
    assert AmdBackend(amdsmi=FakeAmdSmi(mi300x())).available().available


@pytest.mark.parametrize("error", [ImportError("No module named 'amdsmi'"), OSError("libamd_smi.so: cannot open shared object file")])
def test_missing_amdsmi_is_unavailable_with_hint(monkeypatch, error):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "amdsmi":
            raise error
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    info = AmdBackend().available()
    assert not info.available and "amdsmi is not importable" in info.reason and "pip install amdsmi" in info.hint


@pytest.mark.parametrize("text, cpus", [("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)), ("5", (5,)), ("", None)])
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus
