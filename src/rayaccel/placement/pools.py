"""The units behind a node's Ray resources, defined once (the Ray layer, the arbiter and the placer use these).

* ``GPU`` (Ray's own ledger): every device not in MIG mode, without MIG instances and not failed.
* ``mig_<profile>``: one unit per MIG instance of that profile, ordered by parent device, then GI id.
"""

from __future__ import annotations

from ..topology import NodeTopology


def mig_resource(profile: str) -> str:
    """The Ray resource of MIG instances of ``profile``: ``mig_<profile>`` (e.g. ``mig_1g.5gb``)."""
    return f"mig_{profile}"


def gpu_pool(topology: NodeTopology) -> tuple[int, ...]:
    """Devices behind Ray's ``GPU`` resource: every device not in MIG mode, without partitions, not failed."""
    return tuple(d.index for d in sorted(topology.devices, key=lambda d: d.index)
                 if not d.partitions and d.mig_mode is not True and d.health != "failed")


def mig_pools(topology: NodeTopology) -> dict[str, tuple[str, ...]]:
    """MIG resource -> its instances (``Partition.key``), ordered by parent device then GI id."""
    pools: dict[str, list[str]] = {}
    for d in sorted(topology.devices, key=lambda d: d.index):
        if d.health == "failed":
            continue
        for p in sorted(d.partitions, key=lambda p: (p.gi_id if p.gi_id is not None else 1 << 30, p.key)):
            pools.setdefault(mig_resource(p.profile), []).append(p.key)
    return {r: tuple(u) for r, u in pools.items()}
