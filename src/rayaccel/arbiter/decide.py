"""The grant decision and the other state transitions: pure functions of (state, request, table).

Ray decides *how many* units a worker gets and which slot indices (the lowest free
ones); :func:`decide` decides which physical units stand behind those slots:

1. drop holders whose process is gone, and reservations of placement groups the
   caller has learned are removed (``GrantRequest.gone``: asked of Ray *outside* the
   node lock -- nothing here talks to anything);
2. the candidate slots are the granted ones plus every slot no live holder pins (a
   waiting holder, or a drain placeholder not yet on its device, pins nothing);
3. the chooser (:class:`Chooser`) picks the best set among the candidates' units,
   leaving out drained devices and units reserved for placement-group members that
   have not arrived yet; a group's first member reserves the best set for all of the
   group's units on the node, handed out by bundle index;
4. only the candidates' images are permuted, so the granted slots get that set: slots
   in use never change their unit, and the units in use are exactly the images of the
   slots in use -- no unit is held twice.

A grant that cannot be served now comes back with ``waiting`` set (the caller retries)
and, when reservations stand in the way, ``blocked_by``: the groups to ask Ray about.
The arbiter (:mod:`.statefile`) calls these under its lock; tests call them directly.
"""

# no `from __future__ import annotations`: string annotations make each NamedTuple compile its fields
# (~0.1 ms apiece), and every Ray worker of a rayaccel node imports this module

from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Protocol

from ..contract import LEAK_DRAIN_BY
from .state import EPS, GPU, ArbiterState, Drain, Holder, Reservation
from .table import NodeTable


class GrantRequest(NamedTuple):
    """One grant as a worker sees it.

    Attributes:
        pid: the worker process. key: the grant's identity (``task:<id>`` / ``actor:<id>``).
        slots: Ray resource -> ``((slot, fraction), ...)`` the raylet granted.
        pg / bundle: placement group (hex) and bundle index when the grant is a member's.
        pg_bundles: the group's units per bundle on this node (``{bundle: amount}``), given by
            the caller when no reservation exists yet (:func:`needs_reservation`).
        request: a :class:`~rayaccel.placement.Request` with constraints Ray cannot express
            (``rayaccel.remote``'s interconnect, same_numa, ...), or None.
        drain: for a drain placeholder, the device it must end up holding.
        info: what status shows of the holder (``name``, ``kind``, ``job``).
        gone: placement groups the caller learned (from Ray, outside the lock) are removed.
    """

    pid: int
    key: str
    slots: Mapping[str, tuple[tuple[int, float], ...]] = {}
    pg: str | None = None
    bundle: int | None = None
    pg_bundles: Mapping[int, float] | None = None
    request: Any = None
    drain: int | None = None
    info: Mapping[str, str] = {}
    gone: frozenset[str] = frozenset()


class Grant(NamedTuple):
    """What the arbiter decided, with what it was asked: the one value a worker keeps for its grant.

    Attributes:
        units: Ray resource -> the units behind its granted slots, in order (ring order for a set).
        waiting: why the grant cannot be served yet (None when served): the caller retries;
            meanwhile its slots are not pinned, so other grants may re-map them.
        blocked_by: placement groups whose reservations keep it waiting (the caller asks Ray
            whether they still exist, outside the lock, and retries with ``gone``).
        asked: the :class:`GrantRequest` this answers (its ``key`` is the key the state file holds).
        seconds: time spent under the lock (set by the arbiter).
        state_mtime_ns: the state file's modification time as this grant wrote it (set by the arbiter):
            while the file still has it, nothing on the node changed since.
        parents: on a node given MIG UUIDs (its ``GPU`` units are MIG instances, table kind ``mig``): the devices
            of the ``GPU`` units, in order, each once (the table's ``device_of``); None where ``GPU`` units are devices.
    """

    units: Mapping[str, tuple] = {}
    waiting: str | None = None
    blocked_by: frozenset[str] = frozenset()
    asked: GrantRequest | None = None
    seconds: float = 0.0
    state_mtime_ns: int | None = None
    parents: tuple[int, ...] | None = None

    @property
    def devices(self) -> tuple[int, ...]:
        """The devices behind the ``GPU`` slots, in order (a node given MIG UUIDs: the instances' parents)."""
        return self.parents if self.parents is not None else tuple(self.units.get(GPU, ()))

    @property
    def partitions(self) -> tuple[str, ...]:
        """The MIG instances behind MIG-profile slots (a node given MIG UUIDs: behind its ``GPU`` slots too)."""
        return tuple(u for r, us in self.units.items() if r.startswith("mig_") or (r == GPU and self.parents is not None)
                     for u in us)


