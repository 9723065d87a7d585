"""Dynamic MIG, the live half: the node's agent makes the MIG instances Ray's waiting work asks for.

A GPU the operator names in ``rayaccel start --dynamic-mig GPUS`` (``SimulatedCluster(dynamic_mig=)``,
``rayaccel.init(dynamic_mig=)``) must already be in MIG mode (enabling it needs a GPU reset: the
operator's). Its node advertises one ``mig_<profile>`` unit per instance the GPU *could* hold (every
profile and placement, :func:`rayaccel.placement.pools.mig_pools`), and this module keeps Ray's ledger
honest about which of them exist:

* **held**: every unit without an instance is held in Ray's ledger by a detached one-bundle placement
  group pinned to the node (``rayaccel-mig-<node>-<profile>-<n>``; :class:`RayHolds`), so Ray's free
  count of ``mig_<profile>`` is the free existing instances';
* **demand**: about once a second the agent reads Ray's queued task and actor demands and the bundles of
  placement groups waiting to be placed (:func:`rayaccel.ray._ray_private.pending_demand`; never its own holds)
  for this node's dynamic profiles;
* **steps**: :func:`rayaccel.placement.dynmig.plan_steps` (the layout planner: least fragmentation) turns
  them into steps: reuse a free instance, else create one, destroying only *idle* instances that are in the
  way of another waiting profile -- never one with work (a live holder of its unit, or a grant Ray made that
  no worker has reported yet);
* **applied**: a create is NVML's GPU + compute instance calls (:class:`~rayaccel.discovery.nvidia_mig.NvmlMigOps`;
  a simulated node's :class:`~rayaccel.testing.FakeNVML`), then the new instance's UUID goes into the node's
  dynamic-MIG file (:data:`~rayaccel.contract.DYNMIG_FILE`, which the arbiter reads at each MIG grant, so the
  hook names the new UUID) and one hold of its profile is released: Ray grants the waiting work. A destroy
  first holds a unit of the profile (Ray's free count drops by one), then, under the node lock, takes the unit
  out of the file only if no holder has it, then destroys it;
* **logged**: each step goes into the node's decision log and the agent's snapshot (``rayaccel status``).

Placeholders are placement groups rather than actors (as drains use): a group holds resources without a
worker process (a GPU with 18 possible instances would need 18 idle workers), and no worker means the
arbiter never sees a grant for a unit that does not exist. Pure decisions live in
:mod:`rayaccel.placement.dynmig`; the Ray calls behind :class:`RayHolds` in :mod:`rayaccel.ray._ray_private`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid as _uuid
from dataclasses import replace
from typing import Any, Iterable, Mapping, Protocol, Sequence

from rayaccel.contract import DYNMIG_FILE, DYNMIG_PREFIX, NODE_KEY_LABEL
from rayaccel.errors import BackendError, ClusterError, RequestError
from rayaccel.placement.dynmig import MigStep, check_dynamic, dynamic_units, instance_unit, parse_unit, plan_steps
from rayaccel.placement.pools import MIG_RESOURCE_PREFIX, mig_resource
from rayaccel.topology import Device, NodeTopology, Partition

log = logging.getLogger(__name__)
#: How long a hold (a placement group) may take to be placed before the step is abandoned, seconds.
HOLD_TIMEOUT_S = 10.0
#: After a period that took steps, the agent plans again only this much later (Ray grants what was released and
#: its reported demand catches up), seconds.
QUIET_S = 2.0
#: Steps kept for ``status``.
MAX_EVENTS = 64


# ---------------------------------------------------------------------------------------------- the option
def dynamic_gpus(value: str | Iterable[int] | None, topology: NodeTopology) -> tuple[int, ...]:
    """The GPUs ``--dynamic-mig`` names (``"0,1"``, ``"all"``: every GPU in MIG mode, a list), checked.

    Returns:
        Device indices, ascending; ``()`` for None / ``""`` / ``"off"``.

    Raises:
        ClusterError: a GPU the node lacks, one not in MIG mode (enabling it is the operator's: a GPU reset),
            failed, or whose instances dynamic MIG cannot name; ``all`` with no GPU in MIG mode; anything else
            (one line naming the value).
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off", "none")):
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "all":
            out = tuple(d.index for d in sorted(topology.devices, key=lambda d: d.index) if d.mig_mode is True)
            if not out:
                raise ClusterError("dynamic-mig=all: no GPU of this node is in MIG mode (enabling it is the "
                                   "operator's: `nvidia-smi -i N -mig 1` and a GPU reset)")
            return tuple(i for i in out if _check(i, topology) is None) or _fail(out, topology)
        parts = [p.strip() for p in text[:200].split(",")]
        if not all(p.isdigit() for p in parts):
            raise ClusterError(f"dynamic-mig={text[:60]!r}: expected GPU indices such as 0,1 (or all)")
        idx = [int(p) for p in parts]
    else:
        try:
            idx = list(value)
        except TypeError:
            raise ClusterError(f"dynamic-mig: expected GPU indices such as [0, 1] or '0,1', got "
                               f"{type(value).__name__}") from None
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in idx):
            raise ClusterError(f"dynamic-mig: expected GPU indices such as [0, 1], got {str(value)[:60]}")
    if len(set(idx)) != len(idx):
        raise ClusterError(f"dynamic-mig: GPU {next(i for i in idx if idx.count(i) > 1)} is named twice")
    for i in idx:
        why = _check(i, topology)
        if why is not None:
            raise ClusterError(f"dynamic-mig: {why}")
    return tuple(sorted(idx))


