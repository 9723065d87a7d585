"""rayaccel's own API and plain Ray on a 3-node simulated cluster (DGX-1, A100 in MIG mode, PCIe box)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from raytest_helpers import link, needs_feature, node_named, wait_for

import rayaccel
from rayaccel.errors import RequestError, Unsatisfiable
from rayaccel.ray import _ray_private as rp

pytestmark = pytest.mark.ray


def _where():
    import ray

    a = rayaccel.get_devices()
    return {"node": ray.get_runtime_context().get_node_id(), "devices": list(a.indices),
            "parts": [p.key for p in a.partitions], "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpu_ids": [str(i) for i in ray.get_gpu_ids()], "shared": a.shared,
            "mem": a.gpu_memory_bytes, "cpus": a.cpus_intended}


def test_remote_picks_the_node_with_an_nvlink_set(cluster):
    import ray

    dgx = node_named(cluster, "dgx1-v100")

    @rayaccel.remote(gpus=4, interconnect="nvlink")
    def train():
        return _where()

    got = ray.get(train.remote())
    assert got["node"] == dgx.node_id  # the PCIe box has the GPUs but no NVLink
    assert sorted(got["devices"]) in ([0, 1, 2, 3], [4, 5, 6, 7])
    assert got["gpu_ids"] == [str(d) for d in got["devices"]]


def test_a_constrained_remote_task_is_decided_once_in_its_worker(cluster):
    """The constraints travel with the grant: the worker's arbiter decides once, with them (before,
    the hook decided without them at Ray's grant and the task's set-up decided again with them)."""
    import ray

    from rayaccel.arbiter.statefile import DECISION_LOG

    dgx = node_named(cluster, "dgx1-v100")
    log_path = dgx.directory / DECISION_LOG

    def decisions():
        return log_path.read_text().count("\n") if log_path.exists() else 0

    @rayaccel.remote(gpus=4, interconnect="nvlink")
    def train():
        return _where()

    before = decisions()
    got = ray.get(train.remote())
    assert got["node"] == dgx.node_id and sorted(got["devices"]) in ([0, 1, 2, 3], [4, 5, 6, 7])
    assert decisions() - before == 1


def test_num_gpus_is_a_synonym_of_gpus_and_same_numa_is_honoured(cluster):
    import ray

    pcie = node_named(cluster, "pcie-8gpu-2socket")

    @rayaccel.remote(num_gpus=4, same_numa=True, model="PCIe")
    def job():
        return _where()

    got = ray.get(job.remote())
    topo = pcie.topology
    assert got["node"] == pcie.node_id
    assert len({topo.device(d).numa_node for d in got["devices"]}) == 1
    assert got["cpus"]  # pinned (intended) to the devices' NUMA-local CPUs
    with pytest.raises(RequestError):
        rayaccel.remote(gpus=1, num_gpus=2)(lambda: None)


def test_mig_instance_is_named_by_uuid(cluster):
    import ray

    mig = node_named(cluster, "a100-mig")
    profile = mig.topology.partitions()[0].profile

    @rayaccel.remote(mig=profile)
    def infer():
        return _where()

    got = ray.get(infer.remote())
    assert got["node"] == mig.node_id and len(got["parts"]) == 1
    uuid = next(p.uuid for p in mig.topology.partitions() if p.key == got["parts"][0])
    assert got["cvd"] == uuid and got["gpu_ids"] == [uuid]


def test_plain_ray_mig_resource_works_too(cluster):
    import ray

    mig = node_named(cluster, "a100-mig")
    profile = mig.topology.partitions()[0].profile

    @ray.remote(resources={f"mig_{profile}": 1})
    def infer():
        import os

        return os.environ.get("CUDA_VISIBLE_DEVICES")

    uuids = {p.uuid for p in mig.topology.partitions() if p.profile == profile}
    assert ray.get(infer.remote()) in uuids


def test_memory_shares_are_fractions_and_pack(cluster):
    import ray

    @rayaccel.remote(gpu_memory="8GiB")
    class Server:
        def where(self):
            return _where()

    a, b = Server.remote(), Server.remote()
    wa, wb = ray.get([a.where.remote(), b.where.remote()])
    assert wa["shared"] and wb["shared"] and wa["mem"] == 8 << 30
    assert wa["node"] == wb["node"] and wa["devices"] == wb["devices"]  # packed on one device
    for h in (a, b):
        ray.kill(h)


def test_unsatisfiable_fails_at_once(cluster):
    @rayaccel.remote(gpus=16)
    def too_big():
        return 1

    with pytest.raises(Unsatisfiable, match="no node can ever satisfy"):
        too_big.remote()

    @rayaccel.remote(mig="7g.80gb")
    def no_such_profile():
        return 1

    with pytest.raises(Unsatisfiable):
        no_such_profile.remote()


def test_gang_ranks_sit_on_nvlink_pairs(cluster):
    dgx = node_named(cluster, "dgx1-v100")
    with rayaccel.gang(workers=2, gpus_per_worker=2, strategy="strict-pack", model="V100") as g:
        import ray

        def node_id():
            return ray.get_runtime_context().get_node_id()

        landed = set(ray.get([w.run.remote(node_id, (), {}) for w in g.workers], timeout=60))
        if landed != {dgx.node_id}:  # the PCIe V100 node: Ray placed the unpinned bundles by STRICT_PACK
            needs_feature(rp.BUNDLE_LABELS, "Ray put the gang on the other V100 node")
        assert landed == {dgx.node_id}
        devs = g.devices()
        assert [link(dgx.topology, d) for d in devs] == ["NV2", "NV2"]
        pytest.importorskip("torch")

        def allreduce():
            import torch
            import torch.distributed as dist

            t = torch.ones(1) * (dist.get_rank() + 1)
            dist.all_reduce(t)
            return float(t[0])

        assert g.run(allreduce) == [3.0, 3.0]
        import ray

        host, _ = ray.get(g.workers[0].store_address.remote())
        assert host not in ("0.0.0.0", "::", "")  # rank 0's store listens on its node's IP only


def test_a_plain_driver_that_never_imports_rayaccel_gets_its_devices(cluster):
    """A separate driver process: only ``ray.init(address=...)``, plain ``num_gpus`` work."""
    code = textwrap.dedent("""
        import json, os, sys, time, ray
        ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
        assert "rayaccel" not in sys.modules
        dgx = sys.argv[2]
        @ray.remote(num_cpus=0)
        class Barrier:  # all four hold their GPUs at once (a slow worker start must not serialize them)
            def __init__(self):
                self.n = 0
            def arrive(self):
                self.n += 1
            def count(self):
                return self.n
        barrier = Barrier.remote()
        @ray.remote(num_gpus=2, label_selector={"rayaccel.io/topology": "dgx1-v100"})
        def step(barrier):
            ray.get(barrier.arrive.remote())
            deadline = time.time() + 90
            while ray.get(barrier.count.remote()) < 4 and time.time() < deadline:
                time.sleep(0.05)
            return ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")
        print(json.dumps(ray.get([step.remote(barrier) for _ in range(4)])))
        assert "rayaccel" not in sys.modules
    """)
    dgx = node_named(cluster, "dgx1-v100")
    out = subprocess.run([sys.executable, "-c", code, cluster.address, dgx.node_id], capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    pairs = [[int(i) for i in ids] for ids, _ in got]
    assert sorted(d for p in pairs for d in p) == list(range(8))
    assert [link(dgx.topology, p) for p in pairs] == ["NV2"] * 4
    assert all(cvd == ",".join(map(str, p)) for (_, cvd), p in zip(got, pairs))


def test_worker_environment_without_rayaccel_sees_no_gpu_and_status_says_so(cluster):
    """A runtime_env whose workers cannot run the hook (here: told there is no node dir) is fail-safe."""
    import ray

    from rayaccel.ray.driver.status import cluster_status

    @ray.remote(num_gpus=1, runtime_env={"env_vars": {"RAYACCEL_NODE_DIR": ""}},
                label_selector={"rayaccel.io/topology": "dgx1-v100"})
    class Foreign:
        def ids(self):
            import os

            return ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

    f = Foreign.remote()
    ids, cvd = ray.get(f.ids.remote())
    assert all(str(i).startswith("rayaccel-unhooked-") for i in ids) and cvd.startswith("rayaccel-unhooked-")

    def flagged():
        st = cluster_status()
        dgx = next(n for n in st["nodes"] if n["name"] == "dgx1-v100")
        return dgx["unhooked_slots"] >= 1

    wait_for(flagged, 20, "status to report the unhooked GPU slot")
    ray.kill(f)


def test_status_names_holders(cluster):
    import ray

    from rayaccel.ray.driver.status import cluster_status

    @ray.remote(num_gpus=1, label_selector={"rayaccel.io/topology": "dgx1-v100"})
    class Holder:
        def ping(self):
            return ray.get_gpu_ids()

    h = Holder.remote()
    dev = int(ray.get(h.ping.remote())[0])
    st = cluster_status()
    dgx = next(n for n in st["nodes"] if n["name"] == "dgx1-v100")
    row = dgx["devices"][dev]
    assert row["state"] == "busy" and any("Holder" in x for x in row["holders"])
    assert st["unmanaged"] == [] and st["bad"] == []
    ray.kill(h)


def test_near_lands_next_to_the_data_and_required_holds(cluster):
    import numpy as np
    import ray

    pcie = node_named(cluster, "pcie-8gpu-2socket")

    @rayaccel.remote(gpus=1, model="PCIe")
    def produce():
        h = rayaccel.store().put(np.arange(1024, dtype=np.float32))
        return h, rayaccel.get_devices().indices[0]

    h, where = ray.get(produce.remote())

    @rayaccel.remote(gpus=1)
    def consume(h):
        a = rayaccel.get_devices()
        return a.node_id, a.indices[0], float(rayaccel.store().get(h).sum())

    node, dev, total = ray.get(consume.options(near=h).remote(h))
    assert node == pcie.node_id and total == float(np.arange(1024).sum())
    link = pcie.topology.link(min(dev, where), max(dev, where)) if dev != where else None
    assert dev == where or link.label == "PIX"  # on the data's device or behind the same PCIe switch

    @rayaccel.remote(gpus=2, required=(5,), model="V100")
    def pinned():
        return rayaccel.get_devices().indices

    got = ray.get(pinned.remote())
    assert 5 in got and len(got) == 2
    with pytest.raises(RequestError):
        rayaccel.remote(near=object())(lambda: None)


def test_amd_node_sets_hip_visible_devices_and_xgmi_sets(cluster):
    """Two xGMI hives of four, PCIe between (a real rocm-smi capture): with one GPU held, a
    4-GPU job gets the other hive whole -- plain Ray's lowest free slots would span both."""
    import ray

    from rayaccel.discovery import load_topology
    from rayaccel.ray.driver.view import view

    path = os.path.join(os.path.dirname(__file__), "..", "data", "captures",
                        "63_rocm-smi-showtopo-8gpu-2x4-xgmi-hives-pcie-between-pyliteral.txt")
    topo = load_topology(path)
    nid = cluster.add_node(topo)
    sel = {"rayaccel.io/vendor": "amd"}
    try:
        view().invalidate()

        @ray.remote(num_gpus=1, label_selector=sel)
        class One:
            def ids(self):
                return ray.get_gpu_ids()

        one = One.remote()
        held = ray.get(one.ids.remote(), timeout=120)

        @ray.remote(num_gpus=4, label_selector=sel)
        def rocm_job():
            return ray.get_gpu_ids(), os.environ.get("HIP_VISIBLE_DEVICES"), ray.get_runtime_context().get_node_id()

        ids, hip, where = ray.get(rocm_job.remote(), timeout=120)
        assert where == nid and hip == ",".join(str(i) for i in ids) and len(ids) == 4
        assert not set(ids) & set(held)
        links = {topo.link(min(a, b), max(a, b)).label for a in ids for b in ids if a < b}
        assert links == {"XGMI"}, (ids, held)
        ray.kill(one)
    finally:
        cluster.remove_node(nid)
        view().invalidate()


def test_status_tables_name_every_node(cluster):
    r = subprocess.run([sys.executable, "-m", "rayaccel.cli", "status", "--address", cluster.address],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-2000:]
    for n in cluster.nodes:
        assert n.node_key in r.stdout
    assert "free" in r.stdout
