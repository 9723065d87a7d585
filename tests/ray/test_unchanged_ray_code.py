"""Unchanged Ray code on ``rayaccel.init(topology="dgx1-v100")`` lands on rayaccel's devices.

Every workload below is written the way Ray's own documentation writes it -- plain
``num_gpus`` tasks and actors, a GPU placement group, Ray Train's ``TorchTrainer``,
Ray Serve deployments, Ray Data ``map_batches``, Ray Tune trials and vLLM's
Ray-executor pattern -- and never imports rayaccel in the worker. The DGX-1's NVLink
hybrid cube-mesh makes Ray's own choice (the lowest free slot indices) visibly worse:
GPU0-GPU1 is one NVLink lane, GPU0-GPU3 two, GPU0-GPU5 none.
"""

from __future__ import annotations

import os
import socket
import time

import pytest
from raytest_helpers import barrier, link, meet, wait_for

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def dgx1(ray_env):
    import ray

    import rayaccel
    from rayaccel import catalog

    if ray.is_initialized():
        ray.shutdown()
    rayaccel.init(topology="dgx1-v100", num_cpus=8, logging_level="ERROR", log_to_driver=False)
    try:
        yield catalog.load("dgx1-v100")
    finally:
        rayaccel.shutdown()


def _idle():
    """Ray's ledger shows every GPU free and the arbiter's published state no holder: a killed actor's process
    may still be exiting after Ray freed its slot, and its device stays its own until it has (never double-booked)."""
    import ray

    from rayaccel.ray.driver.view import view

    if ray.available_resources().get("GPU", 0) != ray.cluster_resources().get("GPU", 0):
        return False
    return all(n.state is not None and not any(h.devices for h in n.state.holders) for n in view().nodes(fresh=True))


@pytest.fixture
def topo(dgx1):
    wait_for(_idle, 30, "every GPU free")
    yield dgx1
    wait_for(_idle, 30, "every GPU free after the test")


def _views():
    """What every view of the grant says, inside the worker."""
    import ray

    from rayaccel.contract import DEVICES_ENV, parse_devices

    return {"gpu_ids": [int(i) for i in ray.get_gpu_ids()],
            "accel": [int(i) for i in ray.get_runtime_context().get_accelerator_ids()["GPU"]],
            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "rayaccel": list(parse_devices(os.environ.get(DEVICES_ENV)) or ()),
            "pid": os.getpid()}


def test_four_concurrent_two_gpu_tasks_get_four_disjoint_nv2_pairs(topo):
    import ray

    @ray.remote(num_gpus=2)
    def tensor_parallel_step(b):
        import rayaccel

        v = _views()
        v["get_devices"] = list(rayaccel.get_devices().indices)
        meet(b, 4)  # all four hold their pair at once
        return v

    b = barrier(4)
    got = ray.get([tensor_parallel_step.remote(b) for _ in range(4)])
    pairs = [g["gpu_ids"] for g in got]
    assert sorted(d for p in pairs for d in p) == list(range(8))
    assert [link(topo, p) for p in pairs] == ["NV2"] * 4
    for g in got:  # every view names the same devices, in the same order
        assert g["accel"] == g["gpu_ids"] == g["rayaccel"] == g["get_devices"]
        assert g["cvd"] == ",".join(map(str, g["gpu_ids"]))


def test_two_bundle_gpu_placement_group_gets_an_nv2_pair(topo):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}], strategy="STRICT_PACK")
    ray.get(pg.ready())

    @ray.remote(num_gpus=1)
    class Shard:
        def where(self):
            return _views()

    shards = [Shard.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, placement_group_bundle_index=i)).remote() for i in range(2)]
    got = ray.get([s.where.remote() for s in shards])
    devices = [g["gpu_ids"][0] for g in got]
    assert link(topo, devices) == "NV2"
    for s in shards:
        ray.kill(s)
    remove_placement_group(pg)


