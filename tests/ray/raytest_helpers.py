"""Helpers shared by the Ray-layer tests (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

import time


def node_named(cluster, name):
    return next(n for n in cluster.nodes if n.topology.name == name)


def ray_free(node_id):
    """(free GPU slots, {MIG resource: free}) Ray shows on ``node_id``, and the totals."""
    from ray._private import state

    avail = state.available_resources_per_node().get(node_id, {})
    total = state.total_resources_per_node().get(node_id, {})
    return avail, total


def idle(node_id) -> bool:
    avail, total = ray_free(node_id)
    keys = [k for k in total if k == "GPU" or k.startswith("mig_")]
    return all(abs(avail.get(k, 0.0) - total[k]) < 1e-6 for k in keys)


def wait_for(pred, timeout_s=20.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def wait_idle(cluster, timeout_s=30.0):
    try:
        wait_for(lambda: all(idle(n.node_id) for n in cluster.nodes), timeout_s, "every GPU and MIG slot free")
    except AssertionError as e:  # say who holds what: the nodes' holders, drains and leaks as rayaccel sees them
        raise AssertionError(f"{e}; {_who_holds(cluster)}") from None


def _who_holds(cluster) -> str:
    try:
        from rayaccel.ray.driver.status import cluster_status

        keys = {n.node_key for n in cluster.nodes}
        out = []
        for n in cluster_status()["nodes"]:
            if n.get("node_key") not in keys:
                continue
            busy = [{k: d.get(k) for k in ("index", "state", "holders", "drain") if d.get(k)}
                    for d in n.get("devices", []) if d.get("state") not in (None, "free")]
            out.append(f"{n['node_key']}: devices {busy} leaks {n.get('leaks')} events {n.get('leak_events')}")
        return " | ".join(out)[:4000]
    except Exception as e:  # noqa: BLE001 - the diagnosis must not hide the failure
        return f"(status unreadable: {e})"


def link(topo, devices):
    """Label of the weakest link among ``devices`` (e.g. ``"NV2"``)."""
    devs = sorted(devices)
    worst = None
    for i, a in enumerate(devs):
        for b in devs[i + 1:]:
            l = topo.link(a, b)
            if worst is None or (l is not None and l.rank < worst.rank) or l is None:
                worst = l
    return worst.label if worst is not None else None


def submit_concurrently(threads, per_thread, submit):
    """Call ``submit(t, i)`` from ``threads`` threads ``per_thread`` times each; the refs, in no order.

    An exception in any submitter fails the caller's test (re-raised here).
    """
    import threading

    refs, errors = [], []
    lock = threading.Lock()

    def run(t):
        try:
            for i in range(per_thread):
                r = submit(t, i)
                with lock:
                    refs.append(r)
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for th in workers:
        th.start()
    for th in workers:
        th.join()
    if errors:
        raise errors[0]
    return refs


def overlaps(records):
    """Pairs of records (node, device, start, end, who) holding one device at overlapping times."""
    by_dev = {}
    for r in records:
        by_dev.setdefault((r[0], r[1]), []).append(r)
    bad = []
    for key, rs in by_dev.items():
        rs.sort(key=lambda r: r[2])
        longest = None  # the record ending last among those started so far
        for r in rs:
            if longest is not None and r[2] < longest[3]:
                bad.append((longest, r))
            if longest is None or r[3] > longest[3]:
                longest = r
    return bad


def barrier(n: int):
    """An actor that ``n`` tasks meet at (``meet(b)`` in each): they then hold their resources at once,
    however slowly Ray starts their workers on a loaded machine."""
    import ray

    @ray.remote(num_cpus=0)
    class Barrier:
        def __init__(self):
            self.count = 0

        def arrive(self):
            self.count += 1

        def arrived(self):
            return self.count

    b = Barrier.remote()
    b._n = n
    return b


def meet(b, n: int, timeout_s: float = 120.0) -> None:
    """Arrive at barrier ``b`` and wait until ``n`` have (inside a task)."""
    import time

    import ray

    ray.get(b.arrive.remote())
    deadline = time.time() + timeout_s
    while ray.get(b.arrived.remote()) < n and time.time() < deadline:
        time.sleep(0.05)


def needs_feature(feature, why: str = "") -> None:
    """Skip where the installed Ray lacks ``feature`` (a :data:`rayaccel.ray._ray_private.FEATURES` entry, found in
    Ray itself, not from its version); ``why``: what the test would see without it."""
    import pytest

    from rayaccel.ray import _ray_private as rp

    if not rp.capabilities()[feature.name]:
        pytest.skip(f"Ray {rp.release()} does not carry {feature.name} (Ray >= {feature.since_text})"
                    + (f": {why}" if why else ""))


def needs_train_v2() -> None:
    """Skip where Ray Train's v2 worker groups are not the default (Ray < 2.51 without RAY_TRAIN_V2_ENABLED=1):
    Train v1 gives every worker of a node the union of that node's workers' devices."""
    import os

    import pytest

    from rayaccel.ray import _ray_private as rp

    if rp.release_tuple() < (2, 51) and os.environ.get("RAY_TRAIN_V2_ENABLED", "") not in ("1", "true"):
        pytest.skip(f"Ray {rp.release()} does not carry Ray Train v2 worker groups by default (Ray >= 2.51)")
