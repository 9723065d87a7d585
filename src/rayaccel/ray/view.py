"""The cluster as the placer sees it: topologies from the KV, free state from Ray.

One call (``ray._private.state.available_resources_per_node``: a single GCS
request) gives every alive node's available resources; the node marker
``rayaccel_node_<key>`` in it names the node's topology record, fetched once per
node from the KV and cached. The result is cached for ``ttl_s`` (default 50 ms).

Ray's view lags the raylets by ~100 ms, so a driver that submits quickly would
otherwise place several tasks on the same "free" device. :class:`Claims` keeps
what this process has submitted and not yet seen finish; a claim counts against
the free state until its task completes or for ``grace_s`` (after which Ray's
own numbers include it). Claims also give the queue depth per device, used to
spread work evenly when every device is busy.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..topology import NodeTopology
from .resources import (MIB, NODE_KEY_PREFIX, NodeRecord, device_resource, memory_mib, memory_resource,
                        mig_resource)

_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class NodeView:
    """One alive managed node: Ray node id, marker key, record and available resources."""

    node_id: str
    node_key: str
    record: NodeRecord
    available: Mapping[str, float]

    @property
    def topology(self) -> NodeTopology:
        """The node's topology."""
        return self.record.topology


class Claims:
    """Resources this process has asked Ray for and not yet seen released (thread-safe).

    Entries are kept in submission order, so reading the recent ones stops at the
    first entry older than ``grace_s``; per-resource queue depths are counted
    incrementally. Both keep the submit path O(recent claims), not O(all pending).
    """

    def __init__(self, grace_s: float = 1.0):
        self.grace_s = grace_s
        self._lock = threading.Lock()
        self._entries: "OrderedDict[int, tuple]" = OrderedDict()
        self._depth: dict[str, dict[str, int]] = {}
        self._untracked: "deque[int]" = deque()
        self._tracked = 0
        self._seq = 0
        # Largest age_s ever given: entries are in insertion order, but a back-dated one
        # (forwarded by another process) may be older than entries inserted before it, so
        # readers may stop only at an entry older than grace_s + this.
        self._max_age = 0.0

    def add(self, node_id: str, resources: Mapping[str, float], ref: Any = None,
            before: Mapping[str, float] | None = None, age_s: float = 0.0) -> int:
        """Record a submission; if ``ref`` is given, drop the claim when it completes.

        ``before``: the effective availability of each resource when the work was
        placed; once Ray's own numbers drop by the claimed amount the claim is
        reflected there and no longer subtracted (so it is never counted twice).
        Without ``ref`` (actors, gangs) the claim lasts ``grace_s``. ``age_s``: how
        long ago the work was submitted (claims forwarded from another process).
        """
        with self._lock:
            self._expire(time.monotonic())  # untracked claims nobody reads depth() of must not pile up
            self._seq += 1
            cid = self._seq
            self._max_age = max(self._max_age, age_s)
            self._entries[cid] = (node_id, dict(resources), time.monotonic() - age_s, ref is not None,
                                  dict(before or {}), ref)
            acc = self._depth.setdefault(node_id, {})
            for k in resources:
                acc[k] = acc.get(k, 0) + 1
            if ref is None:
                self._untracked.append(cid)
            else:
                self._tracked += 1
        if ref is not None:
            ref._on_completed(lambda _res, cid=cid: self.release(cid))
        return cid

    def _drop(self, cid: int) -> None:
        e = self._entries.pop(cid, None)
        if e is None:
            return
        acc = self._depth.get(e[0], {})
        for k in e[1]:
            c = acc.get(k, 0) - 1
            if c > 0:
                acc[k] = c
            else:
                acc.pop(k, None)
        if e[3]:
            self._tracked -= 1

    def release(self, cid: int) -> None:
        """Forget claim ``cid`` (idempotent)."""
        with self._lock:
            self._drop(cid)

    def _expire(self, now: float) -> None:
        while self._untracked:
            cid = self._untracked[0]
            e = self._entries.get(cid)
            if e is not None and now - e[2] <= self.grace_s:
                break
            self._untracked.popleft()
            self._drop(cid)

    def recent(self, available: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, dict[str, float]]:
        """node -> resource -> amount of claims younger than ``grace_s`` that Ray does not show yet.

        Args:
            available: node -> Ray's available resources now; a claimed resource whose
                availability already dropped by the claimed amount is left out.
        """
        now = time.monotonic()
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            for node, res, t, _, before, _ref in reversed(self._entries.values()):
                if now - t > self.grace_s:
                    if now - t > self.grace_s + self._max_age:
                        break  # every entry inserted before this one is older still
                    continue
                avail = (available or {}).get(node)
                acc = out.setdefault(node, {})
                for k, v in res.items():
                    if avail is not None and k in before and avail.get(k, 0.0) <= before[k] - v + _EPS:
                        continue  # Ray already counts it
                    acc[k] = acc.get(k, 0.0) + v
        return out

    def young(self) -> list[tuple[int, str, dict, dict, float, Any]]:
        """``(claim id, node, resources, before, age_s, ref)`` of claims younger than ``grace_s``, newest first."""
        now = time.monotonic()
        out = []
        with self._lock:
            for cid, (node, res, t, _, before, ref) in reversed(self._entries.items()):
                if now - t > self.grace_s:
                    if now - t > self.grace_s + self._max_age:
                        break  # every entry inserted before this one is older still
                    continue
                out.append((cid, node, res, before, now - t, ref))
        return out

    def depth(self) -> dict[str, dict[str, int]]:
        """node -> resource -> number of unfinished submissions asking for it.

        Tasks count until they complete; actors and gangs (no completion to watch)
        only for ``grace_s``, after which Ray's own numbers show them.
        """
        with self._lock:
            self._expire(time.monotonic())
            return {n: dict(d) for n, d in self._depth.items() if d}

    def pending_tasks(self) -> int:
        """Number of this driver's submitted tasks not yet finished."""
        with self._lock:
            return self._tracked

    def clear(self) -> None:
        """Forget everything (after shutdown)."""
        with self._lock:
            self._entries.clear()
            self._depth.clear()
            self._untracked.clear()
            self._tracked = 0
            self._max_age = 0.0


