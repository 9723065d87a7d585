"""Where a node sits in a cluster: NVLink domains that span nodes, network levels, the cross-node model.

Data, not discovery: a :class:`NodePlace` says which NVLink domain a node's GPUs
belong to (the value of Ray's ``ray.io/gpu-domain`` label: the 18 compute trays of a
GB200 / GB300 NVL72 rack share one) and where the node sits in the network (levels
such as a Slurm block or leaf switch, or an AWS network node: ``(name, value)`` pairs;
two nodes with the same value at a level are under the same switch of that level).
The gang placer (:mod:`.gang`) reads it; the model here prices a ring all-reduce
whose ring crosses nodes:

* two GPUs of **one domain on different nodes** are NVLink-connected: the ring step
  runs at the GPUs' NVLink rate -- each GPU's strongest direct link on its own node,
  the rate its NVLink ports run at into the domain's NVLink switches (a GB200's 18
  NVLink5 lanes: 900 GB/s per direction) -- or :attr:`NodePlace.fabric_gbps`;
* otherwise the step leaves through the **network** at the node's NIC rate
  (:data:`NIC_GBPS`, or :attr:`NodePlace.network_gbps`): NCCL runs one ring per NIC,
  so one ring's cross-node step is bounded by one NIC;
* inside a node, the node's own best ring over its devices (the node model's
  :func:`~.model.allreduce_bandwidth_gbps`; conservative: the ring enters and leaves
  the node once, so a path through the devices could be faster).

Network levels do not change the modeled rate (the model has no oversubscription).
They decide where a gang that fits in no domain goes: the lowest common level with
room (:func:`level_order` orders levels finest first from the data itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ..errors import RequestError
from ..topology import NIC_BANDWIDTH_GBPS, NodeTopology
from .model import allreduce_bandwidth_gbps

#: Modeled per-direction bandwidth of one NIC, GB/s, by kind (:data:`rayaccel.topology.NIC_BANDWIDTH_GBPS`).
NIC_GBPS = NIC_BANDWIDTH_GBPS
#: Longest domain name or level name/value accepted (Ray label values are at most 63 characters).
MAX_NAME = 253
#: Most network levels a node may carry.
MAX_LEVELS = 16
#: Largest per-direction rate a place may name, GB/s.
MAX_GBPS = 1e6


@dataclass(frozen=True, slots=True)
class NodePlace:
    """A node's place in the cluster (all optional; ``NodePlace()`` knows nothing).

    Attributes:
        domain: the NVLink domain its GPUs belong to (nodes with the same value are
            NVLink-connected through NVLink switches), or None: an island.
        levels: ``(level name, value)`` pairs, e.g. ``(("block", "b3"), ("spine", "s1"))``;
            a mapping is accepted and stored as a tuple sorted by name. The order of levels
            is derived from the data (:func:`level_order`), not from the names.
        network_gbps: per-direction rate of one ring step through the network from this
            node, GB/s; None: from its NICs (:data:`NIC_GBPS`).
        fabric_gbps: per-direction NVLink rate of each GPU into the domain's switches, GB/s;
            None: each GPU's strongest direct link on the node.

    Raises:
        RequestError: a field of the wrong type, an empty or over-long name, a level named
            twice, a rate that is not a number in (0, :data:`MAX_GBPS`].
    """

    domain: str | None = None
    levels: tuple[tuple[str, str], ...] = ()
    network_gbps: float | None = None
    fabric_gbps: float | None = None

    def __post_init__(self) -> None:
        if self.domain is not None:
            _check_name(self.domain, "domain")
        levels = self.levels
        if isinstance(levels, Mapping):
            levels = tuple(levels.items())
        try:
            pairs = [tuple(p) for p in levels]
        except TypeError:
            raise RequestError(f"expected (name, value) pairs or a mapping, got {type(self.levels).__name__}",
                               "levels") from None
        if len(pairs) > MAX_LEVELS:
            raise RequestError(f"{len(pairs)} levels (at most {MAX_LEVELS})", "levels")
        seen: set[str] = set()
        for p in pairs:
            if len(p) != 2:
                raise RequestError(f"expected a (name, value) pair, got {p!r}"[:200], "levels")
            _check_name(p[0], "levels (name)")
            _check_name(p[1], f"levels[{p[0]}]")
            if p[0] in seen:
                raise RequestError(f"level {p[0]!r} named twice", "levels")
            seen.add(p[0])
        object.__setattr__(self, "levels", tuple(sorted(pairs)))
        for name in ("network_gbps", "fabric_gbps"):
            v = getattr(self, name)
            if v is None:
                continue
            if (isinstance(v, bool) or not isinstance(v, (int, float))
                    or (isinstance(v, int) and not 0 < v <= MAX_GBPS) or not 0 < float(v) <= MAX_GBPS):
                raise RequestError(f"expected GB/s as a number > 0 and <= {MAX_GBPS:g}, got {str(v)[:40]}", name)
            object.__setattr__(self, name, float(v))

    def level(self, name: str) -> str | None:
        """This node's value at level ``name``, or None when it has none."""
        for k, v in self.levels:
            if k == name:
                return v
        return None

    def describe(self) -> str:
        """One line: ``domain rack-a, block=b1, spine=s0`` (or ``no domain, no network levels``)."""
        head = f"domain {self.domain}" if self.domain else "no domain"
        tail = ", ".join(f"{k}={v}" for k, v in self.levels) or "no network levels"
        return f"{head}, {tail}"


