"""The GPU pool and the MIG pools (rayaccel.placement.pools), defined once, and placement staying inside them.

Regression (issue 17): Ray's pool left out devices holding MIG instances while placement
checked only ``mig_mode``, so a topology listing instances with the mode unknown validated,
advertised an empty ``GPU`` pool, and ``plan`` still picked device 0.
"""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from rayaccel import catalog
from rayaccel.placement import NodeState, Rejection, Request, place, plan
from rayaccel.placement.pools import gpu_pool, in_gpu_pool, mig_pools, mig_resource
from rayaccel.topology import Device, NodeTopology, Partition, make_link

from machines import GiB, mig_profiles, random_topology

A100 = "NVIDIA A100-SXM4-80GB"


def _partitioned_pair(mig_mode=None) -> NodeTopology:
    """Device 0 lists a MIG instance with ``mig_mode`` as given (unknown by default); device 1 is plain."""
    d0 = Device(0, model=A100, memory_bytes=80 * GiB, numa_node=0, mig_mode=mig_mode, mig_profiles=mig_profiles(),
                partitions=(Partition(0, "3g.40gb", uuid="MIG-aaaa", gi_id=1, start=0, size=4),))
    d1 = Device(1, model=A100, memory_bytes=80 * GiB, numa_node=0)
    return NodeTopology((d0, d1), (make_link(0, 1, "nvlink", 12, "SYS"),), name="partitioned-pair").validate()


def test_a_device_holding_mig_instances_is_out_of_the_pool_whatever_its_mode():
    topo = _partitioned_pair()
    assert topo.device(0).mig_mode is None  # the case that slipped through: the mode unknown
    assert gpu_pool(topo) == (1,)
    assert mig_pools(topo) == {"mig_3g.40gb": ("0:mig1",)}


def test_plan_never_picks_a_partitioned_device():
    topo = _partitioned_pair()
    one = plan(topo, gpus=1)
    assert one and one.devices == (1,)
    two = plan(topo, gpus=2)
    assert isinstance(two, Rejection)
    assert "1 is holding MIG instances (use mig=...): 0" in two.reasons
    req = plan(topo, gpus=1, required=(0,))
    assert isinstance(req, Rejection) and req.reasons == ("required device 0 is holding MIG instances (use mig=...)",)
    # the instance itself is still placeable, through mig=
    mig = plan(topo, Request(mig="3g.40gb", gpus=0))
    assert mig and mig.partitions[0].key == "0:mig1"


def test_a_single_partitioned_device_offers_no_whole_gpu():
    d0 = Device(0, model=A100, memory_bytes=80 * GiB, numa_node=0, mig_profiles=mig_profiles(),
                partitions=(Partition(0, "1g.10gb", uuid="MIG-bbbb", gi_id=9, start=0, size=1),))
    topo = NodeTopology((d0,), (), name="one-partitioned").validate()
    assert gpu_pool(topo) == ()
    r = plan(topo, gpus=1)
    assert isinstance(r, Rejection) and r.reasons[0] == "only 0 devices free, 1 asked"


def test_shared_memory_stays_off_partitioned_devices():
    r = plan(_partitioned_pair(), Request(gpu_memory="1GiB", exclusive=False, gpus=0))
    assert r and r.devices == (1,)


