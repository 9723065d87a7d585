"""Building a node's table at node start (:func:`build_table`): units, CPUs, NICs and precomputed plans.

Runs where the node is prepared (``rayaccel start``, :func:`rayaccel.init`,
``SimulatedCluster``), never in a worker. For a pool of up to
:data:`~.table.PLAN_MAX` devices it asks the placer every plain question a grant can
ask -- each set of free devices, each size -- so that workers answer them from the
table. Tables are memoized per topology in the process (a cluster of identical nodes
computes them once).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields

from ..discovery.rayspec import RaySpec
from ..placement import NodeState, Request, allocate
from ..placement.migunits import instance_unit, parse_unit
from ..placement.pools import gpu_pool, instance_pool, mig_pools
from ..placement.units import node_units
from ..topology import NodeTopology, near_nics
from .placer import bundle_order
from .state import GPU
from .table import PLAN_MAX, NodeTable, ResourceTable

#: The visible-devices variable of each GPU vendor (Ray's GPU managers write these).
VISIBLE_ENV = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "HIP_VISIBLE_DEVICES"}
_PLANS: dict[str, tuple[tuple[str, ...], ...]] = {}


def gpu_vendor(topology: NodeTopology) -> str:
    """The node's GPU vendor (``nvidia`` when mixed or none)."""
    vendors = {d.vendor for d in topology.devices}
    return vendors.pop() if len(vendors) == 1 else "nvidia"


def build_table(topology: NodeTopology, node_key: str, simulated: bool, spec: RaySpec | None = None,
                ray_ids: dict[int, str] | None = None, dynamic_mig: tuple[int, ...] = (),
                gpu_instances: tuple[str, ...] | None = None) -> NodeTable:
    """The node table of ``topology`` (see :mod:`.table`).

    Args:
        spec: how the node's accelerators appear to Ray (:func:`rayaccel.discovery.spec_for`);
            None or a ``GPU`` spec: Ray's ``GPU`` pool (:func:`~rayaccel.placement.pools.gpu_pool`)
            and MIG instances; any other family: its resource's units (NeuronCores, TPU chips,
            Gaudi modules, a plugin's devices: :func:`~rayaccel.placement.units.node_units`), chosen
            by :func:`~rayaccel.placement.units.choose_units` at the grant.

        ray_ids: unit -> the id Ray hands out for it when the node was given a visible-devices preset
            (``"4"``, ``"GPU-..."``; a GPU's unit is its device; stored as the resource's ``uuid_of``), else
            None (Ray's integers: the units themselves). See :func:`rayaccel.ray.node.preset.table_ids`.

        dynamic_mig: GPUs the node's agent re-partitions: their MIG units are every instance they could hold
            (``"0:1g.5gb@2"``, :func:`~rayaccel.placement.pools.mig_pools`), named by UUID only where an instance
            exists (the agent keeps that list current: :data:`~rayaccel.contract.DYNMIG_FILE`).

        gpu_instances: the MIG instance keys a node given MIG UUIDs offers as Ray's ``GPU``, in the preset's
            order (:attr:`rayaccel.ray.node.preset.Preset.mig_gpus`), else None. Its ``GPU`` resource is then
            of kind ``mig`` (any free instance: instances have no links to choose by): units the instances
            (:func:`~rayaccel.placement.pools.instance_pool`), ``device_of`` their parents, ``uuid_of`` their
            MIG UUIDs; no ``mig_<profile>`` resource (an instance is one ``GPU`` slot, never also a MIG slot).

    Each device's nearest RDMA NICs come from :func:`rayaccel.topology.near_nics` (PIX, else PXB).
    """
    resources: dict[str, ResourceTable] = {}
    if gpu_instances is not None and (spec is None or spec.resource == GPU):
        keys = instance_pool(topology, gpu_instances)
        part = {p.key: p for p in topology.partitions()}
        resources[GPU] = ResourceTable(GPU, "mig", keys, {k: part[k].parent for k in keys},
                                       {k: part[k].uuid for k in keys if part[k].uuid})
    elif spec is None or spec.resource == GPU:
        pool = tuple(gpu_pool(topology))
        ids = {d: ray_ids[d] for d in pool if d in ray_ids} if ray_ids else {}
        resources[GPU] = ResourceTable(GPU, "units", pool, {d: d for d in pool}, ids, plans(topology, pool))
    else:
        units = node_units(topology, spec)
        ids = tuple(u.id for u in units)
        # device units (Gaudi, Ascend, a plugin's) are placed as GPUs are: their plain plans too
        pre = plans(topology, ids) if spec.unit == "device" and not any(
            topology.device(i).health == "failed" for i in ids) else None
        named = {u: ray_ids[u] for u in ids if u in ray_ids} if ray_ids else {}
        resources[spec.resource] = ResourceTable(spec.resource, "units", ids, {u.id: u.device for u in units},
                                                 named, pre, spec_fields(spec))
    parent = {p.key: p.parent for p in topology.partitions()}
    uuids = {p.key: p.uuid for p in topology.partitions() if p.uuid}
    dyn = set(dynamic_mig)
    for p in topology.partitions():
        if p.parent in dyn and p.start is not None:
            u = instance_unit(p)
            if p.uuid:
                uuids[u] = p.uuid
    for r, units in (mig_pools(topology, dynamic_mig) if gpu_instances is None else {}).items():
        for u in units:
            if (pu := parse_unit(u)) is not None and pu[0] in dyn:
                parent[u] = pu[0]
        units = tuple(units)
        resources[r] = ResourceTable(r, "mig", units, {u: parent[u] for u in units},
                                     {u: uuids[u] for u in units if u in uuids})
    vendor = gpu_vendor(topology)
    env = spec.visible_env[0] if spec is not None and spec.resource == GPU else VISIBLE_ENV.get(vendor,
                                                                                             "CUDA_VISIBLE_DEVICES")
    cpus = {d.index: tuple(d.cpus) for d in topology.devices if d.cpus}
    nics = {d.index: near for d in topology.devices if (near := near_nics(topology, [d.index]))}
    return NodeTable(node_key, simulated, vendor, env, resources, cpus, nics)