NOWHERE = NodePlace()


def _check_name(v: object, field: str) -> None:
    if not isinstance(v, str) or not v.strip():
        raise RequestError(f"expected a non-empty string, got {v!r}"[:200], field)
    if len(v) > MAX_NAME:
        raise RequestError(f"{len(v)} characters (at most {MAX_NAME})", field)


def as_places(places: Sequence[NodePlace | None] | None, n: int) -> list[NodePlace]:
    """``places`` checked against ``n`` nodes (None entries, or None, mean :data:`NOWHERE`).

    Raises:
        RequestError: not a sequence of NodePlace / None of length ``n``.
    """
    if places is None:
        return [NOWHERE] * n
    if isinstance(places, (str, bytes, Mapping)) or not isinstance(places, Sequence):
        raise RequestError(f"expected a sequence of NodePlace (one per node), got {type(places).__name__}", "places")
    if len(places) != n:
        raise RequestError(f"{len(places)} places for {n} nodes; give one per node (None: unknown)", "places")
    out = []
    for i, p in enumerate(places):
        if p is None:
            out.append(NOWHERE)
        elif isinstance(p, NodePlace):
            out.append(p)
        else:
            raise RequestError(f"places[{i}] is a {type(p).__name__}, expected a NodePlace or None", "places")
    return out


def network_gbps(topology: NodeTopology, place: NodePlace) -> float:
    """Per-direction rate of one ring step through the network from this node, GB/s."""
    if place.network_gbps is not None:
        return place.network_gbps
    return NIC_GBPS["rdma"] if any(n.rdma for n in topology.nics) else NIC_GBPS["ethernet"]


def fabric_gbps(topology: NodeTopology, place: NodePlace, device: int) -> float | None:
    """Per-direction NVLink rate of ``device`` into its domain's switches, GB/s (None: no direct link)."""
    if place.fabric_gbps is not None:
        return place.fabric_gbps
    best = None
    for l in topology.links:
        if l.direct and device in (l.a, l.b):
            bw = l.bandwidth_gbps
            best = bw if best is None or bw > best else best
    return best


def same_domain(a: NodePlace, b: NodePlace) -> bool:
    """True when both nodes name the same NVLink domain."""
    return a.domain is not None and a.domain == b.domain


@dataclass(frozen=True, slots=True)
class RingModel:
    """A modeled ring all-reduce across nodes.

    Attributes:
        allreduce_bandwidth_gbps: the ring's weakest step, GB/s (0.0 for one device).
        bottleneck: what bounds it: ``"one device"``, ``"inside node <i>"``, ``"NVLink across nodes"``
            or ``"network"``.
    """

    allreduce_bandwidth_gbps: float
    bottleneck: str


def ring_allreduce(blocks: Sequence[tuple[NodeTopology, NodePlace, Sequence[int]]]) -> RingModel:
    """The modeled ring all-reduce over the devices of several nodes (see module docstring).

    Args:
        blocks: one per node, in ring order: its topology, its place, the devices the ring uses
            there (a node with no devices is skipped).

    Raises:
        RequestError: a device index a topology lacks.
    """
    nodes = [(t, p, list(dict.fromkeys(d))) for t, p, d in blocks if d]
    if sum(len(d) for _, _, d in nodes) < 2:
        return RingModel(0.0, "one device")
    if len(nodes) == 1:
        topo, _, devs = nodes[0]
        return RingModel(allreduce_bandwidth_gbps(topo, devs), "inside node 0")
    best, why = math.inf, ""
    for i, (topo, _, devs) in enumerate(nodes):
        if len(devs) >= 2:
            bw = allreduce_bandwidth_gbps(topo, devs)
            if bw < best:
                best, why = bw, f"inside node {i}"
    for i, (topo, place, devs) in enumerate(nodes):
        ntopo, nplace, ndevs = nodes[(i + 1) % len(nodes)]
        bw, kind = cross_step_gbps(topo, place, devs[-1], ntopo, nplace, ndevs[0])
        if bw <= best:  # on a tie the step between nodes is named: it is what the domain decides
            best, why = bw, kind
    return RingModel(best, why)


def cross_step_gbps(topo_a: NodeTopology, place_a: NodePlace, dev_a: int, topo_b: NodeTopology,
                    place_b: NodePlace, dev_b: int) -> tuple[float, str]:
    """A ring step from ``dev_a`` on one node to ``dev_b`` on another: (GB/s, ``"NVLink across nodes"`` or
    ``"network"``)."""
    if same_domain(place_a, place_b):
        fa = fabric_gbps(topo_a, place_a, dev_a)
        fb = fabric_gbps(topo_b, place_b, dev_b)
        if fa is not None and fb is not None:
            return min(fa, fb), "NVLink across nodes"
    return min(network_gbps(topo_a, place_a), network_gbps(topo_b, place_b)), "network"


def level_order(places: Iterable[NodePlace]) -> tuple[str, ...]:
    """Network level names, finest first: the level with more distinct values splits nodes finer
    (a leaf switch or block under a spine), then by name. Derived from the data, so no naming
    convention (``l1`` at the top or the bottom) is assumed."""
    values: dict[str, set[str]] = {}
    for p in places:
        for k, v in p.levels:
            values.setdefault(k, set()).add(v)
    return tuple(sorted(values, key=lambda k: (-len(values[k]), k)))
