"""Re-planning: tasks that find nothing free wait at the dispatcher, not behind one busy set."""

from __future__ import annotations

import os
import time

import pytest

import rayaccel.ray as rr
from raytest_helpers import free_devices, node_named, submit_concurrently, wait_for

V100 = "SXM2"  # the DGX-1 node of the session cluster


def _hold_until(path):
    """Hold the devices until ``path`` exists; return (node, devices)."""
    import ray

    while not os.path.exists(path):
        time.sleep(0.02)
    return ray.get_runtime_context().get_node_id(), rr.get_devices().indices


def _where():
    import ray

    return ray.get_runtime_context().get_node_id(), rr.get_devices().indices


def _boom(msg):
    raise ValueError(msg)


def _release(path):
    with open(path, "w") as f:
        f.write("go")


def _occupy(tmp_path, node, sizes, tag="gate"):
    """Hold the DGX node with tasks of ``sizes`` devices; return [(gate path, ref, devices)]."""
    held = []
    for i, k in enumerate(sizes):
        gate = str(tmp_path / f"{tag}{i}")
        before = free_devices(node.node_id)
        ref = rr.remote(gpus=k, model=V100, num_cpus=0, max_retries=0)(_hold_until).remote(gate)
        wait_for(lambda: len(free_devices(node.node_id)) == len(before) - k, what=f"holder {i} to start")
        held.append((gate, ref, tuple(sorted(before - free_devices(node.node_id)))))
    return held


def test_queued_task_starts_on_the_set_that_frees_first(cluster, tmp_path):
    import ray

    from rayaccel.ray import dispatch

    node = node_named(cluster, "dgx1-v100")
    (gate_a, ref_a, set_a), (gate_b, ref_b, set_b), (gate_c, ref_c, _) = _occupy(tmp_path, node, (2, 2, 4))
    assert len(set_a) == len(set_b) == 2 and not set(set_a) & set(set_b)
    before = dispatch.stats()
    ref = rr.remote(gpus=2, model=V100, interconnect="nvlink", num_cpus=0)(_where).remote()
    wait_for(lambda: dispatch.stats()["received"] > before["received"], what="the task to reach the dispatcher")
    _release(gate_b)  # B frees first, A stays busy
    where, devices = ray.get(ref, timeout=30)
    assert (where, tuple(sorted(devices))) == (node.node_id, set_b)
    assert ray.get(ref_b, timeout=10)[1]
    ready, _ = ray.wait([ref_a], timeout=0)
    assert not ready, "A was still held: the queued task did not wait for it"
    for g in (gate_a, gate_c):
        _release(g)
    ray.get([ref_a, ref_c], timeout=30)


def test_exception_of_a_queued_task_reaches_ray_get(cluster, tmp_path):
    import ray

    from rayaccel.ray import dispatch

    node = node_named(cluster, "dgx1-v100")
    ((gate, ref_all, _),) = _occupy(tmp_path, node, (8,))
    before = dispatch.stats()
    ref = rr.remote(gpus=1, model=V100, num_cpus=0, max_retries=0)(_boom).remote("queued and failed")
    two = rr.remote(gpus=1, model=V100, num_cpus=0, num_returns=2)(lambda: (1, 2)).remote()
    wait_for(lambda: dispatch.stats()["received"] >= before["received"] + 2, what="both at the dispatcher")
    _release(gate)
    with pytest.raises(ValueError, match="queued and failed"):
        ray.get(ref, timeout=30)
    assert ray.get(two, timeout=30) == [1, 2]
    ray.get(ref_all, timeout=30)
    assert dispatch.stats()["failed"] >= before["failed"] + 1


