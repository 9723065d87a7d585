"""Hand-off of stored objects between processes on one node, and cleanup after killed owners."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
from pathlib import Path

import numpy as np
import pytest

from rayaccel.errors import UnknownObject
from rayaccel.memory import Store, sweep
from rayaccel.memory.owners import SHM_DIR, owner_tag

MiB = 1 << 20


def data(seed: int, n: int = MiB) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**31, n // 8, dtype=np.int64)


def _receiver(blob: bytes, root: str, out) -> None:
    h = pickle.loads(blob)
    with Store(device_bytes=MiB, host_bytes=MiB, spill_dir=root, device="cpu") as s:
        x = s.get(h)
        again = s.get(h)  # imported once, then served from this store
        out.put((x.tobytes() == data(1).tobytes(), again.tobytes() == x.tobytes(), s.stats()["objects"]))


@pytest.mark.parametrize("tier", ["device", "host", "disk"])
def test_handle_crosses_to_another_process(tmp_path, tier):
    with Store(device_bytes=2 * MiB, host_bytes=2 * MiB, spill_dir=tmp_path, device="cpu", share=True) as s:
        h = s.put(data(1))
        if tier != "device":
            s.spill(h, to=tier)
        blob = pickle.dumps(h)
        shared = pickle.loads(blob).shared
        assert shared.segment and (SHM_DIR / shared.segment).exists() and shared.ref is None
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=_receiver, args=(blob, str(tmp_path), q))
        p.start()
        ok, cached, objects = q.get(timeout=60)
        p.join(60)
        assert ok and cached and objects == 1
        assert pickle.dumps(h) == blob  # exported once
        s.delete(h)
        assert not (SHM_DIR / shared.segment).exists()


def test_deleted_owner_object_is_unknown_to_receiver(tmp_path):
    with Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu", share=True) as s, \
            Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu") as other:
        h = pickle.loads(pickle.dumps(s.put(data(2))))
        s.delete(h)
        object.__setattr__(h, "store_id", "elsewhere")  # as seen from a process without the owner store
        with pytest.raises(UnknownObject, match="gone"):
            other.get(h)


def test_unshared_handle_from_elsewhere_is_rejected(tmp_path):
    with Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu") as s:
        h = pickle.loads(pickle.dumps(s.put(data(3))))
        assert h.shared is None
        object.__setattr__(h, "store_id", "elsewhere")
        with pytest.raises(UnknownObject, match="enable sharing"):
            s.get(h)


def test_same_process_other_store(tmp_path):
    with Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu") as a, \
            Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu") as b:
        h = a.put(data(4))
        assert b.get(h).tobytes() == data(4).tobytes()


def _doomed_owner(root: str, out) -> None:
    s = Store(device_bytes=MiB, host_bytes=MiB, spill_dir=root, device="cpu", share=True)
    h = s.put(data(5))
    s.spill(h, to="disk")
    h2 = s.put(data(6))
    shared = s.export(h2)
    out.put((str(s.spill_dir), shared.segment, owner_tag()))
    signal.pause()


def test_sigkilled_owner_leaves_nothing_after_sweep(tmp_path):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_doomed_owner, args=(str(tmp_path), q))
    p.start()
    spill_dir, segment, tag = q.get(timeout=60)
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert Path(spill_dir).exists() and any(Path(spill_dir).iterdir()) and (SHM_DIR / segment).exists()
    # a live process's leftovers are never touched
    mine = Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu")
    assert mine.spill_dir.exists() and not Path(spill_dir).exists() and not (SHM_DIR / segment).exists()
    assert sweep(tmp_path) == [] and mine.spill_dir.exists()
    mine.close()
