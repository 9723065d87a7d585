"""RL and LLM frameworks on rayaccel (issue 21 items 1-4), on two simulated DGX-1 nodes.

* the placement map: before any task runs in a placement group, ``rayaccel.placement_map(pg)`` says per
  bundle the node and the devices its workers will see -- and they do, bundle by bundle, whatever
  order they arrive in; each {"GPU": 2} bundle of a PACK group is an NV2 pair; the NICs are named;
* the colocated pattern (trainer + rollout at 0.5 + 0.5 GPU per {"GPU": 1} bundle) keeps each pair
  on one device, across an actor restart;
* ``rayaccel.rank_order`` puts each TP group of 4 on an all-NVLink quad of the DGX-1;
* ``--nic-env``: NCCL_IB_HCA, NVSHMEM_HCA_LIST and NCCL_SOCKET_IFNAME written from the near NICs
  the host has (a sysfs directory listing them), never over a value the user set;
* one clear error for a removed, unknown or unplaced group -- never a hang.
"""

from __future__ import annotations

import pytest
from raytest_helpers import wait_for, wait_idle

from rayaccel import catalog
from rayaccel.topology import near_nics

pytestmark = pytest.mark.ray

DGX1 = catalog.load("dgx1-v100")
QUADS = ({0, 1, 2, 3}, {4, 5, 6, 7})
NIC_ENV = "NCCL_IB_HCA,NVSHMEM_HCA_LIST,NCCL_SOCKET_IFNAME"


@pytest.fixture(scope="module")
def host_ib(tmp_path_factory):
    """A sysfs ``class/infiniband`` listing the DGX-1's four mlx5 devices, each with its netdev (ib0..ib3)."""
    d = tmp_path_factory.mktemp("infiniband")
    for i, n in enumerate(DGX1.nics):
        (d / n.name / "device" / "net" / f"ib{i}").mkdir(parents=True)
    return str(d)


@pytest.fixture(scope="module")
def two_dgx1(ray_env, host_ib):
    import ray

    from rayaccel.ray.driver.cluster import SimulatedCluster

    if ray.is_initialized():  # the session cluster's driver connection: this module brings its own cluster
        ray.shutdown()
    c = SimulatedCluster(["dgx1-v100", "dgx1-v100"], num_cpus=4, nic_env=NIC_ENV,
                         env={"RAYACCEL_IB_DIR": host_ib}, logging_level="ERROR", log_to_driver=False)
    try:
        yield c
    finally:
        c.shutdown()


@pytest.fixture
def cluster2(two_dgx1):
    wait_idle(two_dgx1)
    yield two_dgx1
    wait_idle(two_dgx1)


def _group(bundles, strategy="PACK"):
    import ray
    from ray.util.placement_group import placement_group

    pg = placement_group(bundles, strategy=strategy)
    ray.get(pg.ready(), timeout=60)
    return pg


def _in(pg, b):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b)


@pytest.fixture(scope="module")
def Probe():
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def where(self):
            import os

            import rayaccel

            a = rayaccel.get_devices()
            env = {v: os.environ.get(v) for v in ("CUDA_VISIBLE_DEVICES", "UCX_NET_DEVICES", "NCCL_IB_HCA",
                                                  "NVSHMEM_HCA_LIST", "NCCL_SOCKET_IFNAME")}
            return {"node": ray.get_runtime_context().get_node_id(), "devices": a.indices, "nics": a.nics,
                    "pid": os.getpid(), **env}

    return Probe


def test_the_map_before_any_task_is_what_each_bundle_then_sees(cluster2, Probe):
    import ray
    from ray.util import remove_placement_group

    import rayaccel

    pg = _group([{"GPU": 2}] * 4)
    try:
        m = rayaccel.placement_map(pg, timeout_s=30)
        assert len(m) == 4 and m.strategy == "PACK"
        for b in m.bundles:
            assert len(b.devices) == 2 and b.node_key is not None and b.why is None
            x, y = b.indices
            link = DGX1.link(x, y)
            assert link is not None and link.kind == "nvlink" and link.count == 2, (b.bundle, b.indices)  # NV2
            assert b.nics and b.nics == near_nics(DGX1, b.indices)  # NICs are named, as get_devices() names them
            assert b.node_ip and b.cpus and b.numa_nodes == tuple(sorted({DGX1.device(i).numa_node for i in b.indices}))
            assert all(d.model for d in b.devices)
        assert len({i for b in m.bundles if b.node_id == m[0].node_id for i in b.indices}) == \
            2 * sum(1 for b in m.bundles if b.node_id == m[0].node_id)  # no device in two bundles
        actors = {b: Probe.options(num_gpus=2, scheduling_strategy=_in(pg, b)).remote() for b in (3, 1, 0, 2)}
        try:
            seen = {b: ray.get(a.where.remote(), timeout=120) for b, a in actors.items()}
        finally:
            for a in actors.values():
                ray.kill(a)
        for b, s in seen.items():
            want = m[b]
            assert s["node"] == want.node_id, b
            assert s["CUDA_VISIBLE_DEVICES"] == want.visible == ",".join(map(str, want.indices)), (b, s, want)
            assert s["nics"] == want.nics  # get_devices().nics and the map name the same NICs
            hcas = ",".join(want.nics)
            assert s["UCX_NET_DEVICES"] == hcas and s["NCCL_IB_HCA"] == "=" + hcas and s["NVSHMEM_HCA_LIST"] == hcas
            ifs = ",".join(f"ib{int(n.split(':')[0].rsplit('_', 1)[1])}" for n in want.nics)
            assert s["NCCL_SOCKET_IFNAME"] == "=" + ifs
        again = rayaccel.placement_map(pg, timeout_s=5)
        assert again == m  # stable for the group's life
    finally:
        remove_placement_group(pg)


