"""The NVLink fabric in the model: JSON, validation, a node's domain, the NIC next to each GPU, racks of trays."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from rayaccel import catalog
from rayaccel.discovery.capture import import_captures
from rayaccel.errors import CatalogError, RequestError, TopologyError
from rayaccel.topology import (
    Device, Domain, Fabric, Nic, NodeTopology, make_link, near_nics, nvlink_domain, nvlink_domain_reason,
)
from rayaccel.topology.domain import ZERO_UUID

CAPTURES = Path(__file__).parent.parent / "data" / "captures"
RACK_A = "9c6f5af3-53bf-49b5-a436-b66766c413c3"
RACK_B = "dc6e40c4-d722-4357-9ba6-5291dd461278"


def tray(*fabrics: Fabric | None) -> NodeTopology:
    devs = tuple(Device(i, model="NVIDIA GB200", fabric=f) for i, f in enumerate(fabrics))
    links = tuple(make_link(a, b, "nvlink", 18) for a in range(len(devs)) for b in range(a + 1, len(devs)))
    return NodeTopology(devices=devs, links=links, hostname="tray").validate()


def done(uuid: str = RACK_A, clique: int = 7, status: int = 0) -> Fabric:
    return Fabric("completed", uuid, clique, status)


# ---------------------------------------------------------------- JSON and validation
def test_fabric_round_trips_in_nvml_names():
    t = tray(done(), done(), Fabric("completed", RACK_A, 7, 0, health_mask=2), done())
    d = t.to_dict()
    assert d["devices"][0]["fabric"] == {"cluster_uuid": RACK_A, "clique_id": 7, "state": "completed", "status": 0}
    assert d["devices"][2]["fabric"]["health_mask"] == 2
    assert NodeTopology.from_json(t.to_json()) == t


def test_no_fabric_writes_no_key_and_reads_back_none():
    t = catalog.load("dgx1-v100")
    assert all("fabric" not in dev for dev in t.to_dict()["devices"])
    d = t.to_dict()
    d["devices"][0]["fabric"] = None
    assert NodeTopology.from_dict(d).devices[0].fabric is None


def test_upper_case_uuid_is_read_as_lower_case():
    d = tray(done()).to_dict()
    d["devices"][0]["fabric"]["cluster_uuid"] = RACK_A.upper()
    assert NodeTopology.from_dict(d).devices[0].fabric.cluster_uuid == RACK_A


@pytest.mark.parametrize("fabric, field, words", [
    ({"state": "done"}, "devices[0].fabric.state", "expected one of not_supported, not_started, in_progress, completed"),
    ({"cluster_uuid": RACK_A}, "devices[0].fabric.state", "missing"),
    ({"state": "completed", "cluster_uuid": "rack-a"}, "devices[0].fabric.cluster_uuid", "expected a UUID"),
    ({"state": "completed", "cluster_uuid": 7}, "devices[0].fabric.cluster_uuid", "expected str"),
    ({"state": "completed", "clique_id": -1}, "devices[0].fabric.clique_id", "0..4294967295"),
    ({"state": "completed", "clique_id": 1 << 32}, "devices[0].fabric.clique_id", "0..4294967295"),
    ({"state": "completed", "clique_id": True}, "devices[0].fabric.clique_id", "expected int"),
    ({"state": "completed", "status": 5000}, "devices[0].fabric.status", "0..999"),
    ({"state": "completed", "health_mask": -2}, "devices[0].fabric.health_mask", "0..4294967295"),
    ({"state": "in_progress", "cluster_uuid": RACK_A}, "devices[0].fabric", "leave cluster_uuid and clique_id null"),
    ("completed", "devices[0].fabric", "expected an object or null"),
], ids=["state", "no-state", "uuid-text", "uuid-int", "clique-neg", "clique-big", "clique-bool", "status", "mask",
        "uuid-before-completed", "not-object"])
def test_bad_fabric_fields_are_named(fabric, field, words):
    d = tray(done()).to_dict()
    d["devices"][0]["fabric"] = fabric
    with pytest.raises(TopologyError) as e:
        NodeTopology.from_dict(d)
    assert str(e.value).startswith(field + ":") and words in str(e.value)


@pytest.mark.parametrize("port", [0, 256, "1", True])
def test_bad_nic_port_is_named(port):
    d = catalog.load("dgx-a100").to_dict()
    d["nics"][3]["port"] = port
    with pytest.raises(TopologyError, match=r"^nics\[3\]\.port: "):
        NodeTopology.from_dict(d)


def test_nic_port_round_trips_and_defaults_to_one_in_ucx_form():
    d = catalog.load("dgx-a100").to_dict()
    d["nics"][1]["port"] = 2
    t = NodeTopology.from_dict(d)
    assert t.nics[1].ucx_device == "mlx5_1:2" and t.nics[0].ucx_device == "mlx5_0:1"
    assert NodeTopology.from_json(t.to_json()) == t
    assert "port" not in catalog.load("dgx-a100").to_dict()["nics"][0]


def test_constructed_fabric_is_validated_too():
    with pytest.raises(TopologyError, match=r"devices\[1\]\.fabric\.cluster_uuid"):
        tray(done(), Fabric("completed", RACK_A.upper(), 1))


# ---------------------------------------------------------------- nvlink_domain
@pytest.mark.parametrize("fabrics, domain, reason", [
    ((done(),) * 4, Domain(RACK_A, 7), None),
    ((done(),), Domain(RACK_A, 7), None),
    ((None,) * 4, None, "the GPUs report no NVLink fabric"),
    ((done(), None, done(), None), None, "GPUs 1, 3 report no NVLink fabric"),
    ((done(), Fabric("in_progress"), done(), done()), None, "GPU 1: fabric registration in progress"),
    ((done(), done(), Fabric("not_started"), done()), None, "GPU 2: fabric registration not started"),
    ((done(), done(), done(), done(status=23)), None, "GPU 3: fabric registration failed (NVML error 23)"),
    ((done(ZERO_UUID, 0),) * 4, None, "cluster UUID is all zeros"),
    ((done(), done(), done(RACK_B), done(RACK_B)), None, "disagree"),
    ((done(clique=1), done(clique=2)), None, "disagree"),
    ((Fabric("completed", None, None), done()), None, "GPU 0: the fabric reports no cluster UUID"),
], ids=["agree", "one-gpu", "none", "some-missing", "in-progress", "not-started", "failed", "zero-uuid",
        "two-clusters", "two-cliques", "completed-without-ids"])
def test_nvlink_domain(fabrics, domain, reason):
    t = tray(*fabrics)
    assert nvlink_domain(t) == domain
    got = nvlink_domain_reason(t)
    assert (got is None) if reason is None else (reason in got)


def test_disagreement_names_every_group():
    why = nvlink_domain_reason(tray(done(), done(RACK_B, 3), done(), done(RACK_B, 3)))
    assert f"GPU 0, 2 in {RACK_A}.7" in why and f"GPU 1, 3 in {RACK_B}.3" in why


def test_domain_name_is_a_valid_ray_label_value():
    from ray._private.label_utils import validate_label_value

    name = Domain("ffffffff-ffff-ffff-ffff-ffffffffffff", (1 << 32) - 1).name
    assert len(name) <= 63
    validate_label_value(name)


def test_only_nvidia_gpus_count():
    amd = catalog.load("mi300x-8x")
    assert nvlink_domain(amd) is None and nvlink_domain_reason(amd) == "no NVIDIA GPU on this node"
    assert nvlink_domain_reason(NodeTopology()) == "no NVIDIA GPU on this node"


@pytest.mark.parametrize("name, domain", [("gb200-nvl72-tray", True), ("gb300-nvl72-tray", True),
                                          ("hgx-h100", False), ("dgx-a100", False), ("nvl72", False)])
def test_catalog_domains(name, domain):
    t = catalog.load(name)
    assert (nvlink_domain(t) is not None) == domain, nvlink_domain_reason(t)


@pytest.mark.parametrize("capture, reason", [
    ("110_nvsmi-q-h100-sxm-8gpu-fabric-completed-zero-uuid.txt", "all zeros"),
    ("111_nvsmi-q-h100nvl-2gpu-fabric-na.txt", "report no NVLink fabric"),
    ("112_nvsmi-q-grep-gb200-fabric-completed-unhealthy.txt", None),
    ("113_nvsmi-q-fabric-block-completed-insufficient-resources.txt", "failed (NVML error 23)"),
])
def test_domains_of_real_captures(capture, reason):
    t = import_captures([CAPTURES / capture]).topology
    got = nvlink_domain_reason(t)
    if reason is None:
        assert got is None and nvlink_domain(t) == Domain(RACK_B, 2)
    else:
        assert reason in got and nvlink_domain(t) is None


# ---------------------------------------------------------------- near_nics
def test_dgx_a100_capture_each_gpu_gets_its_own_mlx5_pair():
    t = import_captures([CAPTURES / "01_dgx-a100-8gpu-10nic.txt"]).topology
    for g in range(8):
        pair = g // 2 * 2
        assert near_nics(t, [g]) == (f"mlx5_{pair}:1", f"mlx5_{pair + 1}:1")
    assert near_nics(t, [5, 0, 1]) == ("mlx5_4:1", "mlx5_5:1", "mlx5_0:1", "mlx5_1:1")


def _nics(*rows: tuple[str, bool, dict[int, str]]) -> NodeTopology:
    devs = tuple(Device(i) for i in range(2))
    nics = tuple(Nic(name, None, tuple(sorted(paths.items())), rdma=rdma) for name, rdma, paths in rows)
    return NodeTopology(devices=devs, links=(make_link(0, 1, "pcie", pcie="PXB"),), nics=nics).validate()


def test_pix_beats_pxb_and_non_rdma_nics_are_ignored():
    t = _nics(("mlx5_0", True, {0: "PXB", 1: "PIX"}), ("mlx5_1", True, {0: "PIX", 1: "PXB"}),
              ("eth0", False, {0: "PIX", 1: "PIX"}), ("mlx5_2", True, {0: "PXB", 1: "PXB"}))
    assert near_nics(t, [0]) == ("mlx5_1:1",)
    assert near_nics(t, [1]) == ("mlx5_0:1",)
    assert near_nics(t, [0, 1]) == ("mlx5_1:1", "mlx5_0:1")


def test_nothing_closer_than_pxb_names_no_nic():
    t = _nics(("mlx5_0", True, {0: "PHB", 1: "NODE"}), ("mlx5_1", True, {0: "SYS"}))
    assert near_nics(t, [0, 1]) == ()
    assert near_nics(t, []) == ()


def test_unknown_device_is_a_key_error():
    with pytest.raises(KeyError):
        near_nics(catalog.load("dgx-a100"), [8])


def test_grace_blackwell_tray_has_no_nic_at_pix_or_pxb():
    for t in (import_captures([CAPTURES / "114_gb200-tray-4gpu-nv18-8nic-all-sys-rhel4nv.txt"]).topology,
              catalog.load("gb200-nvl72-tray")):
        assert all(near_nics(t, [g]) == () for g in range(4))


def _corpus() -> list[NodeTopology]:
    out = []
    for p in sorted(CAPTURES.glob("*.txt")):
        try:
            out.append(import_captures([p]).topology)
        except Exception:  # noqa: BLE001 - rejected captures are tested in test_capture_corpus
            continue
    return out


def test_every_named_nic_is_rdma_at_pix_or_pxb_from_its_gpu_across_the_corpus():
    named = 0
    for t in _corpus():
        by_ucx = {n.ucx_device: n for n in t.nics}
        for d in t.devices:
            got = near_nics(t, [d.index])
            named += len(got)
            classes = {by_ucx[u].path_to(d.index) for u in got}
            assert all(by_ucx[u].rdma for u in got) and classes <= {"PIX", "PXB"} and len(classes) <= 1
            closer = {"PIX"} if classes == {"PXB"} else set()
            assert not any(n.rdma and n.path_to(d.index) in closer for n in t.nics), "a nearer NIC was skipped"
    assert named > 50


# ---------------------------------------------------------------- racks
def test_a_rack_is_eighteen_trays_in_one_domain_and_racks_differ():
    r0, r1 = catalog.rack("gb200-nvl72-tray", rack=0), catalog.rack("gb200-nvl72-tray", rack=1)
    assert len(r0) == 18 and all(len(t.devices) == 4 for t in r0)
    assert len({t.hostname for t in r0 + r1}) == 36
    assert len({d.uuid for t in r0 + r1 for d in t.devices}) == 144
    assert len({nvlink_domain(t) for t in r0}) == 1 and len({nvlink_domain(t) for t in r1}) == 1
    assert nvlink_domain(r0[0]) != nvlink_domain(r1[0])
    assert nvlink_domain(r1[0]).clique_id == 2
    assert catalog.rack("gb200-nvl72-tray", trays=2, rack=1) == r1[:2]  # deterministic


def test_rack_trays_round_trip_and_keep_the_tray_wiring():
    base = catalog.load("gb300-nvl72-tray")
    (t,) = catalog.rack("gb300-nvl72-tray", trays=1, rack=3)
    assert NodeTopology.from_json(t.to_json()) == t
    assert t.links == base.links and t.nics == base.nics
    assert [replace(d, uuid=None, fabric=None) for d in t.devices] == [replace(d, uuid=None, fabric=None)
                                                                       for d in base.devices]


@pytest.mark.parametrize("kw, err, words", [
    ({"trays": 0}, RequestError, "trays: must be an int in 1..18"),
    ({"trays": 19}, RequestError, "trays: must be an int in 1..18"),
    ({"trays": "18"}, RequestError, "trays"),
    ({"rack": -1}, RequestError, "rack: must be an int in 0..4095"),
    ({"name": "hgx-h100"}, CatalogError, "not an NVL72 compute tray"),
    ({"name": "gb200-nvl72"}, CatalogError, "unknown catalog machine"),
])
def test_rack_rejects_bad_arguments(kw, err, words):
    with pytest.raises(err, match=words):
        catalog.rack(**kw)


def test_catalog_tray_facts():
    t = catalog.load("gb200-nvl72-tray")
    assert [d.numa_node for d in t.devices] == [0, 0, 1, 1]
    assert t.devices[2].cpus == tuple(range(72, 144))
    assert {(l.label, l.bandwidth_gbps) for l in t.links} == {("NV18", 900.0)}
    assert [n.name for n in t.nics] == [f"mlx5_{k}" for k in range(8)]
    assert json.loads(t.to_json())["devices"][0]["memory_bytes"] == 189471 << 20


def test_rack_trays_go_to_a_simulated_cluster_as_they_are():
    """SimulatedCluster takes topology objects (resolve_topology hands them through) and each node's
    published record keeps the tray's fabric, so every node of the cluster knows its domain."""
    from rayaccel.ray.record import NodeRecord
    from rayaccel.ray.node.start import resolve_topology

    trays = catalog.rack("gb200-nvl72-tray", trays=2, rack=0) + catalog.rack("gb200-nvl72-tray", trays=2, rack=1)
    assert [resolve_topology(t) for t in trays] == list(trays)
    again = [NodeRecord.from_json(NodeRecord("0123456789ab", t, True).to_json()).topology for t in trays]
    assert again == list(trays)
    assert [nvlink_domain(t).clique_id for t in again] == [1, 1, 2, 2]