if TYPE_CHECKING:  # the interface, for type checkers: a typing.Protocol costs ~1 ms to create, on every worker's path
    class Chooser(Protocol):
        """Picks units for a grant (:class:`~.choose.TableChooser`: the table's plans, else the placer)."""

        def choose(self, resource: str, avail: frozenset, k: int, request: Any) -> tuple[tuple | None, str]:
            """``k`` units of ``resource`` among ``avail`` in ring order, or ``(None, why)``."""

        def gang(self, resource: str, avail: frozenset, sizes: Mapping[int, int]) -> Mapping[int, tuple] | None:
            """The best set for a placement group's bundles (``{bundle: size}``) among ``avail``, by bundle."""


def needs_reservation(st: ArbiterState, pg: str) -> bool:
    """True when no reservation exists yet for placement group ``pg`` (the caller should pass ``pg_bundles``)."""
    return pg not in st.pgs


def decide(st: ArbiterState, req: GrantRequest, table: NodeTable, *, chooser: "Chooser",
           alive: Callable[[int], bool], now: float) -> tuple[ArbiterState, Grant]:
    """Decide which units stand behind ``req``'s slots (module docstring); return the new state and the grant."""
    pgs = {g: r for g, r in st.pgs.items() if g not in req.gone} if req.gone else dict(st.pgs)
    holders: dict[int, Holder] = {}
    before = None
    if not any(req.slots.values()):  # a release: this worker's record goes, and dead holders'
        for p, h in st.holders.items():
            if p == req.pid:
                before = h
            elif alive(p):
                holders[p] = h
        return st._replace(holders=holders, pgs=pgs), Grant(asked=req)
    pools = {r: list(u) for r, u in st.pools.items()}
    # Ray granted these slots whole: any other record of them is stale (its task ended).
    whole = {r: w for r, slots in req.slots.items() if (w := {s for s, f in slots if f >= 1 - EPS})}
    pinned: dict[str, set[int]] = {r: set() for r in (*req.slots, *table.unit_resources()) if r in pools}
    for p, h in st.holders.items():  # one pass: this worker's record, dead holders, stale slots, pinned slots
        if p == req.pid:
            before = h
            continue
        if not alive(p):
            continue
        if whole:
            for r, had in h.slots.items():
                w = whole.get(r)
                if w is not None and any(s in w for s, _ in had):
                    h = h._replace(slots={**h.slots, r: tuple((s, f) for s, f in had if s not in w)})
        holders[p] = h
        if h.waiting or (h.drain is not None and not h.pins(pools, table.device_of)):
            continue  # a waiting grant, or a drain placeholder not on its device yet, pins nothing
        for r, slots in h.slots.items():
            mine = pinned.get(r)
            if mine is not None:
                mine.update([s for s, _ in slots])
    since = before.since if before is not None and before.key == req.key else now
    info = req.info
    if req.drain is not None and any(req.slots.values()):
        # A drain placeholder never uses a device: it records its slots and is moved onto its target.
        holders[req.pid] = Holder(req.key, dict(req.slots), since, info.get("name", ""), info.get("kind", ""),
                                  info.get("job", ""), drain=req.drain)
        _settle_drains(pools, holders, pinned, table)
        got = {r: tuple(pools[r][s] for s, _ in slots) for r, slots in req.slots.items() if r in pools}
        return _state(st, pools, holders, pgs), Grant(got, asked=req, parents=_parents(got, table))
    _settle_drains(pools, holders, pinned, table)
    units: dict[str, tuple] = {}
    waiting = None
    blocked: frozenset[str] = frozenset()
    for r, slots in req.slots.items():
        t = table.resources.get(r)
        if not slots:
            continue
        if t is None:
            waiting = f"{r} is not a resource this node's arbiter maps"
            break
        if t.kind == "mig":
            got, waiting = _instances(r, slots, pools, holders, st.drained, table, req.pid)
        else:
            got, waiting, blocked = _units(r, slots, pools, holders, pgs, st.drained, pinned.get(r, set()), req,
                                           table, chooser, now)
        if waiting is not None:
            break
        units[r] = got
    holders[req.pid] = Holder(req.key, dict(req.slots), since, info.get("name", ""), info.get("kind", ""),
                              info.get("job", ""), req.pg, req.bundle, waiting)
    grant = Grant(units, None, frozenset(), req, parents=_parents(units, table)) if waiting is None \
        else Grant({}, waiting, blocked, req)
    return _state(st, pools, holders, pgs), grant


