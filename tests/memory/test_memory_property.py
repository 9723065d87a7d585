"""Property: over any sequence of put/get/delete/pin/spill/retain/release, every live object comes back bit-identical."""

from __future__ import annotations

import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayaccel.errors import StoreFull
from rayaccel.memory import Store
from rayaccel.memory.spill import drain

KiB = 1024

ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 6 * KiB), st.integers(0, 2**31)),
        st.tuples(st.just("get"), st.integers(0, 50), st.none()),
        st.tuples(st.just("delete"), st.integers(0, 50), st.none()),
        st.tuples(st.just("pin"), st.integers(0, 50), st.integers(0, 50)),
        st.tuples(st.just("spill"), st.integers(0, 50), st.sampled_from(["host", "disk"])),
        st.tuples(st.just("retain"), st.integers(0, 50), st.none()),
        st.tuples(st.just("release"), st.integers(0, 50), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, budgets=st.tuples(st.integers(4 * KiB, 12 * KiB), st.integers(4 * KiB, 12 * KiB), st.sampled_from([None, 16 * KiB])))
def test_live_objects_come_back_bit_identical(ops, budgets):
    dev, host, disk = budgets
    with tempfile.TemporaryDirectory() as d, Store(device_bytes=dev, host_bytes=host, spill_dir=d, disk_bytes=disk,
                                                   device="cpu", chunk_bytes=1024) as s:
        live: dict = {}  # handle -> (bytes, refs)
        handles: list = []

        def pick(i):
            return handles[i % len(handles)] if handles else None

        for op, a, b in ops:
            if op == "put":
                x = np.random.default_rng(b).integers(0, 256, a, dtype=np.uint8)
                try:
                    h = s.put(x)
                except StoreFull:
                    continue
                live[h] = [x.tobytes(), 1]
                handles.append(h)
                continue
            h = pick(a)
            if h is None or h not in live:
                continue
            if op == "get":
                assert s.get(h).tobytes() == live[h][0]
            elif op == "delete":
                s.delete(h)
                del live[h]
            elif op == "pin":
                try:
                    with s.pinned(h) as x:
                        assert s.tier(h) == "device" and x.tobytes() == live[h][0]
                        other = pick(b)
                        if other in live:
                            assert s.get(other).tobytes() == live[other][0]
                        assert s.tier(h) == "device"
                except StoreFull:
                    pass
            elif op == "spill":
                try:
                    s.spill(h, to=b)
                except StoreFull:
                    pass
            elif op == "retain":
                s.retain(h)
                live[h][1] += 1
            elif op == "release":
                live[h][1] -= 1
                assert s.release(h) == live[h][1]
                if live[h][1] == 0:
                    del live[h]
            # invariants after every step
            stats = s.stats()
            assert stats["objects"] == len(live)
            assert stats["device_bytes"] <= dev and stats["host_bytes"] <= host
            assert disk is None or stats["disk_bytes"] <= disk
            assert stats["device_bytes"] + stats["host_bytes"] + stats["disk_bytes"] == sum(len(v[0]) for v in live.values())
        for h, (data, _) in live.items():
            assert s.get(h).tobytes() == data
        for h in list(live):
            s.delete(h)
        drain()
        assert not any(s.spill_dir.iterdir())
