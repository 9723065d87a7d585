"""A node's place in the cluster, read from its Ray labels (no ``ray`` import).

The labels are the contract between node start and the gang placer, and the same
labels Ray's own ``placement_group(..., topology_strategy={"ray.io/gpu-domain":
"STRICT_PACK", ...})`` reads, so unchanged Ray code and ``rayaccel.gang`` agree on
what a domain is:

* ``ray.io/gpu-domain=<domain>``: Ray's own key; the NVLink domain of the node's GPUs
  (one per (fabric cluster UUID, clique) as NVML reports it: an NVL72 rack's trays);
* ``rayaccel.io/nvlink-clique=<clique id>``: the clique within the cluster UUID (shown by
  ``status`` and ``plan``; the placer uses the domain);
* ``rayaccel.io/net-<level>=<value>``: one per network level the node knows (a Slurm
  block or switch, an AWS network node), e.g. ``rayaccel.io/net-block=b3``. The order of
  levels comes from the data (finest first: :func:`rayaccel.placement.domains.level_order`),
  so level names carry no rank.

A label that does not make a valid :class:`~rayaccel.placement.domains.NodePlace`
degrades only its own node (no domain, no levels) and is logged once.
"""

from __future__ import annotations

import logging
from typing import Mapping

from rayaccel.errors import RequestError
from rayaccel.placement.domains import NOWHERE, NodePlace

DOMAIN_LABEL = "ray.io/gpu-domain"
CLIQUE_LABEL = "rayaccel.io/nvlink-clique"
NET_LABEL_PREFIX = "rayaccel.io/net-"

log = logging.getLogger(__name__)
_WARNED: set[tuple] = set()


def place_of(labels: Mapping[str, str], where: str = "node") -> NodePlace:
    """The :class:`NodePlace` a node's Ray labels describe (:data:`NOWHERE` for none, or bad ones)."""
    domain = labels.get(DOMAIN_LABEL) or None
    levels = {k[len(NET_LABEL_PREFIX):]: v for k, v in labels.items()
              if k.startswith(NET_LABEL_PREFIX) and len(k) > len(NET_LABEL_PREFIX)}
    if domain is None and not levels:
        return NOWHERE
    try:
        return NodePlace(domain=domain, levels=levels)
    except RequestError as e:
        key = (where, str(e))
        if key not in _WARNED:
            _WARNED.add(key)
            log.warning("rayaccel: %s: its domain / network labels are not usable (%s); placing it as if it "
                        "had none", where, e)
        return NOWHERE


def place_labels(domain: str | None = None, clique: str | int | None = None,
                 levels: Mapping[str, str] | None = None) -> dict[str, str]:
    """The labels that say where a node is (for ``SimulatedCluster(labels=...)``, tests, examples)."""
    out: dict[str, str] = {}
    if domain is not None:
        out[DOMAIN_LABEL] = str(domain)
    if clique is not None:
        out[CLIQUE_LABEL] = str(clique)
    for k, v in (levels or {}).items():
        out[NET_LABEL_PREFIX + k] = str(v)
    return out