def _parents(units: Mapping[str, tuple], table: NodeTable) -> tuple[int, ...] | None:
    """The devices of the ``GPU`` units where they are MIG instances (a node given MIG UUIDs), else None."""
    t = table.resources.get(GPU)
    if t is None or t.kind != "mig":
        return None
    return tuple(dict.fromkeys(d for u in units.get(GPU, ()) if (d := t.device_of.get(u)) is not None))


def _state(st: ArbiterState, pools: dict, holders: dict, pgs: dict) -> ArbiterState:
    return ArbiterState({r: tuple(u) for r, u in pools.items()}, holders, pgs, st.drained, st.resets,
                        st.reset_reason)


def _settle_drains(pools: dict, holders: Mapping[int, Holder], pinned: dict[str, set[int]], table: NodeTable) -> None:
    """Move each drain placeholder's slots onto its target device's units once nobody uses them.

    A placeholder holds as many slots as its device has units (one GPU; a Trainium device's
    NeuronCores; on a node given MIG UUIDs, every instance of the device the node offers as a
    ``GPU``); each slot not yet on the device swaps images with a slot of a target unit that no
    live holder pins.
    """
    placeholders = [h for h in holders.values() if h.drain is not None]
    for h in placeholders:
        for r, slots in h.slots.items():
            t = table.resources.get(r)
            pool = pools.get(r)
            if t is None or (t.kind != "units" and r != GPU) or not pool:
                continue
            mine = pinned.setdefault(r, set())
            where = {u: s for s, u in enumerate(pool)}
            targets = [u for u in t.units if t.device_of.get(u) == h.drain and u in where]
            have = {pool[s] for s, _ in slots if 0 <= s < len(pool)}
            for s, _ in slots:
                if not 0 <= s < len(pool) or pool[s] in targets:
                    continue
                target = next((u for u in targets if u not in have and where[u] not in mine), None)
                if target is None:
                    continue  # still in use: the placeholder moves there once it frees
                u = where[target]
                pool[s], pool[u] = pool[u], pool[s]
                where[pool[s]], where[pool[u]] = s, u
                have.add(target)
                mine.add(s)


def _reserved(holders: Mapping[int, Holder], pgs: Mapping[str, Reservation], req: GrantRequest,
              resource: str, held: frozenset | set = frozenset()) -> dict[Any, str]:
    """unit -> group, for units reserved to members of other groups (or other bundles) and not ``held`` by a
    live holder (a bundle's members may hold part of it: a 0.5 share of a two-device bundle leaves its other
    device reserved for the bundle's next member)."""
    if not pgs:
        return {}
    present: dict[str, set] = {}
    for h in holders.values():
        if h.pg is not None and not h.waiting:
            present.setdefault(h.pg, set()).add(h.bundle)
    out: dict[Any, str] = {}
    for g, r in pgs.items():
        if r.resource != resource:
            continue
        for b, us in r.bundles.items():
            if g == req.pg and b == req.bundle:
                continue  # our own bundle
            if b in present.get(g, ()):
                # members are here: what they hold is pinned anyway; the rest stays the bundle's while they sit
                # on its reservation (a member that had to choose elsewhere releases it, as before)
                if not any(u in held for u in us):
                    continue
                us = [u for u in us if u not in held]
            for u in us:
                out[u] = g
    return out


