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
from .topology import DIRECT_KINDS, NEAR_PCIE_CLASSES, NIC_BANDWIDTH_GBPS, PCIE_BANDWIDTH_GBPS, NodeTopology
from .topology import near_nics as topology_near_nics

ROUTES = ("same-device", *DIRECT_KINDS, "pcie-p2p", "host-staged", "gpudirect-rdma", "tcp")

#: The transfer model, one place. Bandwidths are per direction, GB/s.
MODEL: dict[str, float] = {
    # a copy inside one accelerator's memory (read + write of HBM; H100 measured ~2.5 TB/s, older parts less)
    "same_device_gbps": 1000.0,
    # a copy inside host memory (one memcpy stream)
    "host_memcpy_gbps": 10.0,
    # one device <-> pinned host leg over PCIe Gen4 x16 (~32 GB/s raw, ~24 achieved)
    "host_leg_gbps": 24.0,
    # an RDMA NIC (the one figure of topology.NIC_BANDWIDTH_GBPS: 400 Gb/s NDR InfiniBand / RoCE)
    "rdma_nic_gbps": NIC_BANDWIDTH_GBPS["rdma"],
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
RDMA_CLASSES = NEAR_PCIE_CLASSES


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


# ---------------------------------------------------------------- tensors between Ray actors
#: The paths of the ``rayaccel`` tensor transport (:mod:`rayaccel.ray.rdt`), best first.
TENSOR_PATHS = ("cuda-ipc", "shared-memory", "nixl", "object-store")
#: PCIe path classes between two GPUs over which the transport maps a peer's memory (CUDA IPC).
IPC_PCIE_CLASSES = NEAR_PCIE_CLASSES
#: The one-line hint for a missing NIXL.
NIXL_HINT = "pip install 'rayaccel[nixl]'"


@dataclass(frozen=True, slots=True)
class TensorPath:
    """How the ``rayaccel`` transport moves one object's tensors from a producer to a consumer.

    Attributes:
        path: one of :data:`TENSOR_PATHS`. reason: why, in one line.
        bandwidth_gbps: modeled end-to-end bandwidth, GB/s (None for a zero-copy share).
        seconds: modeled time for ``nbytes``. nbytes: bytes planned.
        copies: how many times the bytes are copied on the way (0: the consumer maps the producer's memory).
        route: the underlying :class:`TransferPlan` route (``nvlink``, ``host-staged``, ``gpudirect-rdma``, ...).
        nics: ``(producer's NICs, consumer's NICs)`` NIXL traffic leaves and enters through (cross-node only).
    """

    path: str
    reason: str
    bandwidth_gbps: float | None
    seconds: float
    nbytes: int
    copies: int
    route: str
    nics: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"path": self.path, "reason": self.reason, "bandwidth_gbps": self.bandwidth_gbps,
                "seconds": self.seconds, "nbytes": self.nbytes, "copies": self.copies, "route": self.route,
                "nics": [list(self.nics[0]), list(self.nics[1])]}


def near_nics(topology: NodeTopology | None, devices: Iterable[int]) -> tuple[str, ...]:
    """The names of the RDMA NICs nearest ``devices`` (:func:`rayaccel.topology.near_nics`: PIX,
    else PXB, per device -- the NICs ``UCX_NET_DEVICES`` names at a grant), without the port.

    Returns:
        NIC names, sorted; ``()`` when the topology is unknown, ``devices`` is empty or no RDMA
        NIC sits on their PCIe switches.
    """
    devs = tuple(devices)
    if topology is None or not devs:
        return ()
    return tuple(sorted({n.split(":")[0] for n in topology_near_nics(topology, devs)}))


def _path(path: str, reason: str, p: TransferPlan, copies: int, nics=((), ()), zero_copy: bool = False) -> TensorPath:
    if zero_copy:
        return TensorPath(path, reason, None, p.latency_s, p.nbytes, 0, p.route, nics)
    return TensorPath(path, reason, p.bandwidth_gbps, p.seconds, p.nbytes, copies, p.route, nics)


