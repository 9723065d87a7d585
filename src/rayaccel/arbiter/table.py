"""The node table: what a worker needs to map a grant, written once at node start (``table.json``).

A rayaccel node's workers decide their grants without topology objects and without
the placer: the table holds, per Ray resource, the units behind its slots (device
indices for ``GPU``, MIG instance keys for ``mig_<profile>`` -- and for ``GPU`` on a node given
MIG UUIDs, whose ``GPU`` resource is of kind ``mig``), each unit's device,
MIG UUIDs, the visible-devices variable, each device's NUMA-local CPUs and nearest
RDMA NICs -- and, for pools of up to :data:`PLAN_MAX` devices, every plain decision
the placer would make: for each set of free devices and each size, the best set in
ring order (:func:`rayaccel.arbiter.build.build_table` computes them at node start).
A grant the table cannot answer (a constrained ``rayaccel.remote`` request, a larger
pool, a placement group of multi-device bundles) loads the placer then.

Plans are encoded compactly: ``plans[k - 1]`` is one string of ``2 ** n`` entries
separated by ``,``, entry ``m`` answering "free pool positions = bit mask ``m``":
empty when fewer than ``k`` are free, else the chosen positions in ring order as hex
digits, with a ``+`` suffix when the ascending order of that set is a best ring too
(placement groups of one-device bundles then take it: Ray Train ranks by lowest id).

Nothing here imports ``ray``, the topology model or the placer (this module is on every
worker's path).
"""

# no `from __future__ import annotations`: string annotations make each NamedTuple compile its fields
# (~0.1 ms apiece), and every Ray worker of a rayaccel node imports this module

import json
from typing import Any, Mapping, NamedTuple

from ..contract import DYNMIG_SCHEMA, TABLE_SCHEMA, load_json
from .state import StateError

#: The largest node table a worker reads (a 72-device node's is ~1 MiB with its plans).
MAX_TABLE_BYTES = 64 << 20

SCHEMA = TABLE_SCHEMA
#: Pools up to this many devices get every plain decision precomputed (2**n * n/2 placements).
PLAN_MAX = 8


class ResourceTable(NamedTuple):
    """One Ray resource of the node.

    Attributes:
        name: the Ray resource (``GPU``, ``mig_1g.5gb``, ``neuron_cores``, ...).
        kind: ``units`` (the placer chooses among free units) or ``mig`` (any free MIG instance: a profile's,
            or ``GPU`` on a node given MIG UUIDs).
        units: the units in slot order at node start.
        device_of: unit -> its device index.
        uuid_of: unit -> the name the visible-devices variable uses for it when not the unit itself
            (MIG instances: their UUID; a node given a preset: the preset's text, e.g. the host's core id).
        plans: precomputed plain decisions (module docstring): ``plans[k - 1][mask]``, or None.
        spec: for an accelerator family other than GPUs, its :class:`~rayaccel.discovery.RaySpec`
            as a dict of fields (what the placer and the visible variables need), else None.
    """

    name: str
    kind: str
    units: tuple
    device_of: Mapping[Any, int]
    uuid_of: Mapping[Any, str]
    plans: tuple[tuple[str, ...], ...] | None = None
    spec: Mapping[str, Any] | None = None

    def visible_env(self) -> tuple[str, ...]:
        """The variables naming this resource's units in a worker (empty for GPUs and MIG: the node's)."""
        return tuple(self.spec["visible_env"]) if self.spec else ()

    def noset_env(self) -> tuple[str, ...]:
        """``RAY_EXPERIMENTAL_NOSET_<VAR>`` names: when one is true in a worker, nothing is written."""
        return tuple(self.spec.get("noset_env") or ()) if self.spec else ()

    def needs_topology_for_env(self) -> bool:
        """True when the variables depend on where the units sit (TPU bounds), not only on their ids."""
        return bool(self.spec) and bool(self.spec.get("bounds_env") or self.spec.get("whole_host_unsets"))

    def plan(self, positions_mask: int, k: int) -> str | None:
        """The precomputed entry for ``k`` units among free pool positions ``positions_mask`` (None: not stored)."""
        if self.plans is None or not 1 <= k <= len(self.plans):
            return None
        row = self.plans[k - 1]
        return row[positions_mask] if 0 <= positions_mask < len(row) else None


class NodeTable(NamedTuple):
    """Everything a worker of the node needs at a grant (module docstring).

    Attributes:
        node_key: the node. simulated: no real devices behind it. vendor: the GPUs' vendor.
        visible_env: the GPUs' visible-devices variable (``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES``).
        resources: Ray resource -> :class:`ResourceTable`.
        cpus: device -> its NUMA-local CPUs. nics: device -> the RDMA NICs nearest it
            (UCX ``device:port`` names; empty when it has none at PIX/PXB).
    """

    node_key: str
    simulated: bool
    vendor: str
    visible_env: str
    resources: Mapping[str, ResourceTable]
    cpus: Mapping[int, tuple[int, ...]]
    nics: Mapping[int, tuple[str, ...]] = {}

    def pools(self) -> dict[str, tuple]:
        """Ray resource -> its units (what the arbiter's slot maps permute)."""
        return {r: t.units for r, t in self.resources.items()}

    def unit_resources(self) -> tuple[str, ...]:
        """The resources that stand for devices: ``GPU`` (its units devices, or on a node given MIG UUIDs the
        instances it offers as GPUs) or the node's other family; not MIG profiles. The hook answers Ray's ids
        for these, a drain placeholder holds their units of its device, the snapshot counts their devices."""
        return tuple(r for r, t in self.resources.items() if t.kind == "units" or r == "GPU")

    def gpu_instances(self) -> bool:
        """True when the node's ``GPU`` units are MIG instances (a node given MIG UUIDs)."""
        t = self.resources.get("GPU")
        return t is not None and t.kind == "mig"

    def device_of(self, resource: str, unit: Any) -> int | None:
        """The device of ``unit`` of ``resource`` (None when unknown)."""
        t = self.resources.get(resource)
        return None if t is None else t.device_of.get(unit)


