"""Per-driver state of the Ray layer: the cached cluster view, claims, placement calls.

:func:`plan` is the submit path shared by tasks, actors and gangs:

1. place on the free state (Ray's available resources minus recent claims);
2. if nothing fits now, check that the request could fit on an idle cluster,
   otherwise raise :class:`~rayaccel.errors.Unsatisfiable` at once (the request
   would hang in Ray's queue forever);
3. if it could: tasks go to the dispatcher (:mod:`rayaccel.ray.dispatch`), which
   starts them on the first suitable set that frees, wherever it is; actors (and
   streaming generators) pick where to queue in Ray: the best set among the
   devices with the fewest of this driver's unfinished submissions (queue-depth
   levels), so a saturated cluster fills evenly instead of piling onto the first set.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..errors import ClusterError, Unsatisfiable
from .view import Claims, ClusterView, NodeView, node_state

_LOCK = threading.Lock()
_VIEW: ClusterView | None = None
_CLAIMS: Claims | None = None
_REGISTRY_READY = False
_SATISFIABLE: dict[tuple, Any] = {}
#: How long a submit re-reads Ray's numbers when nothing looks free and none of this
#: driver's work is pending (covers Ray's reporting lag after a release), seconds.
LAG_WAIT_S = 0.5
FOREIGN_LOAD = 2


def view() -> ClusterView:
    """The process-wide cluster view."""
    global _VIEW
    if _VIEW is None:
        with _LOCK:
            if _VIEW is None:
                _VIEW = ClusterView()
    return _VIEW


def claims() -> Claims:
    """The process-wide claims."""
    global _CLAIMS
    if _CLAIMS is None:
        with _LOCK:
            if _CLAIMS is None:
                _CLAIMS = Claims()
    return _CLAIMS


def ensure_connected() -> None:
    """Make sure a Ray driver is connected and the holder registry exists.

    Raises:
        ClusterError: Ray is not initialised.
    """
    global _REGISTRY_READY
    import ray

    if not ray.is_initialized():
        raise ClusterError("Ray is not initialised: call rayaccel.init() (embedded cluster) or "
                           "rayaccel.init(address='auto') first")
    if not _REGISTRY_READY:
        from . import registry

        registry.ensure()
        _REGISTRY_READY = True


def reset() -> None:
    """Forget all cached state (called by :func:`rayaccel.ray.shutdown`)."""
    global _VIEW, _CLAIMS, _REGISTRY_READY
    from . import registry

    _VIEW = None
    _CLAIMS = None
    _REGISTRY_READY = False
    _SATISFIABLE.clear()
    registry.reset()
    from . import dispatch

    dispatch.reset()


def _reject_message(request: Any, nodes: list[NodeView], rejection: Any) -> str:
    reasons = "; ".join(getattr(rejection, "reasons", ()) or ("no reason given",))
    names = ", ".join(f"{n.topology.name or n.node_key}" for n in nodes) or "none"
    return f"no node can ever satisfy {request.describe()} (nodes: {names}): {reasons}"


def check_satisfiable(request: Any, nodes: list[NodeView]) -> None:
    """Raise :class:`Unsatisfiable` when ``request`` fits no node even when idle (cached per node set)."""
    from ..placement import place

    if not nodes:
        raise Unsatisfiable("the cluster has no rayaccel-managed nodes (start nodes with `rayaccel start` "
                            "or rayaccel.init(); plain `ray start` nodes advertise no rayaccel devices)")
    key = (request, tuple(n.node_key for n in nodes))
    hit = _SATISFIABLE.get(key)
    if hit is None:
        hit = place([node_state(n, ignore_ray=True) for n in nodes], request)
        _SATISFIABLE[key] = hit
    if not hit:
        raise Unsatisfiable(_reject_message(request, nodes, hit))


def recent_claims(nodes: list[NodeView]) -> dict[str, dict[str, float]]:
    """This driver's claims that Ray's numbers in ``nodes`` do not show yet."""
    return claims().recent({n.node_id: n.available for n in nodes})


def effective(node: NodeView, resources: dict, minus: dict | None) -> dict[str, float]:
    """Availability of ``resources`` on ``node`` as the placer saw it (Ray's minus pending claims)."""
    minus = minus or {}
    return {k: node.available.get(k, 0.0) - minus.get(k, 0.0) for k in resources}


def plan(request: Any, *, fresh: bool = False, queue: bool = True) -> tuple[Any, NodeView, dict] | None:
    """Place ``request`` on the cluster now; return ``(Allocation, NodeView, pending claims on that node)``.

    Args:
        request: what to place.
        fresh: read Ray's numbers now instead of the cached view.
        queue: when nothing fits now, pick a busy set to queue on (actors, generators);
            with ``queue=False`` return None instead, after one fresh re-read (tasks
            then go to the :mod:`~rayaccel.ray.dispatch` queue).

    Raises:
        Unsatisfiable: no node could ever meet the request.
        ClusterError: not connected.
    """
    from ..placement import place

    nodes = view().nodes(fresh=fresh)
    check_satisfiable(request, nodes)
    recent = recent_claims(nodes)
    alloc = place([node_state(n, recent.get(n.node_id)) for n in nodes], request)
    if not alloc and not queue:
        if not fresh and not claims().pending_tasks():
            # Ray's numbers lag ~100 ms behind releases: read once more before queueing.
            nodes = view().nodes(fresh=True)
            recent = recent_claims(nodes)
            alloc = place([node_state(n, recent.get(n.node_id)) for n in nodes], request)
        if not alloc:
            return None
    if not alloc and not claims().pending_tasks():
        # No task of ours is pending: what looks busy is held by others, or was just
        # freed and Ray's numbers lag (~100 ms). Look again before queueing.
        deadline = time.monotonic() + LAG_WAIT_S
        while not alloc and time.monotonic() < deadline:
            time.sleep(0.05)
            nodes = view().nodes(fresh=True)
            recent = recent_claims(nodes)
            alloc = place([node_state(n, recent.get(n.node_id)) for n in nodes], request)
    if not alloc:
        alloc = _queue_plan(request, nodes)
    by_id = {n.node_id: n for n in nodes}
    return alloc, by_id[alloc.node], recent.get(alloc.node, {})


def _queue_plan(request: Any, nodes: list[NodeView]) -> Any:
    """Where to queue when nothing is free: the best set among the least-loaded devices.

    Load of a device = this driver's unfinished submissions on it, plus
    :data:`FOREIGN_LOAD` when Ray shows it taken and none of ours is on it (held by
    other work, possibly long-lived actors): queueing behind our own short tasks,
    which we know are on their way, is the better bet.
    """
    from ..placement import place

    depth = claims().depth()
    load: dict[str, dict[str, int]] = {}
    for n in nodes:
        busy = node_state(n)
        acc = dict(depth.get(n.node_id, {}))
        for i in busy.taken():
            r = f"accel_{i}"
            if not acc.get(r):
                acc[r] = FOREIGN_LOAD
        load[n.node_id] = acc
    levels = sorted({c for d in load.values() for c in d.values()} | {0})

    def at(level: int) -> Any:
        return place([node_state(n, ignore_ray=True,
                                 busy_extra=[r for r, c in load.get(n.node_id, {}).items() if c > level])
                      for n in nodes], request)

    # Fewer devices are blocked as the level rises, so "fits" is monotone: binary search
    # for the lowest level at which the request fits.
    lo, hi = 0, len(levels) - 1
    best = at(levels[hi])
    while lo < hi:
        mid = (lo + hi) // 2
        alloc = at(levels[mid])
        if alloc:
            best, hi = alloc, mid
        else:
            lo = mid + 1
    if best:
        return best
    return place([node_state(n, ignore_ray=True) for n in nodes], request)
