"""Unchanged Ray code on every accelerator Ray knows (issue 16's done-when), on one simulated cluster.

One module-scoped SimulatedCluster: a DGX-1 V100 (head), a trn1.32xlarge (16 Trainium, 2
NeuronCores each, 4x4 NeuronLink torus), a TPU v6e-8 host (2x4 chips), an 8x Gaudi 2 server,
an Atlas 800 (8x Ascend 910 in two HCCS groups of four) and a node of the example plugin's
fictional Acme tiles (installed for real into a temporary directory). Every workload is
written as Ray's documentation writes it: ``resources={"neuron_cores": 2}``,
``resources={"TPU": 4}``, ``accelerator_type="V100"``, placement groups, Ray Train's
``ScalingConfig(resources_per_worker=...)``; workers never import rayaccel.

Each test first checks that the cluster advertises the resource, so a node start that did not
advertise a family fails fast.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from raytest_helpers import needs_train_v2, wait_for

pytestmark = [pytest.mark.ray]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "acme-accelerator"
NODES = ("dgx1-v100", "trn1-32xlarge", "tpu-v6e-8", "gaudi2-hls2-8x", "atlas-800-910a-8x")


@pytest.fixture(scope="module")
def acme_site(tmp_path_factory):
    """The example plugin, pip-installed into a temporary directory (no change to the test venv)."""
    target = tmp_path_factory.mktemp("acme-site")
    source = shutil.copytree(EXAMPLE, tmp_path_factory.mktemp("acme-build") / "acme",
                             ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(target), str(source)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    sys.path.insert(0, str(target))
    try:
        yield target
    finally:
        sys.path.remove(str(target))


@pytest.fixture(scope="module")
def accel(ray_env, acme_site):
    import ray

    from rayaccel import catalog
    from rayaccel.discovery import registry
    from rayaccel.ray.driver.cluster import SimulatedCluster

    import acme_accelerator  # noqa: F401 - installed by acme_site

    registry._reset()
    if ray.is_initialized():
        ray.shutdown()
    pythonpath = os.pathsep.join(p for p in (str(acme_site), os.environ.get("PYTHONPATH")) if p)
    topos = [*NODES, acme_accelerator.acme_node()]
    # the trn1 node's actors each hold a CPU (Ray's default for an actor naming other resources): it
    # gets 8 of its real 128 vCPUs, enough for the done-when's six actors
    cpus = [8 if n == "trn1-32xlarge" else 4 for n in NODES] + [4]
    c = SimulatedCluster(topos, num_cpus=cpus, env={"PYTHONPATH": pythonpath}, logging_level="ERROR",
                         log_to_driver=False)
    c.topologies = {n: catalog.load(n) for n in NODES} | {"acme-t4-8x": topos[-1]}
    try:
        yield c
    finally:
        c.shutdown()
        registry._reset()


def _advertised(resource: str, total: float) -> None:
    import ray

    assert ray.cluster_resources().get(resource) == total, \
        f"the cluster advertises {ray.cluster_resources().get(resource)} {resource}, expected {total}"


def _ids(text: str | None) -> list[int]:
    return [int(x) for x in text.split(",")] if text else []


def _ring(topo, devices) -> bool:
    return len(devices) < 3 or all(topo.link(devices[i], devices[(i + 1) % len(devices)]) for i in range(len(devices)))


# ------------------------------------------------------------------- Neuron
def test_trn1_five_two_core_actors_then_an_eight_core_torus_ring(accel):
    import ray

    _advertised("neuron_cores", 32)
    trn1 = accel.topologies["trn1-32xlarge"]

    @ray.remote(resources={"neuron_cores": 2})
    class Inference:
        def cores(self):
            return (os.environ.get("NEURON_RT_VISIBLE_CORES"),
                    ray.get_runtime_context().get_accelerator_ids()["neuron_cores"])

    @ray.remote(resources={"neuron_cores": 8})
    class Trainer:
        def cores(self):
            return os.environ.get("NEURON_RT_VISIBLE_CORES")

    small = [Inference.remote() for _ in range(5)]
    big = None
    try:
        got = ray.get([a.cores.remote() for a in small], timeout=120)
        devices = []
        for env, ids in got:
            cores = _ids(env)
            assert sorted(cores) == sorted(int(i) for i in ids)  # every view names the same cores
            assert len(cores) == 2 and cores[0] // 2 == cores[1] // 2  # the two cores of one device
            devices.append(cores[0] // 2)
        assert len(set(devices)) == 5
        big = Trainer.remote()
        cores = _ids(ray.get(big.cores.remote(), timeout=120))
        devs = list(dict.fromkeys(c // 2 for c in cores))
        assert len(cores) == 8 and len(devs) == 4 and sorted(cores) == sorted(c for d in devs for c in (2 * d, 2 * d + 1))
        assert not set(devs) & set(devices) and _ring(trn1, devs), devs
    finally:
        for a in small + ([big] if big else []):
            ray.kill(a)


def test_ray_train_worker_group_on_neuron_cores(accel, tmp_path):
    needs_train_v2()
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    _advertised("neuron_cores", 32)
    trn1 = accel.topologies["trn1-32xlarge"]
    out = str(tmp_path)

    def train_func():
        from ray import train

        ctx = train.get_context()
        with open(os.path.join(out, f"rank{ctx.get_world_rank()}.json"), "w") as f:
            json.dump({"cores": os.environ.get("NEURON_RT_VISIBLE_CORES")}, f)

    trainer = TorchTrainer(train_func, torch_config=TorchConfig(backend="gloo"),
                           scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"neuron_cores": 2}))
    trainer.fit()
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(2)]
    devs = [sorted({c // 2 for c in _ids(r["cores"])}) for r in ranks]
    assert all(len(d) == 1 for d in devs) and devs[0] != devs[1]
    assert trn1.link(devs[0][0], devs[1][0]) is not None  # the gang's two devices are NeuronLink neighbours


def test_ray_train_worker_group_on_gaudi(accel, tmp_path):
    """A Ray Train worker group on Gaudi: ``resources_per_worker={"HPU": 1}``, as Intel's docs write it.

    Intel's docs use TorchTrainer; with HPU resources Ray Train 2.60 picks its HPU torch device
    manager, which needs Habana's torch build (``torch.hpu``) -- absent on a CPU machine. The
    framework-agnostic DataParallelTrainer gets the very same worker group from Ray Train.
    """
    needs_train_v2()
    from ray.train import ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    _advertised("HPU", 8)
    gaudi = accel.topologies["gaudi2-hls2-8x"]
    out = str(tmp_path)

    def train_func():
        from ray import train

        with open(os.path.join(out, f"rank{train.get_context().get_world_rank()}.json"), "w") as f:
            json.dump({"modules": os.environ.get("HABANA_VISIBLE_MODULES")}, f)

    DataParallelTrainer(train_func, scaling_config=ScalingConfig(num_workers=4, resources_per_worker={"HPU": 1})).fit()
    mods = [_ids(json.load(open(os.path.join(out, f"rank{r}.json")))["modules"]) for r in range(4)]
    assert all(len(m) == 1 for m in mods) and len({m[0] for m in mods}) == 4
    assert len({gaudi.device(m[0]).numa_node for m in mods}) == 1  # the gang's four modules: one NUMA node


# ---------------------------------------------------------------------- GPU
def test_v100_accelerator_type_work_runs_and_the_node_carries_rays_label(accel):
    import ray
    from ray.util.accelerators import NVIDIA_TESLA_V100

    _advertised("accelerator_type:V100", 1)

    @ray.remote(num_gpus=1, accelerator_type=NVIDIA_TESLA_V100)
    def step():
        return ray.get_runtime_context().get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES")

    @ray.remote(num_gpus=1, label_selector={"ray.io/accelerator-type": "V100"})
    def selected():
        return ray.get_runtime_context().get_node_id()

    node_id, cvd = ray.get(step.remote(), timeout=120)
    assert cvd is not None and len(_ids(cvd)) == 1
    labels = next(n["Labels"] for n in ray.nodes() if n["NodeID"] == node_id)
    assert labels.get("ray.io/accelerator-type") == "V100"
    assert ray.get(selected.remote(), timeout=120) == node_id


# ---------------------------------------------------------------------- TPU
def test_tpu_tasks_under_churn_always_get_contiguous_blocks_with_consistent_bounds(accel):
    import random

    import ray

    _advertised("TPU", 8)
    host = accel.topologies["tpu-v6e-8"]
    coords = {d.index: d.coords for d in host.devices}

    @ray.remote(resources={"TPU": 1})
    def job(hold_s: float):
        t0 = time.time()
        env = {k: os.environ.get(k) for k in ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS")}
        time.sleep(hold_s)
        return env, t0, time.time()

    rng = random.Random(16)
    refs, sizes = [], []
    for _ in range(30):
        k = rng.choice([1, 2, 4])
        refs.append(job.options(resources={"TPU": k}).remote(rng.uniform(0.05, 0.4)))
        sizes.append(k)
        time.sleep(rng.uniform(0, 0.1))
    results = ray.get(refs, timeout=300)
    spans = []
    for k, (env, t0, t1) in zip(sizes, results):
        chips = _ids(env["TPU_VISIBLE_CHIPS"])
        assert len(chips) == k
        bx, by, bz = map(int, env["TPU_CHIPS_PER_HOST_BOUNDS"].split(","))
        assert bx * by * bz == k and env["TPU_HOST_BOUNDS"] == "1,1,1"
        pts = [coords[c] for c in chips]
        lo = [min(p[i] for p in pts) for i in range(3)]
        assert {tuple(p[i] - lo[i] for i in range(3)) for p in pts} == {
            (x, y, z) for x in range(bx) for y in range(by) for z in range(bz)}, (chips, env)
        spans.append((t0, t1, set(chips)))
    for i, (a0, a1, ca) in enumerate(spans):  # chips are never held twice at once
        for b0, b1, cb in spans[i + 1:]:
            if a0 < b1 and b0 < a1:
                assert not ca & cb


def test_tpu_whole_host_grant_unsets_the_visible_chips(accel):
    import ray

    _advertised("TPU", 8)

    @ray.remote(resources={"TPU": 8})
    def whole():
        return {k: os.environ.get(k) for k in ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_HOST_BOUNDS")}

    assert ray.get(whole.remote(), timeout=120) == {"TPU_VISIBLE_CHIPS": None, "TPU_CHIPS_PER_HOST_BOUNDS": None}


# ------------------------------------------------------------ Gaudi, Ascend
def test_hpu_tasks_actors_and_placement_groups(accel):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    _advertised("HPU", 8)
    gaudi = accel.topologies["gaudi2-hls2-8x"]

    @ray.remote(resources={"HPU": 2})
    def task():
        return os.environ.get("HABANA_VISIBLE_MODULES")

    @ray.remote(resources={"HPU": 4})
    class Actor:
        def modules(self):
            return os.environ.get("HABANA_VISIBLE_MODULES")

    mods = _ids(ray.get(task.remote(), timeout=120))
    assert len(mods) == 2 and len({gaudi.device(m).numa_node for m in mods}) == 1
    a = Actor.remote()
    pg = placement_group([{"HPU": 2, "CPU": 1}] * 2, strategy="STRICT_PACK")
    try:
        mods = _ids(ray.get(a.modules.remote(), timeout=120))
        assert len(mods) == 4 and len({gaudi.device(m).numa_node for m in mods}) == 1  # one NUMA node's modules
        ray.get(pg.ready(), timeout=120)
        got = ray.get([task.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)).remote()
                       for i in range(2)], timeout=120)
        both = [m for g in got for m in _ids(g)]
        assert len(set(both)) == 4 and not set(both) & set(mods)
    finally:
        ray.kill(a)
        remove_placement_group(pg)


def test_npu_requests_stay_in_one_hccs_group(accel):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    _advertised("NPU", 8)

    @ray.remote(resources={"NPU": 1})
    def task():
        return os.environ.get("ASCEND_RT_VISIBLE_DEVICES")

    for k in (2, 4):
        devs = _ids(ray.get(task.options(resources={"NPU": k}).remote(), timeout=120))
        assert len(devs) == k and len({d // 4 for d in devs}) == 1, devs
    pg = placement_group([{"NPU": 2, "CPU": 1}] * 2, strategy="STRICT_PACK")
    try:
        ray.get(pg.ready(), timeout=120)
        got = ray.get([task.options(resources={"NPU": 2},
                                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)).remote()
                       for i in range(2)], timeout=120)
        both = [d for g in got for d in _ids(g)]
        assert len(set(both)) == 4 and len({d // 4 for d in both}) == 1  # the gang's four NPUs: one HCCS group
    finally:
        remove_placement_group(pg)


# ------------------------------------------------------------------- plugin
def test_the_plugins_accelerator_runs_unchanged_ray_code_on_its_best_linked_units(accel):
    import ray

    _advertised("ACME", 8)
    acme = accel.topologies["acme-t4-8x"]

    @ray.remote(resources={"ACME": 2})
    class Holder:
        def tiles(self):
            return os.environ.get("ACME_VISIBLE_DEVICES")

    @ray.remote(resources={"ACME": 4})
    def job():
        return os.environ.get("ACME_VISIBLE_DEVICES"), ray.get_runtime_context().get_node_id()

    h = Holder.remote()
    try:
        held = _ids(ray.get(h.tiles.remote(), timeout=120))
        assert len(held) == 2 and held[0] // 4 == held[1] // 4
        tiles, node_id = ray.get(job.remote(), timeout=120)
        tiles = _ids(tiles)
        assert len(tiles) == 4 and len({t // 4 for t in tiles}) == 1 and not set(tiles) & set(held)
        assert all(acme.link(a, b).kind == "direct" for i, a in enumerate(tiles) for b in tiles[i + 1:])
        labels = next(n["Labels"] for n in ray.nodes() if n["NodeID"] == node_id)
        assert labels.get("ray.io/accelerator-type") == "Acme-Tile-T4"
    finally:
        ray.kill(h)
    wait_for(lambda: ray.available_resources().get("ACME") == 8, 30, "every ACME unit free")


def test_status_lists_every_accelerator_node(accel):
    from rayaccel.ray.driver import status
    rows = {r["name"]: r for r in status.cluster_status()["nodes"]}
    for name, resource in (("trn1-32xlarge", "neuron_cores"), ("tpu-v6e-8", "TPU"), ("gaudi2-hls2-8x", "HPU"),
                           ("atlas-800-910a-8x", "NPU"), ("acme-t4-8x", "ACME")):
        assert name in rows
        assert resource in json.dumps(rows[name], default=str)  # the row names the node's Ray resource
