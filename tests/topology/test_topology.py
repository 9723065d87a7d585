"""The topology model: invariants, link ordering, JSON round trip and validation messages."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayaccel.errors import TopologyError
from rayaccel.topology import (
    PCIE_CLASSES,
    SCHEMA,
    Device,
    Link,
    MigProfile,
    Nic,
    NodeTopology,
    Partition,
    make_link,
)


def _two_socket() -> NodeTopology:
    devs = tuple(Device(i, model="Tesla V100", memory_bytes=32 << 30, numa_node=i // 2, cpus=tuple(range(i // 2 * 4, i // 2 * 4 + 4))) for i in range(4))
    links = (
        make_link(0, 1, "nvlink", 2, "PIX"),
        make_link(0, 2, "pcie", pcie="SYS"),
        make_link(0, 3, "pcie", pcie="SYS"),
        make_link(1, 2, "pcie", pcie="SYS"),
        make_link(1, 3, "pcie", pcie="SYS"),
        make_link(2, 3, "pcie", pcie="PXB"),
    )
    nic = Nic("mlx5_0", 0, ((0, "PIX"), (1, "PIX"), (2, "SYS"), (3, "SYS")), rdma=True)
    return NodeTopology(devices=devs, links=links, nics=(nic,), hostname="box", driver="550.54").validate()


def test_link_ordering_direct_beats_every_pcie_class():
    nv1 = Link(0, 1, "nvlink", 1)
    nv2 = Link(0, 1, "nvlink", 2)
    ranks = [Link(0, 1, "pcie", pcie=c).rank for c in PCIE_CLASSES]
    assert nv2.rank > nv1.rank > ranks[0]
    assert ranks == sorted(ranks, reverse=True), "PIX > PXB > PHB > NODE > SYS"


def test_bandwidth_from_one_table():
    assert Link(0, 1, "nvlink", 18).bandwidth_gbps == 450.0
    assert Link(0, 1, "pcie", pcie="SYS").bandwidth_gbps < Link(0, 1, "pcie", pcie="PIX").bandwidth_gbps


def test_queries():
    t = _two_socket()
    assert t.link(1, 0).count == 2
    assert t.rank(2, 3) > t.rank(0, 2)
    assert t.direct_domains() == [frozenset({0, 1}), frozenset({2}), frozenset({3})]
    assert t.numa_nodes() == (0, 1)
    sub = t.subset([2, 3])
    assert sub.indices == (2, 3) and len(sub.links) == 1 and sub.nics[0].paths == ((2, "SYS"), (3, "SYS"))


def test_json_round_trip_with_mig():
    prof = MigProfile("3g.40gb", 9, 2, 40192, (0, 4), 4, 60)
    dev = Device(0, model="NVIDIA H100 80GB HBM3", mig_mode=True, mig_profiles=(prof,),
                 partitions=(Partition(0, "3g.40gb", "MIG-abc", 2, 0, 4, 4, 40192 << 20, 60),))
    t = NodeTopology(devices=(dev,), name="h100-mig", sources=("test",))
    data = json.loads(t.to_json())
    assert data["schema"] == SCHEMA
    assert data["devices"][0]["mig_profiles"][0]["placements"] == [0, 4]
    assert NodeTopology.from_json(t.to_json()) == t
    t2 = _two_socket()
    assert NodeTopology.from_json(t2.to_json()) == t2


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.pop("schema"), "schema"),
        (lambda d: d["devices"][1].update(numa_node="zero"), "devices[1].numa_node"),
        (lambda d: d["devices"][0].update(cpus=[1, "x"]), "devices[0].cpus"),
        (lambda d: d["links"][0].update(kind="infiniband"), "links[0].kind"),
        (lambda d: d["links"][0].update(pcie="FOO"), "links[0].pcie"),
        (lambda d: d["links"][0].update(b=9), "links[0]"),
        (lambda d: d["devices"][1].update(index=0), "devices[1].index"),
        (lambda d: d["devices"][0].update(health="sad"), "devices[0].health"),
        (lambda d: d["nics"][0]["paths"].update(x="PIX"), "nics[0].paths"),
    ],
    ids=["no-schema", "numa-type", "cpus-type", "link-kind", "pcie-class", "unknown-device", "dup-index", "health", "nic-key"],
)
def test_validation_names_the_field(mutate, field):
    d = _two_socket().to_dict()
    mutate(d)
    with pytest.raises(TopologyError) as e:
        NodeTopology.from_dict(d)
    assert e.value.field == field or str(e.value).startswith(field)


def test_malformed_json_says_where(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('{"schema": "rayaccel.topology/1", "devices": [}')
    with pytest.raises(TopologyError, match=r"t.json: not valid JSON: .* line 1"):
        NodeTopology.load(p)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 8),
    data=st.data(),
)
def test_round_trip_random(n, data):
    devs = tuple(Device(i, numa_node=data.draw(st.one_of(st.none(), st.integers(0, 3)))) for i in range(n))
    links = []
    for a in range(n):
        for b in range(a + 1, n):
            kind = data.draw(st.sampled_from(["nvlink", "xgmi", "pcie", None]))
            if kind == "pcie":
                links.append(Link(a, b, "pcie", pcie=data.draw(st.sampled_from(PCIE_CLASSES))))
            elif kind:
                links.append(Link(a, b, kind, data.draw(st.one_of(st.none(), st.integers(1, 18)))))
    t = NodeTopology(devices=devs, links=tuple(links)).validate()
    assert NodeTopology.from_json(t.to_json()) == t


def test_load_binary_file_is_a_clear_error(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    with pytest.raises(TopologyError, match="not a text file"):
        NodeTopology.load(p)
