"""The devices a node was given: a visible-devices variable, ``--num-gpus`` or ``--resources``.

Ray's documented way to give a node only some GPUs of a shared machine is the visible-devices
variable set before the node starts (``CUDA_VISIBLE_DEVICES=4,5,6``: every task gets 4, 5 or 6;
``CUDA_VISIBLE_DEVICES=GPU-uuid1,GPU-uuid2``: tasks get the UUIDs), or ``--num-gpus`` smaller than
the host's count (Ray's ids ``0..n-1``); every other family likewise, with its own variable and
``--resources {resource: n}``. A rayaccel node replaces the variable with its placeholders and
discovery lists every device of the host, so the node must read the variable first:
:func:`node_preset` reads it, checks it against the host's topology before anything starts, and
says which devices (and units) the node manages and which ids Ray would hand out for each;
:func:`restrict` is the node's topology restricted to them
(:meth:`~rayaccel.topology.NodeTopology.subset`: their links, NUMA, NICs) and :func:`table_ids`
the ids its table hands out.

What plain Ray 2.60 does with a preset (measured: ``tests/ray/test_ray_semantics.py`` holds both
sides; the managers are ``ray/_private/accelerators/*.py``):

* ``CUDA_VISIBLE_DEVICES=4,5,6``: ``GPU=3``; a task's ``ray.get_gpu_ids()`` is ``['4']`` (the
  preset's text), ``CUDA_VISIBLE_DEVICES=4``; a UUID preset gives the UUID likewise;
* ``CUDA_VISIBLE_DEVICES=MIG-a,MIG-b`` (MIG instance UUIDs): ``GPU=2``, each Ray GPU slot one instance;
  a ``num_gpus=1`` task gets ``['MIG-a']`` and ``CUDA_VISIBLE_DEVICES=MIG-a``, two ``num_gpus=0.5`` tasks
  can share one instance. A rayaccel node given MIG UUIDs does the same (:attr:`Preset.mig_gpus`): it
  advertises ``GPU`` = the instances and no ``mig_<profile>`` resource for them (advertising both would
  book an instance twice); its table's ``GPU`` units are the instances (kind ``mig``: any free one, no
  links to choose by), named by their UUIDs, their devices the parents (CPU affinity, NICs, drains);
* ``num_gpus=n`` with a preset: the first ``n`` of the preset (more than the preset is Ray's error);
* ``""`` (or ``NoDevFiles``): no GPU.
* another family (``NEURON_RT_VISIBLE_CORES``, ``TPU_VISIBLE_CHIPS``, ``HABANA_VISIBLE_MODULES``,
  ``ASCEND_RT_VISIBLE_DEVICES``): the same rules, the value split on commas (``""`` is none; Ascend's
  ``NoDevFiles`` too). The node counts ``min(detected, ids)`` or ``--resources {"neuron_cores": n}``
  (the first ``n`` of the preset; more is Ray's error); a task's ``get_accelerator_ids()`` and
  variable are the preset's text (``NEURON_RT_VISIBLE_CORES=4,5,6,7``, a one-core task: ``['4']``,
  ``"4"``); without a preset, ``--resources n`` gives the ids ``0..n-1``. Ray reads no range:
  ``NEURON_RT_VISIBLE_CORES=4-7`` is one id ``"4-7"`` (one ``neuron_cores``), which rayaccel refuses
  by name. TPU unsets ``TPU_VISIBLE_CHIPS`` only for a grant of every chip the host has, so a node
  given part of a host always writes it (:func:`table_spec`). A plugin's variable means nothing to
  Ray; rayaccel reads it by the same rules.

A family's units are the ids its variable names: NeuronCores numbered over the host's devices,
TPU chips, Gaudi modules, Ascend devices, a plugin's devices (:mod:`rayaccel.placement.units`).
A node given some cores of a device (``NEURON_RT_VISIBLE_CORES=5,6,7`` on a trn2, four cores a
device) manages those cores: its topology says that device has that many cores (``split``), and
the table names each of the node's cores by the host's id.

Rules (each break is one :class:`~rayaccel.errors.ClusterError` naming the variable or flag and
what would be right): GPU ids are all indices, all GPU UUIDs or all MIG UUIDs; another family's
are its unit ids (``0-31`` on a trn1.32xlarge); each names a unit the host has, once;
``--num-gpus`` / ``--resources {resource: n}`` is a whole number no larger than the preset (or the host).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Mapping

from rayaccel.contract import UNHOOKED_PREFIX
from rayaccel.discovery.rayspec import RaySpec
from rayaccel.errors import ClusterError
from rayaccel.topology import NodeTopology

#: What Ray's GPU managers read as "no device" besides an empty value.
_NONE_VALUES = ("", "NoDevFiles")
#: AMD: Ray 2.60 reads HIP_VISIBLE_DEVICES and refuses ROCR_VISIBLE_DEVICES alone.
_ROCR = "ROCR_VISIBLE_DEVICES"
#: What a family's variable names, by ``RaySpec.unit``, for messages.
_UNIT_WORD = {"core": "core", "chip": "chip", "device": "device"}


@dataclass(frozen=True, slots=True)
class Preset:
    """Which of the host's devices a node manages, and the ids Ray hands out for them.

    Attributes:
        source: what named them (``"CUDA_VISIBLE_DEVICES=4,5,6"``, ``"--num-gpus=2"``,
            ``"--resources neuron_cores=4"``), or None: the whole host.
        host: the host's device indices (discovery).
        devices: the devices the node manages (GPUs: in Ray's slot order, slot ``i`` -> ``devices[i]``;
            another family: those its units are on).
        ray_ids: Ray's id for each of ``devices`` (GPUs) or ``units`` (another family) when a variable
            named them (its own text: ``"4"``, ``"GPU-..."``, ``"MIG-..."``), else None (Ray's integers).
        partitions: MIG instance keys kept (a MIG preset: Ray's ``GPU`` slots, in the preset's order), or None
            for every instance of the kept devices.
        resource: the family's Ray resource (``"GPU"``, ``"neuron_cores"``, ``"TPU"`` ...).
        host_units: another family's: every unit id of the host (NeuronCore, TPU chip, module ids); None for GPUs.
        units: another family's: the host unit ids the node manages, in Ray's slot order; None for GPUs.
        split: core units: ``(device, cores kept)`` for each device the node manages only some cores of
            (its restricted topology says that many cores).
    """

    source: str | None
    host: tuple[int, ...]
    devices: tuple[int, ...]
    ray_ids: tuple[str, ...] | None = None
    partitions: tuple[str, ...] | None = None
    resource: str = "GPU"
    host_units: tuple[int, ...] | None = None
    units: tuple[int, ...] | None = None
    split: tuple[tuple[int, int], ...] = ()

    @property
    def mig_gpus(self) -> bool:
        """True when the node was given MIG instances by UUID: they are its ``GPU`` (module docstring)."""
        return self.partitions is not None and self.units is None

    @property
    def restricted(self) -> bool:
        """True when the node manages less than the whole host (or other ids than Ray's integers)."""
        return self.source is not None

    @property
    def partial(self) -> bool:
        """True when the node manages fewer devices (or units) than the host has."""
        if self.units is not None and self.host_units is not None:
            return len(self.units) < len(self.host_units)
        return self.restricted and (len(self.devices) < len(self.host) or self.partitions is not None)

    def describe(self) -> str:
        """One line for ``status`` / ``doctor``: what the host has and what this node manages."""
        if not self.restricted:
            return f"host devices {_ints(self.host)}; this node manages all of them"
        if self.units is None or self.host_units is None or self.units == self.devices:
            return (f"host devices {_ints(self.host)}; this node manages {_ints(self.devices)} "
                    f"(from {self.source})")
        ids = ",".join(self.ray_ids) if self.ray_ids is not None else _ranges(self.units)
        return (f"host devices {_ints(self.host)} ({self.resource} {_ranges(self.host_units)}); this node manages "
                f"{_ints(tuple(sorted(self.devices)))} ({self.resource} {ids or 'none'}) (from {self.source})")


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
    """A non-GPU family: the units its variable names (by the ids Ray's manager reads) and/or
    ``--resources {resource: n}`` (the first ``n``, of the preset when there is one)."""
    from rayaccel.placement.units import node_units

    host = topology.indices
    units = node_units(topology, spec)
    every = tuple(u.id for u in units)
    name = spec.resource
    n = (resources or {}).get(name)
    count = _count(f"--resources {name}", n)
    if value is None:
        if count is None or count == len(units):
            return Preset(None, host, host)
        if count > len(units):
            raise ClusterError(f"--resources {name}={n}: this host has {len(units)} {name} ({_ranges(every)}); "
                               f"give {name}={len(units)} or fewer")
        chosen, ids, source = every[:count], None, f"--resources {name}={count}"
    else:
        chosen, ids = _parse_units(spec, every, var, value)
        if count is not None:
            if count > len(chosen):
                raise ClusterError(f"--resources {name}={n}: {var}={value} gives this node {len(chosen)} {name}; "
                                   f"give {name}={len(chosen)} or fewer, or name more in {var}")
            chosen, ids = chosen[:count], ids[:count]
        source = f"{var}={value}"
    device_of = {u.id: u.device for u in units}
    devices = tuple(dict.fromkeys(device_of[u] for u in chosen))
    kept = {d: sum(1 for u in chosen if device_of[u] == d) for d in devices}
    split = tuple((d, kept[d]) for d in sorted(devices) if kept[d] < sum(1 for u in units if u.device == d))
    return Preset(source, host, devices, ids, None, name, every, chosen, split)


def _parse_units(spec: RaySpec, every: tuple[int, ...], var: str, value: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(host unit ids, Ray's id for each) of a family's preset value, in the preset's order."""
    name, what = spec.resource, _UNIT_WORD.get(spec.unit, "device")
    if value.strip() in (_NONE_VALUES if name == "NPU" else ("",)):  # Ascend's manager reads NoDevFiles as none too
        return (), ()
    items = [v.strip() for v in value.split(",")]
    example = f"{var}={','.join(map(str, every[:2])) or '0'}"
    if any(not v for v in items):
        raise ClusterError(f"{var}={value}: an empty entry; expected {what} ids separated by commas, such as {example}")
    span = next((v for v in items if re.fullmatch(r"\d+-\d+", v)), None)
    if span is not None:
        a, b = (int(x) for x in span.split("-"))
        whole = ",".join(x if x != span else ",".join(map(str, range(a, b + 1))) for x in items)
        raise ClusterError(f"{var}={value}: Ray reads {span} as one id, not a range (plain Ray counts it as 1 "
                           f"{name}); name each {what}: {var}={whole}")
    bad = next((v for v in items if not v.isdigit()), None)
    if bad is not None:
        raise ClusterError(f"{var}={value}: {bad} is not a {what} id; expected this host's {name} ids "
                           f"({_ranges(every)}), such as {example}")
    dup = next((v for i, v in enumerate(items) if int(v) in {int(x) for x in items[:i]}), None)
    if dup is not None:
        raise ClusterError(f"{var}={value}: {what} {int(dup)} is named twice; name each {what} once")
    missing = next((v for v in items if int(v) not in every), None)
    if missing is not None:
        raise ClusterError(f"{var}={value}: this host has no {what} {missing}; its {name} ids are {_ranges(every)}")
    return tuple(int(v) for v in items), tuple(items)


def _ranges(ids: tuple[int, ...]) -> str:
    """``0-3,6``: ids as ranges (a 64-core host in a few characters); ``none`` for none."""
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


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
    """``topology`` restricted to the devices (and MIG instances) ``preset`` gives the node. Pure.

    A device the node manages only some cores of (``preset.split``) says that many cores: the node's
    units on it are those (:func:`table_ids` maps them back to the host's core ids).
    """
    if not preset.restricted:
        return topology
    sub = topology.subset(preset.devices, preset.partitions)
    if preset.split:
        kept = dict(preset.split)
        sub = replace(sub, devices=tuple(replace(d, cores=kept[d.index]) if d.index in kept else d
                                         for d in sub.devices))
    return sub


def table_ids(topology: NodeTopology, spec: RaySpec | None, preset: Preset | None) -> dict[int, str] | None:
    """The node table's Ray ids: unit of the restricted ``topology`` -> the id Ray hands out for it (None: the unit).

    GPUs: device -> the preset's text for it (``"4"``, the UUID); none for a MIG preset (the MIG
    instances' UUIDs are the ids). Another family: the node's unit -> the preset's text for the host
    unit it stands for: device and chip units keep the host's ids, while the cores of a restricted
    Neuron node are numbered over its own devices (host cores 4-7 are the node's units 0-3), so each
    names its host core. None without a variable (``--resources n``: the first ``n`` units, whose ids
    Ray numbers ``0..n-1`` as the host does).
    """
    if preset is None or not preset.restricted or preset.ray_ids is None:
        return None
    if preset.units is None:
        return dict(zip(preset.devices, preset.ray_ids)) if preset.partitions is None else None
    from rayaccel.placement.units import node_units

    text = dict(zip(preset.units, preset.ray_ids))
    local = [u.id for u in node_units(topology, spec)] if spec is not None else []
    return {u: text[h] for u, h in zip(local, sorted(preset.units))}


def table_spec(spec: RaySpec | None, preset: Preset | None) -> RaySpec | None:
    """The family spec the node's table is built with: a node given part of a TPU host never unsets
    ``TPU_VISIBLE_CHIPS`` (Ray unsets it only for a grant of every chip of the host, which the node lacks)."""
    if spec is not None and spec.whole_host_unsets and preset is not None and preset.partial:
        return replace(spec, whole_host_unsets=False)
    return spec


__all__ = ["Preset", "given", "node_preset", "restrict", "table_ids", "table_spec"]
