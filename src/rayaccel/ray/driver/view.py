"""The cluster as a driver's placer sees it: nodes, their records, published free devices.

One :class:`ClusterView` per driver process. A refresh costs three GCS requests
(every alive node's available resources, their totals for new nodes, the agents'
snapshots in one multi-get); records are fetched once per node key and cached.
The view is cached for ``ttl_s`` (default 50 ms).

Per node, the free devices come from its agent's snapshot (about once a second;
a little stale is fine: the arbiter makes the exact choice at the grant) and Ray's
available ``GPU`` count (fresh). :class:`Claims` keeps this driver's own recent
submissions so a burst does not all aim at the same "free" devices.

Bad data degrades only its own node: a record that does not parse, or that
contradicts what the node advertises to Ray, puts that node in
:attr:`ClusterView.bad` (shown by ``status`` and ``doctor``) and out of placement.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from rayaccel.arbiter.state import Snapshot
from rayaccel.errors import ClusterError, StateError, TopologyError
from rayaccel.placement import NodeState
from rayaccel.placement.pools import gpu_pool
from rayaccel.topology import NodeTopology
from rayaccel.ray import _ray_private as rp
from rayaccel.ray.kv import fetch_record, fetch_states, parse_state
from rayaccel.contract import NODE_KEY_LABEL, valid_key
from rayaccel.ray.record import NodeRecord

log = logging.getLogger(__name__)
#: How long a bad record is remembered before it is read again (it may be repaired), seconds.
BAD_RETRY_S = 5.0


@dataclass(frozen=True, slots=True)
class NodeView:
    """One alive managed node.

    Attributes:
        node_id: Ray node id (hex). node_key: rayaccel key. record: its record.
        available: Ray's available resources. total: Ray's total resources.
        state: the agent's last :class:`~rayaccel.arbiter.state.Snapshot`, or None.
        labels: the node's Ray labels (``ray.io/gpu-domain``, network levels, rayaccel's own).
    """

    node_id: str
    node_key: str
    record: NodeRecord
    available: Mapping[str, float]
    total: Mapping[str, float]
    state: Snapshot | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def topology(self) -> NodeTopology:
        """The node's topology."""
        return self.record.topology

    @property
    def gpus_available(self) -> float:
        """Ray's free ``GPU`` count on the node now."""
        return float(self.available.get("GPU", 0.0))


@dataclass
class _Claim:
    node_id: str
    devices: tuple[int, ...]
    gpus: float
    at: float
    ref: Any = None


