"""The pools a node offers: which devices stand behind Ray's ``GPU`` and each ``mig_<profile>`` resource.

The one definition of both, used by placement (a whole-device request is placed
only inside :func:`gpu_pool`), by the node's start-up (the ``GPU`` count and the
MIG resources it advertises) and by the node's arbiter (the slot -> device
bijection). A device is in the GPU pool when it can be handed out whole:

* it holds no MIG instance (``Device.partitions`` empty): a device with instances is
  used through them, whatever ``mig_mode`` says (a capture or a hand-written
  topology may list instances and leave the mode unknown);
* it is not in MIG mode (``mig_mode is True`` means whole-device work cannot run on it);
* it has not failed (``health == "failed"``).

A MIG instance is in its profile's pool when its parent has not failed. A node given MIG
instances by UUID (``CUDA_VISIBLE_DEVICES=MIG-a,MIG-b``, :mod:`rayaccel.ray.node.preset`) offers
them as Ray's ``GPU``, as plain Ray does (:func:`instance_pool`), and no ``mig_<profile>`` resource.
Pure functions of the topology: no state, no I/O.
"""

from __future__ import annotations

from typing import Iterable

from ..topology import Device, NodeTopology
from .migunits import dynamic_units

#: Prefix of the Ray resource of a MIG profile's instances (:func:`mig_resource`).
MIG_RESOURCE_PREFIX = "mig_"


def mig_resource(profile: str) -> str:
    """The Ray resource of MIG instances of ``profile``: ``mig_<profile>`` (e.g. ``mig_1g.5gb``)."""
    return f"{MIG_RESOURCE_PREFIX}{profile}"


def in_gpu_pool(device: Device) -> bool:
    """True when ``device`` can be handed out whole (see the module docstring)."""
    return not device.partitions and device.mig_mode is not True and device.health != "failed"


def gpu_pool(topology: NodeTopology) -> tuple[int, ...]:
    """The devices behind Ray's ``GPU`` resource, by ascending index (see the module docstring)."""
    return tuple(d.index for d in sorted(topology.devices, key=lambda d: d.index) if in_gpu_pool(d))


def instance_pool(topology: NodeTopology, order: Iterable[str] = ()) -> tuple[str, ...]:
    """The MIG instances behind Ray's ``GPU`` on a node given MIG UUIDs: their keys, instances of failed
    devices left out; in ``order`` (the preset's: Ray's slot ``i`` is its ``i``-th instance) where it names
    them, the rest by parent index, then GPU-instance id (as :func:`mig_pools`)."""
    keys = [p.key for d in sorted(topology.devices, key=lambda d: d.index) if d.health != "failed"
            for p in sorted(d.partitions, key=lambda p: (p.gi_id if p.gi_id is not None else 1 << 30, p.key))]
    first = [k for k in order if k in keys]
    return tuple(dict.fromkeys([*first, *keys]))


def mig_pools(topology: NodeTopology, dynamic: Iterable[int] = ()) -> dict[str, tuple[str, ...]]:
    """MIG resource (:func:`mig_resource`) -> its instances' :attr:`~rayaccel.topology.Partition.key`.

    Ordered by parent device index, then GPU-instance id (instances without one last,
    by key); resources in the order their first instance appears. Instances of failed
    devices are left out. A GPU in ``dynamic`` (re-partitioned by the node's agent,
    :mod:`.dynmig`) offers every instance it could hold instead: one unit per profile and
    placement (:func:`~.migunits.dynamic_units`, ``"0:1g.5gb@2"``), existing or not.
    """
    pools: dict[str, list[str]] = {}
    dyn = frozenset(dynamic)
    for d in sorted(topology.devices, key=lambda d: d.index):
        if d.health == "failed":
            continue
        if d.index in dyn:
            for profile, units in dynamic_units(d).items():
                pools.setdefault(mig_resource(profile), []).extend(units)
            continue
        for p in sorted(d.partitions, key=lambda p: (p.gi_id if p.gi_id is not None else 1 << 30, p.key)):
            pools.setdefault(mig_resource(p.profile), []).append(p.key)
    return {r: tuple(keys) for r, keys in pools.items()}
