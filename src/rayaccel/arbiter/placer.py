"""The placer behind the arbiter: :class:`PlacerChooser` over a topology, and :func:`bundle_order`.

Used where the node table has no answer (a constrained request, a pool larger than
:data:`~.table.PLAN_MAX`, a group of multi-device bundles) and at node start to
precompute the table's plans (:mod:`.build`). It imports the placer and the topology
model, so the worker path (:mod:`.choose`) loads this module only when it needs it.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping

from ..discovery.rayspec import RaySpec
from ..placement import NodeState, Request, allocate
from ..placement.units import choose_units
from ..topology import NodeTopology
from .state import GPU


class PlacerChooser:
    """Chooses units: ``GPU`` devices with :func:`rayaccel.placement.allocate`, any other family's
    units (NeuronCores, TPU chips, Gaudi modules, a plugin's devices) with
    :func:`rayaccel.placement.units.choose_units`.

    Args:
        topology: the node's topology.
        specs: resource -> its :class:`~rayaccel.discovery.RaySpec`, for the families other than GPUs.
    """

    def __init__(self, topology: NodeTopology, specs: Mapping[str, RaySpec] | None = None):
        self.topology = topology
        self.specs = dict(specs or {})
        self._all = frozenset(topology.indices)

    def choose(self, resource: str, avail: frozenset, k: int, request: Any) -> tuple[tuple | None, str]:
        if resource != GPU:
            spec = self.specs.get(resource)
            if spec is None:
                return None, f"no placer for {resource} on this node"
            got = choose_units(self.topology, spec, avail, k, request)
            if not got:
                return None, "; ".join(got.reasons) or f"no suitable {resource} units among the free ones"
            return tuple(got.units), ""
        if request is None:
            request = Request(gpus=k)
        elif request.gpus != k:
            request = replace(request, gpus=k)
        alloc = allocate(NodeState(self.topology, busy=self._all - avail), request)
        if not alloc:
            return None, "; ".join(getattr(alloc, "reasons", ()) or ("no suitable set among the free devices",))
        return tuple(alloc.devices), ""

    def gang(self, resource: str, avail: frozenset, sizes: Mapping[int, int]) -> dict[int, tuple] | None:
        n = sum(sizes.values())
        got, _ = self.choose(resource, avail, n, None)
        if got is None:
            return None
        # devices (GPUs, Gaudi, Ascend, ...): the ring arranged for the bundles; cores and chips come in
        # their family's order already
        spec = self.specs.get(resource)
        devices = resource == GPU or (spec is not None and spec.unit == "device")
        order = bundle_order(self.topology, list(got), [sizes[b] for b in sorted(sizes)]) if devices else list(got)
        out, i = {}, 0
        for b in sorted(sizes):
            out[b] = tuple(order[i:i + sizes[b]])
            i += sizes[b]
        return out


def bundle_order(topology: NodeTopology, order: list[int], sizes: list[int]) -> list[int]:
    """The devices of a best ring ``order``, arranged for bundles of ``sizes`` taken consecutively.

    Bundles of several devices first get the rotation/direction of the ring whose
    bundles are internally best linked (weakest intra-bundle link, then their total).
    Among orders as good, the ascending one wins when it is also a best ring: Ray
    Train ranks a node's workers by their lowest GPU id, so the ranks then follow the ring.
    """
    n = len(order)
    if n <= 1:
        return list(order)

    def ring_q(o: list[int]) -> tuple[float, float]:
        bws = [topology.bandwidth_gbps(o[i], o[(i + 1) % n]) for i in range(n)] if n > 2 else \
            [topology.bandwidth_gbps(o[0], o[1])]
        return (min(bws), sum(bws))

    def bundle_q(o: list[int]) -> tuple[float, float]:
        worst, total, i = float("inf"), 0.0, 0
        for k in sizes:
            part = o[i:i + k]
            i += k
            for a in range(len(part)):
                for b in range(a + 1, len(part)):
                    bw = topology.bandwidth_gbps(part[a], part[b])
                    worst, total = min(worst, bw), total + bw
        return (worst if worst != float("inf") else 0.0, total)

    best_ring = ring_q(order)
    variants = [sorted(order)]
    for seq in (list(order), list(reversed(order))):
        for r in range(n):
            variants.append(seq[r:] + seq[:r])

    def key(o: list[int]) -> tuple:
        rq = ring_q(o)
        is_best = rq[0] >= best_ring[0] - 1e-9 and rq[1] >= best_ring[1] - 1e-9
        return (bundle_q(o), is_best, o == sorted(o))

    best = max(variants, key=key)
    split = _best_split(order, sizes, bundle_q)
    if split is not None and bundle_q(split) > bundle_q(best):
        # a split of the same devices no ring order gives (a ring of 6 on a DGX-1 with a device busy: its
        # rotations pair one NV1, while three NV2 pairs exist among them): the best order of its bundles
        best = max(_arrangements(split, sizes), key=lambda o: (ring_q(o), o == sorted(o)))
    return list(best)


#: Up to this many devices, :func:`bundle_order` also searches every split of the set into its bundles
#: (8 devices in pairs: 105 splits; 8 in fours: 35), and every order of the best split's bundles.
SPLIT_MAX = 8


def _best_split(order: list[int], sizes: list[int], quality: Callable[[list[int]], tuple]) -> list[int] | None:
    """The devices of ``order`` split into bundles of ``sizes`` (consecutive) with the best ``quality``, or None
    when every bundle is one device or there are more than :data:`SPLIT_MAX` devices."""
    if len(order) > SPLIT_MAX or all(k == 1 for k in sizes):
        return None
    best: list[int] | None = None
    best_q: tuple = ()

    def place(rest: tuple[int, ...], i: int, done: list[int]) -> None:
        nonlocal best, best_q
        if i == len(sizes):
            q = quality(done)
            if best is None or q > best_q:
                best, best_q = list(done), q
            return
        k = sizes[i]
        # bundles of the same size are interchangeable: the next one of a size takes the lowest device left
        same = i > 0 and sizes[i - 1] == k
        firsts = rest[:1] if same else rest
        for a in firsts:
            others = tuple(x for x in rest if x != a)
            for more in itertools.combinations(others, k - 1):
                left = tuple(x for x in others if x not in more)
                place(left, i + 1, [*done, a, *more])

    place(tuple(sorted(order)), 0, [])
    return best


def _arrangements(split: list[int], sizes: list[int]) -> Iterator[list[int]]:
    """Every order of ``split``'s bundles (kept whole, each in either direction), as one device list."""
    parts, i = [], 0
    for k in sizes:
        parts.append(tuple(split[i:i + k]))
        i += k
    for perm in itertools.permutations(range(len(parts))):
        if any(sizes[j] != len(parts[p]) for j, p in enumerate(perm)):
            continue  # a bundle keeps its size's place
        for flips in itertools.product((False, True), repeat=len(parts)):
            yield [d for p, f in zip(perm, flips) for d in (reversed(parts[p]) if f else parts[p])]


def spec_of(fields: Mapping[str, Any]) -> RaySpec:
    """The :class:`~rayaccel.discovery.RaySpec` a node table stores as fields (:func:`.build.spec_fields`).

    Raises:
        PluginError: the fields do not make a valid spec (a damaged table).
    """
    def tup(v: Any) -> Any:
        return tuple(tup(x) for x in v) if isinstance(v, list) else v

    return RaySpec(**{k: tup(v) for k, v in fields.items()})
