"""The tiered store: placement, every tier transition, pinning, reference counting, stats, threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from rayaccel.errors import RequestError, StoreError, StoreFull, UnknownObject
from rayaccel.memory import Store, UnsupportedObject
from rayaccel.memory.spill import drain

MiB = 1 << 20


def arr(seed: int, nbytes: int = MiB, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 255, nbytes, dtype=np.uint8).view(dtype)


def same(a, b) -> bool:
    """Bit-identical (NaN payloads included), same dtype and shape."""
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


@pytest.fixture
def store(tmp_path):
    with Store(device_bytes=2 * MiB, host_bytes=2 * MiB, spill_dir=tmp_path, device="cpu") as s:
        yield s


def test_simulated_backend_without_gpu(store):
    assert store.backend == "simulated"
    assert store.budgets == {"device": 2 * MiB, "host": 2 * MiB, "disk": None}


@pytest.mark.parametrize("sizes", [dict(device_bytes="64MiB", host_bytes="1GiB"), dict(device_bytes=1024, host_bytes="1.5KiB")],
                         ids=["strings", "ints"])
def test_sizes_accept_strings_and_ints(tmp_path, sizes):
    with Store(**sizes, spill_dir=tmp_path, device="cpu") as s:
        assert all(isinstance(v, int) for k, v in s.budgets.items() if k != "disk")


@pytest.mark.parametrize("bad,field", [("lots", "device_bytes"), (-1, "device_bytes")], ids=["word", "negative"])
def test_bad_sizes_name_the_field(tmp_path, bad, field):
    with pytest.raises(RequestError, match=field):
        Store(device_bytes=bad, host_bytes=MiB, spill_dir=tmp_path, device="cpu")


def test_fraction_needs_a_gpu(tmp_path):
    with pytest.raises(StoreError, match="fraction"):
        Store(device_bytes=0.5, host_bytes=MiB, spill_dir=tmp_path, device="cpu")


def test_unknown_device_is_rejected(tmp_path):
    with pytest.raises(StoreError, match="cuda"):
        Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cuda:0" if not torch.cuda.is_available() else "tpu")


@pytest.mark.parametrize("obj", [
    np.arange(1000, dtype=np.int64),
    np.arange(24, dtype=np.float16).reshape(2, 3, 4),
    np.zeros((0, 3), dtype=np.float64),
    np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)),
    torch.arange(1000, dtype=torch.float32),
    torch.randn(4, 5).to(torch.bfloat16),
    torch.randn(6, 4).t(),
    np.array([True, False, True]),
], ids=["int64", "f16-3d", "empty", "fortran", "torch-f32", "torch-bf16", "torch-noncontig", "bool"])
@pytest.mark.parametrize("tier", ["device", "host", "disk"])
def test_roundtrip_through_every_tier(store, obj, tier):
    h = store.put(obj)
    if tier != "device":
        store.spill(h, to=tier)
    assert store.tier(h) == tier
    back = store.get(h)
    assert store.tier(h) == "device"
    assert type(back) is type(obj) and back.shape == obj.shape and back.dtype == obj.dtype
    if isinstance(obj, np.ndarray):
        assert same(back, obj)
    else:
        assert torch.equal(back, obj) and back.stride() == back.contiguous().stride()


def test_unsupported_objects_are_rejected(store):
    with pytest.raises(UnsupportedObject, match="numpy array or a torch tensor"):
        store.put([1, 2, 3])
    with pytest.raises(UnsupportedObject, match="object"):
        store.put(np.array([object()]))


def test_lru_spills_device_to_host_to_disk(store):
    hs = [store.put(arr(i)) for i in range(6)]
    tiers = [store.tier(h) for h in hs]
    assert tiers == ["disk", "disk", "host", "host", "device", "device"]
    st = store.stats()
    assert (st["device_bytes"], st["host_bytes"], st["disk_bytes"]) == (2 * MiB, 2 * MiB, 2 * MiB)
    assert st["spills"] == 6  # 4 device->host, 2 host->disk
    assert st["moved_bytes"]["device->host"] == 4 * MiB and st["moved_bytes"]["host->disk"] == 2 * MiB
    assert len(list(store.spill_dir.iterdir())) == 2


def test_get_restores_and_lru_order_follows_access(store):
    hs = [store.put(arr(i)) for i in range(4)]  # 0,1 on host; 2,3 on device
    store.get(hs[2])  # 3 is now least recently used on the device tier
    assert same(store.get(hs[0]), arr(0))  # restore 0 evicts 3
    assert store.tier(hs[0]) == "device" and store.tier(hs[3]) == "host" and store.tier(hs[2]) == "device"
    st = store.stats()
    assert st["restores"] == 1 and st["moved_bytes"]["host->device"] == MiB


def test_restore_from_disk_goes_to_device_and_removes_file(store):
    h = store.put(arr(7))
    store.spill(h, to="disk")
    path = next(store.spill_dir.iterdir())
    assert same(store.get(h), arr(7))
    drain()  # the file is unlinked on a helper thread
    assert not path.exists() and store.stats()["moved_bytes"]["disk->device"] == MiB


def test_device_to_disk_directly(store):
    h = store.put(arr(3))
    store.spill(h, to="disk")
    assert store.stats()["moved_bytes"]["device->disk"] == MiB


def test_object_larger_than_device_budget_lands_on_host(store):
    big = arr(1, 3 * MiB // 2 * 2)  # 3 MiB > device budget
    h = store.put(big)
    assert store.tier(h) == "disk"  # larger than both memory budgets
    assert same(store.get(h), big)  # served without promotion
    assert store.tier(h) == "disk"


def test_put_that_fits_nowhere_raises_and_stores_nothing(tmp_path):
    with Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, disk_bytes=MiB, device="cpu") as s:
        hs = [s.put(arr(i)) for i in range(3)]
        with pytest.raises(StoreFull, match="no tier can hold"):
            s.put(arr(9))
        assert s.stats()["objects"] == 3
        for i, h in enumerate(hs):
            assert same(s.get(h), arr(i))


def test_pinned_objects_are_never_spilled(store):
    a, b = store.put(arr(0)), store.put(arr(1))
    with store.pinned(a) as x:
        assert same(x, arr(0))
        store.put(arr(2))
        store.put(arr(3))
        assert store.tier(a) == "device" and store.tier(b) == "host"
        with pytest.raises(StoreError, match="pinned"):
            store.spill(a)
        with pytest.raises(StoreError, match="pinned"):
            store.delete(a)
    assert store.stats()["pinned"] == 0


def test_pinning_restores_a_spilled_object_first(store):
    h = store.put(arr(5))
    store.spill(h, to="disk")
    with store.pinned(h) as x:
        assert store.tier(h) == "device" and same(x, arr(5))


def test_device_full_of_pinned_objects(store):
    a, b = store.put(arr(0)), store.put(arr(1))
    with store.pinned(a), store.pinned(b):
        h = store.put(arr(2))  # device full of pinned: goes to host
        assert store.tier(h) == "host"
        assert same(store.get(h), arr(2))  # served as a copy, not promoted
        assert store.tier(h) == "host"
        with pytest.raises(StoreFull, match="device tier"):
            with store.pinned(h):
                pass


def test_reference_counting(store):
    h = store.put(arr(0))
    assert store.retain(h) is h and store.refcount(h) == 2
    assert store.release(h) == 1 and h in store
    assert store.release(h) == 0 and h not in store
    with pytest.raises(UnknownObject, match="not in the store"):
        store.get(h)


def test_delete_removes_spill_file_and_frees_bytes(store):
    h = store.put(arr(0))
    store.spill(h, to="disk")
    store.delete(h)
    assert list(store.spill_dir.iterdir()) == []
    st = store.stats()
    assert st["disk_bytes"] == 0 and st["objects"] == 0
    with pytest.raises(UnknownObject):
        store.delete(h)


def test_handles_of_another_store_are_rejected(tmp_path, store):
    with Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu") as other:
        h = other.put(arr(0))
        with pytest.raises(UnknownObject, match="another store"):
            store.delete(h)
    with pytest.raises(UnknownObject, match="Handle"):
        store.get("obj-1")


def test_close_is_idempotent_and_removes_spill_dir(tmp_path):
    s = Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu")
    h = s.put(arr(0))
    s.spill(h, to="disk")
    d = s.spill_dir
    assert any(d.iterdir())
    s.close()
    s.close()
    assert not d.exists() and s.closed
    with pytest.raises(StoreError, match="closed"):
        s.put(arr(1))


def test_get_moves_to_requested_device(store):
    h = store.put(arr(0))
    t = store.get(h, device="cpu")
    assert isinstance(t, np.ndarray)
    th = store.put(torch.arange(10))
    assert store.get(th, device="cpu").device.type == "cpu"
    with pytest.raises(StoreError, match="device"):
        store.get(h, device="cuda:0" if not torch.cuda.is_available() else "cuda:99")


def test_returned_arrays_are_never_overwritten_by_buffer_reuse(store):
    """A restored object's buffer goes back to the pool only when nobody holds it."""
    h = store.put(arr(0))
    store.spill(h)
    kept = store.get(h)  # a view of a pooled device buffer
    store.spill(h)
    h2 = store.put(arr(1))
    store.spill(h2)
    store.get(h2)
    assert same(kept, arr(0))


def test_threads_put_and_get_concurrently(store):
    errors = []

    def work(tid: int) -> None:
        try:
            mine = []
            for i in range(12):
                a = arr(tid * 100 + i, 256 << 10)
                mine.append((store.put(a), a))
                h, a0 = mine[(i * 7) % len(mine)]
                if not same(store.get(h), a0):
                    errors.append(f"thread {tid}: wrong data")
            for h, a0 in mine:
                if not same(store.get(h), a0):
                    errors.append(f"thread {tid}: wrong data at end")
                store.delete(h)
        except Exception as e:  # collected and asserted below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    st = store.stats()
    assert st["objects"] == 0 and st["device_bytes"] == st["host_bytes"] == st["disk_bytes"] == 0
    assert st["spills"] > 0 and st["restores"] > 0
