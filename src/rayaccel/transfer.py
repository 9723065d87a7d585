"""How bytes move between two devices (or host memories), on one node or across nodes.

Pure functions over :mod:`rayaccel.topology` data::

    src = Endpoint("node-a", 0, dgx1)
    dst = Endpoint("node-a", 3, dgx1)
    plan(src, dst, 1 << 30)   # TransferPlan(route="nvlink", seconds=..., bandwidth_gbps=50.0, ...)

Route choice, best first:

* ``same-device``: both ends are the same device (or both host memory of one node).
* ``nvlink`` / ``xgmi`` / ``neuronlink`` / ``ici`` / ``hccs`` / ``roce`` (every kind of
  :data:`~rayaccel.topology.DIRECT_KINDS`): a direct link joins the two devices (peer copy).
* ``pcie-p2p``: the devices share a PCIe switch or host bridge (PIX, PXB, PHB).
* ``host-staged``: anything farther on one node (NODE, SYS, no record) and every
  device <-> host copy: the bytes go through host memory.
* ``gpudirect-rdma``: across nodes, when each end device has an RDMA-capable NIC
  at PIX/PXB (the NIC reads/writes device memory directly).
* ``tcp``: across nodes otherwise, through Ray's object store over TCP.

Modeled time is ``latency + nbytes / bandwidth``. Every constant of the model is
in :data:`MODEL` (GB/s per direction, seconds); the per-link bandwidths come
from the one table in :mod:`rayaccel.topology`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .errors import RequestError
from .topology import DIRECT_KINDS, PCIE_BANDWIDTH_GBPS, NodeTopology

ROUTES = ("same-device", *DIRECT_KINDS, "pcie-p2p", "host-staged", "gpudirect-rdma", "tcp")

#: The transfer model, one place. Bandwidths are per direction, GB/s.
MODEL: dict[str, float] = {
    # a copy inside one accelerator's memory (read + write of HBM; H100 measured ~2.5 TB/s, older parts less)
    "same_device_gbps": 1000.0,
    # a copy inside host memory (one memcpy stream)
    "host_memcpy_gbps": 10.0,
    # one device <-> pinned host leg over PCIe Gen4 x16 (~32 GB/s raw, ~24 achieved)
    "host_leg_gbps": 24.0,
    # an RDMA NIC: 200 Gb/s InfiniBand / RoCE = 25 GB/s
    "rdma_nic_gbps": 25.0,
    # Ray's object store between nodes over TCP (25 GbE, serialization and copies included)
    "tcp_gbps": 2.5,
    # fixed costs per transfer, seconds
    "latency_device_s": 10e-6,  # peer / local copy launch
    "latency_staged_s": 20e-6,  # two copies through host
    "latency_rdma_s": 5e-6 + 10e-6,  # network + copy launch
    "latency_tcp_s": 1e-3,  # Ray object-store round trip
}

#: PCIe path classes over which a peer-to-peer copy is planned.
P2P_CLASSES = ("PIX", "PXB", "PHB")
#: NIC-to-device path classes close enough for GPUDirect RDMA.
RDMA_CLASSES = ("PIX", "PXB")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One end of a transfer.

    Attributes:
        node: node name (or Ray node id). device: device index on that node, or
            None for host memory. topology: the node's topology, or None when unknown.
    """

    node: str
    device: int | None = None
    topology: NodeTopology | None = None

    def label(self) -> str:
        """``"gpu3@node"`` or ``"host@node"``."""
        return f"{'host' if self.device is None else f'gpu{self.device}'}@{self.node}"


@dataclass(frozen=True, slots=True)
class TransferPlan:
    """The chosen route and its modeled cost.

    Attributes:
        route: one of :data:`ROUTES`. seconds: modeled time for ``nbytes``.
        bandwidth_gbps: modeled end-to-end bandwidth, GB/s. latency_s: fixed cost.
        nbytes: bytes planned. reason: why this route. hops: what the bytes cross, in order.
    """

    route: str
    seconds: float
    bandwidth_gbps: float
    latency_s: float
    nbytes: int
    reason: str
    hops: tuple[str, ...]

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"route": self.route, "seconds": self.seconds, "bandwidth_gbps": self.bandwidth_gbps,
                "latency_s": self.latency_s, "nbytes": self.nbytes, "reason": self.reason, "hops": list(self.hops)}


def _check(ep: Endpoint, which: str) -> None:
    if not isinstance(ep, Endpoint):
        raise RequestError(f"expected an Endpoint, got {type(ep).__name__}", which)
    if not isinstance(ep.node, str) or not ep.node:
        raise RequestError(f"node must be a non-empty string, got {ep.node!r}", f"{which}.node")
    if ep.device is None:
        return
    if isinstance(ep.device, bool) or not isinstance(ep.device, int) or ep.device < 0:
        raise RequestError(f"device must be an index >= 0 or None (host memory), got {ep.device!r}", f"{which}.device")
    if ep.topology is not None and ep.device not in ep.topology.indices:
        raise RequestError(f"node {ep.node} has no device {ep.device}", f"{which}.device",
                           f"one of {list(ep.topology.indices)} or None (host memory)")


def _make(route: str, gbps: float, latency: float, nbytes: int, reason: str, hops: Iterable[str]) -> TransferPlan:
    return TransferPlan(route, latency + nbytes / (gbps * 1e9), gbps, latency, nbytes, reason, tuple(hops))


