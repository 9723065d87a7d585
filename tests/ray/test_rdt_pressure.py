"""GPU objects under pressure: a producer's ``rayaccel``-transport objects beyond its device budget spill and return.

One simulated DGX-A100 node; CPU tensors stand in for device ones (no GPU here: the producer's
store runs its simulated device tier; the moves, spill files and checksums are the real ones).
The producer runs ahead of its consumer, so the least recently used objects go to host memory
and disk; the consumer then reads every object, bit-identical, and Ray's RDT store held only
placeholders of the spilled ones meanwhile.
"""

from __future__ import annotations

import hashlib

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.ray

from rayaccel.ray import _ray_private as _rp  # noqa: E402

if _rp.release_tuple() < _rp.TRANSPORT.since:
    pytest.skip(f"Ray {_rp.release()} does not carry {_rp.TRANSPORT.name} (Ray >= {_rp.TRANSPORT.since_text})",
                allow_module_level=True)

MiB = 1 << 20


def _make(nbytes, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), dtype=torch.int32, generator=g).view(torch.float32)


def _digest(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.fixture(scope="module")
def one_a100(ray_env):
    import ray

    import rayaccel.ray  # noqa: F401 - the driver side of the transport
    from rayaccel.ray.driver.cluster import SimulatedCluster

    if ray.is_initialized():
        ray.shutdown()
    c = SimulatedCluster(["dgx-a100"], num_cpus=2, object_store_memory=200 << 20, logging_level="ERROR",
                         log_to_driver=False)
    try:
        yield c
    finally:
        c.shutdown()


def test_objects_beyond_the_budget_spill_and_come_back_bit_identical(one_a100, tmp_path):
    import ray

    @ray.remote(enable_tensor_transport=True, num_gpus=1, num_cpus=0)
    class Producer:
        @ray.method(tensor_transport="rayaccel")
        def make(self, nbytes, seed):
            return _make(nbytes, seed)  # the producer keeps no reference: only Ray's RDT store and the transport

        def state(self):
            from ray._private.worker import global_worker

            from rayaccel.ray.rdt.transport import manager

            store = global_worker.rdt_manager.rdt_store
            devices = {}
            with store._lock:
                for oid, q in store._rdt_store.items():
                    devices[oid] = [t.device.type for t in q[0].data]
            return manager().held.stats(), devices

    env = {"RAYACCEL_RDT_DEVICE_BYTES": "50MiB", "RAYACCEL_HOST_MEMORY_BYTES": "25MiB",
           "RAYACCEL_SPILL_DIR": str(tmp_path)}
    p = Producer.options(runtime_env={"env_vars": env}).remote()
    n, size = 6, 20 * MiB
    refs = [p.make.remote(size, seed) for seed in range(n)]
    ray.wait(refs, num_returns=n, timeout=120)
    stats, devices = ray.get(p.state.remote(), timeout=60)
    assert stats["objects"] == n and stats["held_bytes"] == n * size
    assert stats["device_bytes"] <= 50 * MiB and stats["spilled_bytes"] == (n - 2) * size
    assert stats["host_bytes"] == size and stats["disk_bytes"] == (n - 3) * size  # host full: the rest on disk
    assert sorted(d[0] for d in devices.values()).count("meta") == n - 2  # Ray's store let go of the spilled ones
    # per-holder spilled bytes: the producer's row in status (the metric rayaccel_holder_spilled_bytes follows it)
    from raytest_helpers import wait_for

    from rayaccel.ray.driver.status import cluster_status

    def spilled_row():
        rows = cluster_status()["nodes"][0]["usage"] or []
        return next((r for r in rows if r["actor_class"] == "Producer" and r["spilled_bytes"] == (n - 2) * size), None)

    row = wait_for(spilled_row, 30, "the producer's spilled bytes in status")
    assert row["kind"] == "actor" and row["used_bytes"] is None  # a simulated node: no NVML figure, none reported
    for seed, ref in enumerate(refs):
        got = ray.get(ref, timeout=120)
        assert _digest(got) == _digest(_make(size, seed)), seed
    stats, _ = ray.get(p.state.remote(), timeout=60)
    assert stats["restores"] >= n - 2 and stats["device_bytes"] <= 50 * MiB
    del refs, got
    ray.kill(p)


def test_a_bad_budget_is_one_clear_error(one_a100):
    import ray

    @ray.remote(enable_tensor_transport=True, num_gpus=1, num_cpus=0)
    class Producer:
        @ray.method(tensor_transport="rayaccel")
        def make(self):
            return torch.zeros(4)

    p = Producer.options(runtime_env={"env_vars": {"RAYACCEL_RDT_DEVICE_BYTES": "lots"}}).remote()
    with pytest.raises(Exception, match="RAYACCEL_RDT_DEVICE_BYTES='lots'.*not a size"):
        ray.get(p.make.remote(), timeout=60)
    ray.kill(p)