def test_train_with_three_actors_running_gets_an_all_nvlink_quad(topo, tmp_path):
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    @ray.remote(num_gpus=1)
    class Inference:
        def gpu(self):
            return ray.get_gpu_ids()

    servers = [Inference.remote() for _ in range(3)]
    held = [ray.get(s.gpu.remote())[0] for s in servers]

    @ray.remote(num_cpus=0)
    class Box:
        def __init__(self):
            self.items = []

        def put(self, x):
            self.items.append(x)

        def get(self):
            return self.items

    box = Box.options(name="train-box").remote()

    def train_loop_per_worker(config):
        import os

        import ray
        import ray.train
        import ray.train.torch
        import torch
        import torch.distributed as dist

        ctx = ray.train.get_context()
        t = torch.ones(1) * (ctx.get_world_rank() + 1)
        dist.all_reduce(t)  # a real collective across the four workers (gloo on CPU)
        ray.get(ray.get_actor("train-box").put.remote({
            "rank": ctx.get_world_rank(), "gpu_ids": [int(i) for i in ray.get_gpu_ids()],
            "device": str(ray.train.torch.get_device()), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "sum": float(t[0])}))

    trainer = TorchTrainer(train_loop_per_worker,
                           scaling_config=ScalingConfig(num_workers=4, use_gpu=True),
                           torch_config=TorchConfig(backend="gloo"),
                           run_config=RunConfig(storage_path=str(tmp_path)))
    try:
        trainer.fit()
    finally:
        for s in servers:
            ray.kill(s)
    rows = sorted(ray.get(box.get.remote()), key=lambda r: r["rank"])
    assert len(rows) == 4 and all(r["sum"] == 10.0 for r in rows)
    quad = [r["gpu_ids"][0] for r in rows]
    assert not set(quad) & set(held)
    assert sorted(quad) in ([0, 1, 2, 3], [4, 5, 6, 7]), quad  # the NVLink-connected quad, not {3,5,6,7}
    assert link(topo, quad) in ("NV1", "NV2")
    visible = rows[0]["cvd"].split(",")
    for r in rows:  # get_device() names the worker's own device within the shared visible list
        assert r["device"] == f"cuda:{visible.index(str(r['gpu_ids'][0]))}"
    assert quad == sorted(quad)  # ranks follow the ring (ascending is a best ring on a quad)
    ray.kill(box)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_serve_replicas_and_placement_group_bundles_see_distinct_devices(topo):
    import ray
    from ray import serve

    @serve.deployment(num_replicas=2, ray_actor_options={"num_gpus": 1})
    class Embedder:
        def __call__(self, request=None):
            return ray.get_gpu_ids()

    # The replica needs the first bundle's CPU; the GPU bundles hold no CPU, as vLLM's do. Serve on Ray 2.48
    # does not pin a replica to bundle 0 (its deployment scheduler asks for any bundle; 2.60's pins it): with a
    # CPU in every bundle the replica can land in a GPU bundle and wait forever for its own shard, on plain
    # Ray 2.48 too.
    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 1},
                      placement_group_bundles=[{"CPU": 1}, {"GPU": 1}, {"GPU": 1}],
                      placement_group_strategy="STRICT_PACK")
    class TensorParallel:
        def __init__(self):
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            pg = ray.util.get_current_placement_group()

            @ray.remote(num_cpus=0, num_gpus=1)
            def shard():
                return ray.get_gpu_ids()

            self.devices = [ray.get(shard.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=i)).remote())[0] for i in (1, 2)]

        def __call__(self, request=None):
            return self.devices

    serve.start(http_options={"host": "127.0.0.1", "port": _free_port()})
    try:
        h = serve.run(Embedder.bind(), name="embed", route_prefix="/embed")
        seen = set()
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:
            seen.update(tuple(h.remote().result()) for _ in range(4))
        assert len(seen) == 2 and all(len(s) == 1 for s in seen)
        h2 = serve.run(TensorParallel.bind(), name="tp", route_prefix="/tp")
        pair = [int(i) for i in h2.remote().result()]
        embed = {int(s[0]) for s in seen}
        assert not set(pair) & embed
        assert link(topo, pair) == "NV2"
    finally:
        serve.shutdown()


def test_data_map_batches_tasks_see_one_device_each(topo):
    import ray

    def where(batch):
        import os

        import ray

        ids = ray.get_gpu_ids()
        batch["gpu"] = [int(ids[0])] * len(batch["id"])
        batch["cvd"] = [os.environ.get("CUDA_VISIBLE_DEVICES")] * len(batch["id"])
        return batch

    ds = ray.data.range(16, override_num_blocks=4).map_batches(where, num_gpus=1, batch_size=4)
    rows = ds.take_all()
    assert len(rows) == 16
    for r in rows:
        assert r["cvd"] == str(r["gpu"])
        assert 0 <= r["gpu"] < 8


def test_tune_gpu_trials_get_devices(topo, tmp_path):
    from ray import tune

    def trainable(config):
        import os

        import ray

        return {"gpus": len(ray.get_gpu_ids()), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "score": config["x"]}

    tuner = tune.Tuner(tune.with_resources(trainable, {"gpu": 2}),
                       param_space={"x": tune.grid_search([1, 2])},
                       run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0))
    results = tuner.fit()
    assert not results.errors
    for r in results:
        assert r.metrics["gpus"] == 2
        assert link(topo, [int(i) for i in r.metrics["cvd"].split(",")]) == "NV2"


def test_vllm_ray_executor_pattern_gets_one_nvlink_set(topo):
    """vLLM's executor: a placement group of {"GPU": 1} bundles, one worker per bundle reading
    get_accelerator_ids(), CUDA_VISIBLE_DEVICES set to the node's union (no vLLM installed)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    world_size = 4
    pg = placement_group([{"GPU": 1.0}] * world_size, strategy="PACK")
    ray.get(pg.ready(), timeout=30)

    @ray.remote(num_gpus=1, num_cpus=0)
    class RayWorkerWrapper:
        def get_node_and_gpu_ids(self):
            return ray.get_runtime_context().get_node_id(), ray.get_runtime_context().get_accelerator_ids()["GPU"]

        def set_visible(self, ids):
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
            return os.environ["CUDA_VISIBLE_DEVICES"]

    workers = [RayWorkerWrapper.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_capture_child_tasks=True, placement_group_bundle_index=i)).remote()
        for i in range(world_size)]
    ids = ray.get([w.get_node_and_gpu_ids.remote() for w in workers])
    gpus = [int(g[0]) for _, g in ids]
    assert sorted(gpus) in ([0, 1, 2, 3], [4, 5, 6, 7])
    union = sorted({g for _, gs in ids for g in gs}, key=int)
    assert ray.get(workers[0].set_visible.remote(union)) == ",".join(union)
    for w in workers:
        ray.kill(w)
    remove_placement_group(pg)
