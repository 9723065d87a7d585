"""Helpers shared by the Ray-layer tests (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

import time


def node_named(cluster, name):
    return next(n for n in cluster.nodes if n.topology.name == name)


def free_devices(node_id):
    """Device indices Ray shows free on ``node_id`` (fresh read)."""
    from ray._private import state

    avail = state.available_resources_per_node().get(node_id, {})
    return {int(k.split("_")[1]) for k, v in avail.items()
            if k.startswith("accel_") and k.count("_") == 1 and v >= 1}


def wait_for(pred, timeout_s=20.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def wait_idle(cluster, timeout_s=30.0):
    def idle():
        for n in cluster.nodes:
            if free_devices(n.node_id) != set(n.topology.indices):
                return False
        return True

    wait_for(idle, timeout_s, "every device free")


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