def test_colocated_trainer_and_rollout_share_one_device_across_a_restart(cluster2, Probe):
    import ray
    from ray.util import remove_placement_group

    import rayaccel

    pg = _group([{"GPU": 1}] * 4)
    try:
        m = rayaccel.placement_map(pg, timeout_s=30)
        trainers = {b: Probe.options(num_gpus=0.5, max_restarts=2, max_task_retries=2, scheduling_strategy=_in(pg, b))
                    .remote() for b in range(4)}
        rollouts = {b: Probe.options(num_gpus=0.5, scheduling_strategy=_in(pg, b)).remote() for b in range(4)}
        try:
            t = {b: ray.get(a.where.remote(), timeout=120) for b, a in trainers.items()}
            r = {b: ray.get(a.where.remote(), timeout=120) for b, a in rollouts.items()}
            for b in range(4):
                assert t[b]["node"] == r[b]["node"] == m[b].node_id
                assert t[b]["devices"] == r[b]["devices"] == m[b].indices, (b, t[b], r[b], m[b])
            # rank order of the rollouts: TP 2 pairs on NV2 links
            ro = rayaccel.rank_order(pg, group_size=2)
            assert sorted(ro.order) == [0, 1, 2, 3]
            for g in ro.groups:
                if len(g.nodes) == 1:
                    a, b2 = (m[x].indices[0] for x in g.bundles)
                    assert DGX1.link(a, b2).count == 2 and g.allreduce_bandwidth_gbps == 50.0
            # the trainer of bundle 0 dies and Ray restarts it: the same device as its rollout
            old = t[0]["pid"]
            ray.kill(trainers[0], no_restart=False)
            after = wait_for(lambda: _where_new(trainers[0], old), 60, "the trainer's restart")
            assert after["devices"] == r[0]["devices"] == m[0].indices and after["node"] == m[0].node_id
        finally:
            for a in (*trainers.values(), *rollouts.values()):
                ray.kill(a)
    finally:
        remove_placement_group(pg)


def _where_new(actor, old_pid):
    import ray

    try:
        s = ray.get(actor.where.remote(), timeout=30)
    except ray.exceptions.RayActorError:
        return None
    return s if s["pid"] != old_pid else None


def test_rank_order_puts_each_tp4_group_on_an_all_nvlink_quad(cluster2, Probe):
    import ray
    from ray.util import remove_placement_group

    import rayaccel

    pg = _group([{"GPU": 1}] * 8, strategy="STRICT_PACK")
    try:
        ro = rayaccel.rank_order(pg, group_size=4, timeout_s=30)
        m = rayaccel.placement_map(pg)
        assert len(ro.groups) == 2
        for g in ro.groups:
            devs = {m[b].indices[0] for b in g.bundles}
            assert devs in QUADS and g.scope == "nvlink island" and len(g.nodes) == 1, (g, devs)
            assert g.allreduce_bandwidth_gbps == 25.0
        # the TP rollouts, started in rank order, sit where the order says
        actors = [Probe.options(num_gpus=1, scheduling_strategy=_in(pg, b)).remote() for b in ro.order]
        try:
            seen = ray.get([a.where.remote() for a in actors], timeout=120)
        finally:
            for a in actors:
                ray.kill(a)
        for rank, s in enumerate(seen):
            assert s["devices"] == m[ro.order[rank]].indices
        assert {frozenset(s["devices"][0] for s in seen[i:i + 4]) for i in (0, 4)} == {frozenset(q) for q in QUADS}
    finally:
        remove_placement_group(pg)


def test_a_nic_variable_the_user_set_is_kept(cluster2, Probe):
    import ray

    a = Probe.options(num_gpus=1, runtime_env={"env_vars": {"NCCL_IB_HCA": "=mlx5_9:1"}}).remote()
    try:
        s = ray.get(a.where.remote(), timeout=120)
    finally:
        ray.kill(a)
    assert s["NCCL_IB_HCA"] == "=mlx5_9:1" and s["NVSHMEM_HCA_LIST"] == ",".join(s["nics"])


def test_removed_unknown_and_unplaced_groups_are_one_clear_error(cluster2):
    import time

    from ray.util import remove_placement_group
    from ray.util.placement_group import placement_group

    import rayaccel
    from rayaccel.errors import ClusterError, RequestError

    pg = _group([{"GPU": 1}])
    remove_placement_group(pg)
    with pytest.raises(ClusterError, match=f"placement group {pg.id.hex()}.* is removed"):
        rayaccel.placement_map(pg, timeout_s=5)
    with pytest.raises(ClusterError, match="is unknown"):
        rayaccel.placement_map("ab" * 14, timeout_s=5)
    big = placement_group([{"GPU": 9}])  # no node has 9 GPUs: never placed
    try:
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=f"{big.id.hex()}.* not placed after 0.5 s"):
            rayaccel.placement_map(big, timeout_s=0.5)
        assert time.monotonic() - t0 < 10
    finally:
        remove_placement_group(big)
    with pytest.raises(RequestError, match="placement group or its hex id"):
        rayaccel.placement_map(42)


def test_status_lists_placement_groups_with_their_map(cluster2):
    from ray.util import remove_placement_group

    from rayaccel.ray.driver.placemap import placement_groups_status

    pg = _group([{"GPU": 2}] * 2)
    try:
        rows = placement_groups_status()
        row = next(r for r in rows if r["pg_id"] == pg.id.hex())
        assert row["state"] == "CREATED" and [len(b["devices"]) for b in row["map"]["bundles"]] == [2, 2]
    finally:
        remove_placement_group(pg)
