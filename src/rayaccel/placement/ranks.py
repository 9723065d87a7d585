"""Rank order that follows the fabric: which bundle of a placement group gets which rank (pure data).

RL and LLM frameworks (verl, OpenRLHF, SkyRL, slime, vLLM's Ray executor) give rank ``r`` to
the ``r``-th bundle of a sorted list and cut the ranks into groups of ``k`` consecutive ranks
for tensor parallelism. :func:`rank_order` returns that list so that

* each group of ``k`` ranks sits on one node whenever the node holds ``k`` of the group's
  bundles, and there on the best-linked devices (an all-NVLink quad of a DGX-1 rather than a
  ring that crosses PCIe): the node's bundles are partitioned into groups maximizing the
  weakest group's modeled ring all-reduce (:func:`~.model.allreduce_bandwidth_gbps`), then
  the NVLink pairs inside groups, then the total;
* inside a group, consecutive ranks follow the best ring over its devices; groups on a node
  follow the node's ring, nodes of one NVLink domain are consecutive;
* bundles left over on a node (its count is not a multiple of ``k``) form groups with the
  next nodes', the NVLink domain first, priced by the cross-node model
  (:func:`~.domains.ring_allreduce`).

Each group comes back with its modeled all-reduce and the scope it stays in:
``"one device"``, ``"nvlink island"`` (every ring step a direct link), ``"node"``,
``"nvlink domain"`` (nodes of one domain) or ``"network"``. No ``ray`` here: the Ray layer
(:func:`rayaccel.rank_order`) reads the bundles' devices from :func:`rayaccel.placement_map`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import RequestError
from ..topology import NodeTopology
from ._index import index_of
from .domains import NOWHERE, NodePlace, ring_allreduce
from .model import allreduce_bandwidth_gbps, ring

#: Nodes with at most this many bundles are partitioned exhaustively; more, greedily.
EXACT_BUNDLES = 10

SCOPES = ("one device", "nvlink island", "node", "nvlink domain", "network")


@dataclass(frozen=True, slots=True)
class BundleSite:
    """Where one bundle of a placement group sits.

    Attributes:
        bundle: its index in the group. node: the node's id (any string naming it).
        devices: the devices behind it on that node, in order (empty: a bundle without devices).
    """

    bundle: int
    node: str
    devices: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RankGroup:
    """``k`` consecutive ranks (a tensor-parallel group).

    Attributes:
        bundles: the bundles, in rank order. nodes: the nodes they sit on, in order.
        allreduce_bandwidth_gbps: the modeled ring all-reduce over their devices, GB/s (0.0 for one device).
        scope: one of :data:`SCOPES`. bottleneck: what bounds the all-reduce (the cross-node model's words).
    """

    bundles: tuple[int, ...]
    nodes: tuple[str, ...]
    allreduce_bandwidth_gbps: float
    scope: str
    bottleneck: str


@dataclass(frozen=True, slots=True)
class RankOrder:
    """Bundle indices by rank (``order[r]`` is rank ``r``'s bundle) and the groups of ``group_size`` ranks."""

    order: tuple[int, ...]
    group_size: int
    groups: tuple[RankGroup, ...]

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"order": list(self.order), "group_size": self.group_size,
                "groups": [{"bundles": list(g.bundles), "nodes": list(g.nodes),
                            "allreduce_bandwidth_gbps": g.allreduce_bandwidth_gbps, "scope": g.scope,
                            "bottleneck": g.bottleneck} for g in self.groups]}


def rank_order(sites: Sequence[BundleSite], group_size: int, topologies: Mapping[str, NodeTopology],
               places: Mapping[str, NodePlace] | None = None) -> RankOrder:
    """The bundle order for ranks (module docstring).

    Args:
        sites: every bundle of the group, nodes in the order the caller prefers (e.g. by IP).
        group_size: ranks per group (tensor-parallel size), >= 1, dividing the number of bundles.
        topologies: node -> its topology (a node without one orders its bundles by index).
        places: node -> its place (NVLink domain, network levels); missing: :data:`NOWHERE`.

    Raises:
        RequestError: ``group_size`` below 1 or not dividing the bundles, a bundle given twice, or a
            device its node's topology lacks.
    """
    places = places or {}
    n = len(sites)
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise RequestError(f"group_size must be a positive integer, got {group_size!r}", "group_size",
                           "the ranks per group, e.g. the tensor-parallel size")
    if n % group_size:
        raise RequestError(f"group_size {group_size} does not divide the group's {n} bundles", "group_size",
                           f"a divisor of {n}")
    if len({s.bundle for s in sites}) != n:
        raise RequestError("a bundle index is given twice", "sites", "one BundleSite per bundle")
    for s in sites:
        topo = topologies.get(s.node)
        for d in s.devices:
            if topo is not None and d not in topo.indices:
                raise RequestError(f"bundle {s.bundle}: node {s.node} has no device {d}", "sites",
                                   f"indices of its topology: {list(topo.indices)}")
    nodes = _node_order(sites, places)
    by_node: dict[str, list[BundleSite]] = {nd: [] for nd in nodes}
    for s in sites:
        by_node[s.node].append(s)
    groups: list[list[BundleSite]] = []
    leftover: list[BundleSite] = []
    for nd in nodes:
        full, rest = _split_node(by_node[nd], group_size, topologies.get(nd))
        groups += full
        leftover += rest
    for i in range(0, len(leftover), group_size):
        groups.append(leftover[i:i + group_size])
    out = [_group(g, topologies, places) for g in groups]
    return RankOrder(tuple(b for g in out for b in g.bundles), group_size, tuple(out))


def _node_order(sites: Sequence[BundleSite], places: Mapping[str, NodePlace]) -> list[str]:
    """Nodes in the caller's order, those of one NVLink domain brought together (where the first of them was)."""
    seen = list(dict.fromkeys(s.node for s in sites))
    first: dict[str | None, int] = {}
    for i, nd in enumerate(seen):
        first.setdefault(places.get(nd, NOWHERE).domain or f"\0{nd}", i)
    return sorted(seen, key=lambda nd: (first[places.get(nd, NOWHERE).domain or f"\0{nd}"], seen.index(nd)))


def _devices(group: Sequence[BundleSite]) -> list[int]:
    return list(dict.fromkeys(d for s in group for d in s.devices))


class _Scorer:
    """A group's quality on one node, memoized: (modeled all-reduce, NVLink pairs, ring total)."""

    def __init__(self, topology: NodeTopology):
        self.topology = topology
        self._memo: dict[frozenset, tuple[float, int]] = {}

    def group(self, devices: Sequence[int]) -> tuple[float, int]:
        key = frozenset(devices)
        got = self._memo.get(key)
        if got is None:
            t = self.topology
            ds = sorted(key)
            bw = allreduce_bandwidth_gbps(t, ds) if len(ds) > 1 else float("inf")
            pairs = sum(1 for a, b in itertools.combinations(ds, 2) if (l := t.link(a, b)) is not None and l.direct)
            got = self._memo[key] = (bw, pairs)
        return got

    def partition(self, groups: Sequence[Sequence[BundleSite]]) -> tuple[float, int, float]:
        scores = [self.group(_devices(g)) for g in groups]
        if not scores:
            return (float("inf"), 0, 0.0)
        return (min(s[0] for s in scores), sum(s[1] for s in scores),
                sum(s[0] for s in scores if s[0] != float("inf")))


def _split_node(bundles: list[BundleSite], k: int, topology: NodeTopology | None
                ) -> tuple[list[list[BundleSite]], list[BundleSite]]:
    """The node's bundles as full groups of ``k`` (best partition, in the node's ring order) and the rest."""
    full_n = len(bundles) // k
    if topology is None or not any(s.devices for s in bundles) or full_n == 0:
        ordered = sorted(bundles, key=lambda s: (min(s.devices, default=-1), s.bundle))
        return [ordered[i * k:(i + 1) * k] for i in range(full_n)], ordered[full_n * k:]
    sc = _Scorer(topology)
    if len(bundles) <= EXACT_BUNDLES:
        best, best_q = None, None
        rest_n = len(bundles) - full_n * k
        for rest in itertools.combinations(range(len(bundles)), rest_n):
            pool = [b for i, b in enumerate(bundles) if i not in rest]
            for part in _partitions(pool, k):
                q = sc.partition(part)
                if best_q is None or q > best_q:
                    best, best_q = (part, [bundles[i] for i in rest]), q
        groups, left = best
    else:  # greedy: the best group among the remaining bundles, again and again
        remaining = list(bundles)
        groups = []
        for _ in range(full_n):
            g = max(itertools.combinations(remaining, k), key=lambda c: sc.partition([c]))
            groups.append(list(g))
            remaining = [b for b in remaining if b not in g]
        left = remaining
    pos = _ring_positions(topology, _devices(bundles))
    groups = [_in_ring(g, topology) for g in groups]
    groups.sort(key=lambda g: min((pos.get(d, 1 << 30) for s in g for d in s.devices), default=1 << 30))
    return groups, sorted(left, key=lambda s: min((pos.get(d, 1 << 30) for d in s.devices), default=1 << 30))


def _partitions(pool: list[BundleSite], k: int):
    """Every partition of ``pool`` into groups of ``k`` (the first remaining bundle anchors each group)."""
    if not pool:
        yield []
        return
    head, tail = pool[0], pool[1:]
    for mates in itertools.combinations(range(len(tail)), k - 1):
        g = [head, *(tail[i] for i in mates)]
        rest = [b for i, b in enumerate(tail) if i not in mates]
        for more in _partitions(rest, k):
            yield [g, *more]


def _ring_positions(topology: NodeTopology, devices: list[int]) -> dict[int, int]:
    """device -> its position in the best ring over ``devices`` (started at the lowest device)."""
    if not devices:
        return {}
    ix = index_of(topology)
    order = [ix.indices[p] for p in ring(ix, [ix.pos[d] for d in devices])]
    i = order.index(min(order))
    order = order[i:] + order[:i]
    if len(order) > 2 and order[-1] < order[1]:  # the direction toward the lower neighbour: deterministic
        order = [order[0], *reversed(order[1:])]
    return {d: i for i, d in enumerate(order)}


def _in_ring(group: list[BundleSite], topology: NodeTopology) -> list[BundleSite]:
    pos = _ring_positions(topology, _devices(group))
    return sorted(group, key=lambda s: (min((pos[d] for d in s.devices), default=1 << 30), s.bundle))


def _group(group: list[BundleSite], topologies: Mapping[str, NodeTopology],
           places: Mapping[str, NodePlace]) -> RankGroup:
    nodes = tuple(dict.fromkeys(s.node for s in group))
    bundles = tuple(s.bundle for s in group)
    devs = _devices(group)
    if len(nodes) == 1:
        topo = topologies.get(nodes[0])
        if topo is None or not devs:
            return RankGroup(bundles, nodes, 0.0, "node", "no devices known")
        if len(devs) == 1:
            return RankGroup(bundles, nodes, 0.0, "one device", "one device")
        bw = allreduce_bandwidth_gbps(topo, devs)
        ix = index_of(topo)
        order = [ix.indices[p] for p in ring(ix, [ix.pos[d] for d in devs])]
        steps = [topo.link(order[i], order[(i + 1) % len(order)]) for i in range(len(order) if len(order) > 2 else 1)]
        island = all(l is not None and l.direct for l in steps)
        return RankGroup(bundles, nodes, bw, "nvlink island" if island else "node", "inside node 0")
    blocks = []
    for nd in nodes:
        topo = topologies.get(nd)
        here = [d for s in group if s.node == nd for d in s.devices]
        if topo is None or not here:
            return RankGroup(bundles, nodes, 0.0, "network", "no devices known")
        blocks.append((topo, places.get(nd, NOWHERE), here))
    model = ring_allreduce(blocks)
    domains = {places.get(nd, NOWHERE).domain for nd in nodes}
    scope = "nvlink domain" if len(domains) == 1 and None not in domains and model.bottleneck != "network" \
        else "network"
    return RankGroup(bundles, nodes, model.allreduce_bandwidth_gbps, scope, model.bottleneck)


__all__ = ["EXACT_BUNDLES", "SCOPES", "BundleSite", "RankGroup", "RankOrder", "rank_order"]
