"""What is in use on one node: :class:`NodeState`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ..errors import RequestError
from ..topology import NodeTopology
from ._index import index_of


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node's topology plus what is taken on it.

    Attributes:
        topology: the node's devices and links.
        busy: indices of devices held whole.
        busy_partitions: :attr:`Partition.key` values of MIG instances held.
        memory_used: bytes reserved per device index by shared (memory) tasks;
            a device with any reservation is not free for exclusive use.
        node_id: the node's name in a cluster, or None.

    Raises:
        RequestError: a busy index, partition key or memory entry that names no
            device of the topology.
    """

    topology: NodeTopology
    busy: frozenset[int] = frozenset()
    busy_partitions: frozenset[str] = frozenset()
    memory_used: Mapping[int, int] = field(default_factory=dict)
    node_id: str | None = None
    _key: tuple | None = field(default=None, init=False, repr=False, compare=False, hash=False)
    _kid: int = field(default=0, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.topology, NodeTopology):
            raise RequestError(f"expected a NodeTopology, got {type(self.topology).__name__}", "topology")
        ix = index_of(self.topology)
        busy = _as_int_set(self.busy, "busy")
        bad = sorted(busy - ix.index_set)
        if bad:
            raise RequestError(f"no device {bad[0]} on this node", "busy", f"device indices {_ranges(ix.indices)}")
        object.__setattr__(self, "busy", busy)
        parts = frozenset(self.busy_partitions)
        object.__setattr__(self, "busy_partitions", parts)
        mem = dict(self.memory_used or {})
        for d, b in mem.items():
            if d not in ix.index_set:
                raise RequestError(f"no device {d} on this node", "memory_used", f"device indices {_ranges(ix.indices)}")
            if isinstance(b, bool) or not isinstance(b, int) or b < 0:
                raise RequestError(f"device {d}: expected bytes as an int >= 0, got {b!r}", "memory_used")
        object.__setattr__(self, "memory_used", {d: b for d, b in mem.items() if b > 0})

    @property
    def key(self) -> tuple:
        """A hashable identity of (topology content, what is taken): equal keys place alike."""
        k = self._key
        if k is None:
            ix = index_of(self.topology)
            mask = 0
            for d in self.busy:
                mask |= 1 << ix.pos[d]
            for d in self.memory_used:
                mask |= 1 << ix.pos[d]
            k = (ix.key, mask, tuple(sorted(self.memory_used.items())), self.busy_partitions)
            object.__setattr__(self, "_key", k)
            object.__setattr__(self, "_kid", _key_id(k))
        return k

    def key_id(self) -> int:
        """A small int standing for :attr:`key` (equal keys, equal ids, within a process): cheap to hash.

        Ids are never reused, so a cache keyed by them stays correct when the id table is reset.
        """
        return self._kid or (self.key and self._kid)

    def taken(self) -> frozenset[int]:
        """Devices not free for exclusive use: busy, with shared reservations, or with busy MIG instances."""
        held = set(self.busy) | set(self.memory_used)
        for p in self.topology.partitions():
            if p.key in self.busy_partitions:
                held.add(p.parent)
        return frozenset(held)

    def with_busy(self, devices: Iterable[int]) -> "NodeState":
        """A copy with ``devices`` also held whole."""
        return NodeState(self.topology, self.busy | frozenset(devices), self.busy_partitions, self.memory_used, self.node_id)

    def with_free(self, devices: Iterable[int]) -> "NodeState":
        """A copy with ``devices`` no longer held whole."""
        return NodeState(self.topology, self.busy - frozenset(devices), self.busy_partitions, self.memory_used, self.node_id)


_IDS: dict[tuple, int] = {}
_NEXT_ID = [1]
_MAX_IDS = 500_000


def _key_id(key: tuple) -> int:
    got = _IDS.get(key)
    if got is None:
        if len(_IDS) >= _MAX_IDS:
            _IDS.clear()
        got = _IDS[key] = _NEXT_ID[0]
        _NEXT_ID[0] += 1
    return got


def as_state(topology_or_state: NodeTopology | NodeState, busy: Iterable[int] = ()) -> NodeState:
    """Wrap a topology (with ``busy``) in a :class:`NodeState`; a state is returned as is (plus ``busy``).

    Raises:
        RequestError: not a topology or state, or a bad busy index.
    """
    if isinstance(topology_or_state, NodeState):
        return topology_or_state.with_busy(busy) if busy else topology_or_state
    if isinstance(topology_or_state, NodeTopology):
        return NodeState(topology_or_state, busy=frozenset(_as_int_set(busy, "busy")))
    raise RequestError(f"expected a NodeTopology or NodeState, got {type(topology_or_state).__name__}", "topology")


def _as_int_set(values: Iterable[int], name: str) -> frozenset[int]:
    try:
        items = list(values)
    except TypeError:
        raise RequestError(f"expected a set of device indices, got {values!r}", name) from None
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int):
            raise RequestError(f"expected device indices (ints), got {v!r}", name)
    return frozenset(items)


def _ranges(indices: Iterable[int]) -> str:
    xs = sorted(indices)
    if not xs:
        return "(none)"
    if xs == list(range(xs[0], xs[-1] + 1)) and len(xs) > 2:
        return f"{xs[0]}-{xs[-1]}"
    return ",".join(map(str, xs))
