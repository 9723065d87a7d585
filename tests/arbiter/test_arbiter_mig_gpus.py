"""A node given MIG UUIDs (``CUDA_VISIBLE_DEVICES=MIG-a,MIG-b``): its ``GPU`` slots stand for those instances.

The table's ``GPU`` resource is of kind ``mig`` (:func:`rayaccel.arbiter.build.build_table`'s
``gpu_instances``): any free instance, since instances have no links to choose by. Ray's rules, as
``resource_instance_set.cc`` grants them: whole slots are distinct instances; two ``num_gpus=0.5`` tasks
share one slot, so one instance; a slot another live holder uses never changes its instance.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rayaccel import catalog
from rayaccel.arbiter.build import build_table
from rayaccel.arbiter.choose import TableChooser
from rayaccel.arbiter.decide import GrantRequest, decide
from rayaccel.arbiter.state import fresh_state, snapshot_of
from rayaccel.arbiter.statefile import Arbiter
from rayaccel.topology import NodeTopology

KEY = "0123456789ab"


def two_mig_gpus() -> NodeTopology:
    """a100-mig's device and a twin at index 1 (its instances' UUIDs changed): two parents of instances."""
    t = catalog.load("a100-mig")
    d0 = t.devices[0]
    d1 = replace(d0, index=1, uuid=(d0.uuid or "GPU-0")[:-1] + "1",
                 partitions=tuple(replace(p, parent=1, uuid=p.uuid[:-1] + "f") for p in d0.partitions))
    return replace(t, devices=(d0, d1))


@pytest.fixture()
def node():
    topo = two_mig_gpus()
    keys = tuple(p.key for p in topo.partitions())  # 0:mig7 0:mig8 0:mig2 1:mig7 1:mig8 1:mig2
    table = build_table(topo, KEY, True, gpu_instances=keys)
    return topo, table


def _decide(st, table, topo, pid, slots, alive, drained=None):
    if drained:
        st = st._replace(drained=drained)
    return decide(st, GrantRequest(pid=pid, key=f"task:{pid}", slots={"GPU": slots}), table,
                  chooser=TableChooser(table, lambda: topo), alive=lambda p: p in alive, now=1.0)


def test_the_gpu_table_is_the_instances_by_uuid(node):
    topo, table = node
    gpu = table.resources["GPU"]
    assert gpu.kind == "mig" and table.gpu_instances() and "GPU" in table.unit_resources()
    assert gpu.units == tuple(p.key for p in topo.partitions())
    assert gpu.uuid_of == {p.key: p.uuid for p in topo.partitions()}
    assert gpu.device_of == {p.key: p.parent for p in topo.partitions()}
    assert not any(r.startswith("mig_") for r in table.resources)


def test_whole_slots_get_distinct_instances_named_with_their_parents(node):
    topo, table = node
    st = fresh_state(table.pools())
    st, a = _decide(st, table, topo, 1, ((0, 1.0),), {1})
    st, b = _decide(st, table, topo, 2, ((1, 1.0),), {1, 2})
    assert a.waiting is None and b.waiting is None
    assert a.units["GPU"] != b.units["GPU"]
    assert a.partitions == a.units["GPU"] and a.devices == (int(a.units["GPU"][0].split(":")[0]),)
    st, c = _decide(st, table, topo, 3, ((2, 1.0), (3, 1.0)), {1, 2, 3})
    assert len(set(c.units["GPU"]) | set(a.units["GPU"]) | set(b.units["GPU"])) == 4
    assert c.devices == tuple(dict.fromkeys(table.device_of("GPU", u) for u in c.units["GPU"]))


def test_two_halves_of_one_slot_share_its_instance(node):
    topo, table = node
    st = fresh_state(table.pools())
    st, a = _decide(st, table, topo, 1, ((0, 0.5),), {1})
    st, b = _decide(st, table, topo, 2, ((0, 0.5),), {1, 2})
    assert a.units == b.units and b.waiting is None


def test_a_share_never_moves_the_instance_of_a_live_sharer(node):
    """Regression: a slot whose instance was drained swapped images with a free slot even while another live
    holder used it fractionally, moving that holder's instance under it."""
    from rayaccel.arbiter.state import Drain

    topo, table = node
    st = fresh_state(table.pools())
    st, a = _decide(st, table, topo, 1, ((0, 0.5),), {1})
    parent = a.devices[0]
    pool = st.pools["GPU"]
    st, b = _decide(st, table, topo, 2, ((0, 0.5),), {1, 2}, drained={parent: Drain("test", 1.0, "operator")})
    assert b.waiting and "drained" in b.waiting
    assert st.pools["GPU"] == pool  # the sharer's instance stays behind its slot
    # whole, or alone on it: a drained instance's slot takes another instance
    st, c = _decide(st, table, topo, 3, ((0, 1.0),), {3}, drained={parent: Drain("test", 1.0, "operator")})
    assert c.waiting is None and table.device_of("GPU", c.units["GPU"][0]) != parent


