"""A :class:`Claim`: the one thing that crosses from placement to Ray.

``rayaccel.remote`` and ``rayaccel.gang`` turn a placement
:class:`~rayaccel.placement.Request` into a Claim with :func:`plan`, then into Ray
options with :meth:`Claim.ray_options`. Ray's own ledger does the rest:

* whole devices -> ``num_gpus=k``; a memory share -> Ray's fractional GPU, the
  request's bytes over the node's device memory, rounded up (never oversubscribed);
  a MIG instance -> ``resources={"mig_<profile>": 1}``;
* the node: a *soft* pin to the node whose published free devices serve the request
  best (Ray falls back to another feasible node when that one is gone), and a label
  selector restricting the work to nodes that could ever serve it;
* which devices on the node: the node's arbiter, at the grant (:mod:`.arbiter`).

A request no node can ever meet raises :class:`~rayaccel.errors.Unsatisfiable` at
once instead of waiting in Ray's queue forever.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rayaccel.errors import RequestError, Unsatisfiable
from rayaccel.placement import Rejection, allocate, place
from rayaccel.placement.pools import gpu_pool, mig_resource
from rayaccel.contract import LABEL_PREFIX, NODE_KEY_LABEL
from rayaccel.ray.driver.places import place_of
from rayaccel.ray.driver.view import NodeView, claims, node_state, view

#: Ray's resource precision (``num_gpus`` is kept to 4 decimals).
RAY_PRECISION = 10_000
#: Above this many candidate nodes, the selector names "every rayaccel node" instead of the list.
MAX_SELECTOR_KEYS = 64


@dataclass(frozen=True, slots=True)
class Claim:
    """What rayaccel asks Ray for one piece of work.

    Attributes:
        request: the placement request.
        num_gpus: whole devices, a fraction (memory share) or 0 (MIG).
        resources: custom resources, e.g. ``(("mig_1g.5gb", 1.0),)``.
        node_id: the soft-pinned node, or None (Ray chooses among ``node_keys``).
        node_keys: every node that could ever serve the request.
        every_node: True when that is every usable rayaccel node.
        devices: the set the placer expects on ``node_id`` (advisory; the arbiter decides).
        real: some node that may run it has real (not simulated) devices.
    """

    request: Any
    num_gpus: float
    resources: tuple[tuple[str, float], ...]
    node_id: str | None
    node_keys: tuple[str, ...]
    every_node: bool
    devices: tuple[int, ...] = ()
    real: bool = False

    def ray_options(self, user: dict) -> dict:
        """Ray options for this claim merged over the user's own (``resources``, ``label_selector``).

        Raises:
            RequestError: the user's options name a key rayaccel sets.
        """
        opts = dict(user)
        opts["num_gpus"] = self.num_gpus
        if self.resources:
            res = dict(opts.get("resources") or {})
            res.update(dict(self.resources))
            opts["resources"] = res
        sel = dict(opts.get("label_selector") or {})
        if NODE_KEY_LABEL in sel or (LABEL_PREFIX + "simulated") in sel:
            raise RequestError("rayaccel chooses the nodes by these labels", "label_selector",
                               "your own labels, or none")
        if self.every_node or len(self.node_keys) > MAX_SELECTOR_KEYS:
            sel[LABEL_PREFIX + "simulated"] = "in(true,false)"  # every rayaccel node carries this label
        else:
            sel[NODE_KEY_LABEL] = "in(" + ",".join(self.node_keys) + ")"
        opts["label_selector"] = sel
        if self.node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.node_id, soft=True)
        return opts


_IDLE: dict = {}


def _idle_fit(n: NodeView, request: Any) -> Any:
    """The request's placement on the node when idle (cached per record and request).

    A node given MIG UUIDs offers its instances as ``GPU`` only (no ``mig_<profile>``, as plain Ray): never a MIG
    request's node. (Its GPU pool is empty, so no device request lands there either: plain ``num_gpus`` work does.)
    """
    if request.kind == "mig" and n.record.mig_gpus:
        return Rejection((f"its MIG instances are its GPUs ({n.record.given_by}): ask num_gpus=, not mig=",), request)
    key = (id(n.record), request)
    hit = _IDLE.get(key)
    if hit is None:
        if len(_IDLE) > 4096:
            _IDLE.clear()
        try:
            hit = allocate(node_state(n, idle=True), request)
        except RequestError as e:  # e.g. a required device this node does not have
            hit = Rejection((str(e),), request)
        _IDLE[key] = hit
    return hit


def share_fraction(nbytes: int, nodes: list[NodeView]) -> float:
    """Ray's GPU fraction for ``nbytes`` on any of ``nodes`` (by their smallest pool device), rounded up."""
    mem = [n.topology.device(i).memory_bytes for n in nodes for i in gpu_pool(n.topology)]
    known = [m for m in mem if m]
    if not known:
        raise RequestError("the nodes do not say how much memory their devices have", "gpu_memory",
                           "gpus= or mig= on these nodes")
    frac = math.ceil(nbytes / min(known) * RAY_PRECISION) / RAY_PRECISION
    return min(1.0, max(frac, 1.0 / RAY_PRECISION))


def plan(request: Any) -> Claim:
    """Choose how to ask Ray for ``request`` (see module docstring).

    Raises:
        Unsatisfiable: no node could ever meet the request.
        ClusterError: not connected to Ray.
    """
    nodes = view().nodes()
    feasible = []
    reasons = []
    for n in nodes:
        fit = _idle_fit(n, request)
        if fit:
            feasible.append(n)
        else:
            reasons.append(f"{n.topology.name or n.node_key}: " + "; ".join(getattr(fit, "reasons", ()) or ("no",)))
    if not feasible:
        if not nodes:
            extra = ""
            bad = view().bad
            if bad:
                extra = " (unusable: " + "; ".join(f"node {k}: {why}" for k, (why, _, _) in sorted(bad.items())) + ")"
            raise Unsatisfiable("the cluster has no usable rayaccel nodes (start them with `rayaccel start` or "
                                "rayaccel.init(); plain `ray start` nodes are not managed)" + extra)
        raise Unsatisfiable(f"no node can ever satisfy {request.describe()}: " + " | ".join(reasons))
    c = claims()
    alloc = place([node_state(n, c) for n in feasible], request,
                  places=[place_of(n.labels, n.node_key) for n in feasible])
    pinned = None
    devices: tuple[int, ...] = ()
    kind = request.kind
    need = request.gpus if kind == "devices" else 0
    if alloc:
        n = next(x for x in feasible if x.node_id == alloc.node)
        _, mine = c.on(n.node_id)
        if kind != "devices" or n.gpus_available - mine >= need - 1e-6:
            pinned = n
            devices = tuple(alloc.devices)
    resources: tuple[tuple[str, float], ...] = ()
    if kind == "devices":
        num_gpus: float = float(request.gpus)
    elif kind == "shared":
        num_gpus = share_fraction(request.gpu_memory, [pinned] if pinned else feasible)
    else:
        num_gpus = 0.0
        resources = ((mig_resource(request.mig), 1.0),)
    every = len(feasible) == len(nodes) and not view().unmanaged and not view().bad
    real = not pinned.record.simulated if pinned else any(not n.record.simulated for n in feasible)
    return Claim(request, num_gpus, resources, pinned.node_id if pinned else None,
                 tuple(n.node_key for n in feasible), every, devices, real)


def record(claim: Claim, ref: Any = None) -> None:
    """Count a submitted claim against its node until it completes (or briefly, without a ref)."""
    if claim.node_id is not None:
        claims().add(claim.node_id, claim.devices, claim.num_gpus, ref)