def _units(r: str, slots: tuple, pools: dict, holders: dict, pgs: dict, drained: Mapping[int, Drain],
           pinned: set[int], req: GrantRequest, table: NodeTable, chooser: "Chooser",
           now: float) -> tuple[tuple, str | None, frozenset[str]]:
    pool = pools[r]
    dev = table.resources[r].device_of
    frac = [(s, f) for s, f in slots if f < 1 - EPS]
    if frac and frac[0][0] in pinned:
        # Sharing a slot that live holders already use: its unit is fixed.
        u = pool[frac[0][0]]
        if dev.get(u) in drained:
            return (), f"device {dev.get(u)} is drained; this share waits until its other sharers end", frozenset()
        return (u,), None, frozenset()
    mine = sorted(s for s, _ in slots)
    cand = [s for s in range(len(pool)) if s not in pinned]
    reserved = _reserved(holders, pgs, req, r, {pool[s] for s in pinned})
    avail = frozenset(u for u in (pool[s] for s in cand) if dev.get(u) not in drained and u not in reserved)
    want, why = _pick(r, avail, len(mine), bool(frac), pgs, req, chooser, now)
    if want is None:
        return (), why, frozenset(reserved.values())
    _assign(pool, cand, mine, want)
    return tuple(want), None, frozenset()


def _pick(r: str, avail: frozenset, k: int, shared: bool, pgs: dict, req: GrantRequest, chooser: "Chooser",
          now: float) -> tuple[tuple | None, str]:
    if len(avail) < k:
        return None, f"{k} unit(s) of {r} granted by Ray but only {len(avail)} free here that are neither drained " \
                     f"nor reserved"
    if req.pg is not None and req.bundle is not None:
        res = pgs.get(req.pg)
        if res is None and req.pg_bundles:
            res = _reserve(r, avail, req, pgs, chooser, now)
        if res is not None and res.resource == r:
            us = res.bundles.get(req.bundle)
            if us is not None and len(us) == k and set(us) <= avail:
                return tuple(us), ""
            if us is not None and (shared or len(us) > k):
                # a share of the bundle's device (0.5 + 0.5 colocated workers), or a member holding part of a
                # bundle: the bundle's reserved units, in their order -- what placement_map promised
                mine = tuple(u for u in us if u in avail)[:k]
                if len(mine) == k:
                    return mine, ""
            # the reservation cannot be honoured (a device drained or taken meanwhile): choose afresh, next to
            # the group's other members (a member restarted off a failed GPU stays near its peers), and keep it
            peers = _peer_devices(res, req.bundle) if res is not None and r == GPU == res.resource and not shared else ()
            if peers:
                got, why = chooser.choose(r, avail, k, _near(req.request, k, peers))
                if got:
                    pgs[req.pg] = res._replace(bundles={**res.bundles, req.bundle: tuple(got)})
                return got, why
    return chooser.choose(r, avail, k, None if shared else req.request)


def _peer_devices(res: Reservation, bundle: int) -> tuple[int, ...]:
    """The units the group's other bundles hold on this node (of ``GPU``: device indices)."""
    return tuple(sorted({u for b, us in res.bundles.items() if b != bundle for u in us}))


def _near(request: Any, k: int, peers: tuple[int, ...]) -> Any:
    """``request`` (or a plain ``k``-device one) preferring devices near ``peers`` (imported only here: rare)."""
    from dataclasses import replace

    from rayaccel.placement import Request

    return Request(gpus=k, near=peers) if request is None else replace(request, near=peers)


