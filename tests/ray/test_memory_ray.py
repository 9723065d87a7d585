"""``rayaccel.store()`` inside Ray tasks: sizing, same-node hand-off, Ray fallback, cleanup of killed workers."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray
MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    os.environ["RAY_AUTH_MODE"] = "disabled"
    tmp = tmp_path_factory.mktemp("ray")
    spill = tmp_path_factory.mktemp("spill")
    import sys

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import test modules
    if ray.is_initialized():  # e.g. the Ray-layer tests' session cluster: it reconnects when needed
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=str(tmp), configure_logging=False,
             runtime_env={"env_vars": {"RAYACCEL_SPILL_DIR": str(spill), "RAY_AUTH_MODE": "disabled"}})
    yield spill
    ray.shutdown()


def _data(seed: int, n: int = MiB) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, n, dtype=np.uint8)


@ray.remote
def produce(seed: int, spill_to: str | None = None):
    from rayaccel.ray.worker.store import store

    os.environ["RAYACCEL_GPU_MEMORY_BYTES"] = str(2 * MiB)  # as the in-worker setup would
    s = store()
    h = s.put(_data(seed), name=f"batch-{seed}")
    if spill_to:
        s.spill(h, to=spill_to)
    return h, os.getpid(), s.budgets["device"], str(s.spill_dir)


@ray.remote
def consume(handle):
    from rayaccel.ray.worker.store import store

    x = store().get(handle)
    return x.tobytes() == _data(int(handle.name.split("-")[1])).tobytes(), os.getpid(), handle.shared.ref is None


@ray.remote
def fresh_store():
    from rayaccel.memory import Store

    Store(device_bytes=MiB, host_bytes=MiB, spill_dir=os.environ["RAYACCEL_SPILL_DIR"]).close()


@pytest.mark.parametrize("tier", [None, "host", "disk"], ids=["device", "host", "disk"])
def test_handle_passes_between_tasks_without_object_store(cluster, tier):
    h, owner_pid, budget, _ = ray.get(produce.remote(11, tier))
    assert budget == 2 * MiB
    ok, pid, no_ray_copy = ray.get(consume.remote(h))
    assert ok and no_ray_copy  # one node: the bytes went through shared memory only


@ray.remote
class Owner:
    def put(self, seed):
        from rayaccel.ray.worker.store import store

        s = store()
        self.h = s.put(_data(seed), name=f"batch-{seed}")
        return self.h

    def delete(self):
        from rayaccel.ray.worker.store import store

        store().delete(self.h)


def test_falls_back_to_ray_object_store_when_segment_is_gone(cluster):
    owner = Owner.options(runtime_env={"env_vars": {"RAYACCEL_SHARE_VIA_RAY": "always"}}).remote()
    h = ray.get(owner.put.remote(21))
    assert h.shared.ref is not None and h.shared.segment
    ray.get(owner.delete.remote())
    ok, _, _ = ray.get(consume.remote(h))
    assert ok
    ray.kill(owner)


def test_driver_store_defaults(cluster, monkeypatch):
    from rayaccel.ray.worker.store import DEFAULT_DEVICE_BYTES, close_store, store

    monkeypatch.delenv("RAYACCEL_GPU_MEMORY_BYTES", raising=False)
    s = store()
    try:
        assert s.budgets["device"] == DEFAULT_DEVICE_BYTES and store() is s
        assert s.node_id == ray.get_runtime_context().get_node_id()
        monkeypatch.setenv("RAYACCEL_GPU_MEMORY_BYTES", "1MiB")
        h = s.put(_data(1))
        h2 = s.put(_data(2))
        assert store().budgets["device"] == MiB and s.tier(h) == "host" and s.tier(h2) == "device"
    finally:
        close_store()


def test_bad_env_size_is_named(cluster, monkeypatch):
    from rayaccel.errors import StoreError
    from rayaccel.ray.worker.store import store

    monkeypatch.setenv("RAYACCEL_GPU_MEMORY_BYTES", "plenty")
    with pytest.raises(StoreError, match="RAYACCEL_GPU_MEMORY_BYTES"):
        store()


def test_killed_worker_leaves_no_spill_files_or_segments(cluster):
    h, pid, _, spill_dir = ray.get(produce.remote(31, "disk"))
    import pickle

    segment = pickle.loads(pickle.dumps(h)).shared.segment  # already exported when returned
    assert Path(spill_dir).exists() and Path("/dev/shm", segment).exists()
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 30
    while Path(f"/proc/{pid}").exists() and time.time() < deadline:
        time.sleep(0.1)
    # any new store on the node sweeps the dead worker's leftovers
    ray.get(fresh_store.remote())
    assert not Path(spill_dir).exists() and not Path("/dev/shm", segment).exists()