def spec_fields(spec: RaySpec) -> dict:
    """A spec as the table stores it (JSON-ready; :func:`rayaccel.arbiter.placer.spec_of` reads it back)."""
    return {f.name: _plain(getattr(spec, f.name)) for f in fields(spec)}


def _plain(v: object) -> object:
    return [_plain(x) for x in v] if isinstance(v, tuple) else v


def plans(topology: NodeTopology, pool: tuple[int, ...]) -> tuple[tuple[str, ...], ...] | None:
    """Every plain decision over ``pool`` (``plans[k - 1][mask]``, see :mod:`.table`), or None above PLAN_MAX."""
    n = len(pool)
    if not 0 < n <= PLAN_MAX:
        return None
    key = hashlib.sha1(json.dumps([topology.to_dict(), list(pool)], sort_keys=True).encode()).hexdigest()
    hit = _PLANS.get(key)
    if hit is not None:
        return hit
    pos = {d: i for i, d in enumerate(pool)}
    everything = frozenset(topology.indices)
    rows = []
    for k in range(1, n + 1):
        row = []
        for m in range(1 << n):
            free = [pool[i] for i in range(n) if m >> i & 1]
            if len(free) < k:
                row.append("")
                continue
            alloc = allocate(NodeState(topology, busy=everything - frozenset(free)), Request(gpus=k))
            if not alloc:
                row.append("")
                continue
            order = list(alloc.devices)
            asc = k > 1 and bundle_order(topology, order, [1] * k) == sorted(order)
            row.append("".join(format(pos[d], "x") for d in order) + ("+" if asc else ""))
        rows.append(tuple(row))
    out = tuple(rows)
    _PLANS[key] = out
    return out