def _reserve(r: str, avail: frozenset, req: GrantRequest, pgs: dict, chooser: "Chooser", now: float) -> Reservation | None:
    """Reserve the best set for all of the group's whole units on this node, by bundle index."""
    sizes = {int(b): int(round(g)) for b, g in (req.pg_bundles or {}).items()
             if g >= 1 - EPS and abs(g - round(g)) < EPS}
    if req.bundle not in sizes or sum(sizes.values()) > len(avail):
        return None
    got = chooser.gang(r, avail, sizes)
    if not got:
        return None
    res = Reservation(r, dict(got), now)
    pgs[req.pg] = res
    return res


def reserve_group(st: ArbiterState, pg: str, resource: str, pg_bundles: Mapping[int, float], table: NodeTable, *,
                  chooser: "Chooser", alive: Callable[[int], bool], now: float) -> tuple[ArbiterState, Reservation | None]:
    """Reserve placement group ``pg``'s units on this node now, as its first member's grant would.

    The driver-side form of a first member's arrival (:func:`rayaccel.placement_map`): the
    candidates are the same -- units of slots no live holder pins, not drained, not reserved for
    another group -- and so is the choice (:meth:`Chooser.gang` over the group's whole-unit
    bundles here). Idempotent: an existing reservation is returned unchanged, and a member that
    arrives later is handed exactly its bundle's units.

    Args:
        pg_bundles: the group's amount of ``resource`` per bundle placed on this node.

    Returns:
        The new state and the reservation (None when the group has no whole-unit bundle here, or
        not enough free units: its members then choose at their grants, as without a reservation).
    """
    have = st.pgs.get(pg)
    if have is not None:
        return st, have
    pool = st.pools.get(resource)
    t = table.resources.get(resource)
    if pool is None or t is None or t.kind == "mig":
        return st, None
    pinned: set[int] = set()
    holders = {p: h for p, h in st.holders.items() if alive(p)}
    pools = {r: list(u) for r, u in st.pools.items()}
    for h in holders.values():
        if h.waiting or (h.drain is not None and not h.pins(pools, table.device_of)):
            continue
        pinned.update(s for s, _ in h.slots.get(resource, ()))
    req = GrantRequest(pid=-1, key="reservation", pg=pg, pg_bundles=pg_bundles)
    reserved = _reserved(holders, st.pgs, req, resource, {pool[s] for s in pinned if 0 <= s < len(pool)})
    dev = t.device_of
    avail = frozenset(u for s, u in enumerate(pool)
                      if s not in pinned and dev.get(u) not in st.drained and u not in reserved)
    pgs = dict(st.pgs)
    first = min((int(b) for b, g in pg_bundles.items() if g >= 1 - EPS and abs(g - round(g)) < EPS), default=None)
    if first is None:
        return st, None
    res = _reserve(resource, avail, req._replace(bundle=first), pgs, chooser, now)
    if res is None:
        return st, None
    return st._replace(pgs=pgs), res


def _assign(pool: list, cand: list[int], mine: list[int], want: tuple) -> None:
    """Give ``mine`` (sorted slots) the units ``want`` by permuting images among ``cand`` only."""
    wanted = set(want)
    freed = [pool[s] for s in mine if pool[s] not in wanted]
    mine_set = set(mine)
    displaced = [s for s in cand if s not in mine_set and pool[s] in wanted]
    for s, u in zip(displaced, freed):
        pool[s] = u
    for s, u in zip(mine, want):
        pool[s] = u