def _staged_gbps(legs: int) -> float:
    # store-and-forward through host memory: the legs add up
    return MODEL["host_leg_gbps"] / legs


def plan(src: Endpoint, dst: Endpoint, nbytes: int) -> TransferPlan:
    """Choose how ``nbytes`` go from ``src`` to ``dst`` and model the time.

    Raises:
        RequestError: a negative or non-integer size, an endpoint that is not an
            :class:`Endpoint`, or a device the node's topology does not have.
    """
    _check(src, "src")
    _check(dst, "dst")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise RequestError(f"must be a whole number of bytes >= 0, got {nbytes!r}", "nbytes")
    if src.node == dst.node:
        return _same_node(src, dst, nbytes)
    return _cross_node(src, dst, nbytes)


def _same_node(src: Endpoint, dst: Endpoint, n: int) -> TransferPlan:
    a, b, topo = src.device, dst.device, src.topology or dst.topology
    if a == b:
        if a is None:
            return _make("same-device", MODEL["host_memcpy_gbps"], MODEL["latency_device_s"], n,
                         "both ends are host memory of one node: a memcpy", [src.label()])
        return _make("same-device", MODEL["same_device_gbps"], MODEL["latency_device_s"], n,
                     f"both ends are device {a}: a copy inside its memory", [src.label()])
    if a is None or b is None:
        dev = a if a is not None else b
        return _make("host-staged", MODEL["host_leg_gbps"], MODEL["latency_device_s"], n,
                     f"one end is host memory: one PCIe copy to/from device {dev}", [src.label(), dst.label()])
    link = topo.link(a, b) if topo is not None else None
    if link is not None and link.direct:
        return _make(link.kind, link.bandwidth_gbps, MODEL["latency_device_s"], n,
                     f"devices {a} and {b} are joined by {link.label} ({link.count or 1} {link.kind} lane(s)): peer copy",
                     [src.label(), link.label, dst.label()])
    if link is not None and link.pcie in P2P_CLASSES:
        return _make("pcie-p2p", PCIE_BANDWIDTH_GBPS[link.pcie], MODEL["latency_device_s"], n,
                     f"devices {a} and {b} share a PCIe path of class {link.pcie}: peer copy over PCIe",
                     [src.label(), f"PCIe {link.pcie}", dst.label()])
    if link is None:
        why = "no topology is known" if topo is None else f"the topology has no link record for {a}-{b}"
    else:
        why = (f"their PCIe path is {link.pcie} (crosses "
               f"{'the CPU interconnect' if link.pcie == 'SYS' else 'host bridges'}), where peer copies are not used")
    return _make("host-staged", _staged_gbps(2), MODEL["latency_staged_s"], n,
                 f"devices {a} and {b}: {why}; the bytes stage through host memory",
                 [src.label(), "host", dst.label()])


def _rdma_nic(ep: Endpoint) -> tuple[str, str] | None:
    """(NIC name, path class) of the best RDMA NIC at PIX/PXB of the endpoint's device, or None."""
    if ep.device is None or ep.topology is None:
        return None
    best = None
    for nic in ep.topology.nics:
        cls = nic.path_to(ep.device)
        if nic.rdma and cls in RDMA_CLASSES and (best is None or RDMA_CLASSES.index(cls) < RDMA_CLASSES.index(best[1])):
            best = (nic.name, cls)
    return best


def _cross_node(src: Endpoint, dst: Endpoint, n: int) -> TransferPlan:
    s_nic, d_nic = _rdma_nic(src), _rdma_nic(dst)
    if s_nic and d_nic:
        return _make("gpudirect-rdma", MODEL["rdma_nic_gbps"], MODEL["latency_rdma_s"], n,
                     f"RDMA NICs sit next to both devices ({s_nic[0]} {s_nic[1]} on {src.node}, "
                     f"{d_nic[0]} {d_nic[1]} on {dst.node}): GPUDirect RDMA",
                     [src.label(), s_nic[0], d_nic[0], dst.label()])
    missing = []
    for ep, nic in ((src, s_nic), (dst, d_nic)):
        if nic:
            continue
        if ep.device is None:
            missing.append(f"{ep.label()} is host memory")
        elif ep.topology is None:
            missing.append(f"{ep.node}'s topology is unknown")
        else:
            missing.append(f"no RDMA NIC at PIX/PXB of device {ep.device} on {ep.node}")
    hops = [src.label()] + (["host"] if src.device is not None else []) + ["tcp"] + \
        (["host"] if dst.device is not None else []) + [dst.label()]
    return _make("tcp", MODEL["tcp_gbps"], MODEL["latency_tcp_s"], n,
                 f"across nodes without GPUDirect ({'; '.join(missing)}): through Ray's object store over TCP", hops)


def locality_cost(dst: Endpoint, sources: Iterable[tuple[Endpoint, int]]) -> float:
    """Modeled seconds to bring data held at ``sources`` (endpoint, bytes) to ``dst``.

    A data-locality term for placement: 0.0 when all data already sits on ``dst``.

    Raises:
        RequestError: as for :func:`plan`.
    """
    total = 0.0
    for src, nbytes in sources:
        p = plan(src, dst, nbytes)  # validates
        if not (src.node == dst.node and src.device == dst.device):
            total += p.seconds
    return total
