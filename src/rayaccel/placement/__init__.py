"""Topology-aware placement: pure functions over topology data (no ray, no vendor library).

* :class:`Request` -- what a task asks for (whole devices, a MIG instance, or memory on a shared device).
* :class:`NodeState` -- a node's topology and what is taken on it.
* :func:`plan` -- the best devices on one node: :class:`Allocation` or :class:`Rejection`.
* :func:`place` / :func:`place_gang` -- the best node across a cluster; gangs of workers.
* :func:`plan_mig_layout` -- new MIG instances for pending requests, as ``nvidia-smi mig`` commands.
* :func:`allreduce_bandwidth_gbps` -- the modeled ring all-reduce bandwidth of a set.
* :func:`node_units` / :func:`choose_units` / :func:`visible_env` -- Ray's slots of any
  accelerator resource (GPUs, NeuronCores, TPU chips, Gaudi, Ascend, plugins) -> units.
* :mod:`.baselines` -- Ray's first-free, go-gpuallocator's best-effort, random (benchmarks only).

"The best set" follows docs/ARCHITECTURE.md: weakest link, then total bandwidth, (data
locality with ``near``), then NUMA (and NIC), then fragmentation, then the PCIe
paths under the links; ``required`` devices are a hard constraint. See
:mod:`.node`, :mod:`.search` and :mod:`._tiebreak`; ``Allocation.explain()`` names
the criterion that decided.
"""

from __future__ import annotations

from typing import Iterable

from ..topology import NodeTopology
from .cluster import STRATEGIES, place, place_gang
from .mig import MigLayout, NewInstance, plan_mig_layout
from .model import allreduce_bandwidth_gbps
from .node import allocate
from .request import INTERCONNECTS, Request, make_request
from .result import Allocation, GangAllocation, Rejection, Score
from .state import NodeState, as_state
from .units import Unit, UnitChoice, choose_units, node_units, visible_env

__all__ = [
    "INTERCONNECTS",
    "STRATEGIES",
    "Allocation",
    "GangAllocation",
    "MigLayout",
    "NewInstance",
    "NodeState",
    "Rejection",
    "Request",
    "Score",
    "Unit",
    "UnitChoice",
    "allreduce_bandwidth_gbps",
    "choose_units",
    "place",
    "node_units",
    "place_gang",
    "plan",
    "plan_mig_layout",
    "visible_env",
]


def plan(topology_or_state: NodeTopology | NodeState, request: Request | None = None, *,
         busy: Iterable[int] = (), **request_fields) -> Allocation | Rejection:
    """The best placement of ``request`` on one node.

    Examples:
        ``plan(topo, gpus=4, busy={0, 3})``, ``plan(topo, Request(mig="3g.40gb"))``,
        ``plan(NodeState(topo, memory_used={0: 2**30}), gpu_memory="20GiB", exclusive=False)``,
        ``plan(topo, gpus=2, required=(4,))`` (the set holds device 4, or a Rejection says why),
        ``plan(topo, gpus=2, near=(5,))`` (data on device 5: among the sets tied on weakest
        link and bandwidth, the one that brings it closest).

    Args:
        topology_or_state: a :class:`NodeTopology` or a :class:`NodeState`.
        request: a :class:`Request`, or None to build one from ``request_fields``.
        busy: device indices held whole (added to the state's).

    Returns:
        an :class:`Allocation` (truthy) or a :class:`Rejection` (falsy) with reasons.

    Raises:
        RequestError: an invalid request, an unknown field, or a busy, required or near
            index the node lacks.
    """
    req = make_request(request, **request_fields) if request is not None or request_fields else Request()
    return allocate(as_state(topology_or_state, busy), req)
