"""MIG instances and layouts; GPU memory packing."""

from __future__ import annotations

import pytest

from rayaccel.errors import RequestError
from rayaccel.placement import NodeState, Request, plan, plan_mig_layout
from rayaccel.topology import Device, NodeTopology, Partition

from machines import GiB, mig_gpu, pcie8


def _h100(partitions=()):
    return NodeTopology((mig_gpu(0, tuple(partitions)),), name="h100-mig")


def test_mig_3g_on_h100_after_a_1g_at_slot_0_goes_to_start_4():
    topo = _h100([Partition(0, "1g.10gb", gi_id=7, start=0, size=1)])
    layout = plan_mig_layout(topo, ["3g.40gb"])
    assert layout.placed == 1
    (ni,) = layout.create
    assert (ni.gpu, ni.profile.name, ni.start) == (0, "3g.40gb", 4)
    assert layout.commands() == ["nvidia-smi mig -i 0 -cgi 9:4 -C"]


def test_layout_fits_the_most_requests_and_never_overlaps():
    topo = NodeTopology((mig_gpu(0), mig_gpu(1)), name="2xh100")
    reqs = ["3g.40gb", "3g.40gb", "4g.40gb", "1g.10gb", "1g.10gb", "1g.10gb", "7g.80gb"]
    layout = plan_mig_layout(topo, reqs)
    # 16 slices: 4g(4)+3g(4) on one GPU, 3g(4)+3x1g on the other; the 7g cannot fit too
    assert layout.placed == 6
    assert [i for i, _ in layout.unplaced] == [6]
    for gpu in (0, 1):
        spans = sorted((ni.start, ni.end) for ni in layout.create if ni.gpu == gpu)
        for (s1, e1), (s2, _) in zip(spans, spans[1:]):
            assert e1 <= s2
        for ni in layout.create:
            assert ni.start in ni.profile.placements


def test_layout_keeps_busy_instances_and_reuses_free_ones():
    busy = Partition(0, "3g.40gb", gi_id=1, start=0, size=4)
    free = Partition(0, "1g.10gb", gi_id=9, start=4, size=1)
    topo = _h100([busy, free])
    layout = plan_mig_layout(NodeState(topo, busy_partitions=frozenset({busy.key})), ["1g.10gb", "3g.40gb", "2g.20gb"])
    assert layout.assigned[0] == free  # reused
    assert 1 in dict(layout.unplaced)  # 3g at 4 overlaps the free 1g at 4; 3g at 0 is busy
    assert all(ni.start >= 5 for ni in layout.create)
    reclaim = plan_mig_layout(NodeState(topo, busy_partitions=frozenset({busy.key})), ["3g.40gb"], reclaim_free=True)
    assert reclaim.placed == 1 and reclaim.destroy == (free,)
    assert reclaim.commands()[0] == "nvidia-smi mig -i 0 -gi 9 -dci"


def test_place_on_existing_instance_and_rejection_lists_free_profiles():
    parts = [Partition(0, "1g.10gb", gi_id=i, start=i, size=1) for i in (0, 1)]
    topo = _h100(parts)
    a = plan(topo, mig="1g.10gb")
    assert a.partitions == (parts[0],) and a.devices == (0,)
    a2 = plan(NodeState(topo, busy_partitions=frozenset({parts[0].key})), Request(mig="1g.10gb"))
    assert a2.partitions == (parts[1],)
    r = plan(topo, mig="3g.40gb")
    assert not r and "no free MIG instance of profile 3g.40gb (free: 1g.10gb x2)" in r.reasons
    assert "plan_mig_layout" in r.reasons[1]


def test_mig_request_must_be_a_profile():
    with pytest.raises(RequestError):
        plan_mig_layout(_h100(), [Request(gpus=1)])


# ------------------------------------------------------------------ memory
def test_shared_memory_best_fit_and_never_oversubscribed():
    topo = pcie8()  # 48 GiB each
    st = NodeState(topo, memory_used={0: 40 * GiB, 1: 20 * GiB, 2: 30 * GiB})
    a = plan(st, gpu_memory="10GiB", exclusive=False)
    assert a.devices == (2,) and a.memory_bytes == {2: 10 * GiB}  # leaves 8 GiB: the tightest fit
    a = plan(st, gpu_memory="20GiB", exclusive=False)
    assert a.devices == (1,)
    r = plan(NodeState(topo, busy=frozenset(range(1, 8)), memory_used={0: 40 * GiB}), gpu_memory="20GiB", exclusive=False)
    assert not r and "device 0 has 8.0 GiB free, 20.0 GiB asked" in r.reasons


def test_whole_device_and_shared_do_not_double_book():
    topo = pcie8()
    st = NodeState(topo, busy=frozenset({0}), memory_used={1: GiB})
    a = plan(st, gpus=6)
    assert 0 not in a.devices and 1 not in a.devices
    assert not plan(st, gpus=7)
    s = plan(NodeState(topo, busy=frozenset(range(1, 8))), gpu_memory="1GiB", exclusive=False)
    assert s.devices == (0,)
    assert not plan(NodeState(topo, busy=frozenset(range(8))), gpu_memory="1GiB", exclusive=False)


def test_exclusive_gpu_memory_filters_devices():
    devs = tuple(Device(i, memory_bytes=(80 if i % 2 else 40) * GiB, numa_node=0) for i in range(4))
    topo = NodeTopology(devs, name="mixed-memory")
    a = plan(topo, gpus=2, gpu_memory="64GiB")
    assert set(a.devices) == {1, 3}
