"""The gang placer's node state reconciles the agent's snapshot (up to a second old) with Ray's fresh GPU count."""

from __future__ import annotations

from types import SimpleNamespace

from rayaccel import catalog
from rayaccel.ray.driver.gangs import live_state
from rayaccel.ray.driver.view import Claims


def _node(free, available, drained=()):
    topo = catalog.load("dgx-a100")
    state = SimpleNamespace(free=tuple(free), drained=tuple(drained), mig_held=())
    return SimpleNamespace(node_id="n0", topology=topo, state=state, gpus_available=float(available))


def test_fewer_free_when_ray_counts_fewer():
    st = live_state(_node(free=range(8), available=5))
    assert sorted(set(range(8)) - st.taken()) == [0, 1, 2, 3, 4]


def test_work_the_snapshot_still_shows_has_ended_when_ray_counts_more():
    st = live_state(_node(free=(4, 5, 6, 7), available=8))  # a gang on 0-3 exited since the snapshot
    assert st.taken() == frozenset()
    st = live_state(_node(free=(6, 7), available=4))
    assert sorted(set(range(8)) - st.taken()) == [0, 1, 6, 7]


def test_drained_devices_and_young_claims_stay_busy():
    c = Claims(grace_s=60)
    c.add("n0", (2,), 1.0)  # submitted by this driver, not in Ray's count yet
    st = live_state(_node(free=(6, 7), available=8, drained=(0,)), c)
    assert st.taken() >= {0, 2}
    assert sorted(set(range(8)) - st.taken()) == [1, 3, 4, 5, 6, 7]


def test_no_snapshot_is_ray_counts_alone():
    n = _node(free=(), available=3)
    n.state = None
    st = live_state(n)
    assert sorted(set(range(8)) - st.taken()) == [0, 1, 2]