def test_the_cli_plan_agrees(tmp_path):
    from rayaccel.cli import app

    path = tmp_path / "t.json"
    _partitioned_pair().save(path)
    res = CliRunner().invoke(app, ["plan", "--topology", str(path), "--gpus", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["devices"] == [1]
    res = CliRunner().invoke(app, ["plan", "--topology", str(path), "--gpus", "2"])
    assert res.exit_code == 1 and "holding MIG instances" in res.output


@pytest.mark.parametrize("mig_mode,partitions,health,expected", [
    (None, False, "ok", True), (False, False, "ok", True), (True, False, "ok", False),
    (None, True, "ok", False), (False, True, "ok", False), (None, False, "failed", False),
], ids=["plain", "mig off", "mig on", "instances, mode unknown", "instances, mode off", "failed"])
def test_in_gpu_pool(mig_mode, partitions, health, expected):
    parts = (Partition(0, "1g.10gb", gi_id=1),) if partitions else ()
    assert in_gpu_pool(Device(0, mig_mode=mig_mode, partitions=parts, health=health)) is expected


def test_mig_pools_order_by_parent_then_gi_id_and_skip_failed_parents():
    def dev(i, parts, health="ok"):
        return Device(i, model=A100, memory_bytes=80 * GiB, mig_mode=True, health=health, partitions=parts)

    topo = NodeTopology((
        dev(1, (Partition(1, "1g.10gb", uuid="MIG-c", gi_id=13), Partition(1, "1g.10gb", uuid="MIG-d", gi_id=9))),
        dev(0, (Partition(0, "1g.10gb", uuid="MIG-e"), Partition(0, "3g.40gb", uuid="MIG-f", gi_id=2),
                Partition(0, "1g.10gb", uuid="MIG-g", gi_id=7))),
        dev(2, (Partition(2, "1g.10gb", uuid="MIG-h", gi_id=1),), health="failed"),
    ), (), name="mig-order")
    assert mig_pools(topo) == {"mig_3g.40gb": ("0:mig2",), "mig_1g.10gb": ("0:mig7", "0:MIG-e", "1:mig9", "1:mig13")}
    assert list(mig_pools(topo)) == ["mig_3g.40gb", "mig_1g.10gb"]  # in the order the first instance appears
    assert gpu_pool(topo) == ()
    assert mig_resource("1g.10gb") == "mig_1g.10gb"


def _machines():
    out = [(n, catalog.load(n)) for n in catalog.names()]
    rng = random.Random(5)
    for i in range(12):  # random machines with some devices in MIG mode, some with instances and the mode unknown
        t = random_topology(rng, rng.choice((2, 4, 8)))
        devs = []
        for d in t.devices:
            r = rng.random()
            if r < 0.15:
                d = Device(d.index, memory_bytes=d.memory_bytes, numa_node=d.numa_node, health=d.health,
                           partitions=(Partition(d.index, "1g.10gb", gi_id=1),))
            elif r < 0.25:
                d = Device(d.index, memory_bytes=d.memory_bytes, numa_node=d.numa_node, health=d.health, mig_mode=True)
            devs.append(d)
        out.append((f"random-{i}", NodeTopology(tuple(devs), t.links, t.nics, name=f"random-{i}").validate()))
    return out


@pytest.mark.parametrize("name,topo", _machines(), ids=lambda x: x if isinstance(x, str) else "")
def test_whole_device_placement_stays_inside_the_pool(name, topo):
    pool = set(gpu_pool(topo))
    rng = random.Random(name)
    for _ in range(20):
        busy = frozenset(d.index for d in topo.devices if rng.random() < 0.3)
        k = rng.randint(1, max(1, len(topo.devices)))
        a = plan(NodeState(topo, busy=busy), gpus=k)
        if a:
            assert set(a.devices) <= pool - busy, (name, sorted(busy), k, a.devices)
        else:
            assert len(pool - busy) < k or a.reasons, (name, k)
    c = place([NodeState(topo, node_id="a"), NodeState(topo, busy=frozenset(pool), node_id="b")], Request(gpus=1))
    if pool:
        assert c and c.node == "a" and set(c.devices) <= pool
    else:
        assert not c


def test_the_node_table_offers_exactly_the_pools():
    """The arbiter's units per resource are the pools (one definition: the table is built from them)."""
    from rayaccel.arbiter.build import build_table

    for name in catalog.names():
        topo = catalog.load(name)
        t = build_table(topo, "0123456789ab", True)
        assert t.resources["GPU"].units == gpu_pool(topo), name
        assert {r: x.units for r, x in t.resources.items() if r != "GPU"} == mig_pools(topo), name