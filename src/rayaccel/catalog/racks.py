"""A rack of NVL72 compute trays: one topology per tray, one NVLink domain per rack.

The catalog holds one compute tray (``gb200-nvl72-tray``, ``gb300-nvl72-tray``) whose fabric
carries a placeholder cluster UUID. :func:`rack` makes the trays of one rack the way a real one
reports them: each its own hostname and GPU UUIDs, all of them the rack's cluster UUID and clique
(NVML's ``clusterUuid`` / ``cliqueId``), so :func:`~rayaccel.topology.nvlink_domain` puts them in
one domain and trays of different racks in different ones. For examples, tests, benchmarks and
:class:`~rayaccel.ray.driver.cluster.SimulatedCluster` (which takes topologies as they are)::

    trays = catalog.rack("gb200-nvl72-tray", trays=18, rack=0) + catalog.rack("gb200-nvl72-tray", rack=1)
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from ..errors import CatalogError, RequestError
from ..topology import Fabric, NodeTopology
from ..topology.domain import ZERO_UUID

#: Compute trays in an NVL72 rack (72 GPUs, 4 per tray).
TRAYS_PER_RACK = 18
#: Namespace of the deterministic UUIDs :func:`rack` gives (cluster per rack, GPU per tray and index).
RACK_NAMESPACE = uuid.UUID("0b5f3b8e-6c1d-4f3e-9a55-3d1c0f2a7b64")
#: Most racks one call can number (rack ids are ``0..MAX_RACK``).
MAX_RACK = 4095


def rack_of(tray: NodeTopology, name: str, trays: int = TRAYS_PER_RACK, rack: int = 0) -> tuple[NodeTopology, ...]:
    """The compute trays of one NVL72 rack, as topologies (``rayaccel.catalog.rack`` loads ``tray`` by name).

    Args:
        tray: one compute tray whose GPUs carry a completed fabric (``gb200-nvl72-tray``, ``gb300-nvl72-tray``).
        name: its catalog name (hostnames and UUIDs derive from it).
        trays: how many trays (1..18; a full rack is 18).
        rack: the rack's number (0..4095): names the hostnames (``<name>-r<rack>-t<tray>``), the
            rack's cluster UUID and its clique id (``rack + 1``).

    Returns:
        ``trays`` validated topologies, tray 0 first. Deterministic: the same arguments give the
        same UUIDs; different racks never share a cluster UUID, GPU UUID or hostname.

    Raises:
        CatalogError: a machine that is not a tray of a multi-node NVLink domain.
        RequestError: ``trays`` or ``rack`` out of range.
    """
    for field, value, hi in (("trays", trays, TRAYS_PER_RACK), ("rack", rack, MAX_RACK)):
        lo = 1 if field == "trays" else 0
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise RequestError(f"must be an int in {lo}..{hi}, got {value!r}", field, f"{lo}..{hi}")
    if not tray.devices or any(d.fabric is None or d.fabric.state != "completed"
                               or d.fabric.cluster_uuid in (None, ZERO_UUID) for d in tray.devices):
        raise CatalogError(f"{name!r} is not an NVL72 compute tray (its GPUs carry no multi-node NVLink fabric); "
                           "expected gb200-nvl72-tray or gb300-nvl72-tray")
    cluster = str(uuid.uuid5(RACK_NAMESPACE, f"{name}/rack{rack}"))
    out = []
    for t in range(trays):
        host = f"{name}-r{rack}-t{t:02d}"
        devices = tuple(replace(d, uuid=f"GPU-{uuid.uuid5(RACK_NAMESPACE, f'{host}/{d.index}')}",
                                fabric=Fabric(state="completed", cluster_uuid=cluster, clique_id=rack + 1, status=0,
                                              health_mask=d.fabric.health_mask))  # type: ignore[union-attr]
                        for d in tray.devices)
        sources = (*tray.sources, f"rayaccel.catalog.rack({name!r}, rack={rack}): tray {t} of rack {rack}, cluster "
                   f"UUID {cluster}, clique {rack + 1} (simulated rack; hostnames and UUIDs generated)")
        out.append(replace(tray, devices=devices, hostname=host, sources=sources).validate())
    return tuple(out)
