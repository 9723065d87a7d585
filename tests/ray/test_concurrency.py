"""Exclusivity under concurrent submitters, and release after failures."""

from __future__ import annotations

import os
import signal
import time

import pytest

import rayaccel.ray as rr
from raytest_helpers import free_devices, node_named, submit_concurrently, wait_for


def _ledger_cls():
    import ray

    @ray.remote(num_cpus=0)
    class Ledger:
        """Who holds which (node, device) right now; counts overlaps."""

        def __init__(self):
            self.held = {}
            self.violations = []
            self.done = 0

        def enter(self, node, devices, who):
            for d in devices:
                k = (node, d)
                if k in self.held:
                    self.violations.append((k, self.held[k], who))
                self.held[k] = who

        def leave(self, node, devices, who):
            for d in devices:
                if self.held.get((node, d)) == who:
                    del self.held[(node, d)]
            self.done += 1

        def report(self):
            return self.done, self.violations

    return Ledger


def _hold(ledger, who):
    import ray

    a = rr.get_devices()
    node = ray.get_runtime_context().get_node_id()
    ray.get(ledger.enter.remote(node, a.indices, who))
    time.sleep(0.02)
    ray.get(ledger.leave.remote(node, a.indices, who))
    return a.indices


def test_concurrent_submitters_never_share_a_device(cluster):
    import ray

    ledger = _ledger_cls().remote()
    one = rr.remote(gpus=1, num_cpus=0)(_hold)
    two = rr.remote(gpus=2, num_cpus=0)(_hold)
    refs = submit_concurrently(4, 25, lambda t, i: (two if i % 3 == 0 else one).remote(ledger, f"t{t}-{i}"))
    results = ray.get(refs, timeout=180)
    done, violations = ray.get(ledger.report.remote())
    assert done == 100 and len(results) == 100
    assert violations == []
    ray.kill(ledger)


def _pid_and_devices():
    import ray

    return os.getpid(), ray.get_runtime_context().get_node_id(), rr.get_devices().indices


def _sleep_forever():
    time.sleep(3600)


class Sleeper:
    def where(self):
        return _pid_and_devices()


def test_sigkilled_worker_frees_its_devices_and_new_work_lands_there(cluster):
    import ray

    from rayaccel.ray import registry

    node = node_named(cluster, "pcie-8gpu-2socket")

    # a long task holding the whole PCIe node, found through Ray's free state
    slow = rr.remote(gpus=8, num_cpus=0, max_retries=0)(_sleep_forever)
    model = node.topology.devices[0].model
    ref = slow.options(model=model).remote()
    wait_for(lambda: free_devices(node.node_id) == set(), what="the task to take every device")
    holders = wait_for(lambda: [e for e in registry.holders().values()
                                if e["node_id"] == node.node_id], what="the holder entry")
    os.kill(holders[0]["pid"], signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayError):
        ray.get(ref, timeout=60)
    t0 = time.monotonic()
    wait_for(lambda: free_devices(node.node_id) == set(node.topology.indices), what="devices freed")
    freed_s = time.monotonic() - t0
    pid, node_id, devs = ray.get(rr.remote(gpus=8, model=model, num_cpus=0)(_pid_and_devices).remote(), timeout=60)
    assert node_id == node.node_id and sorted(devs) == list(node.topology.indices)
    print(f"devices free {freed_s:.2f} s after the task failed")


def test_killed_actor_frees_its_devices(cluster):
    import ray

    node = node_named(cluster, "dgx1-v100")
    cls = rr.remote(gpus=8, model="SXM2", num_cpus=0)(Sleeper)
    a = cls.remote()
    ray.get(a.where.remote())
    assert free_devices(node.node_id) == set() or wait_for(lambda: free_devices(node.node_id) == set())
    ray.kill(a)
    wait_for(lambda: free_devices(node.node_id) == set(node.topology.indices), what="devices freed")
    b = cls.remote()
    _, node_id, devs = ray.get(b.where.remote(), timeout=60)
    assert node_id == node.node_id and len(devs) == 8
    ray.kill(b)


def test_removed_node_leaves_the_view_and_work_goes_elsewhere(cluster):
    import ray

    from rayaccel.errors import Unsatisfiable
    from rayaccel.ray import context

    node_id = cluster.add_node("hgx-h100")
    try:
        cls = rr.remote(gpus=4, model="H100", num_cpus=0)(Sleeper)
        a = cls.remote()
        _, where, _ = ray.get(a.where.remote(), timeout=60)
        assert where == node_id
    finally:
        cluster.remove_node(node_id)
    wait_for(lambda: node_id not in {n.node_id for n in context.view().nodes(fresh=True)}, what="node gone")
    with pytest.raises(Unsatisfiable, match="H100"):
        cls.remote()
    out = ray.get(rr.remote(gpus=4, num_cpus=0)(_pid_and_devices).remote(), timeout=60)
    assert out[1] in {n.node_id for n in cluster.nodes}
