"""Gangs across NVLink domains in Ray, and gangs that hold under change (issue 14).

One module cluster: four ``gb200-nvl72-tray`` compute trays of two racks, interleaved --
trays 0 and 2 of rack 0, trays 1 and 3 of rack 1 (``catalog.rack``: one fabric cluster UUID
and clique per rack). Nothing labels them by hand: node start reads each tray's NVLink
domain from its GPUs' fabric and sets ``ray.io/gpu-domain`` and ``rayaccel.io/nvlink-clique``;
only the network level (which a ``--network-topology`` file would give) is passed in.
"""

from __future__ import annotations

import os
import re
import time

import pytest
from raytest_helpers import needs_feature, wait_idle

pytestmark = pytest.mark.ray  # a module cluster: the Ray tier, not the unit tier

RACKS = (0, 1, 0, 1)


def _trays():
    from rayaccel import catalog

    r0, r1 = (catalog.rack("gb200-nvl72-tray", trays=2, rack=r) for r in (0, 1))
    return [r0[0], r1[0], r0[1], r1[1]]


def _domains():
    from rayaccel.topology import nvlink_domain

    return tuple(nvlink_domain(t).name for t in _trays())


@pytest.fixture(scope="module")
def trays(ray_env):
    import ray

    from rayaccel.ray.driver.cluster import SimulatedCluster
    from rayaccel.ray.driver.places import place_labels

    if ray.is_initialized():  # the session cluster's driver connection: this module brings its own cluster
        ray.shutdown()
    topos = _trays()
    labels = [place_labels(levels={"block": "b0"}) for _ in topos]
    c = SimulatedCluster(topos, num_cpus=4, labels=labels, logging_level="ERROR", log_to_driver=False)
    try:
        yield c
    finally:
        c.shutdown()


@pytest.fixture
def idle_trays(trays):
    wait_idle(trays)
    yield trays
    wait_idle(trays, 15)  # a gang's exit frees its devices at once


def _domain_of(cluster):
    import ray

    by_id = {n["NodeID"]: n["Labels"] for n in ray.nodes() if n["Alive"]}
    return {n.node_id: by_id[n.node_id].get("ray.io/gpu-domain") for n in cluster.nodes}


def test_every_tray_carries_its_ray_gpu_domain_label(idle_trays):
    import ray

    labels = {n["NodeID"]: n["Labels"] for n in ray.nodes() if n["Alive"]}
    domains = _domains()
    assert domains[0] == domains[2] != domains[1] == domains[3]
    for i, n in enumerate(idle_trays.nodes):
        assert labels[n.node_id]["ray.io/gpu-domain"] == domains[i]
        assert labels[n.node_id]["rayaccel.io/nvlink-clique"] == str(RACKS[i] + 1)
        assert labels[n.node_id]["rayaccel.io/net-block"] == "b0"
        assert labels[n.node_id]["rayaccel.io/node-key"] == n.node_key  # rayaccel's own labels are kept


def _needs_topology_strategy():
    from rayaccel.ray import _ray_private as rp

    needs_feature(rp.TOPOLOGY_STRATEGY)


def test_an_unchanged_ray_topology_strategy_group_lands_in_one_domain(idle_trays):
    _needs_topology_strategy()
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    domain_of = _domain_of(idle_trays)
    for _ in range(2):
        pg = placement_group([{"GPU": 4}, {"GPU": 4}],
                             topology_strategy={"ray.io/gpu-domain": "STRICT_PACK", "ray.io/node-id": "STRICT_SPREAD"})
        try:
            ray.get(pg.ready(), timeout=60)
            nodes = list(placement_group_table(pg)["bundles_to_node_id"].values())
            assert len(set(nodes)) == 2 and len({domain_of[n] for n in nodes}) == 1
        finally:
            remove_placement_group(pg)
        wait_idle(idle_trays)


def _hog(node_id=None):
    """An actor holding one tray's 4 GPUs (on ``node_id`` when given)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_gpus=4, num_cpus=0)
    class Hog:
        def ping(self):
            return ray.get_runtime_context().get_node_id()

    opts = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)} if node_id else {}
    return Hog.options(**opts).remote()


def test_with_one_tray_busy_a_gang_takes_both_trays_of_the_other_domain(idle_trays):
    import ray

    import rayaccel
    from rayaccel.ray import _ray_private as rp

    needs_feature(rp.BUNDLE_LABELS, "Ray places a gang's bundles by PACK, not on the planned trays")

    domain_of = _domain_of(idle_trays)
    domains = _domains()
    for busy, node in enumerate(idle_trays.nodes):  # the last hog and gang ended just before: fresh counts
        hog = _hog(node.node_id)
        try:
            assert ray.get(hog.ping.remote(), timeout=60) == node.node_id
            with rayaccel.gang(workers=2, gpus_per_worker=4) as g:
                other = domains[1] if domains[busy] == domains[0] else domains[0]
                assert [domain_of[n.node_id] for n in g.nodes] == [other, other]
                assert len({n.node_id for n in g.nodes}) == 2
                assert g.allocation.scope == "domain" and g.allocation.domain == other
                assert f"decided by: NVLink domain {other}" in g.allocation.explain()
                assert g.devices() == [(0, 1, 2, 3), (0, 1, 2, 3)]
        finally:
            ray.kill(hog)
        wait_idle(idle_trays)


def _worker_logs() -> str:
    """Every worker log of this cluster's session."""
    import glob

    import ray

    logs = ray._private.worker._global_node.get_logs_dir_path()
    out = []
    for p in glob.glob(os.path.join(logs, "*worker*")) + glob.glob(os.path.join(logs, "python-core-worker*")):
        try:
            with open(p, errors="replace") as f:
                out.append(f.read())
        except OSError:
            continue
    return "\n".join(out)


ABORTS = re.compile(r"Fatal Python error|Unexpected poll revent|SIGABRT received|Aborted \(core dumped\)")


def test_gang_loop_holds_under_change_and_exits_cleanly(idle_trays, caplog):
    """The issue's loop: an actor takes one tray (not yet granted), a 2 x 4 gang starts at once; five times.

    The actor takes the tray the placer would choose first (the lowest node id: the view's order),
    the adversarial case of the race. Every gang runs (a plan gone stale is re-planned instead of
    waiting on a taken tray: without it 2 of 5 ran), every exit tears torch.distributed down
    without an abort, and the devices are free right after.
    """
    pytest.importorskip("torch")
    import ray

    import rayaccel

    def allreduce():
        import torch
        import torch.distributed as dist

        t = torch.ones(4) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        return float(t[0])

    before = len(ABORTS.findall(_worker_logs()))
    ran = 0
    first = sorted(n.node_id for n in idle_trays.nodes)[0]
    for _ in range(5):
        hog = _hog(first)
        with rayaccel.gang(workers=2, gpus_per_worker=4, timeout_s=60) as g:
            assert g.run(allreduce) == [3.0, 3.0]
            ran += 1
        ray.get(hog.ping.remote(), timeout=60)
        ray.kill(hog)
        wait_idle(idle_trays, 15)
    assert ran == 5
    time.sleep(1.0)  # let the workers' last lines reach their log files
    found = ABORTS.findall(_worker_logs())
    assert len(found) == before, f"worker aborts in the logs: {found[before:][:5]}"
    assert "closing torch.distributed failed" not in caplog.text
