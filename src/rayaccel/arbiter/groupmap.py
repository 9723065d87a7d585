"""A placement group's devices on a node, per bundle: what the group's workers will see.

One shape for the live map (:func:`rayaccel.placement_map`, ``rayaccel status --placement-groups``)
and the dry run (``rayaccel plan --bundles``):

* :func:`bundle_units` -- a node's :class:`~.state.Reservation` for a group as the node table names
  it: per bundle its devices, units, NUMA-local CPUs and nearest NICs (what a node's worker answers
  the driver, :mod:`rayaccel.ray.node.placemap`);
* :func:`bundle_placement` -- one bundle's :class:`BundlePlacement` from those facts and its node's
  topology (devices with UUID and model, the link class between them, NUMA nodes);
* :func:`rank_sites` -- a map's bundles as :class:`~rayaccel.placement.ranks.BundleSite`, in the
  order :func:`rayaccel.rank_order` hands them to :func:`rayaccel.placement.ranks.rank_order`;
* :func:`dry_run` -- the map a node's arbiter would give a group all of whose bundles Ray placed on
  one machine: the node table built as node start builds it, a state with the busy devices held,
  and :func:`.decide.reserve_group` with the worker's :class:`~.choose.TableChooser` -- the path of
  :meth:`.statefile.Arbiter.reserve_group`, with nothing re-implemented.

No ``ray`` here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from ..errors import RequestError
from .state import GPU, Holder, Reservation, fresh_state
from .table import NodeTable

if TYPE_CHECKING:  # the node's worker that answers a driver imports this module: no placer, no topology model
    from ..placement.ranks import BundleSite
    from ..topology import NodeTopology

#: The format of :meth:`PlacementMap.to_dict` (``rayaccel status --placement-groups --json``, ``rayaccel plan
#: --bundles --json``).
MAP_SCHEMA = "rayaccel.placement-map/1"
#: Why a bundle has no devices: it asks for none.
NO_GPU = "the bundle holds no GPU"
#: The node key of :func:`dry_run`'s node table (no node directory is made).
DRY_RUN_KEY = "dry-run"
#: The placement group id the dry run reserves for (the arbiter's state is a fresh one, in memory).
DRY_RUN_PG = "dry-run"
#: The pid of the holder that stands for the busy devices in :func:`dry_run` (alive, never a real process).
BUSY_PID = -2
#: The largest amount of a resource a dry run's bundle may name (memory in bytes included).
MAX_AMOUNT = 1 << 53
#: Ray's own resources a dry run's bundle may carry besides ``GPU`` (kept as given; they choose no device).
OTHER_RESOURCES = ("CPU", "memory", "object_store_memory")


@dataclass(frozen=True, slots=True)
class DeviceSite:
    """One device behind a bundle.

    Attributes:
        index: the device index on its node (what ``CUDA_VISIBLE_DEVICES`` names). uuid / model: or None.
        mig: the MIG instance (UUID) when the bundle holds one, else None.
    """

    index: int
    uuid: str | None = None
    model: str | None = None
    mig: str | None = None


@dataclass(frozen=True, slots=True)
class BundlePlacement:
    """One bundle: where it is and what its workers will see.

    Attributes:
        bundle: its index. node_id / node_ip: its Ray node. node_key: the rayaccel node key (None: unmanaged).
        resources: the bundle's resources as Ray holds them.
        devices: the devices its workers will see, in the order they see them (empty: none known, see ``why``).
        link: the link class of the weakest pair among ``devices`` (``nvidia-smi topo -m``'s label: ``NV2``,
            ``PIX``, ``SYS``), None for fewer than two devices.
        visible: the visible-devices variable's value (``CUDA_VISIBLE_DEVICES``) a whole member gets.
        nics: the RDMA NICs next to the devices (UCX ``device:port``, as ``get_devices().nics``).
        numa_nodes / cpus: the devices' NUMA nodes and NUMA-local CPUs (the affinity the hook sets).
        nvlink_domain: the node's NVLink domain (``ray.io/gpu-domain``), or None.
        why: why ``devices`` is empty, else None.
    """

    bundle: int
    node_id: str
    node_ip: str | None
    node_key: str | None
    resources: dict = field(default_factory=dict)
    devices: tuple[DeviceSite, ...] = ()
    link: str | None = None
    visible: str | None = None
    nics: tuple[str, ...] = ()
    numa_nodes: tuple[int, ...] = ()
    cpus: tuple[int, ...] = ()
    nvlink_domain: str | None = None
    why: str | None = None

    @property
    def indices(self) -> tuple[int, ...]:
        """Device indices, in order."""
        return tuple(d.index for d in self.devices)

    def to_dict(self) -> dict:
        """JSON-ready form (one entry of :meth:`PlacementMap.to_dict`'s ``bundles``)."""
        return {"bundle": self.bundle, "node_id": self.node_id, "node_ip": self.node_ip, "node_key": self.node_key,
                "resources": dict(self.resources),
                "devices": [{"index": d.index, "uuid": d.uuid, "model": d.model, "mig": d.mig} for d in self.devices],
                "link": self.link, "visible": self.visible, "nics": list(self.nics),
                "numa_nodes": list(self.numa_nodes), "cpus": list(self.cpus), "nvlink_domain": self.nvlink_domain,
                "why": self.why}


@dataclass(frozen=True, slots=True)
class PlacementMap:
    """Every bundle of a placement group (:class:`BundlePlacement`, by bundle index).

    ``pg_id`` is None for a dry run (``rayaccel plan --bundles``: no group exists).
    """

    pg_id: str | None
    name: str
    strategy: str
    bundles: tuple[BundlePlacement, ...]

    def __getitem__(self, bundle: int) -> BundlePlacement:
        return self.bundles[bundle]

    def __len__(self) -> int:
        return len(self.bundles)

    def to_dict(self) -> dict:
        """JSON-ready form (:data:`MAP_SCHEMA`)."""
        return {"schema": MAP_SCHEMA, "pg_id": self.pg_id, "name": self.name, "strategy": self.strategy,
                "bundles": [b.to_dict() for b in self.bundles]}


def bundle_units(table: NodeTable, resource: str, reservation: Reservation) -> dict[int, dict[str, list]]:
    """``{bundle: {"devices", "units", "cpus", "nics"}}`` of a group's reservation on the node of ``table``.

    ``devices``: the units' devices in the units' order (each once); ``cpus``: their NUMA-local CPUs
    (sorted); ``nics``: their nearest RDMA NICs (each once), as the node table lists them.
    """
    device_of = table.resources[resource].device_of
    out: dict[int, dict[str, list]] = {}
    for b, units in reservation.bundles.items():
        devs = list(dict.fromkeys(d for d in (device_of.get(u) for u in units) if d is not None))
        cpus = sorted({c for d in devs for c in table.cpus.get(d, ())})
        nics = list(dict.fromkeys(n for d in devs for n in table.nics.get(d, ())))
        out[int(b)] = {"devices": devs, "units": list(units), "cpus": cpus, "nics": nics}
    return out


def weakest_link(topology: NodeTopology, devices: Sequence[int]) -> str | None:
    """The ``nvidia-smi topo -m`` label of the weakest pair among ``devices`` (None for fewer than two;
    ``"?"`` for a pair the topology has no link record of)."""
    pairs = [(a, b) for i, a in enumerate(devices) for b in devices[i + 1:]]
    if not pairs:
        return None
    a, b = min(pairs, key=lambda p: topology.rank(*p))
    link = topology.link(a, b)
    return link.label if link is not None else "?"


def bundle_placement(bundle: int, node_id: str, node_ip: str | None, node_key: str | None, resources: dict,
                     topology: NodeTopology, facts: Mapping[str, Any], nvlink_domain: str | None) -> BundlePlacement:
    """The :class:`BundlePlacement` of a bundle whose node reserved it devices (``facts``: one entry of
    :func:`bundle_units`).

    Raises:
        KeyError: a device ``topology`` lacks (a node table that does not match its topology).
    """
    idx = [int(i) for i in facts["devices"]]
    found = [topology.device(i) for i in idx]
    devs = tuple(DeviceSite(i, getattr(d, "uuid", None), getattr(d, "model", None), None) for i, d in zip(idx, found))
    numa = tuple(sorted({d.numa_node for d in found if d.numa_node is not None}))
    return BundlePlacement(bundle, node_id, node_ip, node_key, resources, devices=devs,
                           link=weakest_link(topology, idx), visible=",".join(map(str, idx)),
                           nics=tuple(facts.get("nics", ())), numa_nodes=numa, cpus=tuple(facts.get("cpus", ())),
                           nvlink_domain=nvlink_domain)


def rank_sites(m: PlacementMap) -> list["BundleSite"]:
    """The map's bundles for :func:`rayaccel.placement.ranks.rank_order`: nodes by IP (then id), bundles by index."""
    from ..placement.ranks import BundleSite

    by = {b.bundle: b for b in m.bundles}
    return sorted((BundleSite(b.bundle, b.node_id, b.indices) for b in m.bundles),
                  key=lambda s: (_ip_key(by[s.bundle].node_ip), s.node, s.bundle))


def _ip_key(ip: str | None) -> tuple:
    parts = (ip or "").split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) and len(parts) == 4 else (1 << 9, ip or "")