def encode_table(t: NodeTable) -> bytes:
    """The table file's bytes."""
    return json.dumps({
        "schema": SCHEMA, "node_key": t.node_key, "simulated": t.simulated, "vendor": t.vendor,
        "visible_env": t.visible_env,
        "resources": {r: {"kind": x.kind, "units": list(x.units),
                          "devices": [x.device_of[u] for u in x.units],
                          "uuids": [x.uuid_of.get(u) for u in x.units],
                          "plans": [",".join(row) for row in x.plans] if x.plans is not None else None,
                          "spec": dict(x.spec) if x.spec is not None else None}
                      for r, x in t.resources.items()},
        "cpus": {str(d): _ranges(c) for d, c in t.cpus.items()},
        "nics": {str(d): list(n) for d, n in t.nics.items() if n},
    }, separators=(",", ":")).encode()


def decode_table(raw: bytes) -> NodeTable:
    """Parse a table file.

    Raises:
        StateError: not a table of this schema, or a field of the wrong shape (names it).
    """
    d = load_json(raw, what="node table", max_bytes=MAX_TABLE_BYTES, error=StateError, schema=SCHEMA)
    try:
        res = {}
        for r, x in d["resources"].items():
            units = tuple(x["units"])
            devs = x["devices"]
            uuids = x.get("uuids") or [None] * len(units)
            if len(devs) != len(units) or len(uuids) != len(units) or not all(isinstance(i, int) for i in devs):
                raise StateError("devices/uuids must list one entry per unit", f"resources.{r}")
            plans = x.get("plans")
            spec = x.get("spec")
            if spec is not None and (not isinstance(spec, dict) or not isinstance(spec.get("visible_env"), list)):
                raise StateError("spec must be an object with visible_env", f"resources.{r}")
            res[r] = ResourceTable(r, str(x["kind"]), units, dict(zip(units, devs)),
                                   {u: v for u, v in zip(units, uuids) if v},
                                   tuple(tuple(row.split(",")) for row in plans) if plans is not None else None,
                                   spec)
        cpus = {int(k): _parse_ranges(v) for k, v in d.get("cpus", {}).items()}
        nics = {int(k): tuple(v) for k, v in d.get("nics", {}).items()}
        return NodeTable(str(d["node_key"]), bool(d["simulated"]), str(d["vendor"]), str(d["visible_env"]),
                         res, cpus, nics)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, StateError):
            raise
        raise StateError(f"malformed node table: {e!r}") from None


def _ranges(cpus: tuple[int, ...]) -> str:
    out, xs, i = [], sorted(set(cpus)), 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def _parse_ranges(s: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in s.split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


# ------------------------------------------------------------------ dynamic MIG: the instances that exist now
def dynamic_resources(t: NodeTable) -> tuple[str, ...]:
    """The MIG resources whose units are a dynamic-MIG GPU's possible instances (``"0:1g.5gb@2"``)."""
    return tuple(r for r, x in t.resources.items() if x.kind == "mig" and any("@" in str(u) for u in x.units))


def encode_live(instances: Mapping[str, str], at: float) -> bytes:
    """The dynamic-MIG file's bytes: ``instances`` (dynamic unit -> MIG UUID) that exist now."""
    return json.dumps({"schema": DYNMIG_SCHEMA, "at": at, "instances": dict(sorted(instances.items()))},
                      separators=(",", ":")).encode()


def decode_live(raw: bytes) -> dict[str, str]:
    """Parse the dynamic-MIG file (dynamic unit -> MIG UUID).

    Raises:
        StateError: not that format (names it), or a malformed entry.
    """
    d = load_json(raw, what="dynamic MIG instances", max_bytes=1 << 20, error=StateError, schema=DYNMIG_SCHEMA)
    inst = d.get("instances")
    if not isinstance(inst, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in inst.items()):
        raise StateError("instances must map units to MIG UUIDs", "instances")
    return dict(inst)


def with_live(t: NodeTable, live: Mapping[str, str]) -> NodeTable:
    """``t`` with its dynamic MIG resources' UUIDs replaced by ``live`` (a unit absent there has no instance)."""
    res = dict(t.resources)
    for r in dynamic_resources(t):
        x = res[r]
        res[r] = x._replace(uuid_of={u: live[u] for u in x.units if u in live})
    return t._replace(resources=res)
