"""Gangs: N workers of k devices each, reserved all at once, with torch.distributed ready.

::

    with rayaccel.gang(workers=2, gpus_per_worker=4, strategy="pack") as g:
        sums = g.run(train_step, batch)     # fn runs on every worker, rank order

A gang is an ordinary Ray placement group of ``{"GPU": k}`` bundles (so Ray's ledger
and autoscaler see it as GPU demand), each bundle pinned to the node
:func:`rayaccel.placement.place_gang` chose by the node marker resource. The placer
reads each node's place from its Ray labels (:mod:`.places`: ``ray.io/gpu-domain``,
``rayaccel.io/net-<level>``), so a gang that fits in one NVLink domain gets one, and a
bigger one the lowest common network level. On each node, the arbiter treats the group
as one gang: its first worker reserves the best set for all of the group's GPUs there
and hands the bundles their devices in ring order, so rank ``i`` (bundle ``i``) sits
next to rank ``i+1``. Workers are actors in the group. On the first :meth:`Gang.run`
every worker calls ``torch.distributed.init_process_group`` (NCCL on real GPUs, gloo on
simulated nodes) with rank 0's node IP and a free port as the rendezvous; rank 0's store
listens on that node IP only.

**A stale view never fails a gang.** The placer's view of free devices comes from the
agents' snapshots (about once a second old), and work submitted just before the gang
(an actor Ray has not granted yet) is in no count at all. So the plan is made on the
snapshot reconciled with Ray's fresh ``GPU`` counts (:func:`live_state`: fewer free when Ray
counts fewer, more when work the snapshot still shows has ended), and while the group
is pending the gang checks Ray's fresh counts: when a chosen node no longer has room for
its bundles, it re-plans and re-creates the group on nodes that do (:data:`REPLAN_AFTER_S`).
Measured on 4 simulated ``l40s-4x-pcie`` nodes, an actor (not yet granted) taking the node
the placer would choose first while a 2 x 4 gang starts, 5 gangs each: hard pins on the
snapshot alone ran 2 of 5 (the others timed out); the capped counts alone 3 of 5 (they do
not see an actor Ray has not granted yet); re-planning alone 5 of 5 with 2-4 re-creations
each (the snapshot is still stale at the first re-plan); both 5 of 5 with 0-1. Soft pins
are not an option: a placement group bundle has no soft node affinity, and dropping the
pins hands the node choice (domains, packing) back to Ray's PACK.

**Teardown** (:meth:`Gang.shutdown`): every rank passes a barrier, the other ranks destroy
their process group before rank 0, whose TCPStore (which owns the listening socket
handed to it) goes last; only then are the actors killed and the group removed, which
frees the devices at once. Closing the store's socket under it is what made every exit
abort ("Unexpected poll revent on the master's listening socket", SIGABRT).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import time
import uuid
from typing import Any, Callable

from rayaccel.errors import ClusterError, RequestError, Unsatisfiable
from rayaccel.placement import place_gang
from rayaccel.placement.pools import gpu_pool
from rayaccel.contract import NODE_KEY_LABEL
from rayaccel.ray import _ray_private as rp
from rayaccel.ray.driver.places import place_of
from rayaccel.ray.driver.tasks import REQUEST_FIELDS
from rayaccel.ray.driver.view import claims, node_state, view
from rayaccel.ray.worker.gang import GangWorker

log = logging.getLogger(__name__)
_WORKER_CLS: Any = None
#: How long a gang's placement group may stay pending before the gang checks Ray's fresh counts for
#: whether its nodes were taken meanwhile (then it re-plans), seconds; the wait doubles up to REPLAN_MAX_S.
REPLAN_AFTER_S = 0.5
REPLAN_MAX_S = 4.0
#: How long the teardown waits for each step (barrier, process-group destruction), seconds.
TEARDOWN_S = 30.0


def live_state(n: Any, c: Any = None) -> Any:
    """The node's :class:`~rayaccel.placement.NodeState` (:func:`.view.node_state`) with as many free
    devices as Ray's fresh ``GPU`` count says.

    The agent's snapshot may be up to a second old; Ray's available count is fresh. When the
    count is lower, which devices were taken is not known until the snapshot catches up: the
    placer keeps the lowest-index free ones. When it is higher, work the snapshot still shows
    has ended: the lowest-index devices it shows held (not drained, not this driver's young
    claims, which Ray may not count yet) are free again. A gang's bundles need counts; the
    node's arbiter chooses the devices at the grant.
    """
    st = node_state(n, c)
    pool = set(gpu_pool(st.topology))
    free = sorted(pool - st.taken())
    allowed = max(0, math.floor(n.gpus_available + 1e-6))
    if len(free) > allowed:
        return st.with_busy(free[allowed:])
    if len(free) < allowed and n.state is not None:
        held = pool - set(n.state.free) - set(n.state.drained) - (c.on(n.node_id)[0] if c is not None else set())
        return st.with_free(sorted(held & st.busy)[:allowed - len(free)])
    return st


def _worker_cls() -> Any:
    global _WORKER_CLS
    if _WORKER_CLS is None:
        import ray

        _WORKER_CLS = ray.remote(GangWorker)
    return _WORKER_CLS


class Gang:
    """A reserved group of workers (see module docstring). Use :func:`gang` to make one.

    Attributes:
        allocation: the :class:`~rayaccel.placement.gang.GangPlacement` the placer expected (rank
            order; ``allocation.explain()`` says which node, domain or network level decided).
        placement_group: the Ray placement group. workers: actor handles, rank order.
        nodes: the :class:`~.view.NodeView` of each rank. backend: ``"nccl"`` or ``"gloo"``.
        replans: how often the pending group was re-created on fresher counts.
    """

    def __init__(self, workers: int, gpus_per_worker: int, strategy: str = "pack", interconnect: str = "any",
                 *, backend: str | None = None, timeout_s: float = 60.0, name: str = "gang", **fields: Any):

        import ray
        from ray.util.placement_group import remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


        unknown = sorted(set(fields) - set(REQUEST_FIELDS) - {"gpus"})
        if unknown or "gpus" in fields:
            bad = unknown[0] if unknown else "gpus"
            raise RequestError("not an option of rayaccel.gang()", bad,
                               "workers, gpus_per_worker, strategy, interconnect, backend, timeout_s, name, "
                               + ", ".join(f for f in REQUEST_FIELDS if f not in ("gpus", "interconnect")))
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise RequestError(f"expected a number of seconds > 0, got {timeout_s!r}", "timeout_s")
        if backend not in (None, "nccl", "gloo"):
            raise RequestError(f"unknown torch.distributed backend {backend!r}", "backend", "None (auto), nccl, gloo")
        self._ask = (workers, gpus_per_worker, strategy, interconnect, fields)
        self.name = name
        self.timeout_s = timeout_s
        self.replans = 0
        self.workers = []
        deadline = time.monotonic() + timeout_s
        ga, nodes = self._plan(idle_ok=True)
        self._reserve(ga, nodes)
        try:
            wait_s = REPLAN_AFTER_S
            while True:
                left = deadline - time.monotonic()
                ready, _ = ray.wait([self.placement_group.ready()], timeout=max(0.0, min(wait_s, left)))
                if ready:
                    break
                if left <= wait_s:
                    raise ClusterError(f"gang {name!r}: the placement group was not granted within "
                                       f"{timeout_s:.0f} s (devices still held by other work)")
                wait_s = min(wait_s * 2, REPLAN_MAX_S)
                if self._taken():
                    if ray.wait([self.placement_group.ready()], timeout=0)[0]:
                        break  # granted meanwhile: the "taken" devices are this group's own reservation
                    fresh = self._plan(idle_ok=False)
                    # re-create only on other nodes: the same ones again mean the view has not caught up yet
                    if fresh is not None and sorted(a.node for a in fresh[0].workers) != sorted(
                            n.node_id for n in self.nodes):
                        remove_placement_group(self.placement_group)
                        self.replans += 1
                        self._reserve(*fresh)
                        wait_s = REPLAN_AFTER_S
            if not rp.can_pin_bundles():
                self._nodes_granted()
            c = claims()
            for n, a in zip(self.nodes, self.allocation.workers):
                if n.node_id == a.node:  # a bundle Ray placed elsewhere (unpinned) claims nothing
                    c.add(n.node_id, tuple(a.devices), float(gpus_per_worker))
            self.backend = backend or ("gloo" if any(n.record.simulated for n in self.nodes) else "nccl")
            cls = _worker_cls()
            for i in range(len(self.bundles)):
                strategy_i = PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=i)
                self.workers.append(cls.options(num_cpus=0, num_gpus=gpus_per_worker, name=None,
                                                scheduling_strategy=strategy_i).remote(f"{name}[rank {i}]", i))
        except BaseException:
            # never leave the reservation (or half the workers) behind: nobody holds this Gang
            for w in self.workers:
                ray.kill(w)
            remove_placement_group(self.placement_group)
            raise
        self._dist_ready = False
        self._closed = False

    def _plan(self, idle_ok: bool) -> tuple | None:
        """(placement, its nodes) on the live state; with ``idle_ok`` a placement to wait for when none fits
        now (None without it).

        Raises:
            Unsatisfiable: no usable node, or no placement could ever hold the gang.
        """

        workers, k, strategy, interconnect, fields = self._ask
        nodes = view().nodes(fresh=True)
        if not nodes:
            raise Unsatisfiable("the cluster has no usable rayaccel nodes (start them with `rayaccel start` or "
                                "rayaccel.init())")
        places = [place_of(n.labels, f"node {n.node_key}") for n in nodes]
        c = claims()
        ga = place_gang([live_state(n, c) for n in nodes], workers, k, strategy=strategy,
                        interconnect=interconnect, places=places, **fields)
        if ga:
            return ga, nodes
        if not idle_ok:
            return None
        idle = place_gang([node_state(n, idle=True) for n in nodes], workers, k, strategy=strategy,
                          interconnect=interconnect, places=places, **fields)
        if not idle:
            raise Unsatisfiable(f"no placement can ever hold {workers} workers x {k} devices "
                                f"({strategy}): " + "; ".join(idle.reasons))
        return idle, nodes  # wait for these nodes: the placement group queues until their devices are free

    def _reserve(self, ga: Any, nodes: list) -> None:
        """Create the placement group for ``ga``: one ``{"GPU": k}`` bundle per worker, pinned to its node."""

        from ray.util.placement_group import placement_group


        k = self._ask[1]
        by_id = {n.node_id: n for n in nodes}
        self.allocation = ga
        self.nodes = [by_id[a.node] for a in ga.workers]
        # Hard node pins by label: a bundle has no soft node affinity, and without a pin Ray's PACK would choose
        # the nodes (no domains, no packing). A pin gone stale is re-planned while the group is pending. Pinned
        # bundles use PACK even on one node (the pins keep them there; STRICT_PACK ignores bundle selectors on
        # some releases). A Ray that cannot pin a bundle by label places them by its own strategy.
        self.bundles = [{"GPU": float(k)} for _ in self.nodes]
        name = f"rayaccel-gang-{self.name}-{uuid.uuid4().hex[:8]}"
        if rp.can_pin_bundles():
            self.placement_group = placement_group(
                self.bundles, strategy="PACK", name=name,
                bundle_label_selector=[{NODE_KEY_LABEL: n.node_key} for n in self.nodes])
        else:
            rp.warn_missing(rp.BUNDLE_LABELS)
            one_node = len({n.node_id for n in self.nodes}) == 1
            self.placement_group = placement_group(self.bundles, strategy="STRICT_PACK" if one_node else "PACK",
                                                   name=name)

    def _nodes_granted(self) -> None:
        """Unpinned bundles (a Ray without bundle label selectors): read the nodes Ray placed them on."""
        from ray.util.placement_group import placement_group_table

        where = placement_group_table(self.placement_group).get("bundles_to_node_id") or {}
        by_id = {n.node_id: n for n in view().nodes(fresh=True)}
        self.nodes = [by_id.get(where.get(i), n) for i, n in enumerate(self.nodes)]

    def _taken(self) -> bool:
        """True when Ray's fresh counts say a chosen node no longer has room for its bundles (or is gone)."""
        from collections import Counter


        now = {n.node_id: n for n in view().nodes(fresh=True)}
        need = Counter(n.node_id for n in self.nodes)
        k = float(self._ask[1])
        return any(nid not in now or now[nid].gpus_available + 1e-6 < cnt * k for nid, cnt in need.items())

    def devices(self) -> list[tuple[int, ...]]:
        """The devices each worker holds, rank order (as the nodes' arbiters chose them)."""
        import ray

        return ray.get([w.devices.remote() for w in self.workers], timeout=self.timeout_s)

    @property
    def world_size(self) -> int:
        """Number of workers."""
        return len(self.workers)

    def _init_dist(self) -> None:

        import ray

        if importlib.util.find_spec("torch") is None:
            raise ClusterError(f"gang {self.name!r}: run() initialises torch.distributed, but PyTorch is not "
                               "installed here; pip install 'rayaccel[torch]' (or any torch), or call a worker "
                               "directly through gang.workers[i].run.remote(fn, args, kwargs)")

        addr, port = ray.get(self.workers[0].rendezvous.remote(), timeout=self.timeout_s)
        ray.get([w.init_dist.remote(self.world_size, addr, port, self.backend, self.timeout_s)
                 for w in self.workers], timeout=self.timeout_s + 30)
        self._dist_ready = True

    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> list:
        """Run ``fn(*args, **kwargs)`` on every worker with torch.distributed initialised; results in rank order.

        Raises:
            ClusterError: the gang was shut down, or PyTorch is not installed.
        """
        import ray

        if self._closed:
            raise ClusterError(f"gang {self.name!r} was shut down")
        if not self._dist_ready:
            self._init_dist()
        return ray.get([w.run.remote(fn, args, kwargs) for w in self.workers])

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> list:
        """Like :meth:`run` but returns the ObjectRefs without waiting.

        Raises:
            ClusterError: the gang was shut down.
        """
        if self._closed:
            raise ClusterError(f"gang {self.name!r} was shut down")
        if not self._dist_ready:
            self._init_dist()
        return [w.run.remote(fn, args, kwargs) for w in self.workers]

    def shutdown(self) -> None:
        """Tear torch.distributed down cleanly, kill the workers and free the placement group (idempotent).

        Order: a barrier on every rank; ranks 1.. destroy their process group, then rank 0
        (whose store served them); then the actors are killed and the group removed, so the
        devices are free at once. A rank that fails a step is killed like the others.
        """
        import ray
        from ray.util.placement_group import remove_placement_group

        if self._closed:
            return
        self._closed = True
        if self._dist_ready:
            try:
                ray.get([w.barrier.remote() for w in self.workers], timeout=TEARDOWN_S)
                ray.get([w.close.remote() for w in self.workers[1:]], timeout=TEARDOWN_S)
                ray.get(self.workers[0].close.remote(), timeout=TEARDOWN_S)
            except (ray.exceptions.RayError, TimeoutError) as e:  # a dead worker: killing below still frees it
                log.warning("gang %s: closing torch.distributed failed: %s", self.name, e)
        for w in self.workers:
            ray.kill(w)
        remove_placement_group(self.placement_group)

    def __enter__(self) -> "Gang":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def gang(workers: int, gpus_per_worker: int = 1, strategy: str = "pack", interconnect: str = "any",
         **kwargs: Any) -> Gang:
    """Reserve ``workers`` x ``gpus_per_worker`` devices at once (all or nothing); see :class:`Gang`.

    Raises:
        Unsatisfiable: no placement could ever hold the gang.
        ClusterError: the reservation was not granted within ``timeout_s``.
        RequestError: bad strategy or counts.
    """
    return Gang(workers, gpus_per_worker, strategy, interconnect, **kwargs)