def tensor_path(src: Endpoint, dst: Endpoint, nbytes: int, *, src_nics: Iterable[str] | None = None,
                dst_nics: Iterable[str] | None = None, nixl: bool = True, gpudirect: bool | None = None,
                shared_memory: bool = True) -> TensorPath:
    """The path the ``rayaccel`` tensor transport takes for ``nbytes`` of tensors, and why.

    ``src`` is where the producer's tensors live (a device index, or None for host
    memory), ``dst`` where the consumer wants them. Same node: CUDA IPC between GPUs
    joined by NVLink/xGMI or a PCIe switch (PIX/PXB), or on one GPU (zero copy);
    otherwise a POSIX shared-memory segment (host memory, or GPU memory staged through
    host). Other node: NIXL (UCX) through the RDMA NICs nearest each end, reading GPU
    memory directly (GPUDirect RDMA) when both devices sit next to one and ``gpudirect``
    is true. Nothing else serves: Ray's object store.

    Args:
        src / dst: the two ends (node names compare equal on one node).
        nbytes: bytes of all the object's tensors.
        src_nics / dst_nics: the NICs each end's process uses; default :func:`near_nics` of its device.
        nixl: whether NIXL can serve both ends (False: cross-node objects can only use the object store).
        gpudirect: whether ``rayaccel doctor`` finds GPUDirect RDMA working on both nodes (None: unknown).
        shared_memory: whether a shared-memory segment can serve this node (``/dev/shm`` writable).

    Raises:
        RequestError: as for :func:`plan`.
    """
    p = plan(src, dst, nbytes)  # validates
    if src.node == dst.node:
        return _same_node_tensor(src, dst, p, shared_memory)
    sn = tuple(src_nics) if src_nics is not None else near_nics(src.topology, () if src.device is None else (src.device,))
    dn = tuple(dst_nics) if dst_nics is not None else near_nics(dst.topology, () if dst.device is None else (dst.device,))
    nics = (tuple(sn), tuple(dn))
    if not nixl:
        tcp = _make("tcp", MODEL["tcp_gbps"], MODEL["latency_tcp_s"], nbytes, "", ())
        return _path("object-store", f"NIXL is not available at both ends ({NIXL_HINT}): only Ray's object store "
                     "reaches the other node", tcp, 2)
    if not sn or not dn:
        where = " and ".join(w for w, n in ((src.label(), sn), (dst.label(), dn)) if not n)
        tcp = _make("tcp", MODEL["tcp_gbps"], MODEL["latency_tcp_s"], nbytes, "", ())
        return _path("nixl", f"NIXL over UCX: no RDMA NIC next to {where}, so UCX uses TCP (or whatever it finds)",
                     tcp, 1, nics)
    both_gpus = src.device is not None and dst.device is not None
    if both_gpus and gpudirect:
        rdma = _make("gpudirect-rdma", MODEL["rdma_nic_gbps"], MODEL["latency_rdma_s"], nbytes, "", ())
        return _path("nixl", f"NIXL over UCX, GPUDirect RDMA: {','.join(sn)} on {src.node} reads/writes "
                     f"gpu{src.device}, {','.join(dn)} on {dst.node} gpu{dst.device}", rdma, 1, nics)
    rdma_gbps = MODEL["rdma_nic_gbps"]
    why = ""
    if src.device is not None or dst.device is not None:
        # GPU memory without GPUDirect: UCX bounces it through host memory (cuda_copy) on that end
        rdma_gbps = min(rdma_gbps, MODEL["host_leg_gbps"] / 2)
        why = (": GPUDirect RDMA is " + ("not working (rayaccel doctor: gpudirect)" if gpudirect is False else
                                         "not known to work" if both_gpus else "moot for host memory")
               + ", so GPU memory is staged through host")
    net = _make("rdma", rdma_gbps, MODEL["latency_rdma_s"], nbytes, "", ())
    return _path("nixl", f"NIXL over UCX through RDMA NICs {','.join(sn)} on {src.node} and {','.join(dn)} on "
                 f"{dst.node}{why}", net, 1, nics)


def _same_node_tensor(src: Endpoint, dst: Endpoint, p: TransferPlan, shared_memory: bool) -> TensorPath:
    a, b, topo = src.device, dst.device, src.topology or dst.topology
    if a is not None and a == b:
        return _path("cuda-ipc", f"both ends on device {a}: the consumer maps the producer's memory (CUDA IPC), "
                     "no copy", p, 0, zero_copy=True)
    if a is not None and b is not None:
        link = topo.link(a, b) if topo is not None else None
        if link is not None and (link.direct or link.pcie in IPC_PCIE_CLASSES):
            how = link.label if link.direct else f"PCIe {link.pcie}"
            return _path("cuda-ipc", f"devices {a} and {b} are peers ({how}): the consumer maps the producer's "
                         "memory (CUDA IPC) and copies it once", p, 1)
    if not shared_memory:
        store = _make("host-staged", MODEL["host_memcpy_gbps"] / 2, MODEL["latency_tcp_s"], p.nbytes, "", ())
        return _path("object-store", "no shared memory on this node (/dev/shm missing or not writable): "
                     "through Ray's object store", store, 2)
    if a is None and b is None:
        return _path("shared-memory", "host memory on one node: the producer copies it once into a shared-memory "
                     "segment the consumer maps (no second copy)", p, 1)
    if a is not None and b is not None:
        return _path("shared-memory", f"{p.reason.split(': ', 1)[-1]} (a shared-memory segment: one copy out of "
                     f"device {a}, one into device {b})", p, 2)
    dev = a if a is not None else b
    return _path("shared-memory", f"one end is host memory: one PCIe copy between device {dev} and a shared-memory "
                 "segment", p, 1)
