"""The Acme Tile T4, a fictional accelerator: a complete rayaccel backend plugin.

A node has 8 tiles in two quads. The tiles of a quad are joined pairwise by two AcmeLink
lanes (50 GB/s each, per direction); the quads meet only through the host (PCIe across
sockets). ``ACME_SIMULATE=1`` pretends the node has them; without it the backend says it
is unavailable and what to do, as every backend must.
"""

from __future__ import annotations

import os
from itertools import combinations

from rayaccel.discovery import BackendInfo, RaySpec
from rayaccel.errors import BackendUnavailable
from rayaccel.topology import Device, Link, NodeTopology

__all__ = ["ACME", "AcmeBackend", "acme_node"]

#: How Acme tiles appear to Ray: resource ACME, one slot per tile, ACME_VISIBLE_DEVICES.
ACME = RaySpec(
    vendor="acme",
    resource="ACME",
    unit="device",
    visible_env=("ACME_VISIBLE_DEVICES",),
    accelerator_type="model",  # Ray's accelerator_type:<T> from the model: "Acme-Tile-T4"
    noset_env=("RAY_EXPERIMENTAL_NOSET_ACME_VISIBLE_DEVICES",),
    whole_units=True,
)
ACMELINK_LANE_GBPS = 50.0
_HINT = "set ACME_SIMULATE=1 to simulate a node of 8 Acme tiles (there is no real Acme hardware)"


def acme_node(hostname: str | None = None) -> NodeTopology:
    """The topology of one node: 8 tiles, two quads of AcmeLink, PCIe SYS between the quads."""
    devices = tuple(Device(index=i, vendor="acme", model="Acme Tile T4", uuid=f"ACME-{i:04d}",
                           memory_bytes=24 << 30, numa_node=i // 4,
                           cpus=tuple(range(16 * (i // 4), 16 * (i // 4) + 16))) for i in range(8))
    links = tuple(Link(a, b, "direct", 2, None, ACMELINK_LANE_GBPS) if a // 4 == b // 4
                  else Link(a, b, "pcie", None, "SYS") for a, b in combinations(range(8), 2))
    return NodeTopology(devices=devices, links=links, hostname=hostname, name="acme-t4-8x",
                        sources=("acme-accelerator example plugin: a simulated node (the Acme Tile T4 is fictional)",))


class AcmeBackend:
    """Discovery of Acme tiles, and how they appear to Ray (:data:`ACME`)."""

    name = "acme"
    ray_spec = ACME

    def available(self) -> BackendInfo:
        if os.environ.get("ACME_SIMULATE"):
            return BackendInfo(self.name, True)
        return BackendInfo(self.name, False, "no Acme tiles here (ACME_SIMULATE is not set)", _HINT)

    def discover(self) -> NodeTopology:
        if not os.environ.get("ACME_SIMULATE"):
            raise BackendUnavailable(self.name, "no Acme tiles here (ACME_SIMULATE is not set)", _HINT)
        return acme_node()
