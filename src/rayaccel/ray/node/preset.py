"""The devices a node was given: a visible-devices variable, ``--num-gpus`` or ``--resources``.

Ray's documented way to give a node only some GPUs of a shared machine is the visible-devices
variable set before the node starts (``CUDA_VISIBLE_DEVICES=4,5,6``: every task gets 4, 5 or 6;
``CUDA_VISIBLE_DEVICES=GPU-uuid1,GPU-uuid2``: tasks get the UUIDs), or ``--num-gpus`` smaller than
the host's count (Ray's ids ``0..n-1``). A rayaccel node replaces the variable with its
placeholders and discovery lists every device of the host, so the node must read the variable
first: :func:`node_preset` reads it, checks it against the host's topology before anything
starts, and says which devices the node manages and which ids Ray would hand out for each;
:func:`restrict` is the node's topology restricted to them
(:meth:`~rayaccel.topology.NodeTopology.subset`: their links, NUMA, NICs).

What plain Ray 2.60 does with a preset (measured, ``tests/ray/test_ray_semantics.py``):

* ``CUDA_VISIBLE_DEVICES=4,5,6``: ``GPU=3``; a task's ``ray.get_gpu_ids()`` is ``['4']`` (the
  preset's text), ``CUDA_VISIBLE_DEVICES=4``; a UUID preset gives the UUID likewise;
* ``num_gpus=n`` with a preset: the first ``n`` of the preset (more than the preset is Ray's error);
* ``""`` (or ``NoDevFiles``): no GPU.

Rules (each break is one :class:`~rayaccel.errors.ClusterError` naming the variable or flag and
what would be right): ids are all indices, all GPU UUIDs or all MIG UUIDs; each names a device
(or MIG instance) the host has, once; ``--num-gpus`` is a whole number no larger than the preset
(or the host). Only GPU families (NVIDIA, AMD) may be given part of the host; another family's
variable must name all its units (or be unset) for now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from rayaccel.contract import UNHOOKED_PREFIX
from rayaccel.discovery.rayspec import RaySpec
from rayaccel.errors import ClusterError
from rayaccel.topology import NodeTopology

#: What Ray's GPU managers read as "no device" besides an empty value.
_NONE_VALUES = ("", "NoDevFiles")
#: AMD: Ray 2.60 reads HIP_VISIBLE_DEVICES and refuses ROCR_VISIBLE_DEVICES alone.
_ROCR = "ROCR_VISIBLE_DEVICES"


@dataclass(frozen=True, slots=True)
class Preset:
    """Which of the host's devices a node manages, and the ids Ray hands out for them.

    Attributes:
        source: what named them (``"CUDA_VISIBLE_DEVICES=4,5,6"``, ``"--num-gpus=2"``), or None: the whole host.
        host: the host's device indices (discovery).
        devices: the devices the node manages, in Ray's slot order (slot ``i`` -> ``devices[i]``).
        ray_ids: Ray's id for each of ``devices`` when a variable named them (its own text:
            ``"4"``, ``"GPU-..."``, ``"MIG-..."``), else None (Ray's ids are the integers ``0..n-1``).
        partitions: MIG instance keys kept (a MIG preset), or None for every instance of the kept devices.
    """

    source: str | None
    host: tuple[int, ...]
    devices: tuple[int, ...]
    ray_ids: tuple[str, ...] | None = None
    partitions: tuple[str, ...] | None = None

    @property
    def restricted(self) -> bool:
        """True when the node manages less than the whole host (or other ids than Ray's integers)."""
        return self.source is not None

    def describe(self) -> str:
        """One line for ``status`` / ``doctor``: what the host has and what this node manages."""
        if not self.restricted:
            return f"host devices {_ints(self.host)}; this node manages all of them"
        return (f"host devices {_ints(self.host)}; this node manages {_ints(self.devices)} "
                f"(from {self.source})")


def _ints(xs: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, xs)) + "]" if xs else "none"


def node_preset(topology: NodeTopology, spec: RaySpec | None, environ: Mapping[str, str], *,
                num_gpus: object = None, resources: Mapping[str, object] | None = None) -> Preset:
    """The devices a node with ``topology`` manages, given its environment and flags (module docstring).

    Args:
        topology: the host as discovery (or simulation) found it.
        spec: the family's :class:`RaySpec` (None: a node without devices, or GPUs).
        environ: the environment the node starts with (its visible-devices variables).
        num_gpus: ``--num-gpus`` / ``ray.init(num_gpus=)``, or None.
        resources: ``--resources`` / ``ray.init(resources=)``: the family's resource, when named,
            counts like ``num_gpus`` for a non-GPU family.

    Raises:
        ClusterError: a preset or count the host cannot honour (one line naming it and what would be right).
    """
    host = topology.indices
    gpu = spec is None or spec.resource == "GPU"
    variables = (spec.visible_env if spec is not None else ("CUDA_VISIBLE_DEVICES",))
    var = variables[0]
    if gpu and spec is not None and spec.vendor == "amd" and environ.get(var) is None and environ.get(_ROCR):
        raise ClusterError(f"{_ROCR}={environ[_ROCR]}: Ray reads HIP_VISIBLE_DEVICES on AMD nodes; set "
                           f"HIP_VISIBLE_DEVICES={environ[_ROCR]} instead")
    value = environ.get(var)
    if value is not None and _placeholders(value):
        value = ""  # a rayaccel worker without devices: none (never a device another worker holds)
    if not gpu:
        return _family(topology, spec, var, value, resources)
    count = _count("--num-gpus", num_gpus)
    if value is None:
        if count is None or count == len(host):
            return Preset(None, host, host)
        if count > len(host):
            raise ClusterError(f"--num-gpus={count}: this host has {len(host)} GPU(s) ({_ints(host)}); give "
                               f"--num-gpus={len(host)} or fewer")
        return Preset(f"--num-gpus={count}", host, host[:count])
    devices, ids, parts = _parse(topology, var, value)
    if count is not None:
        if count > len(ids):
            raise ClusterError(f"--num-gpus={count}: {var}={value} gives this node {len(ids)} device(s); give "
                               f"--num-gpus={len(ids)} or fewer, or name more devices in {var}")
        devices, ids = devices[:count] if parts is None else devices, ids[:count]
        if parts is not None:
            parts = parts[:count]
            devices = tuple(dict.fromkeys(_parent(topology, p) for p in parts))
    return Preset(f"{var}={value}", host, devices, ids, parts)


def _parent(topology: NodeTopology, key: str) -> int:
    return next(p.parent for p in topology.partitions() if p.key == key)


def _placeholders(value: str) -> bool:
    items = [v.strip() for v in value.split(",") if v.strip()]
    return bool(items) and all(v.startswith(UNHOOKED_PREFIX) for v in items)


def _count(flag: str, n: object) -> int | None:
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, (int, float)) or n < 0 or n != int(n):
        try:
            n2 = float(str(n))
        except ValueError:
            n2 = -1.0
        if n2 < 0 or n2 != int(n2):
            raise ClusterError(f"{flag}={n}: expected a whole number of devices >= 0")
        n = n2
    return int(n)  # type: ignore[arg-type]


