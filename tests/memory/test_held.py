"""Objects a producer holds for readers under a device budget (:class:`rayaccel.memory.held.HeldObjects`).

No GPU here: CPU tensors stand in for device ones (the store's simulated device tier,
``device="cpu"``); the moves, the LRU, the spill files and their checksums are the store's real ones.
"""

from __future__ import annotations

import threading

import pytest
import torch

from rayaccel.errors import CorruptObject, StoreError
from rayaccel.memory.held import HeldObjects

MIB = 1 << 20


def _tensor(seed, n=MIB // 4, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g).to(dtype)


class Swaps:
    """What the producer's other references (Ray's RDT store) are told."""

    def __init__(self):
        self.now = {}
        self.calls = 0

    def __call__(self, obj_id, tensors):
        self.calls += 1
        self.now[obj_id] = tensors

    def spilled(self, obj_id):
        return obj_id in self.now and all(t.device.type == "meta" for t in self.now[obj_id])


@pytest.fixture
def held(tmp_path):
    swaps = Swaps()
    h = HeldObjects(3 * MIB, 8 * MIB, swap=swaps, spill_dir=str(tmp_path), device="cpu")
    h.swaps = swaps
    yield h
    h.close()


def test_beyond_the_budget_the_least_recently_used_move_and_come_back_bit_identical(held):
    originals = {f"o{i}": _tensor(i) for i in range(5)}
    for k, t in originals.items():
        assert held.add(k, [t.clone()])
    st = held.stats()
    assert st["device_bytes"] <= 3 * MIB and st["spilled_bytes"] == 2 * MIB and st["held_bytes"] == 5 * MIB
    assert held.spilled("o0") and held.spilled("o1") and not held.spilled("o4")
    assert held.swaps.spilled("o0") and held.swaps.now["o0"][0].shape == originals["o0"].shape
    with held.reading("o0") as got:
        assert torch.equal(got[0], originals["o0"]) and got[0].dtype == torch.float32
    assert not held.spilled("o0") and held.swaps.now["o0"][0].device.type == "cpu"
    assert held.spilled("o2")  # the least recently used one made room
    assert held.stats()["restores"] >= 1 and held.stats()["spills"] >= 3


def test_a_host_tier_too_small_spills_to_disk_and_restores_from_it(tmp_path):
    swaps = Swaps()
    held = HeldObjects(MIB, MIB, swap=swaps, spill_dir=str(tmp_path), device="cpu")
    try:
        ts = [_tensor(i, dtype=torch.bfloat16) for i in range(4)]
        for i, t in enumerate(ts):
            held.add(f"o{i}", [t.clone(), _tensor(100 + i, n=1000)])
        assert held.stats()["disk_bytes"] > 0
        for i in range(4):
            with held.reading(f"o{i}") as got:
                assert torch.equal(got[0], ts[i]) and torch.equal(got[1], _tensor(100 + i, n=1000))
    finally:
        held.close()


def test_a_damaged_spill_file_is_an_error_never_wrong_bytes(tmp_path):
    held = HeldObjects(MIB, 0, swap=Swaps(), spill_dir=str(tmp_path), device="cpu")
    try:
        held.add("a", [_tensor(1)])
        held.add("b", [_tensor(2)])  # a goes to disk (no host tier)
        assert held.stats()["disk_bytes"] == MIB
        spill = next(held.store.spill_dir.glob("*.spill"))
        raw = bytearray(spill.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        spill.write_bytes(bytes(raw))
        with pytest.raises(CorruptObject):
            with held.reading("a"):
                pass
    finally:
        held.close()


def test_an_object_being_read_or_kept_never_moves(held):
    held.add("read", [_tensor(1)])
    held.add("kept", [_tensor(2)])
    held.keep("kept")
    with held.reading("read"):
        for i in range(6):
            held.add(f"n{i}", [_tensor(10 + i)])
        assert not held.spilled("read")
    assert not held.spilled("kept")
    held.add("more", [_tensor(99)])
    assert held.spilled("read")  # once read, it is a candidate again
    assert not held.spilled("kept")


def test_objects_that_cannot_move_are_held_as_they_are_and_counted(held):
    strided = _tensor(1).reshape(512, 512).t()
    assert not held.add("s", [strided])
    assert not held.add("empty", [])
    with held.reading("s") as got:
        assert got is None  # the caller reads its own tensors
    assert held.stats()["unspillable_bytes"] == MIB
    held.drop("s")
    assert held.stats()["unspillable_bytes"] == 0 and held.stats()["objects"] == 1


def test_drop_frees_the_store_copies_and_is_idempotent(held):
    for i in range(5):
        held.add(f"o{i}", [_tensor(i)])
    for i in range(5):
        held.drop(f"o{i}")
        held.drop(f"o{i}")
    st = held.stats()
    assert st["objects"] == 0 and st["device_bytes"] == st["spilled_bytes"] == 0
    with pytest.raises(StoreError, match="held already"):
        held.add("x", [_tensor(1)])
        held.add("x", [_tensor(1)])


def test_concurrent_producers_and_readers_keep_every_byte(held):
    originals = {f"o{i}": _tensor(i) for i in range(12)}
    errors = []

    def produce(keys):
        for k in keys:
            held.add(k, [originals[k].clone()])

    def read(keys):
        for _ in range(3):
            for k in keys:
                try:
                    with held.reading(k) as got:
                        if got is not None and not torch.equal(got[0], originals[k]):
                            errors.append(k)
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(repr(e))

    produce(list(originals)[:6])
    threads = [threading.Thread(target=produce, args=(list(originals)[6:],)),
               threading.Thread(target=read, args=(list(originals)[:6],)),
               threading.Thread(target=read, args=(list(originals)[:6][::-1],))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert held.stats()["device_bytes"] <= 3 * MIB
