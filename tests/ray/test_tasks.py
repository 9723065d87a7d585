"""Tasks and actors through Ray: placement, in-worker setup, MIG, memory sharing, fail-fast."""

from __future__ import annotations

import json
import os

import pytest

import rayaccel.ray as rr
from rayaccel.errors import ClusterError, RequestError, Unsatisfiable

from raytest_helpers import node_named


def _probe():
    import ray

    a = rr.get_devices()
    return {"node": ray.get_runtime_context().get_node_id(), "indices": list(a.indices),
            "links": [l.label for l in a.links], "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "devices_env": os.environ.get("RAYACCEL_DEVICES"), "node_env": os.environ.get("RAYACCEL_NODE_ID"),
            "mem_env": os.environ.get("RAYACCEL_GPU_MEMORY_BYTES"), "memory": a.memory_bytes,
            "cpus_intended": a.cpus_intended, "cpus_applied": a.cpus_applied,
            "affinity": sorted(os.sched_getaffinity(0)), "partitions": [p.uuid for p in a.partitions]}


probe = rr.remote(num_cpus=0)(_probe)


class Prober:
    def probe(self):
        return _probe()


def test_two_gpu_task_on_dgx1_gets_an_nv2_pair_with_ordered_visible_devices(cluster):
    import ray

    node = node_named(cluster, "dgx1-v100")
    out = ray.get(probe.options(gpus=2, model="SXM2").remote())
    assert out["node"] == node.node_id
    assert out["links"] == ["NV2"]
    assert out["cuda"] == ",".join(map(str, out["indices"]))
    assert json.loads(out["devices_env"]) == out["indices"]
    assert out["node_env"] == node.node_id
    # NUMA-local CPUs of the devices, intersected with what this host allows
    topo = node.topology
    want = set().union(*(set(topo.device(i).cpus) for i in out["indices"]))
    assert set(out["cpus_intended"]) == want
    assert set(out["affinity"]) <= set(os.sched_getaffinity(0))
    if out["cpus_applied"] is not None:
        assert set(out["cpus_applied"]) == want & set(os.sched_getaffinity(0)) == set(out["affinity"])


def test_four_gpus_nvlink_is_one_nvlink_quad(cluster):
    import ray

    out = ray.get(probe.options(gpus=4, interconnect="nvlink").remote())
    topo = node_named(cluster, "dgx1-v100").topology
    idx = out["indices"]
    assert all(topo.link(a, b) is not None and topo.link(a, b).direct for a in idx for b in idx if a < b)


class _Barrier:
    def __init__(self):
        self.n = 0

    def arrive(self):
        self.n += 1

    def count(self):
        return self.n


def _probe_together(barrier, parties):
    """Hold the devices until ``parties`` tasks hold theirs (so they really run at the same time)."""
    import time

    import ray

    ray.get(barrier.arrive.remote())
    deadline = time.monotonic() + 60
    while ray.get(barrier.count.remote()) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError("the other tasks never started: some waited for a device")
        time.sleep(0.05)
    return _probe()


def test_concurrent_two_gpu_tasks_never_share_a_device(cluster):
    import ray

    barrier = ray.remote(num_cpus=0)(_Barrier).remote()
    together = rr.remote(num_cpus=0)(_probe_together)
    refs = [together.options(gpus=2, model="SXM2").remote(barrier, 4) for _ in range(4)]
    outs = ray.get(refs, timeout=90)
    # four pairs on one 8-GPU node, all held at once: all distinct devices
    held = [i for o in outs for i in o["indices"]]
    assert len(held) == len(set(held)) == 8
    ray.kill(barrier)


def test_mig_instance_is_visible_by_uuid(cluster):
    import ray

    topo = node_named(cluster, "a100-mig").topology
    out = ray.get(probe.options(mig="3g.20gb").remote())
    part = next(p for p in topo.partitions() if p.profile == "3g.20gb")
    assert out["cuda"] == part.uuid
    assert out["partitions"] == [part.uuid]
    assert out["memory"] == {0: part.memory_bytes}


def test_actors_share_a_device_by_memory_without_oversubscribing(cluster):
    import ray

    cls = rr.remote(gpu_memory="12GiB", model="SXM2", num_cpus=0)(Prober)
    actors = [cls.remote() for _ in range(5)]
    try:
        outs = ray.get([a.probe.remote() for a in actors])
        per_device: dict = {}
        for o in outs:
            assert o["mem_env"] == str(12 << 30)
            (dev,) = o["indices"]
            per_device[dev] = per_device.get(dev, 0) + 12
        # V100s have 32 GiB: at most two 12 GiB shares per device, and packing uses the fewest devices
        assert max(per_device.values()) <= 24
        assert len(per_device) == 3
    finally:
        for a in actors:
            ray.kill(a)


def test_options_change_request_and_keep_ray_options(cluster):
    import ray

    f = rr.remote(gpus=1, num_cpus=0, max_retries=0)(_probe)
    g = f.options(gpus=3)
    assert f.request.gpus == 1 and g.request.gpus == 3
    assert len(ray.get(g.remote())["indices"]) == 3


@pytest.mark.parametrize("opts, match", [
    ({"gpus": 9}, "9 GPUs"),
    ({"mig": "9g.99gb"}, "9g.99gb"),
    ({"gpus": 1, "gpu_memory": "200GiB"}, "no node can ever"),
    ({"gpu_memory": "200GiB"}, "no node can ever"),
    ({"gpus": 2, "model": "H100"}, "no node can ever"),
], ids=["too-many-gpus", "unknown-mig-profile", "memory-bigger-than-any-device", "share-bigger-than-any-device",
        "absent-model"])
def test_unsatisfiable_requests_fail_fast(cluster, opts, match):
    with pytest.raises(Unsatisfiable, match=match):
        probe.options(**opts).remote()


@pytest.mark.parametrize("opts, field", [
    ({"num_gpus": 1}, "num_gpus"),
    ({"interconnect": "carrier-pigeon"}, "interconnect"),
    ({"resources": {"accel_0": 1}}, "resources"),
], ids=["num_gpus", "bad-interconnect", "managed-resource"])
def test_bad_options_are_rejected_at_decoration(opts, field):
    with pytest.raises(RequestError, match=field):
        rr.remote(**opts)(_probe)


def test_get_devices_outside_a_task_raises():
    with pytest.raises(ClusterError, match="inside"):
        rr.get_devices()


def test_calling_directly_is_a_clear_error():
    with pytest.raises(TypeError, match=r"\.remote"):
        probe()