class Claims:
    """This driver's submissions Ray's numbers may not show yet (thread-safe).

    A claim counts until its task completes (when a ref is given) or for ``grace_s``.
    """

    def __init__(self, grace_s: float = 1.0):
        self.grace_s = grace_s
        self._lock = threading.Lock()
        self._items: dict[int, _Claim] = {}
        self._seq = 0

    def add(self, node_id: str, devices: tuple[int, ...], gpus: float, ref: Any = None) -> int:
        """Record a submission to ``node_id`` expected on ``devices``."""
        with self._lock:
            self._expire()
            self._seq += 1
            cid = self._seq
            self._items[cid] = _Claim(node_id, tuple(devices), float(gpus), time.monotonic(), ref)
        if ref is not None and hasattr(ref, "_on_completed"):
            ref._on_completed(lambda _r, cid=cid: self.release(cid))
        return cid

    def release(self, cid: int) -> None:
        with self._lock:
            self._items.pop(cid, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for cid in [c for c, it in self._items.items() if it.ref is None and now - it.at > self.grace_s]:
            del self._items[cid]

    def on(self, node_id: str) -> tuple[set[int], float]:
        """(devices, GPUs) this driver's young claims take on ``node_id``."""
        now = time.monotonic()
        with self._lock:
            self._expire()
            devs: set[int] = set()
            gpus = 0.0
            for it in self._items.values():
                if it.node_id == node_id and now - it.at <= self.grace_s:
                    devs.update(it.devices)
                    gpus += it.gpus
            return devs, gpus


class ClusterView:
    """Cached snapshot of the managed nodes (see module docstring)."""

    def __init__(self, ttl_s: float = 0.05):
        self.ttl_s = ttl_s
        self._records: dict[str, NodeRecord] = {}
        self._totals: dict[str, dict] = {}
        self._labels: dict[str, dict] = {}  # Ray node id -> labels (fixed at node start: read once per node)
        #: node key -> (why it cannot be used, Ray node id, when noticed)
        self.bad: dict[str, tuple[str, str, float]] = {}
        self.unmanaged: list[str] = []
        self._nodes: list[NodeView] = []
        self._at = -1.0
        self._lock = threading.Lock()

    def invalidate(self) -> None:
        """Make the next :meth:`nodes` call read Ray again."""
        self._at = -1.0

    def nodes(self, fresh: bool = False) -> list[NodeView]:
        """Alive, usable managed nodes sorted by node id (cached for ``ttl_s`` unless ``fresh``).

        Raises:
            ClusterError: not connected to Ray.
        """
        if not fresh and time.monotonic() - self._at <= self.ttl_s:
            return self._nodes
        with self._lock:
            if not fresh and time.monotonic() - self._at <= self.ttl_s:
                return self._nodes
            if rp.kv() is None:
                raise ClusterError("not connected to Ray: call rayaccel.init() (or ray.init()) first")
            avail = rp.available_resources_per_node()
            if any(nid not in self._totals for nid in avail):
                self._totals.update(rp.total_resources_per_node())
                self._labels.update(_labels_per_node())
            found: list[tuple[str, str, dict]] = []
            unmanaged = []
            for node_id, res in avail.items():
                key = self._labels.get(node_id, {}).get(NODE_KEY_LABEL)
                if key is None:
                    unmanaged.append(node_id)
                    continue
                found.append((node_id, key, res))
            self.unmanaged = sorted(unmanaged)
            try:
                states = fetch_states([k for _, k, _ in found])
            except Exception as e:  # noqa: BLE001 - snapshots are advisory: place on Ray's counts alone
                states = {}
                log.warning("rayaccel: node snapshots unreadable: %s", e)
            nodes = []
            now = time.monotonic()
            for node_id, key, res in found:
                rec = self._record(key, node_id, now)
                if rec is None:
                    continue
                why = rec.mismatch(self._totals.get(node_id, {}))
                if why is not None:
                    self.bad[key] = (f"its record does not match what it advertises to Ray: {why}", node_id, now)
                    continue
                state = None
                try:
                    state = parse_state(states.get(key), key)
                except StateError as e:
                    self.bad[key] = (str(e), node_id, now)
                nodes.append(NodeView(node_id, key, rec, res, self._totals.get(node_id, {}), state,
                                      self._labels.get(node_id, {})))
            alive_keys = {k for _, k, _ in found}
            for k in [k for k in self.bad if k not in alive_keys]:
                del self.bad[k]
            nodes.sort(key=lambda n: n.node_id)
            self._nodes = nodes
            self._at = time.monotonic()
            return nodes

    def _record(self, key: str, node_id: str, now: float) -> NodeRecord | None:
        rec = self._records.get(key)
        if rec is not None:
            return rec
        bad = self.bad.get(key)
        if bad is not None and now - bad[2] < BAD_RETRY_S:
            return None
        if not valid_key(key):
            self.bad[key] = (f"malformed node key {key!r}", node_id, now)
            return None
        try:
            rec = fetch_record(key)
        except ClusterError:
            return None  # joined but not yet published
        except TopologyError as e:
            self.bad[key] = (str(e), node_id, now)
            return None
        if rec.node_key != key:
            self.bad[key] = (f"record names node key {rec.node_key!r}, published under {key!r}", node_id, now)
            return None
        self.bad.pop(key, None)
        self._records[key] = rec
        return rec


def _labels_per_node() -> dict[str, dict]:
    """Every alive node's Ray labels (one GCS request; ``ray.nodes()`` is public API)."""
    import ray

    return {n["NodeID"]: dict(n.get("Labels") or {}) for n in ray.nodes() if n.get("Alive")}


def node_state(view: NodeView, claims: Claims | None = None, *, idle: bool = False) -> Any:
    """The :class:`~rayaccel.placement.NodeState` of ``view`` for the placer.

    Busy = devices outside the GPU pool (MIG mode, failed), drained devices, and unless
    ``idle``: devices the agent's snapshot shows held, plus this driver's young claims.
    """
    topo = view.topology
    pool = set(gpu_pool(topo))
    busy = {d.index for d in topo.devices if d.health == "failed"}  # MIG-mode devices: placement knows them
    parts: set[str] = set()
    st = view.state
    if st is not None:
        busy |= set(st.drained)
    if not idle:
        if st is not None:
            busy |= pool - set(st.free)
            parts |= set(st.mig_held)
        if claims is not None:
            devs, _ = claims.on(view.node_id)
            busy |= devs
    busy &= set(topo.indices)
    known = {p.key for p in topo.partitions()}
    return NodeState(topo, busy=frozenset(busy), busy_partitions=frozenset(parts & known), node_id=view.node_id)


_VIEW: ClusterView | None = None
_CLAIMS: Claims | None = None


def view() -> ClusterView:
    """This process's cluster view."""
    global _VIEW
    if _VIEW is None:
        _VIEW = ClusterView()
    return _VIEW


def claims() -> Claims:
    """This process's claims."""
    global _CLAIMS
    if _CLAIMS is None:
        _CLAIMS = Claims()
    return _CLAIMS


def reset() -> None:
    """Forget cached state (after shutdown)."""
    global _VIEW, _CLAIMS
    _VIEW = None
    _CLAIMS = None