def test_dispatcher_restarts_and_is_recreated(cluster, tmp_path):
    import ray

    from rayaccel.ray import dispatch

    node = node_named(cluster, "dgx1-v100")
    ((gate, ref_all, _),) = _occupy(tmp_path, node, (8,))
    ref = rr.remote(gpus=2, model=V100, num_cpus=0)(_where).remote()
    wait_for(lambda: dispatch.stats()["queued"] >= 1, what="the task queued at the dispatcher")
    # a crash: Ray restarts the actor and retries the queued call there
    ray.kill(dispatch.handle(), no_restart=False)
    time.sleep(0.5)
    _release(gate)
    assert ray.get(ref, timeout=60)[0] == node.node_id
    ray.get(ref_all, timeout=30)

    # killed for good: the next driver call creates a new dispatcher
    ray.kill(dispatch.handle())
    wait_for(lambda: _gone(), what="the named dispatcher to disappear")
    time.sleep(dispatch.HANDLE_CHECK_S + 0.1)
    ((gate, ref_all, _),) = _occupy(tmp_path, node, (8,), tag="again")
    ref = rr.remote(gpus=1, model=V100, num_cpus=0)(_where).remote()
    _release(gate)
    assert ray.get(ref, timeout=60)[0] == node.node_id
    ray.get(ref_all, timeout=30)


def _gone():
    import ray

    from rayaccel.ray import dispatch

    try:
        ray.get_actor(dispatch.NAME, namespace=dispatch.NAMESPACE)
    except ValueError:
        return True
    return False


def _ledger_cls():
    import ray

    @ray.remote(num_cpus=0)
    class Ledger:
        """Start/end times and devices of every task; counts devices held twice."""

        def __init__(self):
            self.held = {}
            self.violations = []
            self.events = []  # (who, submitted, started, ended, devices)

        def enter(self, devices, who):
            for d in devices:
                if d in self.held:
                    self.violations.append((d, self.held[d], who))
                self.held[d] = who
            return time.time()

        def leave(self, devices, who, submitted, started):
            for d in devices:
                if self.held.get(d) == who:
                    del self.held[d]
            self.events.append((who, submitted, started, time.time(), tuple(devices)))

        def report(self):
            return self.events, self.violations

    return Ledger


def _work(ledger, who, submitted, seconds):
    import ray

    devices = rr.get_devices().indices
    started = ray.get(ledger.enter.remote(devices, who))
    time.sleep(seconds)
    ray.get(ledger.leave.remote(devices, who, submitted, started))
    return devices


#: A 1-GPU task waiting while some device of its node sits free this long is a failure.
IDLE_LIMIT_S = 2.0


def test_concurrent_submitters_never_wait_while_a_device_is_free(cluster):
    import ray

    from rayaccel.ray import dispatch

    node = node_named(cluster, "pcie-8gpu-2socket")
    model = node.topology.devices[0].model
    ledger = _ledger_cls().remote()
    fn = rr.remote(gpus=1, model=model, num_cpus=0)(_work)
    before = dispatch.stats()
    def submit(t, i):
        # mostly short tasks, some long ones: a task pinned behind a long one
        # would wait seconds while other devices sit idle
        seconds = 2.5 if (t * 31 + i) % 23 == 0 else 0.02
        return fn.remote(ledger, f"t{t}-{i}", time.time(), seconds)

    refs = submit_concurrently(6, 30, submit)
    ray.get(refs, timeout=120)
    events, violations = ray.get(ledger.report.remote())
    ray.kill(ledger)
    assert violations == [] and len(events) == 180
    after = dispatch.stats()
    assert after["received"] > before["received"], "the burst should have overflowed to the dispatcher"
    assert after["missed"] == before["missed"], "a queued request was left while a matching set was free"

    # Idle stretches of each device (between one task's end and the next start on it).
    per_device: dict[int, list] = {}
    for _, _, started, ended, devs in events:
        for d in devs:
            per_device.setdefault(d, []).append((started, ended))
    idle = []
    for spans in per_device.values():
        spans.sort()
        idle += [(a[1], b[0]) for a, b in zip(spans, spans[1:]) if b[0] > a[1]]
    # No task waited (submitted, not started) across a whole idle stretch longer than the limit.
    for who, submitted, started, _, _ in events:
        for free_from, free_to in idle:
            overlap = min(started, free_to) - max(submitted, free_from)
            assert overlap <= IDLE_LIMIT_S, f"{who} waited {overlap:.1f} s while a device was free"
