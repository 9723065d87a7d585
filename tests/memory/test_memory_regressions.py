"""Regression tests for bugs found in the pre-release review of the memory store."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rayaccel.errors import StoreError
from rayaccel.memory import Store
from rayaccel.memory.owners import SHM_DIR, owner_tag

MiB = 1 << 20


def _my_segments() -> set[str]:
    return {p.name for p in SHM_DIR.glob(f"rayaccel_{owner_tag()}_*")} if SHM_DIR.is_dir() else set()


def test_failing_export_hook_does_not_leak_the_segment(tmp_path):
    with Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu", share=True) as s:
        h = s.put(np.arange(1000, dtype=np.int64))
        before = _my_segments()

        def hook(shared, data):
            raise StoreError("hook failed")

        s.export_hook = hook
        for _ in range(3):
            with pytest.raises(StoreError, match="hook failed"):
                s.export(h)
        assert _my_segments() == before and not s._segments
        s.export_hook = None
        assert s.export(h).segment in _my_segments()
    assert _my_segments() == before


def test_close_with_timeout_does_not_wait_forever_for_a_stuck_thread(tmp_path):
    s = Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu")
    s.put(np.zeros(10))
    held, release = threading.Event(), threading.Event()

    def stuck():
        with s._lock:
            held.set()
            release.wait(60)

    t = threading.Thread(target=stuck, daemon=True)
    t.start()
    assert held.wait(30)
    try:
        s.close(timeout_s=0.05)  # used to block for as long as the other thread held the lock
        assert s.closed and not s.spill_dir.exists()
    finally:
        release.set()
        t.join(30)
    s.close()  # idempotent afterwards
