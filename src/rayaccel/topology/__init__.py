"""The topology model: what accelerators a node has and how they are wired.

Pure data, stdlib only. Everything above this layer (discovery, placement, the
Ray layer, the CLI) speaks these types:

* :mod:`.model`   the value types (:class:`Device`, :class:`Partition`, :class:`MigProfile`,
  :class:`Link`, :class:`Nic`, :class:`Fabric`, :class:`Slice`), the one bandwidth table and the bounds of every field
* :mod:`.node`    :class:`NodeTopology`: one node's devices, links and NICs, with queries
  and :meth:`~NodeTopology.validate`
* :mod:`.codec`   its JSON form (``rayaccel.topology/1``): ``NodeTopology.to_dict`` /
  ``from_dict`` / ``to_json`` / ``from_json`` / ``load`` / ``save``
* :mod:`.domain`  :func:`nvlink_domain`: the NVLink domain (fabric cluster UUID, clique) a node's GPUs share
* :mod:`.nics`    :func:`near_nics`: the RDMA NICs next to given GPUs, as UCX names them
"""

from __future__ import annotations

from .codec import SCHEMA
from .domain import Domain, nvlink_domain, nvlink_domain_reason
from .model import (
    DIRECT_KINDS, FABRIC_STATES, HEALTH_STATES, LANE_BANDWIDTH_GBPS, LINK_KINDS, MAX_DEVICES, MAX_INDEX, MAX_ITEMS,
    MAX_LANE_GBPS, MAX_LANES, MAX_MEMORY_BYTES, MAX_MIG_SLOTS, MAX_TEXT, NEAR_PCIE_CLASSES, NIC_BANDWIDTH_GBPS,
    NO_LINK_RANK, PCIE_BANDWIDTH_GBPS,
    PCIE_CLASSES, UNKNOWN_PAIR_BANDWIDTH_GBPS, Device, Fabric, Link, MigProfile, Nic, Partition, Slice, make_link,
)
from .nics import near_nics
from .node import NodeTopology

__all__ = [
    "DIRECT_KINDS", "Domain", "FABRIC_STATES", "HEALTH_STATES", "LANE_BANDWIDTH_GBPS", "LINK_KINDS", "MAX_DEVICES",
    "MAX_INDEX", "MAX_ITEMS", "MAX_LANES", "MAX_LANE_GBPS", "MAX_MEMORY_BYTES", "MAX_MIG_SLOTS", "MAX_TEXT",
    "NEAR_PCIE_CLASSES", "NIC_BANDWIDTH_GBPS", "NO_LINK_RANK", "PCIE_BANDWIDTH_GBPS", "PCIE_CLASSES", "SCHEMA", "UNKNOWN_PAIR_BANDWIDTH_GBPS", "Device",
    "Fabric", "Link", "MigProfile", "Nic", "NodeTopology", "Partition", "Slice", "make_link", "near_nics", "nvlink_domain",
    "nvlink_domain_reason",
]