def _parse(topology: NodeTopology, var: str, value: str) -> tuple[tuple[int, ...], tuple[str, ...],
                                                                  tuple[str, ...] | None]:
    """(devices, Ray ids, MIG keys or None) of a preset value."""
    if value.strip() in _NONE_VALUES:
        return (), (), None
    items = [v.strip() for v in value.split(",")]
    host = topology.indices
    if any(not v for v in items):
        raise ClusterError(f"{var}={value}: an empty entry; expected ids separated by commas, such as "
                           f"{var}={','.join(map(str, host[:2])) or '0'}")
    kinds = {"index" if v.isdigit() else "mig" if v.startswith("MIG-") else "uuid" for v in items}
    if len(kinds) > 1:
        raise ClusterError(f"{var}={value}: mixes " + " and ".join(sorted(f"{k}s" for k in kinds)) +
                           "; name the devices one way: all indices or all UUIDs")
    dup = next((v for i, v in enumerate(items) if v in items[:i]), None)
    if dup is not None:
        raise ClusterError(f"{var}={value}: {dup} is named twice; name each device once")
    kind = kinds.pop()
    if kind == "index":
        missing = [v for v in items if int(v) not in host]
        if missing:
            raise ClusterError(f"{var}={value}: this host has no device {missing[0]}; its devices are "
                               f"{_ints(host)}")
        return tuple(int(v) for v in items), tuple(items), None
    if kind == "uuid":
        by_uuid = {d.uuid: d.index for d in topology.devices if d.uuid}
        missing = [v for v in items if v not in by_uuid]
        if missing:
            known = ", ".join(f"{i}={u}" for u, i in sorted(by_uuid.items(), key=lambda x: x[1])[:8]) or "none known"
            raise ClusterError(f"{var}={value}: no device of this host has UUID {missing[0]} (expected an index, "
                               f"a GPU UUID or a MIG UUID; this host's GPUs: {known})")
        return tuple(by_uuid[v] for v in items), tuple(items), None
    by_mig = {p.uuid: p for p in topology.partitions() if p.uuid}
    missing = [v for v in items if v not in by_mig]
    if missing:
        known = ", ".join(sorted(by_mig)[:8]) or "none"
        raise ClusterError(f"{var}={value}: no MIG instance of this host has UUID {missing[0]} "
                           f"(this host's MIG instances: {known})")
    parts = tuple(by_mig[v].key for v in items)
    return tuple(dict.fromkeys(by_mig[v].parent for v in items)), tuple(items), parts


