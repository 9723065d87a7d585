"""A placement group's devices on this node, decided when a driver asks (:func:`rayaccel.placement_map`).

The driver runs :func:`reserve_here` as a small task pinned to each node that holds bundles of
the group (``num_cpus=0``): a worker of the node, which already has the node table and the
arbiter's files open (:mod:`rayaccel.ray.worker.hook`), asks the arbiter to reserve the group's
set on this node exactly as the group's first member would
(:meth:`~rayaccel.arbiter.statefile.Arbiter.reserve_group`): the same candidates, the same choice,
one short hold of the node lock *on this node*. Idempotent: a group already reserved (by an
earlier ask or a member) answers with its units unchanged, so the answer is stable for the
group's life, and every member that arrives later gets its bundle's units.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from rayaccel.arbiter.groupmap import bundle_units
from rayaccel.arbiter.state import GPU
from rayaccel.errors import ClusterError
from rayaccel.ray.worker import hook

#: How long :func:`reserve_here` waits for the group's devices to be free here (as a first member would), seconds.
WAIT_S = 15.0
#: The format of :func:`reserve_here`'s answer (it crosses from a node's worker to the driver).
ANSWER_SCHEMA = "rayaccel.placemap/1"


def reserve_here(pg: str, bundles: Mapping[int, float], resource: str = GPU) -> dict[str, Any]:
    """Reserve group ``pg``'s units on this node (if not yet) and say what each bundle's workers will see.

    Args:
        pg: the placement group id (hex). bundles: the group's amount of ``resource`` per bundle on this node.

    Returns:
        ``{"schema", "node_key", "bundles": {bundle: {"devices", "cpus", "nics"}}, "why"}``: ``why`` says
        why no reservation exists (then ``bundles`` is empty and members choose at their grants).

    Raises:
        ClusterError: this is not a rayaccel node.
    """
    ns = hook.node()
    if ns is None:
        raise ClusterError("this node is not managed by rayaccel (no RAYACCEL_NODE_DIR in its workers)")
    t = ns.table
    out: dict[str, Any] = {"schema": ANSWER_SCHEMA, "node_key": t.node_key, "bundles": {}, "why": None}
    if resource not in t.resources:
        out["why"] = f"this node's arbiter does not map {resource}"
        return out
    sizes = {int(b): float(g) for b, g in bundles.items()}
    if not any(g >= 1 - 1e-6 and abs(g - round(g)) < 1e-6 for g in sizes.values()):
        out["why"] = "no bundle here holds whole devices (a fractional bundle's device is decided at its first grant)"
        return out
    # Ray placed the group, so its devices are free in Ray's ledger; what can stand in the way here is what a
    # first member's grant waits out too: workers still exiting, reservations of groups Ray has removed
    # (asked of Ray outside the lock, as the hook does)
    deadline, delay = time.monotonic() + WAIT_S, 0.02
    res = ns.arbiter.reserve_group(pg, resource, sizes)
    while res is None and time.monotonic() < deadline:
        st = ns.arbiter.peek()
        gone = {g for g in (st.pgs if st is not None else {}) if g != pg and not hook.pg_alive(g)}
        if gone:
            ns.arbiter.forget_groups(gone)
        time.sleep(delay)
        delay = min(0.25, delay * 2)
        res = ns.arbiter.reserve_group(pg, resource, sizes)
    if res is None:
        out["why"] = (f"the group's devices here were still held after {WAIT_S:g} s (workers exiting, or groups "
                      f"being removed); each member chooses at its grant")
        return out
    out["bundles"] = bundle_units(t, resource, res)
    return out


__all__ = ["ANSWER_SCHEMA", "WAIT_S", "reserve_here"]
