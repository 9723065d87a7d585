"""Gangs (torch.distributed all-reduce in gloo), `rayaccel status` data, the demo."""

from __future__ import annotations

import os

import pytest

import rayaccel.ray as rr
from rayaccel.errors import ClusterError, Unsatisfiable
from raytest_helpers import free_devices, node_named, wait_for


def _allreduce(n):
    import torch
    import torch.distributed as dist

    t = torch.full((n,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.tolist(), list(rr.get_devices().indices), os.environ["MASTER_PORT"]


def test_gang_allreduce_in_gloo_ranks_in_topology_order(cluster):
    with rr.gang(workers=2, gpus_per_worker=2, strategy="strict-pack", model="SXM2") as g:
        node = node_named(cluster, "dgx1-v100")
        assert g.backend == "gloo"
        assert {n.node_id for n in g.nodes} == {node.node_id}
        out = g.run(_allreduce, 3)
        assert [o[0] for o in out] == [0, 1]
        assert all(o[1] == 2 and o[2] == [3.0, 3.0, 3.0] for o in out)
        # each rank holds exactly what the placement chose, NV2-linked pairs, all distinct
        assert [o[3] for o in out] == [list(w.devices) for w in g.allocation.workers]
        held = [d for o in out for d in o[3]]
        assert len(set(held)) == 4
        assert all(node.topology.link(*o[3]).label == "NV2" for o in out)
        # the devices are reserved in Ray while the gang lives
        assert not (set(held) & free_devices(node.node_id))
        out2 = g.run(_allreduce, 1)  # the process group is reused
        assert [o[2] for o in out2] == [[3.0], [3.0]]
    wait_for(lambda: set(held) <= free_devices(node.node_id), what="gang devices freed")


def test_gang_spread_spans_nodes(cluster):
    with rr.gang(workers=2, gpus_per_worker=1, strategy="spread") as g:
        assert len({n.node_id for n in g.nodes}) == 2
        out = g.run(_allreduce, 2)
        assert [o[2] for o in out] == [[3.0, 3.0], [3.0, 3.0]]


def test_impossible_gang_fails_fast(cluster):
    with pytest.raises(Unsatisfiable):
        rr.gang(workers=2, gpus_per_worker=9)
    with pytest.raises(Unsatisfiable):
        rr.gang(workers=3, gpus_per_worker=8, strategy="strict-pack")


class Named:
    def ping(self):
        return rr.get_devices().indices


def test_status_names_the_holders(cluster):
    import ray

    from rayaccel.ray.status import cluster_status

    a = rr.remote(gpus=2, model="SXM2", num_cpus=0, name="my-trainer")(Named).remote()
    devs = ray.get(a.ping.remote())
    try:
        def holder_seen():
            data = {n["name"]: n for n in cluster_status()}
            dgx = data["dgx1-v100"]
            rows = [d for d in dgx["devices"] if d["index"] in devs]
            return rows if all(r["state"] == "busy" and any("my-trainer" in h for h in r["holders"])
                               for r in rows) else None

        rows = wait_for(holder_seen, what="status to show the actor")
        assert len(rows) == 2
        data = {n["name"]: n for n in cluster_status()}
        assert data["a100-mig"]["free"] == 1 and data["dgx1-v100"]["free"] == 6
    finally:
        ray.kill(a)


def test_gang_run_without_torch_is_a_clear_error(cluster, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with rr.gang(workers=1, gpus_per_worker=1, name="no-torch") as g:
        with pytest.raises(ClusterError, match="PyTorch is not installed"):
            g.run(sum, [1])