def _check(i: int, topology: NodeTopology) -> str | None:
    if i not in topology.indices:
        return f"this node has no GPU {i} (GPUs {list(topology.indices)})"
    return check_dynamic(topology.device(i))


def _fail(gpus: Sequence[int], topology: NodeTopology) -> tuple[int, ...]:
    raise ClusterError(f"dynamic-mig=all: {_check(gpus[0], topology)}")


# ---------------------------------------------------------------------------------------------- Ray's side
class Holds(Protocol):
    """How the agent holds units in Ray's ledger (:class:`RayHolds`; tests give a fake)."""

    def held(self) -> dict[str, int]:
        """Resource -> how many units this node's holds have placed."""

    def hold(self, resource: str, n: int = 1) -> int:
        """Hold ``n`` more units of ``resource``; returns how many were placed in time (the rest are removed)."""

    def release(self, resource: str, n: int = 1) -> int:
        """Release ``n`` of the holds of ``resource``; returns how many."""

    def demand(self) -> dict[str, int]:
        """Resource -> units of it Ray's queued tasks and actors wait for."""

    def used(self) -> dict[str, float]:
        """Resource -> units Ray shows in use on this node, not counting the holds."""


class RayHolds:
    """:class:`Holds` through Ray: one detached one-bundle placement group per held unit, pinned to the node."""

    def __init__(self, node_key: str, node_id: str, gcs_address: str | None = None):
        self.node_key = node_key
        self.node_id = node_id
        self.gcs_address = gcs_address
        self.prefix = f"{DYNMIG_PREFIX}{node_key}-"
        self._groups: dict[str, list[Any]] = {}  # resource -> placed groups (handles)
        self._total: dict[str, float] | None = None
        self._adopt()

    def _adopt(self) -> None:
        """Take over the holds a previous agent of the node left (they are detached: they outlive it)."""
        from rayaccel.ray import _ray_private as rp

        for gid, row in rp.group_nodes().items():
            name = row["name"]
            if not name.startswith(self.prefix) or row["state"] == "REMOVED":
                continue
            r = name[len(self.prefix):].rsplit("-", 1)[0]
            self._groups.setdefault(r, []).append(rp.group_handle(gid))

    def held(self) -> dict[str, int]:
        return {r: len(g) for r, g in self._groups.items() if g}

    def hold(self, resource: str, n: int = 1) -> int:
        import ray

        from rayaccel.ray import _ray_private as rp

        made = [rp.pinned_group([{resource: 1.0}], self.node_id, {NODE_KEY_LABEL: self.node_key},
                                f"{self.prefix}{resource}-{_uuid.uuid4().hex[:8]}") for _ in range(n)]
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        placed = []
        for pg in made:
            try:
                placed.append(pg.wait(max(0.1, deadline - time.monotonic())))
            except Exception as e:  # noqa: BLE001 - a group that cannot be placed is removed below
                log.warning("rayaccel dynamic MIG: holding %s: %s", resource, e)
                placed.append(False)
        where = rp.group_nodes() if any(placed) else {}  # one read of the GCS's table for every group placed
        ok = 0
        for pg, was in zip(made, placed):
            if was and where.get(pg.id.hex(), {}).get("nodes", []) == [self.node_id]:
                self._groups.setdefault(resource, []).append(pg)
                ok += 1
            else:
                ray.util.remove_placement_group(pg)
        return ok

    def release(self, resource: str, n: int = 1) -> int:
        import ray

        gs = self._groups.get(resource, [])
        out = 0
        while gs and out < n:
            ray.util.remove_placement_group(gs.pop())
            out += 1
        return out

    def release_all(self) -> int:
        """Remove every hold (the agent's exit once its node is gone: they would wait for it forever)."""
        return sum(self.release(r, len(g)) for r, g in list(self._groups.items()))

    def demand(self) -> dict[str, int]:
        import ray

        from rayaccel.ray import _ray_private as rp

        addr = self.gcs_address or ray.get_runtime_context().gcs_address
        rows = [(b, n, pg) for b, n, pg in rp.pending_demand(addr)
                if any(r.startswith(MIG_RESOURCE_PREFIX) and v > 0 for r, v in b.items())]
        if any(pg is not None for _, _, pg in rows):  # never a hold's own group (this node's or another's)
            names = {gid: row["name"] for gid, row in rp.group_nodes().items()}
            rows = [(b, n, pg) for b, n, pg in rows
                    if pg is None or not (names.get(pg) or "").startswith(DYNMIG_PREFIX)]
        out: dict[str, int] = {}
        for bundle, count, _ in rows:
            for r, v in bundle.items():
                if r.startswith(MIG_RESOURCE_PREFIX) and v > 0:
                    out[r] = out.get(r, 0) + int(round(v)) * count
        return out

    def used(self) -> dict[str, float]:
        from rayaccel.ray import _ray_private as rp

        if self._total is None:
            self._total = {r: float(v) for r, v in rp.total_resources_per_node().get(self.node_id, {}).items()
                           if r.startswith(MIG_RESOURCE_PREFIX)}
        avail = rp.available_resources_per_node().get(self.node_id, {})
        held = self.held()
        return {r: t - float(avail.get(r, 0.0)) - held.get(r, 0) for r, t in self._total.items()}


