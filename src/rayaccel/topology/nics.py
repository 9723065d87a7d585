"""The RDMA NICs next to GPUs, in UCX's ``device:port`` form (``UCX_NET_DEVICES``).

GPUDirect RDMA is fastest through the NIC on the GPU's own PCIe switch. For each given GPU,
:func:`near_nics` takes the RDMA NICs at the nearest PCIe class that has one, PIX first, then
PXB; a GPU with neither gets none (traffic through the host bridge or across sockets gains
nothing from pinning it). The union keeps device order, then the NIC order of the topology.
Pure function over data; the Ray layer sets ``UCX_NET_DEVICES`` from it.
"""

from __future__ import annotations

from typing import Iterable

from .model import NEAR_PCIE_CLASSES
from .node import NodeTopology

#: PCIe classes close enough to pin a GPU's RDMA traffic to, nearest first.
NEAR_CLASSES = NEAR_PCIE_CLASSES


def near_nics(topology: NodeTopology, devices: Iterable[int]) -> tuple[str, ...]:
    """UCX device names (``"mlx5_0:1"``) of the RDMA NICs at PIX, else PXB, from each of ``devices``.

    Args:
        topology: the node's topology (NICs with their PCIe class to each device).
        devices: device indices, in the order the caller holds them.

    Returns:
        The NICs, each once, in device order; empty when no given device has an RDMA NIC at PIX/PXB.

    Raises:
        KeyError: a device index the topology does not have.
    """
    rdma = [n for n in topology.nics if n.rdma]
    out: dict[str, None] = {}
    for dev in devices:
        topology.device(dev)  # KeyError for an unknown index
        for cls in NEAR_CLASSES:
            found = [n.ucx_device for n in rdma if n.path_to(dev) == cls]
            if found:
                out.update(dict.fromkeys(found))
                break
    return tuple(out)