class ClusterView:
    """Cached snapshot of the managed nodes (see module docstring)."""

    def __init__(self, ttl_s: float = 0.05):
        self.ttl_s = ttl_s
        self._records: dict[str, NodeRecord] = {}
        self._nodes: list[NodeView] = []
        self._at = -1.0
        self._lock = threading.Lock()

    def invalidate(self) -> None:
        """Make the next :meth:`nodes` call read Ray again."""
        self._at = -1.0

    def nodes(self, fresh: bool = False) -> list[NodeView]:
        """Alive managed nodes, sorted by node id (cached for ``ttl_s`` unless ``fresh``).

        Raises:
            ClusterError: not connected to Ray.
        """
        now = time.monotonic()
        if not fresh and now - self._at <= self.ttl_s:
            return self._nodes
        with self._lock:
            if not fresh and time.monotonic() - self._at <= self.ttl_s:
                return self._nodes
            from ray._private import state

            avail = state.available_resources_per_node()
            nodes = []
            for node_id, res in avail.items():
                key = next((k[len(NODE_KEY_PREFIX):] for k in res if k.startswith(NODE_KEY_PREFIX)), None)
                if key is None:
                    continue
                rec = self._records.get(key)
                if rec is None:
                    from ..errors import ClusterError
                    from .kv import fetch_record

                    try:
                        rec = fetch_record(key)
                    except ClusterError:
                        continue  # a node that has joined but not yet published its record
                    self._records[key] = rec
                nodes.append(NodeView(node_id, key, rec, res))
            nodes.sort(key=lambda n: n.node_id)
            self._nodes = nodes
            self._at = time.monotonic()
            return nodes


def node_state(view: NodeView, minus: Mapping[str, float] | None = None, *, ignore_ray: bool = False,
               busy_extra: Iterable[str] = ()):
    """The :class:`~rayaccel.placement.NodeState` of ``view``.

    Args:
        view: the node.
        minus: resources to count as taken on top of Ray's numbers (recent claims).
        ignore_ray: treat every device as free (used for "can this ever fit?" and for
            queue-depth levels), then apply only ``busy_extra``.
        busy_extra: resource names to treat as fully taken.
    """
    from ..placement import NodeState

    minus = minus or {}
    extra = set(busy_extra)
    topo = view.topology

    def free(name: str, total: float) -> float:
        if name in extra:
            return 0.0
        have = total if ignore_ray else view.available.get(name, 0.0)
        return have - minus.get(name, 0.0)

    busy, parts, mem = set(), set(), {}
    for d in topo.devices:
        if d.health == "failed" or free(device_resource(d.index), 1.0) < 1 - _EPS:
            busy.add(d.index)
            continue
        total = memory_mib(d.memory_bytes)
        mig_mib = 0
        for p in d.partitions:
            if free(mig_resource(p), 1.0) < 1 - _EPS:
                parts.add(p.key)
                mig_mib += memory_mib(p.memory_bytes)
        if total:
            used = total - free(memory_resource(d.index), float(total)) - mig_mib
            if used > 0.5:
                mem[d.index] = int(round(used)) * MIB
    return NodeState(topo, busy=frozenset(busy), busy_partitions=frozenset(parts), memory_used=mem,
                     node_id=view.node_id)