def _family(topology: NodeTopology, spec: RaySpec, var: str, value: str | None,
            resources: Mapping[str, object] | None) -> Preset:
    """A non-GPU family: a variable or a count naming all of the host's units is accepted, nothing less (yet)."""
    host = topology.indices
    from rayaccel.placement.units import node_units

    units = node_units(topology, spec)
    every = [str(u.id) for u in units]
    if value is not None and [v.strip() for v in value.split(",") if v.strip()] != every:
        raise ClusterError(f"{var}={value}: rayaccel cannot yet give a {spec.resource} node part of the host; "
                           f"unset {var} (this host's {spec.resource} ids: {','.join(every[:16]) or 'none'})")
    n = (resources or {}).get(spec.resource)
    count = _count(f"--resources {spec.resource}", n)
    if count is not None and count != len(units):
        raise ClusterError(f"--resources {spec.resource}={n}: rayaccel cannot yet give a {spec.resource} node "
                           f"part of the host; drop it (this host has {len(units)})")
    return Preset(None, host, host)


def given(topology: NodeTopology, environ: Mapping[str, str], *, num_gpus: object = None,
          resources: Mapping[str, object] | None = None) -> tuple[NodeTopology, Preset]:
    """The node's topology restricted to what it was given, and the :class:`Preset` (checked before anything starts).

    Raises:
        ClusterError: see :func:`node_preset`.
    """
    from rayaccel.ray.record import node_spec

    preset = node_preset(topology, node_spec(topology), environ, num_gpus=num_gpus, resources=resources)
    return restrict(topology, preset), preset


def restrict(topology: NodeTopology, preset: Preset) -> NodeTopology:
    """``topology`` restricted to the devices (and MIG instances) ``preset`` gives the node. Pure."""
    if not preset.restricted:
        return topology
    return topology.subset(preset.devices, preset.partitions)


__all__ = ["Preset", "given", "node_preset", "restrict"]