def test_a_grant_never_swaps_with_its_own_other_slot(node):
    from rayaccel.arbiter.state import Drain

    topo, table = node
    st = fresh_state(table.pools())
    first = table.device_of("GPU", st.pools["GPU"][0])
    st, g = _decide(st, table, topo, 1, ((0, 1.0), (3, 1.0)), {1}, drained={first: Drain("test", 1.0, "operator")})
    assert g.waiting is None and len(set(g.units["GPU"])) == 2
    assert all(table.device_of("GPU", u) != first for u in g.units["GPU"])


def test_a_drain_placeholder_holds_every_instance_of_its_device(tmp_path):
    topo = two_mig_gpus()
    keys = tuple(p.key for p in topo.partitions())
    table = build_table(topo, KEY, True, gpu_instances=keys)
    alive = {1, 2}
    arb = Arbiter(tmp_path, table, topology=topo, alive=lambda p: p in alive)
    g = arb.grant(GrantRequest(pid=1, key="task:1", slots={"GPU": ((0, 1.0),)}))
    busy = g.devices[0]
    other = 1 - busy
    arb.drain(other, "test")
    n = sum(1 for k in keys if table.device_of("GPU", k) == other)
    # the agent's placeholder asks Ray for as many GPU slots as the device has instances (Ray gives free ones)
    ph = arb.grant(GrantRequest(pid=2, key="actor:ph", slots={"GPU": tuple((s, 1.0) for s in range(1, 1 + n))},
                                drain=other, info={"name": f"rayaccel-drain-{KEY}-{other}", "kind": "actor"}))
    assert sorted(table.device_of("GPU", u) for u in ph.units["GPU"]) == [other] * n
    snap = arb.snapshot()
    assert busy not in snap.free and other not in snap.free
    holder = next(h for h in snap.holders if h.pid == 1)
    assert holder.devices == (busy,) and holder.partitions == g.units["GPU"]
    assert g.units["GPU"][0] in snap.mig_held


def test_snapshot_names_the_instances_of_gpu_slots(node):
    topo, table = node
    st = fresh_state(table.pools())
    st, a = _decide(st, table, topo, 1, ((0, 0.5),), {1})
    snap = snapshot_of(st, table.device_of, at=1.0, unit_resources=table.unit_resources())
    (h,) = snap.holders
    assert h.devices == a.devices and h.partitions == a.units["GPU"] and h.shared
    assert snap.mig_held == a.units["GPU"] and snap.shared == {a.devices[0]: 0.5}


def test_a_share_of_an_instance_is_capped_by_the_instance_memory(node):
    """memcap's bytes per device: on a node given MIG UUIDs, the instance's memory (else the parent's)."""
    from types import SimpleNamespace

    from rayaccel.ray.worker import memcap
    from rayaccel.ray.worker.hook import device_bytes

    topo, table = node
    st = fresh_state(table.pools())
    st, g = _decide(st, table, topo, 1, ((0, 0.5),), {1})
    inst = next(p for p in topo.partitions() if p.key == g.units["GPU"][0])
    ns = SimpleNamespace(topology=topo)
    share = memcap.share_of((0.5,), g.devices, device_bytes(ns, g))
    assert share.bytes_by_device == {inst.parent: inst.memory_bytes // 2}
    unknown = replace(topo, devices=tuple(replace(d, partitions=tuple(replace(p, memory_bytes=None)
                                                                     for p in d.partitions)) for d in topo.devices))
    share = memcap.share_of((0.5,), g.devices, device_bytes(SimpleNamespace(topology=unknown), g))
    assert share.bytes_by_device == {inst.parent: topo.device(inst.parent).memory_bytes // 2}