# ---------------------------------------------------------------------------------------------- the agent side
class DynamicMig:
    """The agent's dynamic MIG (module docstring): one per node with ``--dynamic-mig`` GPUs, run every period.

    Args:
        topology: the node's topology (the record's); gpus: its dynamic-MIG GPUs.
        arbiter: the node's :class:`~rayaccel.arbiter.statefile.Arbiter` (the lock, the dynamic-MIG file, the log).
        ops: an :class:`~rayaccel.discovery.nvidia_mig.NvmlMigOps` on the node's NVML (a simulated node's FakeNVML).
        holds: Ray's side (:class:`Holds`).
        alive: whether a holder's pid lives (the arbiter's test).
    """

    def __init__(self, topology: NodeTopology, gpus: Sequence[int], arbiter: Any, ops: Any, holds: Holds):
        self.topology = topology
        self.gpus = tuple(gpus)
        self.arbiter = arbiter
        self.ops = ops
        self.holds = holds
        self.events: list[dict] = []
        self.error: str | None = None
        self.last_demand: dict[str, int] = {}
        self._quiet_until = 0.0
        self._busy = threading.Lock()  # the agent's loop and a `status` request may both run a period
        self.parts: dict[str, Partition] = {}
        for g in self.gpus:
            for p in ops.instances(g):
                self.parts[instance_unit(p)] = p
        self.units: dict[str, tuple[str, ...]] = {}  # resource -> its units on the dynamic GPUs
        for g in self.gpus:
            for profile, us in dynamic_units(topology.device(g)).items():
                self.units[mig_resource(profile)] = self.units.get(mig_resource(profile), ()) + us

    # ------------------------------------------------------------------ state
    def live(self) -> dict[str, str]:
        """Dynamic unit -> MIG UUID of every instance that exists now."""
        return {u: p.uuid for u, p in self.parts.items() if p.uuid}

    def devices(self) -> list[Device]:
        """The dynamic GPUs with their instances now (what the planner plans over)."""
        out = []
        for g in self.gpus:
            parts = tuple(p for u, p in sorted(self.parts.items()) if p.parent == g)
            out.append(replace(self.topology.device(g), partitions=parts))
        return out

    def want_held(self) -> dict[str, int]:
        """Resource -> units without an instance (what Ray's ledger must hold)."""
        live = self.live()
        return {r: sum(1 for u in us if u not in live) for r, us in self.units.items()}

    def busy(self, st: Any) -> tuple[set[str], dict[str, int]]:
        """Units with work: held by a live holder (waiting ones too: Ray granted them), or -- where Ray shows more in
        use than holders report (a grant no worker has reported yet) -- every instance of that profile; and, per
        resource, how many units Ray shows in use beyond what holders report."""
        out: set[str] = set()
        hooked: dict[str, int] = {}
        for pid, h in st.holders.items():
            if not self.arbiter.alive(pid):
                continue
            for r, slots in h.slots.items():
                if r not in self.units:
                    continue
                pool = st.pools.get(r, ())
                for s, _ in slots:
                    if 0 <= s < len(pool):
                        out.add(pool[s])
                hooked[r] = hooked.get(r, 0) + len(slots)
        try:
            used = self.holds.used()
        except Exception as e:  # noqa: BLE001 - unknown: count every instance busy (nothing is destroyed)
            log.warning("rayaccel dynamic MIG: Ray's use unknown (%s); destroying nothing this round", e)
            used = {r: float("inf") for r in self.units}
        extra: dict[str, int] = {}
        for r, n in used.items():
            if r in self.units and n > hooked.get(r, 0) + 1e-6:
                out.update(u for u in self.units[r] if u in self.parts)
                extra[r] = int(min(n - hooked.get(r, 0), len(self.units[r])) + 0.5)
        return out, extra

    # ------------------------------------------------------------------ setup and the period
    def setup(self) -> None:
        """Publish the instances that exist and hold the units that do not (idempotent; a restarted agent adopts)."""
        self.arbiter.exclusive(lambda st: self.arbiter.write_live(self.live()))
        self.reconcile()

    def reconcile(self) -> None:
        """Make Ray's holds match the units without an instance (more after a lost hold, fewer after a create)."""
        held = self.holds.held()
        for r, want in sorted(self.want_held().items()):
            have = held.get(r, 0)
            if have < want:
                got = self.holds.hold(r, want - have)
                if got < want - have:
                    self.error = f"{r}: {want - have - got} unit(s) could not be held in Ray's ledger (retrying)"
            elif have > want:
                self.holds.release(r, have - want)

    def __call__(self, agent: Any = None) -> None:
        """One period (an agent extension): reconcile, read the demand, plan, apply; skipped while one runs."""
        if not self._busy.acquire(blocking=False):
            return
        try:
            self.tick()
        finally:
            self._busy.release()

    def tick(self) -> list[dict]:
        """One period; returns the events of the steps taken."""
        self.error = None
        self.reconcile()
        try:
            demand = self.holds.demand()
        except Exception as e:  # noqa: BLE001 - demand is read again next period
            self.error = f"Ray's pending demand unreadable: {e}"
            return []
        self.last_demand = {r: n for r, n in demand.items() if r in self.units and n > 0}
        if not self.last_demand or time.monotonic() < self._quiet_until:
            return []
        st = self.arbiter.read()
        busy, unreported = self.busy(st)
        # Ray's demand lags its grants: a unit Ray granted that no worker reported yet is no longer waited for
        want = {r[len(MIG_RESOURCE_PREFIX):]: n - unreported.get(r, 0) for r, n in self.last_demand.items()
                if n - unreported.get(r, 0) > 0}
        if not want:
            return []
        try:
            plan = plan_steps(self.devices(), want, busy)
        except RequestError as e:
            self.error = str(e)
            return []
        out = []
        for step in plan.steps:
            ev = self.apply(step)
            out.append(ev)
            if not ev["ok"]:
                break  # the rest assumed this one; plan again next period
        if out:  # let Ray grant what was released and its demand catch up before planning again
            self._quiet_until = time.monotonic() + QUIET_S
        return out

    # ------------------------------------------------------------------ the steps
    def apply(self, step: MigStep) -> dict:
        """Apply one step (module docstring); returns its event (also logged and kept for ``status``)."""
        ev = {"at": time.time(), "action": step.action, "gpu": step.gpu, "profile": step.profile,
              "start": step.start, "unit": step.unit, "why": step.why, "uuid": None, "ok": False, "error": None}
        try:
            if step.action == "create":
                ev["uuid"] = self._create(step)
            elif step.action == "destroy":
                ev["uuid"] = self._destroy(step)
            else:
                raise ClusterError(f"unknown MIG step {step.action!r}")
            ev["ok"] = True
        except (ClusterError, BackendError) as e:
            ev["error"] = str(e)[:300]
        self._record(ev)
        return ev

    def _create(self, step: MigStep) -> str:
        profile = self.topology.device(step.gpu).profile(step.profile)
        if profile is None:
            raise ClusterError(f"GPU {step.gpu} has no MIG profile {step.profile}")
        part = self.ops.create(step.gpu, profile, step.start)
        unit = instance_unit(part)
        self.parts[unit] = part
        self.arbiter.exclusive(lambda st: self.arbiter.write_live(self.live()))
        self.holds.release(mig_resource(step.profile), 1)  # Ray may grant it now
        return part.uuid or ""

    def _destroy(self, step: MigStep) -> str:
        unit = step.unit
        part = self.parts.get(unit)
        if part is None or part.gi_id is None:
            raise ClusterError(f"no instance {unit} to destroy")
        r = mig_resource(step.profile)
        if self.holds.hold(r, 1) < 1:  # Ray's ledger first: nobody is granted it meanwhile
            raise ClusterError(f"{unit}: could not hold it in Ray's ledger before destroying it")

        def take_out(st: Any) -> bool:
            if unit in self.busy(st)[0]:
                return False
            del self.parts[unit]
            self.arbiter.write_live(self.live())
            return True

        if not self.arbiter.exclusive(take_out):
            self.holds.release(r, 1)
            raise ClusterError(f"{unit} has work now; not destroyed")
        try:
            self.ops.destroy(step.gpu, part.gi_id)
        except BackendError:
            self.parts[unit] = part  # still there: hand it out again
            self.arbiter.exclusive(lambda st: self.arbiter.write_live(self.live()))
            self.holds.release(r, 1)
            raise
        return part.uuid or ""

    def _record(self, ev: dict) -> None:
        self.events = (self.events + [ev])[-MAX_EVENTS:]
        what = (f"{ev['action']} {ev['profile']} at slice {ev['start']} of GPU {ev['gpu']}"
                + (f" ({ev['uuid']})" if ev["uuid"] else ""))
        if ev["ok"]:
            log.info("rayaccel dynamic MIG: %s: %s", what, ev["why"])
        else:
            log.warning("rayaccel dynamic MIG: %s failed: %s", what, ev["error"])
        try:
            self.arbiter.log_step({"dynmig": ev})
        except OSError:
            pass

    def summary(self) -> dict:
        """What the snapshot shows (``rayaccel status``): GPUs, instances, holds, demand, recent steps, error."""
        return {"gpus": list(self.gpus), "instances": self.live(), "held": self.holds.held(),
                "demand": dict(self.last_demand), "events": list(self.events[-32:]), "error": self.error}