def _instances(r: str, slots: tuple, pools: dict, holders: dict, drained: Mapping[int, Drain],
               table: NodeTable, pid: int = -1) -> tuple[tuple, str | None]:
    """MIG instances behind ``slots`` of ``r`` (a ``mig_<profile>``, or ``GPU`` on a node given MIG UUIDs).

    A slot keeps its instance unless that one is drained (or, dynamic MIG, does not exist): it then swaps images
    with a slot no live holder uses and this grant does not hold. A slot another live holder uses too (Ray granted
    it fractionally to both: two ``num_gpus=0.5`` tasks on one instance) never moves: the share stays on that
    instance, and waits while its device is drained -- swapping it would move the other holder's instance.
    """
    units = pools[r]
    t = table.resources[r]
    dev = t.device_of
    # a dynamic-MIG unit ("0:1g.5gb@2") is handed out only while its instance exists (it has a UUID): the node's
    # agent holds the others in Ray's ledger, so Ray's free count is the existing free instances'
    absent = {u for u in units if "@" in str(u) and u not in t.uuid_of}
    # slots live holders use (a waiting grant, or a drain placeholder not on its device yet, uses none)
    used = {s for p, h in holders.items() if p != pid and not h.waiting
            and (h.drain is None or h.pins(pools, table.device_of)) for s, _ in h.slots.get(r, ())}
    mine = {s for s, _ in slots}
    out = []
    for slot, _ in slots:
        if not 0 <= slot < len(units):
            return (), f"{r} slot {slot} is not a MIG instance of this node"
        u = units[slot]
        if slot in used:  # shared with a live holder: its instance is fixed
            if dev.get(u) in drained:
                return (), f"device {dev.get(u)} is drained; this share of {r} waits until its other sharers end"
            out.append(u)
            continue
        if dev.get(u) in drained or u in absent:
            ok = [s for s in range(len(units)) if s not in used and s not in mine
                  and dev.get(units[s]) not in drained and units[s] not in absent]
            if not ok:
                return (), (f"no free {r} instance outside drained devices"
                            + (" (the node's agent creates one: dynamic MIG)" if absent else ""))
            other = ok[0]
            units[slot], units[other] = units[other], units[slot]
        out.append(units[slot])
    return tuple(out), None


# ------------------------------------------------------------------ the other transitions
def release(st: ArbiterState, pid: int, key: str | None = None) -> ArbiterState | None:
    """Forget ``pid``'s grant (only grant ``key`` when given); None when nothing changes. Idempotent."""
    h = st.holders.get(pid)
    if h is None or (key is not None and h.key != key):
        return None
    holders = dict(st.holders)
    del holders[pid]
    return st._replace(holders=holders)


def reap(st: ArbiterState, alive: Callable[[int], bool]) -> tuple[ArbiterState, int]:
    """Drop holders whose process is gone; return the new state and how many."""
    dead = [p for p in st.holders if not alive(p)]
    if not dead:
        return st, 0
    return st._replace(holders={p: h for p, h in st.holders.items() if p not in dead}), len(dead)


def memberless_groups(st: ArbiterState) -> set[str]:
    """Reserved groups none of whose members holds a grant here (the ones worth asking Ray about)."""
    present = {h.pg for h in st.holders.values() if h.pg is not None}
    return {g for g in st.pgs if g not in present}


def forget_groups(st: ArbiterState, gone: set[str] | frozenset[str]) -> tuple[ArbiterState, list[str]]:
    """Drop the reservations of groups in ``gone`` that have no member here; return them."""
    present = {h.pg for h in st.holders.values() if h.pg is not None}
    drop = sorted(g for g in st.pgs if g in gone and g not in present)
    if not drop:
        return st, []
    return st._replace(pgs={g: r for g, r in st.pgs.items() if g not in drop}), drop


def drain(st: ArbiterState, device: int, reason: str, by: str, now: float) -> tuple[ArbiterState, bool]:
    """Mark ``device`` drained; False when it already was.

    A leak watcher's fence (``by="leak"``) gives way to an operator's or the health watcher's drain (which
    then replaces it, so lifting the fence when the leak ends never lifts their drain); never the reverse.
    """
    old = st.drained.get(device)
    if old is not None and not (old.by == LEAK_DRAIN_BY and by != LEAK_DRAIN_BY):
        return st, False
    return st._replace(drained={**st.drained, device: Drain(reason, now, by)}), True


def undrain(st: ArbiterState, device: int, only_by: str | None = None) -> tuple[ArbiterState, bool]:
    """Lift a drain; False when ``device`` was not drained (or, with ``only_by``, drained by someone else)."""
    if device not in st.drained or (only_by is not None and st.drained[device].by != only_by):
        return st, False
    return st._replace(drained={d: v for d, v in st.drained.items() if d != device}), True
