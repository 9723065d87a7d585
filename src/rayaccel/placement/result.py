"""Answers of the placer: :class:`Allocation`, :class:`Rejection`, :class:`GangAllocation`, :class:`Score`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..topology import Partition
from ..units import format_bytes
from .request import Request


@dataclass(frozen=True, slots=True)
class Score:
    """How good a device set is, criterion by criterion (docs/ARCHITECTURE.md "What the best set means").

    Attributes:
        weakest: label of the weakest pair (``"NV2"``, ``"SYS"``), None for one device.
        weakest_rank: :attr:`Link.rank` of that pair, None for one device.
        total_bandwidth_gbps: sum of modeled per-direction bandwidth over all pairs.
        numa_nodes: distinct NUMA nodes spanned.
        pcie_score: criterion 5, the PCIe paths under the links summed over pairs
            (PIX 5, PXB 4, PHB 3, NODE 2, SYS 1, unknown 0; higher is closer).
        nic_near: devices with an RDMA NIC at PIX/PXB (counted only when the request asks for a NIC).
        free_quality: criterion 4, how well-connected what is left stays (higher is better;
            see :mod:`rayaccel.placement._tiebreak`), or None when not computed.
        allreduce_bandwidth_gbps: modeled ring all-reduce bottleneck, GB/s (0 for one device;
            None for runners-up, where it is not computed).
        optimal: True when criteria 1-2 are proven optimal among the free devices.
        bound_gbps: when not proven, an upper bound on the total bandwidth at that weakest link.
    """

    weakest: str | None
    weakest_rank: tuple | None
    total_bandwidth_gbps: float
    numa_nodes: int
    nic_near: int = 0
    free_quality: tuple | None = None
    allreduce_bandwidth_gbps: float | None = 0.0
    optimal: bool = True
    bound_gbps: float | None = None
    pcie_score: int = 0

    def key(self) -> tuple:
        """Sort key: criteria 1-3 (weakest link, bandwidth, -NUMA, NICs), then the PCIe paths; higher is better."""
        rank = self.weakest_rank if self.weakest_rank is not None else (99, 0.0)
        return (rank, round(self.total_bandwidth_gbps, 3), -self.numa_nodes, self.nic_near, self.pcie_score)

    def describe(self) -> str:
        """One line: weakest link, total bandwidth, NUMA nodes."""
        if self.weakest is None:
            head = "one device"
        else:
            head = f"weakest link {self.weakest}, total pair bandwidth {self.total_bandwidth_gbps:g} GB/s"
            if self.pcie_score:
                head += f", PCIe-path score {self.pcie_score}"
        out = f"{head}, {self.numa_nodes} NUMA node{'s' if self.numa_nodes != 1 else ''}"
        if self.nic_near:
            out += f", {self.nic_near} near an RDMA NIC"
        return out


@dataclass(frozen=True, slots=True)
class Allocation:
    """A placement: which devices (or MIG instance, or memory share) on which node.

    Attributes:
        devices: chosen device indices, ordered so that neighbours are best linked
            (a ring order maximizing the weakest consecutive link).
        partitions: MIG instances chosen (for a ``mig`` request).
        memory_bytes: bytes reserved per device: for shared requests the asked
            memory, for exclusive ones the device's memory (None when unknown).
        node: the node id (set by the cluster placer), or None.
        score: the :class:`Score` of the set. request: what was asked.
        runners_up: ``(devices, Score)`` of the next best sets seen, best first.
        why: sentences on how the choice was made; for whole devices the first one is
            ``"decided by: ..."``, naming the criterion that decided (the first in order that
            set the chosen set apart from a set tied with it so far); ``"then: ..."`` lines
            follow when later criteria chose among the sets that one left.
        decided_by: that criterion for whole devices: ``"criterion 1"``, ``"criterion 2"``,
            ``"near"``, ``"criterion 3"``, ``"criterion 4"``, ``"criterion 5"`` (PCIe paths),
            ``"tie: lowest indices"`` or ``"only set"``; None for MIG / shared memory.
    """

    devices: tuple[int, ...]
    request: Request
    score: Score | None = None
    partitions: tuple[Partition, ...] = ()
    memory_bytes: dict[int, int | None] = field(default_factory=dict)
    node: str | None = None
    runners_up: tuple[tuple[tuple[int, ...], Score], ...] = ()
    why: tuple[str, ...] = ()
    decided_by: str | None = None

    def __bool__(self) -> bool:
        return True

    def explain(self) -> str:
        """Why this set: the request, the choice, its score, the tie-breaks, what the runners-up scored."""
        where = f" on node {self.node}" if self.node else ""
        lines = [f"{self.request.describe()}{where}:"]
        if self.partitions:
            lines.append("  chose " + ", ".join(f"MIG {p.profile} on device {p.parent} (slot {p.start})" for p in self.partitions))
        elif self.request.kind == "shared":
            d = self.devices[0]
            lines.append(f"  chose device {d}, reserving {format_bytes(self.memory_bytes.get(d))}")
        else:
            lines.append(f"  chose devices {list(self.devices)} (ring order)")
        if self.score is not None and not self.partitions and self.request.kind == "devices":
            lines.append(f"  score: {self.score.describe()}; modeled all-reduce {self.score.allreduce_bandwidth_gbps:g} GB/s")
            if self.score.optimal:
                lines.append("  optimal on weakest link and total bandwidth among the free devices (exact search)")
            else:
                lines.append(f"  best found within the search budget (total bandwidth bound {self.score.bound_gbps:g} GB/s)")
        lines.extend(f"  {w}" for w in self.why)
        for devs, sc in self.runners_up[:3]:
            lines.append(f"  runner-up {list(devs)}: {sc.describe()}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        sc = self.score
        return {
            "ok": True,
            "node": self.node,
            "devices": list(self.devices),
            "partitions": [{"parent": p.parent, "profile": p.profile, "key": p.key, "start": p.start, "uuid": p.uuid}
                           for p in self.partitions],
            "memory_bytes": {str(k): v for k, v in self.memory_bytes.items()},
            "score": None if sc is None else {
                "weakest": sc.weakest, "total_bandwidth_gbps": sc.total_bandwidth_gbps, "numa_nodes": sc.numa_nodes,
                "nic_near": sc.nic_near, "allreduce_bandwidth_gbps": sc.allreduce_bandwidth_gbps,
                "optimal": sc.optimal, "bound_gbps": sc.bound_gbps},
            "runners_up": [{"devices": list(d), "weakest": s.weakest, "total_bandwidth_gbps": s.total_bandwidth_gbps,
                            "numa_nodes": s.numa_nodes} for d, s in self.runners_up],
            "explain": self.explain(),
        }


@dataclass(frozen=True, slots=True)
class Rejection:
    """A request that cannot be placed on the current free state (an expected outcome, not an error).

    Attributes:
        reasons: sentences a person understands. request: what was asked. node: node id or None.
    """

    reasons: tuple[str, ...]
    request: Request | None = None
    node: str | None = None

    def __bool__(self) -> bool:
        return False

    def explain(self) -> str:
        """The request and every reason, one per line."""
        head = f"cannot place {self.request.describe()}" if self.request is not None else "cannot place the request"
        if self.node:
            head += f" on node {self.node}"
        return head + ":\n" + "\n".join(f"  - {r}" for r in self.reasons)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"ok": False, "node": self.node, "reasons": list(self.reasons), "explain": self.explain()}


@dataclass(frozen=True, slots=True)
class GangAllocation:
    """N workers placed together. ``workers`` in rank order; ``strategy`` as asked."""

    workers: tuple[Allocation, ...]
    strategy: str

    def __bool__(self) -> bool:
        return True

    @property
    def nodes(self) -> tuple[str | None, ...]:
        """Node of each worker, in rank order."""
        return tuple(w.node for w in self.workers)

    def explain(self) -> str:
        """One line per worker plus the strategy."""
        lines = [f"gang of {len(self.workers)} workers ({self.strategy}) on {len(set(self.nodes))} node(s):"]
        for i, w in enumerate(self.workers):
            sc = w.score.describe() if w.score else ""
            lines.append(f"  worker {i}: node {w.node} devices {list(w.devices)} - {sc}")
        return "\n".join(lines)
