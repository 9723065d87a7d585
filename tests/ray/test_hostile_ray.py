"""A corrupt or lying node record degrades only its node; work follows its owner (issue "Hardening").

Regression tests for the audit's H1 (a corrupt record in the KV broke every
``.remote()`` of the cluster), H3 (a record listing devices the node does not have
was trusted), M1 (queued work outlived its driver), M2 (retries pinned to a dead
node: see test_correctness.py) and H2 (rayaccel's own machinery restarting ran a
task twice).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from raytest_helpers import node_named, wait_for

import rayaccel
from rayaccel.contract import NAMESPACE, kv_key

pytestmark = pytest.mark.ray


def _put(key, value):
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(kv_key(key), value, overwrite=True, namespace=NAMESPACE)


def _get(key):
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_get(kv_key(key), namespace=NAMESPACE)


@pytest.fixture
def fresh_view():
    from rayaccel.ray.driver import view
    view.reset()
    yield
    view.reset()


@pytest.mark.parametrize("bad", [b"{corrupt", b"[" * 200_000 + b"]" * 200_000, b'{"node_key": "x"}',
                                 b'"just a string"'], ids=["truncated", "deeply-nested", "wrong-key", "not-object"])
def test_a_corrupt_record_degrades_only_its_node(cluster, fresh_view, bad):
    import ray

    from rayaccel.ray.driver.status import cluster_status

    pcie = node_named(cluster, "pcie-8gpu-2socket")
    good = _get(pcie.node_key)
    try:
        _put(pcie.node_key, bad)

        @rayaccel.remote(gpus=2)
        def job():
            return ray.get_runtime_context().get_node_id()

        # new drivers/submissions still work, on the other nodes
        assert ray.get([job.remote() for _ in range(3)], timeout=60)
        st = cluster_status()
        names = {n["name"] for n in st["nodes"]}
        assert "pcie-8gpu-2socket" not in names and "dgx1-v100" in names
        assert [b["node_key"] for b in st["bad"]] == [pcie.node_key]
        assert "record" in st["bad"][0]["why"]
    finally:
        _put(pcie.node_key, good)


def test_a_lying_record_is_not_trusted(cluster, fresh_view):
    import ray

    from rayaccel import catalog
    from rayaccel.ray.record import NodeRecord
    from rayaccel.ray.driver.status import cluster_status
    from rayaccel.topology import NodeTopology

    pcie = node_named(cluster, "pcie-8gpu-2socket")
    good = _get(pcie.node_key)
    d = catalog.load("dgx2-v100").to_dict()  # 16 devices, but the node advertises 8 GPUs
    lie = NodeRecord(pcie.node_key, NodeTopology.from_dict(d), True)
    try:
        _put(pcie.node_key, lie.to_json())
        st = cluster_status()
        bad = {b["node_key"]: b["why"] for b in st["bad"]}
        assert "16 GPU(s)" in bad[pcie.node_key] and "advertises 8" in bad[pcie.node_key]

        @rayaccel.remote(gpus=16)
        def huge():
            return 1

        with pytest.raises(rayaccel.RayaccelError):  # never sent to the node that lied
            huge.remote()
    finally:
        _put(pcie.node_key, good)
        del ray


def test_queued_work_of_a_dead_driver_is_dropped(cluster, tmp_path):
    """A driver queues GPU tasks behind busy devices, then is SIGKILLed: they never run."""
    import ray

    dgx = node_named(cluster, "dgx1-v100")

    @ray.remote(num_gpus=8, label_selector={"rayaccel.io/topology": "dgx1-v100"})
    class Hog:
        def ok(self):
            return True

    hog = Hog.remote()
    ray.get(hog.ok.remote())
    marker = tmp_path / "ran"
    code = textwrap.dedent(f"""
        import sys, time, ray
        ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
        @ray.remote(num_gpus=1, label_selector={{"rayaccel.io/topology": "dgx1-v100"}})
        def late():
            open({str(marker)!r}, "a").write("x")
        refs = [late.remote() for _ in range(8)]
        print("queued", flush=True)
        time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", code, cluster.address], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "queued"
        time.sleep(1.0)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        time.sleep(2.0)  # Ray notices the dead driver and cancels its work
    finally:
        ray.kill(hog)
    time.sleep(3.0)
    assert not marker.exists(), "tasks of a dead driver ran"
    del dgx


def test_restarting_rayaccel_machinery_never_reruns_a_task(cluster, tmp_path):
    """The node agent is killed (it restarts) while tasks run: each runs exactly once."""
    import ray

    from rayaccel.ray.node import agent
    dgx = node_named(cluster, "dgx1-v100")
    out = tmp_path / "runs"
    out.mkdir()

    @rayaccel.remote(gpus=1, max_retries=0, model="V100")
    def once(i):
        import time

        open(os.path.join(str(out), f"{i}-{os.getpid()}-{time.time()}"), "w").close()
        time.sleep(1.5)
        return i

    refs = [once.remote(i) for i in range(6)]
    time.sleep(0.5)
    h = agent.handle(dgx.node_key)
    pid = h.ask("pid")  # any call: the agent is alive
    assert pid
    os.kill(pid, signal.SIGKILL)  # its supervisor starts it again
    assert sorted(ray.get(refs, timeout=120)) == list(range(6))
    runs = sorted(p.name.split("-")[0] for p in out.iterdir())
    assert runs == [str(i) for i in range(6)], runs  # exactly one execution each
    wait_for(lambda: agent.handle(dgx.node_key) is not None and agent.handle(dgx.node_key).pid != pid and
             agent.handle(dgx.node_key).ping() == dgx.node_key, 30, "the agent back")


@pytest.mark.parametrize("bad", [
    {"free": [0], "holders": ["x"]},
    {"free": [0], "holders": [{"devices": [{"a": 1}]}]},
    {"free": [0], "drained": {"0": "nope"}},
    {"free": [0], "shared": {"0": "half"}},
    {"free": "all"},
], ids=["holder-not-object", "devices-not-indices", "drain-not-object", "share-not-number", "free-not-list"])
def test_a_malformed_published_snapshot_degrades_only_its_node(cluster, fresh_view, bad):
    from rayaccel.ray.kv import parse_state
    from rayaccel.ray.driver.status import cluster_status

    with pytest.raises(rayaccel.RayaccelError):
        parse_state(json.dumps(bad).encode(), "abcdef123456")
    # and status, which prefers the agents' own answers, still renders every node
    st = cluster_status()
    assert {n["name"] for n in st["nodes"]} >= {"dgx1-v100", "pcie-8gpu-2socket"}
