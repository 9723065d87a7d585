"""A rayaccel cluster shows Ray exactly what plain Ray shows on the same hardware; its labels are the only addition.

Two clusters on the same simulated hardware, one after the other: plain Ray nodes started with what
Ray itself computes on that hardware (``num_gpus``, ``accelerator_type:<T>``, ``ray.io/accelerator-type``:
:func:`rayaccel.discovery.ray_node_resources`), and rayaccel nodes (``SimulatedCluster``). Ray's
resources (total and available), the actors and jobs its state API lists, and every node label but
``rayaccel.io/*`` are equal. The topologies have no MIG instances (``mig_<profile>`` is the one
documented resource difference). The rayaccel side also checks that a node's agent (a process
beside its raylet, not an actor) exits when its raylet dies, and that shutdown stops the rest.
"""

from __future__ import annotations

import os
import signal

import pytest
from raytest_helpers import wait_for

pytestmark = pytest.mark.ray

TOPOLOGIES = ("dgx1-v100", "pcie-8gpu-2socket")
#: Depends on the machine's free memory at each start, not on who started the node.
MACHINE_DEPENDENT = ("memory",)
#: Each node's own id, different on every start (Ray 2.48 spells the key ``ray.io/node_id``).
NODE_ID_LABELS = ("ray.io/node-id", "ray.io/node_id")


def _seen() -> dict:
    """What Ray (and its state API) shows the connected driver, minus machine-dependent figures."""
    import ray
    from ray.util.state import list_actors, list_jobs

    def res(d):
        return {k: v for k, v in d.items() if k not in MACHINE_DEPENDENT}

    total = wait_for(lambda: res(ray.cluster_resources()) if len(ray.nodes()) == len(TOPOLOGIES) else None, 30,
                     "every node in Ray's view")
    avail = wait_for(lambda: (lambda a: a if a == total else None)(res(ray.available_resources())), 30,
                     "Ray's available resources to equal its totals (nothing held)")
    labels = sorted(tuple(sorted((k, v) for k, v in (n.get("Labels") or {}).items() if k not in NODE_ID_LABELS))
                    for n in ray.nodes())
    return {"total": total, "available": avail,
            "actors": sorted((a.class_name, a.state) for a in list_actors()),
            "jobs": len([j for j in list_jobs() if j.status == "RUNNING"]),
            "labels": labels}


def _plain() -> dict:
    """The plain-Ray side: a cluster of nodes started as plain ``ray start`` would on that hardware."""
    import ray
    from ray.cluster_utils import Cluster

    from rayaccel.discovery import ray_node_resources
    from rayaccel.ray.node.start import resolve_topology

    def args(name):
        res, labels = ray_node_resources(resolve_topology(name))
        return {"num_cpus": 4, "object_store_memory": 100 << 20, "num_gpus": int(res.pop("GPU", 0)),
                "resources": res, "labels": labels}

    c = Cluster(initialize_head=True, head_node_args={**args(TOPOLOGIES[0]), "include_dashboard": True})
    try:
        for t in TOPOLOGIES[1:]:
            c.add_node(**args(t))
        c.wait_for_nodes()
        ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
        try:
            return _seen()
        finally:
            ray.shutdown()
    finally:
        c.shutdown()


def _rayaccel() -> dict:
    from rayaccel.contract import LABEL_PREFIX
    from rayaccel.ray import _ray_private as rp
    from rayaccel.ray.driver.cluster import SimulatedCluster

    with SimulatedCluster(list(TOPOLOGIES), num_cpus=4, dashboard=True, logging_level="ERROR",
                          log_to_driver=False) as c:
        from rayaccel.ray.node import agent

        assert all(agent.handle(n.node_key).ping() == n.node_key for n in c.nodes)  # the agents run
        seen = _seen()
        procs = [n.agent for n in c.nodes]
        # an agent never outlives its raylet (a node that dies without anyone stopping its agent)
        os.kill(rp.raylet_pid(c.nodes[1].handle), signal.SIGKILL)
        wait_for(lambda: procs[1].poll() is not None, 30, "the dead node's agent to exit")
        assert procs[0].poll() is None and agent.handle(c.nodes[0].node_key).ping() == c.nodes[0].node_key
    assert all(p.poll() is not None for p in procs)  # and the cluster's shutdown stopped the others
    ours = [tuple((k, v) for k, v in node if not k.startswith(LABEL_PREFIX)) for node in seen["labels"]]
    assert all(any(k.startswith(LABEL_PREFIX) for k, _ in node) for node in seen["labels"])
    return {**seen, "labels": sorted(ours)}


def test_ray_sees_the_same_cluster_with_or_without_rayaccel(ray_env):
    import ray

    if ray.is_initialized():  # another module's session cluster: the `cluster` fixture reconnects later
        ray.shutdown()
    plain, ours = _plain(), _rayaccel()
    assert ours["total"] == plain["total"]
    assert ours["available"] == plain["available"]
    assert ours["actors"] == plain["actors"] == []  # no agent among the user's actors
    assert ours["jobs"] == plain["jobs"] == 1  # only this driver's job: the agents' is Ray-internal
    assert ours["labels"] == plain["labels"]
    assert not any(k.startswith("rayaccel") for k in ours["total"])