def dry_run(topology: NodeTopology, bundles: Sequence[Mapping[str, float]], busy: Iterable[int] = (), *,
            spec: Any = None, node_id: str | None = None) -> tuple[PlacementMap, str | None]:
    """The map a node's arbiter would give a group of ``bundles``, all placed on a ``topology`` machine.

    As the group's first member (or :func:`rayaccel.placement_map`) would have it reserved on that node:
    the node table as node start builds it (:func:`.build.build_table`, with ``spec``), a fresh state in
    which one live holder has the ``busy`` devices, and :func:`.decide.reserve_group` with the worker's
    :class:`~.choose.TableChooser` (the table's plans for one-device bundles, else the placer's gang).

    Args:
        bundles: each bundle's resources (``{"GPU": 2}``); ``GPU`` a whole number >= 0, plus any of
            :data:`OTHER_RESOURCES` (kept as given).
        busy: devices other work holds (indices outside the node's GPU pool are ignored).
        spec: how the node's accelerators appear to Ray (what node start uses:
            ``rayaccel.ray.record.node_spec``); None: GPUs.
        node_id: what the map calls the node (default: the topology's name).

    Returns:
        The map and None, or -- when the arbiter would reserve nothing (its members would then choose at
        their grants) -- the map with each bundle's ``why`` and that reason.

    Raises:
        RequestError: (field ``bundles``) no bundles, a resource other than ``GPU`` and
            :data:`OTHER_RESOURCES`, an amount that is no number from 0 to :data:`MAX_AMOUNT`, a fractional
            ``GPU``, no bundle with a GPU, a machine without a GPU pool, a bundle larger than that pool, or more
            GPUs than are free there; a ``spec`` of another family than ``GPU``.
    """
    from ..topology import nvlink_domain
    from . import decide
    from .build import build_table
    from .choose import TableChooser

    name = node_id or topology.name or "this machine"
    if spec is not None and spec.resource != GPU:
        raise RequestError(f"{name}'s accelerators are Ray's {spec.resource!r}, not GPUs; a placement map covers "
                           f"GPU bundles", "bundles", "a topology with GPUs")
    sizes = _sizes(bundles)
    table = build_table(topology, DRY_RUN_KEY, True, spec)
    pool = table.resources[GPU].units
    taken = frozenset(busy) & frozenset(pool)
    free = len(pool) - len(taken)
    if not pool:
        raise RequestError(f"{name} has no whole GPU to reserve (its devices are in MIG mode, hold MIG instances or "
                           f"failed)", "bundles", "a topology with GPUs Ray counts as GPU")
    for b, k in sizes.items():
        if k > len(pool):
            raise RequestError(f"bundle {b} asks {k} GPU(s); {name} has {len(pool)} (Ray places a bundle on one node)",
                               "bundles", f"at most {len(pool)} GPUs per bundle")
    asked = sum(sizes.values())
    if asked > free:
        held = f", {len(taken)} busy" if taken else ""
        raise RequestError(f"the group asks {asked} GPUs; {name} has {free} free ({len(pool)} in all{held})",
                           "bundles", f"at most {free} GPUs in all, or fewer busy devices")
    st = fresh_state(table.pools())
    if taken:
        slots = tuple((s, 1.0) for s, u in enumerate(st.pools[GPU]) if u in taken)
        st = st._replace(holders={BUSY_PID: Holder("busy", {GPU: slots}, 0.0, name="busy devices")})
    _, res = decide.reserve_group(st, DRY_RUN_PG, GPU, {b: float(k) for b, k in sizes.items()}, table,
                                  chooser=TableChooser(table, lambda: topology), alive=lambda pid: True, now=0.0)
    dom = nvlink_domain(topology)
    domain = dom.name if dom is not None else None
    facts = bundle_units(table, GPU, res) if res is not None else {}
    why = None if res is not None else "the arbiter would reserve nothing: each member would choose at its grant"
    out = []
    for b, r in enumerate(bundles):
        resources = {k: float(v) for k, v in r.items()}
        if b not in sizes:
            out.append(BundlePlacement(b, name, None, None, resources, nvlink_domain=domain, why=NO_GPU))
        elif b not in facts:
            out.append(BundlePlacement(b, name, None, None, resources, nvlink_domain=domain, why=why))
        else:
            out.append(bundle_placement(b, name, None, None, resources, topology, facts[b], domain))
    return PlacementMap(None, "", "STRICT_PACK", tuple(out)), why