def simulated_ops(topology: NodeTopology, node_dir: str) -> Any:
    """NVML's MIG calls on a simulated node: a FakeNVML of its topology, with the instances the node's dynamic-MIG
    file says a previous agent made (so a restarted agent sees the same instances, by the same UUIDs)."""
    from rayaccel.arbiter.table import decode_live
    from rayaccel.discovery.nvidia_mig import NvmlMigOps
    from rayaccel.testing import FakeNVML

    path = os.path.join(node_dir, DYNMIG_FILE)
    try:
        with open(path, "rb") as f:
            live = decode_live(f.read())
    except (OSError, ValueError) as e:
        live = None
        if not isinstance(e, FileNotFoundError):
            log.warning("rayaccel dynamic MIG: %s unreadable (%s); starting from the node's topology", path, e)
    fake = FakeNVML(topology)
    ops = NvmlMigOps(fake)
    if live is not None:
        _replay(ops, topology, live)
    return ops


def _replay(ops: Any, topology: NodeTopology, live: Mapping[str, str]) -> None:
    """Bring a fresh FakeNVML to the instances ``live`` names (destroy the others, create the missing ones)."""
    have = {}
    for d in topology.devices:
        if d.mig_mode is True:
            for p in ops.instances(d.index):
                if p.start is not None:
                    have[instance_unit(p)] = p
    for u, p in have.items():
        if u not in live and p.gi_id is not None:
            try:
                ops.destroy(p.parent, p.gi_id)
            except BackendError:
                pass
    for u, uuid in live.items():
        pu = parse_unit(u)
        if pu is None or u in have:
            continue
        gpu, name, start = pu
        prof = topology.device(gpu).profile(name) if gpu in topology.indices else None
        if prof is None:
            continue
        try:
            ops.create(gpu, prof, start)  # a new UUID: a simulated restart renames its instances
        except BackendError:
            continue


def attach(agent: Any) -> DynamicMig | None:
    """Start the agent's dynamic MIG when its node has ``--dynamic-mig`` GPUs: publish the instances, hold the
    rest in Ray's ledger (before the agent answers: nothing is granted a unit that does not exist), and run every
    period. None when the node has none."""
    rec = agent.record
    if not rec.dynamic_mig:
        return None
    if rec.simulated:
        ops = simulated_ops(rec.topology, agent.dir)
    else:
        from rayaccel.discovery.nvidia_mig import host_ops

        ops = host_ops()
    dm = DynamicMig(rec.topology, rec.dynamic_mig, agent.arbiter, ops, RayHolds(rec.node_key, agent.node_id))
    dm.setup()
    agent.dynmig = dm
    agent.extensions.append(dm)
    return dm


__all__ = ["DynamicMig", "HOLD_TIMEOUT_S", "Holds", "RayHolds", "attach", "dynamic_gpus", "simulated_ops"]