def _amount(v: Any) -> bool:
    """A bundle's amount of a resource: a number (not a bool) from 0 to :data:`MAX_AMOUNT`."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return (isinstance(v, int) or math.isfinite(v)) and 0 <= v <= MAX_AMOUNT


def _sizes(bundles: Sequence[Mapping[str, float]]) -> dict[int, int]:
    """``{bundle: GPUs}`` of the bundles that hold GPUs (see :func:`dry_run` for what is refused)."""
    if not bundles:
        raise RequestError("no bundles", "bundles", "one or more bundles, e.g. 4x2")
    out: dict[int, int] = {}
    for b, r in enumerate(bundles):
        if not isinstance(r, Mapping):
            raise RequestError(f"bundle {b} is {type(r).__name__}, not an object", "bundles", '{"GPU": 2}')
        for k, v in r.items():
            if k != GPU and k not in OTHER_RESOURCES:
                raise RequestError(f"bundle {b}: resource {str(k)[:40]!r} places no device in a dry run", "bundles",
                                   f"{GPU}, and {', '.join(OTHER_RESOURCES)} carried as given")
            if not _amount(v):
                raise RequestError(f"bundle {b}: {k} is {str(v)[:40]!r}", "bundles", f"a number from 0 to {MAX_AMOUNT}")
        g = r.get(GPU, 0)
        if g != int(g):
            raise RequestError(f"bundle {b} asks {g:g} GPU: the arbiter reserves whole devices for a group (a "
                               f"fractional bundle's device is decided at its first grant)", "bundles",
                               "a whole number of GPUs per bundle")
        if g:
            out[b] = int(g)
    if not out:
        raise RequestError("no bundle holds a GPU", "bundles", "at least one bundle with GPUs, e.g. 4x2")
    return out


__all__ = ["BUSY_PID", "DRY_RUN_KEY", "DRY_RUN_PG", "MAP_SCHEMA", "MAX_AMOUNT", "NO_GPU", "OTHER_RESOURCES",
           "BundlePlacement", "DeviceSite", "PlacementMap", "bundle_placement", "bundle_units", "dry_run", "rank_sites",
           "weakest_link"]
