"""The shared formats of a node, typed, with their encoding and validation -- one home for all three.

* :class:`ArbiterState` -- the arbiter's state file (``arbiter.state`` in the node
  directory): the slot -> unit map of every resource, the holders, placement-group
  reservations, drains. Read and written under the node lock by the arbiter only.
* :class:`Holder` -- one process's grant in that state.
* :class:`Snapshot` -- what the node agent publishes about once a second (GCS KV
  ``state/<key>``) and what drivers, ``status``, ``top``, ``doctor`` and the metrics
  read: free devices, holders, drains, health. :func:`snapshot_of` derives it from the
  state; :func:`device_state` is the one classification of a device (free / busy /
  shared / mig / drained / failed) that status and metrics both use.

The types are ``typing.NamedTuple`` rather than frozen dataclasses on purpose: this
module is imported by every Ray worker of a rayaccel node (through the hook), and a
frozen, slotted dataclass costs ~1-2 ms to create at import, a NamedTuple ~0.3 ms.
They are immutable; ``dict`` fields are never mutated after construction (the pure
transitions in :mod:`.decide` build new states). Nothing here imports ``ray``.
"""

# no `from __future__ import annotations`: string annotations make each NamedTuple compile its fields
# (~0.1 ms apiece), and every Ray worker of a rayaccel node imports this module

import json
import marshal
import math
import zlib
from typing import Any, Mapping, NamedTuple

from ..contract import LEAK_DRAIN_BY, SNAPSHOT_SCHEMA, STATE_SCHEMA, load_json
from ..errors import StateError

#: The state file's schema tag (a file with another tag is rebuilt, never misread).
SCHEMA = STATE_SCHEMA
#: Ray's ``GPU`` resource.
GPU = "GPU"
#: One device's states, as :func:`device_state` names them (``leaked``: fenced by the leak watcher).
STATES = ("free", "busy", "shared", "mig", "drained", "leaked", "failed")
#: Fractions within this of 1.0 are whole units.
EPS = 1e-6
#: The largest published snapshot a reader accepts, bytes.
MAX_SNAPSHOT_BYTES = 4 << 20


# ------------------------------------------------------------------ the arbiter's state
class Drain(NamedTuple):
    """A drained device: no new grant maps to it.

    Attributes:
        reason: why (an operator's words or the health event). since: epoch seconds.
        by: ``operator`` or ``health``.
    """

    reason: str
    since: float
    by: str = "operator"


class Reservation(NamedTuple):
    """A placement group's units on this node, by bundle index, in ring order (see :mod:`.decide`).

    Attributes:
        resource: the Ray resource the bundles hold (``GPU``, ``neuron_cores``, ...).
        bundles: bundle index -> the units reserved for it.
        since: epoch seconds.
    """

    resource: str
    bundles: Mapping[int, tuple]
    since: float


class Holder(NamedTuple):
    """One process's current grant.

    Attributes:
        key: the grant's identity (``task:<hex>`` / ``actor:<hex>``); a new key from the
            same process replaces its grant.
        slots: Ray resource -> ``((slot, fraction), ...)`` granted (fraction 1.0 = whole unit).
        since: epoch seconds of the grant.
        name / kind / job: what ``status`` shows (task or actor name, ``task``/``actor``, job id).
        pg / bundle: placement group (hex) and bundle index, when the grant is a group member's.
        waiting: why the grant cannot be served yet (None once served); a waiting holder's
            slots are not pinned, so other grants may re-map them.
        drain: for a drain placeholder, the device it must end up holding.
    """

    key: str
    slots: Mapping[str, tuple[tuple[int, float], ...]]
    since: float
    name: str = ""
    kind: str = ""
    job: str = ""
    pg: str | None = None
    bundle: int | None = None
    waiting: str | None = None
    drain: int | None = None

    def pins(self, pools: Mapping[str, tuple], device_of: Any) -> bool:
        """Does this holder pin the images of its slots? (Not while waiting; a placeholder once on target.)"""
        if self.waiting:
            return False
        if self.drain is not None:
            return self.drain in held_devices(self, pools, device_of)
        return True


class ArbiterState(NamedTuple):
    """The arbiter's state file (see module docstring).

    Attributes:
        pools: Ray resource -> slot -> unit (a permutation of the node's units of that
            resource: device indices for ``GPU``, MIG instance keys for ``mig_<profile>``).
        holders: process id -> its :class:`Holder`.
        pgs: placement group (hex) -> its :class:`Reservation`.
        drained: device index -> its :class:`Drain`.
        resets: how many times a damaged state file was rebuilt; reset_reason: the last why.
    """

    pools: Mapping[str, tuple]
    holders: Mapping[int, Holder]
    pgs: Mapping[str, Reservation]
    drained: Mapping[int, Drain]
    resets: int = 0
    reset_reason: str | None = None


def fresh_state(pools: Mapping[str, tuple], *, resets: int = 0, reset_reason: str | None = None) -> ArbiterState:
    """A state with identity slot maps and nothing held."""
    return ArbiterState({r: tuple(u) for r, u in pools.items()}, {}, {}, {}, resets, reset_reason)


def held_devices(h: Holder, pools: Mapping[str, tuple], device_of: Any) -> set[int]:
    """The devices behind holder ``h``'s slots (``device_of(resource, unit)`` maps a unit to its device)."""
    out: set[int] = set()
    for r, slots in h.slots.items():
        units = pools.get(r, ())
        for s, _ in slots:
            if 0 <= s < len(units):
                d = device_of(r, units[s])
                if d is not None:
                    out.add(d)
    return out


#: The state file starts with this tag, then a CRC-32 of the rest (4 bytes, big-endian), then the payload.
MAGIC = b"RAS2"


def encode_state(st: ArbiterState) -> bytes:
    """The state file's bytes: :data:`MAGIC`, a CRC-32, then the state as ``marshal`` data.

    ``marshal`` rather than JSON: the state is read and rewritten at every grant under the
    node-wide lock, and marshal encodes and decodes it about ten times faster (a 72-device
    node with 36 holders: ~10 us each way instead of ~90). The file is private to the node's
    user (0600 in a 0700 directory) and written only by this encoder; the checksum tells a
    damaged file, which is then rebuilt (see :class:`~.statefile.Arbiter`), from a whole one.
    """
    payload = marshal.dumps((
        SCHEMA,
        {r: tuple(u) for r, u in st.pools.items()},
        {p: tuple(h) for p, h in st.holders.items()},  # fields of builtin types: marshal takes them as they are
        {g: tuple(v) for g, v in st.pgs.items()},
        {d: tuple(v) for d, v in st.drained.items()},
        st.resets, st.reset_reason))
    return MAGIC + zlib.crc32(payload).to_bytes(4, "big") + payload


def decode_state(raw: bytes, pools: Mapping[str, tuple]) -> ArbiterState:
    """Parse a state file and check it against the node's units (``pools``: resource -> its units).

    Raises:
        StateError: not a state file of this schema, a checksum that does not match (a
            damaged file), or contents of the wrong shape (names the field); a slot map that
            is not a permutation of the node's units of that resource.
    """
    if raw[:4] != MAGIC or len(raw) < 8:
        raise StateError(f"not a {SCHEMA} state file")
    payload = raw[8:]
    if int.from_bytes(raw[4:8], "big") != zlib.crc32(payload):
        raise StateError("checksum mismatch (the file is damaged)")
    try:
        schema, got, holders, pgs, drained, resets, why = marshal.loads(payload)
    except (ValueError, EOFError, TypeError) as e:
        raise StateError(f"unreadable contents: {e}") from None
    if schema != SCHEMA:
        raise StateError(f"schema {schema!r}, expected {SCHEMA!r}", "schema")
    out_pools: dict[str, tuple] = {}
    for r, units in pools.items():
        have = got.get(r) if type(got) is dict else None
        if type(have) is not tuple or len(have) != len(units) or set(have) != set(units):
            raise StateError(f"not a permutation of the node's {len(units)} unit(s)", f"pools.{r}")
        out_pools[r] = have
    try:
        out = ArbiterState(out_pools, {p: Holder._make(h) for p, h in holders.items()},
                           {g: Reservation._make(v) for g, v in pgs.items()},
                           {d: Drain._make(v) for d, v in drained.items()}, resets, why)
    except (TypeError, AttributeError) as e:
        raise StateError(f"contents of the wrong shape: {e}") from None
    return out  # the checksum vouches for the holders: only this encoder wrote them


# ------------------------------------------------------------------ the agent's snapshot
class LockInfo(NamedTuple):
    """Who has held the node lock for a while (a stuck process stalls every grant).

    Attributes:
        pid: the holder. what: its command line (shortened). held_s: for how long, seconds.
    """

    pid: int
    what: str
    held_s: float


class SnapshotHolder(NamedTuple):
    """One holder as the snapshot shows it (devices resolved from the slot maps)."""

    pid: int
    name: str
    kind: str
    job: str
    id: str
    since: float | None
    devices: tuple[int, ...]
    partitions: tuple[str, ...]
    shared: bool
    waiting: str | None
    drain: int | None
    pg: str | None
    bundle: int | None
    units: Mapping[str, tuple[int, ...]] = {}  # resource -> unit ids, for families other than GPUs


class Snapshot(NamedTuple):
    """A node's published state (see module docstring).

    Attributes:
        at: epoch seconds. node_key: the node. free: devices of the GPU pool nobody holds
            and not drained. holders: live holders, oldest first. drained: device -> drain.
        mig_held: MIG instance keys in use. shared: device -> fraction held by shares.
        slots_held: GPU slots (fractions summed) held by hooked workers. resets: state rebuilds.
        pgs: reservations. decisions / new_decisions: ``(time, us, devices, n_mig)`` of recent
            grants / of grants since the last snapshot. unhooked_slots: GPU slots Ray shows in
            use beyond hooked holders. agent_errors: failed agent periods. health: the watcher's
            summary (``worst``, ``events``, ...) or ``{"error": ...}``. lock: a lock held long, or None.
        pool: the devices behind the node's unit resources (``GPU``'s pool, or the devices of the
            node's NeuronCores, TPU chips, ...), or None when not known (then: the GPU pool).
        leaks: the leak watcher's summary (``rows``: leaked processes, ``events``: fences, lifts and
            reclaims, ``reclaim_after_s``, ``error``; :mod:`rayaccel.ray.node.leaks`), empty when none runs.
        dynmig: dynamic MIG's summary (``gpus``, ``instances``: unit -> UUID, ``held``, ``demand``, ``events``: its
            creates and destroys, ``error``; :mod:`rayaccel.ray.node.dynmig`), empty on a node without it.
    """

    at: float
    node_key: str = ""
    free: tuple[int, ...] = ()
    holders: tuple[SnapshotHolder, ...] = ()
    drained: Mapping[int, Drain] = {}
    mig_held: tuple[str, ...] = ()
    shared: Mapping[int, float] = {}
    slots_held: float = 0.0
    resets: int = 0
    pgs: Mapping[str, Reservation] = {}
    decisions: tuple = ()
    new_decisions: tuple = ()
    unhooked_slots: float = 0.0
    agent_errors: int = 0
    health: Mapping[str, Any] = {}
    lock: LockInfo | None = None
    pool: tuple[int, ...] | None = None
    leaks: Mapping[str, Any] = {}
    dynmig: Mapping[str, Any] = {}

    def waiting(self) -> tuple[SnapshotHolder, ...]:
        """Holders whose grant waits."""
        return tuple(h for h in self.holders if h.waiting)


def snapshot_of(st: ArbiterState, device_of: Any, *, at: float, alive: Any = None,
                unit_resources: tuple[str, ...] = (GPU,)) -> Snapshot:
    """The publishable snapshot of a state (pure). ``device_of(resource, unit)`` -> device or None.

    ``unit_resources`` are the node's resources whose units are devices' (``GPU``, or
    ``neuron_cores``, ``TPU``, ...; not MIG profiles): their devices form the snapshot's
    ``pool``; a device some of whose units are held is ``shared`` by the held fraction (a GPU
    by its memory shares, a Trainium device by its NeuronCores). Holders whose process is
    not ``alive`` (when given) are left out. On a node given MIG UUIDs the ``GPU`` units are MIG
    instance keys (text, where devices are integers): a holder's are its ``partitions`` as well as
    its devices' (``mig_held`` names them; the parent is then ``mig`` in :func:`device_state`).
    """
    res = [r for r in unit_resources if r in st.pools]
    gpu_instances = any(isinstance(u, str) for u in st.pools.get(GPU, ()))
    pool: set[int] = set()
    total: dict[tuple[str, int], int] = {}
    for r in res:
        for u in st.pools[r]:
            d = device_of(r, u)
            if d is not None:
                pool.add(d)
                total[(r, d)] = total.get((r, d), 0) + 1
    used: set[int] = set()
    used_units: dict[tuple[str, int], int] = {}
    mig_held: set[str] = set()
    slots_held = 0.0
    shared: dict[int, float] = {}
    holders = []
    for pid, h in sorted(st.holders.items(), key=lambda kv: kv[1].since):
        if alive is not None and not alive(pid):
            continue
        devs: list[int] = []
        units: dict[str, tuple[int, ...]] = {}
        for r in res:
            pl = st.pools[r]
            mine = [pl[s] for s, _ in h.slots.get(r, ()) if 0 <= s < len(pl)]
            if r != GPU and mine:
                units[r] = tuple(mine)
            for u in mine:
                d = device_of(r, u)
                if d is not None and d not in devs:
                    devs.append(d)
        active = not h.waiting and (h.drain is None or h.drain in devs)
        for r in res:
            pl = st.pools[r]
            for s, f in h.slots.get(r, ()):
                if r == GPU:
                    slots_held += f
                if not active or not 0 <= s < len(pl):
                    continue
                d = device_of(r, pl[s])
                used.add(d)
                if r == GPU and f < 1 - EPS:
                    shared[d] = shared.get(d, 0.0) + f
                elif r != GPU:
                    used_units[(r, d)] = used_units.get((r, d), 0) + 1
        parts = []
        for r, slots in h.slots.items():
            if r.startswith("mig_") or (r == GPU and gpu_instances):
                pl = st.pools.get(r, ())
                parts += [pl[s] for s, _ in slots if 0 <= s < len(pl)]
        if not h.waiting:
            mig_held.update(parts)
        holders.append(SnapshotHolder(pid, h.name, h.kind, h.job, h.key.split(":")[-1], h.since,
                                      () if h.waiting else tuple(devs), tuple(parts),
                                      any(f < 1 - EPS for _, f in h.slots.get(GPU, ())), h.waiting, h.drain,
                                      h.pg, h.bundle, {} if h.waiting else units))
    for (r, d), n in used_units.items():
        if n < total.get((r, d), 0):
            shared[d] = max(shared.get(d, 0.0), n / total[(r, d)])
    free = tuple(sorted(d for d in pool if d not in used and d not in st.drained))
    return Snapshot(at=at, free=free, holders=tuple(holders), drained=dict(st.drained),
                    mig_held=tuple(sorted(mig_held)), shared={k: round(v, 4) for k, v in shared.items()},
                    slots_held=round(slots_held, 4), resets=st.resets, pgs=dict(st.pgs), pool=tuple(sorted(pool)))


def device_state(index: int, snap: Snapshot | None, *, pool: frozenset[int] | set[int],
                 partitioned: frozenset[int] | set[int]) -> str:
    """The one classification of device ``index`` (see :data:`STATES`), for status and metrics alike.

    Args:
        snap: the node's snapshot (None: nothing known yet -- a pool device is then free).
        pool: the devices of Ray's ``GPU`` pool, used when the snapshot does not name its own
            (``Snapshot.pool``: the devices behind the node's unit resources, whatever the family).
        partitioned: devices with MIG instances.
    """
    if snap is not None and snap.pool is not None:
        pool = snap.pool
    if snap is not None and index in snap.drained:
        return "leaked" if snap.drained[index].by == LEAK_DRAIN_BY else "drained"
    if index in partitioned:
        if snap is not None and any(str(k).split(":")[0] == str(index) for k in snap.mig_held):
            return "mig"
        return "free"
    if index not in pool:
        return "failed"
    if snap is None:
        return "free"
    if index in snap.shared:
        return "shared"
    return "free" if index in snap.free else "busy"


def encode_snapshot(s: Snapshot) -> str:
    """The snapshot as published (compact JSON)."""
    return json.dumps({
        "schema": SNAPSHOT_SCHEMA, "at": s.at, "node_key": s.node_key, "free": list(s.free),
        "holders": [dict(h._asdict(), devices=list(h.devices), partitions=list(h.partitions),
                         units={r: list(u) for r, u in h.units.items()}) for h in s.holders],
        "drained": {str(d): v._asdict() for d, v in s.drained.items()},
        "mig_held": list(s.mig_held), "shared": {str(k): v for k, v in s.shared.items()},
        "slots_held": s.slots_held, "resets": s.resets,
        "pgs": {g: {"resource": v.resource, "bundles": {str(b): list(u) for b, u in v.bundles.items()},
                    "since": v.since} for g, v in s.pgs.items()},
        "decisions": [list(x) for x in s.decisions], "new_decisions": [list(x) for x in s.new_decisions],
        "unhooked_slots": s.unhooked_slots, "agent_errors": s.agent_errors, "health": dict(s.health),
        "lock": s.lock._asdict() if s.lock is not None else None,
        "pool": list(s.pool) if s.pool is not None else None, "leaks": dict(s.leaks),
        **({"dynmig": dict(s.dynmig)} if s.dynmig else {}),
    }, separators=(",", ":"))


def decode_snapshot(raw: bytes | str, where: str) -> Snapshot:
    """Parse and validate a published snapshot, field by field (a damaged or forged one is refused whole).

    Raises:
        StateError: too large, not JSON, or a field of the wrong type (names it and ``where``).
    """
    d = load_json(raw, what="state snapshot", max_bytes=MAX_SNAPSHOT_BYTES, error=StateError, where=where,
                  schema=SNAPSHOT_SCHEMA, schema_optional=True)

    def bad(field: str, what: str) -> StateError:
        return StateError(f"state snapshot: {field} must be {what}", where)

    free = d.get("free")
    if not isinstance(free, list) or not all(_is_int(i) for i in free):
        raise bad("free", "a list of device indices")
    holders = d.get("holders", [])
    if not isinstance(holders, list) or not all(isinstance(h, dict) for h in holders):
        raise bad("holders", "a list of objects")
    out_h = []
    for h in holders:
        for key in ("devices", "partitions"):
            v = h.get(key, [])
            if not isinstance(v, list) or not all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in v):
                raise bad(f"holders[].{key}", "a list of device indices / instance keys")
        for key in ("name", "kind", "waiting", "job", "id", "pg"):
            if h.get(key) is not None and not isinstance(h[key], str):
                raise bad(f"holders[].{key}", "a string")
        for key in ("pid", "drain", "bundle"):
            if h.get(key) is not None and not _is_int(h[key]):
                raise bad(f"holders[].{key}", "an int")
        if h.get("since") is not None and not _is_num(h["since"]):
            raise bad("holders[].since", "a number")
        units = h.get("units", {})
        if not isinstance(units, dict) or not all(isinstance(v, list) and all(_is_int(x) for x in v)
                                                  for v in units.values()):
            raise bad("holders[].units", "an object of unit id lists")
        out_h.append(SnapshotHolder(h.get("pid") or 0, h.get("name") or "", h.get("kind") or "", h.get("job") or "",
                                    h.get("id") or "", h.get("since"),
                                    tuple(x for x in h.get("devices", []) if _is_int(x)),
                                    tuple(str(x) for x in h.get("partitions", [])), bool(h.get("shared")),
                                    h.get("waiting"), h.get("drain"), h.get("pg"), h.get("bundle"),
                                    {str(r): tuple(v) for r, v in units.items()}))
    drained = d.get("drained", {})
    if not isinstance(drained, dict) or not all(isinstance(v, dict) for v in drained.values()):
        raise bad("drained", "an object of objects")
    out_d = {}
    for k, v in drained.items():
        if not _int_text(k):
            raise bad("drained", "keyed by device index")
        if not isinstance(v.get("reason", ""), str) or not isinstance(v.get("by", ""), str) \
                or not _is_num(v.get("since", 0)):
            raise bad(f"drained.{k}", "{reason, since, by}")
        out_d[int(k)] = Drain(v.get("reason", ""), float(v.get("since", 0)), v.get("by", "operator"))
    shared = d.get("shared", {})
    if not isinstance(shared, dict) or not all(_is_num(v) for v in shared.values()) \
            or not all(_int_text(k) for k in shared):
        raise bad("shared", "an object of numbers keyed by device index")
    mig = d.get("mig_held", [])
    if not isinstance(mig, list) or not all(isinstance(x, str) for x in mig):
        raise bad("mig_held", "a list of strings")
    for key in ("at", "unhooked_slots", "slots_held"):
        if not _is_num(d.get(key, 0)):
            raise bad(key, "a number")
    for key in ("resets", "agent_errors"):
        if not _is_int(d.get(key, 0)):
            raise bad(key, "an int")
    health = d.get("health") or {}
    if not isinstance(health, dict) or not isinstance(health.get("worst", {}), dict) \
            or not isinstance(health.get("events", []), list):
        raise bad("health", "an object with worst{} and events[]")
    pgs = {}
    raw_pgs = d.get("pgs", {})
    if not isinstance(raw_pgs, dict):
        raise bad("pgs", "an object")
    for g, v in raw_pgs.items():
        if not isinstance(v, dict) or not isinstance(v.get("bundles", {}), dict) \
                or not all(_int_text(b) and isinstance(u, list) for b, u in v.get("bundles", {}).items()):
            raise bad(f"pgs.{g}", "{resource, bundles{index: [units]}, since}")
        pgs[g] = Reservation(str(v.get("resource", GPU)), {int(b): tuple(u) for b, u in v["bundles"].items()},
                             float(v.get("since", 0)) if _is_num(v.get("since", 0)) else 0.0)
    lock = d.get("lock")
    if lock is not None:
        if not isinstance(lock, dict) or not _is_int(lock.get("pid")) or not isinstance(lock.get("what", ""), str) \
                or not _is_num(lock.get("held_s", 0)):
            raise bad("lock", "{pid, what, held_s} or null")
        lock = LockInfo(lock["pid"], lock.get("what", ""), float(lock.get("held_s", 0)))
    decisions = _decisions(d.get("decisions", []), bad, "decisions")
    new = _decisions(d.get("new_decisions", []), bad, "new_decisions")
    node_key = d.get("node_key", "")
    if not isinstance(node_key, str):
        raise bad("node_key", "a string")
    pool = d.get("pool")
    if pool is not None and (not isinstance(pool, list) or not all(_is_int(i) for i in pool)):
        raise bad("pool", "a list of device indices or null")
    leaks = d.get("leaks") or {}
    if not isinstance(leaks, dict) or not isinstance(leaks.get("rows", []), list) \
            or not all(isinstance(r, dict) and _is_int(r.get("device")) and _is_int(r.get("pid"))
                       for r in leaks.get("rows", [])) \
            or not isinstance(leaks.get("events", []), list):
        raise bad("leaks", "an object with rows[{device, pid, ...}] and events[]")
    dyn = d.get("dynmig") or {}
    if not isinstance(dyn, dict) or not isinstance(dyn.get("instances", {}), dict) \
            or not isinstance(dyn.get("events", []), list) \
            or not all(isinstance(e, dict) for e in dyn.get("events", [])) \
            or not isinstance(dyn.get("held", {}), dict) or not isinstance(dyn.get("gpus", []), list):
        raise bad("dynmig", "an object with gpus[], instances{unit: uuid}, held{}, events[{...}]")
    return Snapshot(at=float(d.get("at", 0)), node_key=node_key, free=tuple(free), holders=tuple(out_h),
                    drained=out_d, mig_held=tuple(mig), shared={int(k): float(v) for k, v in shared.items()},
                    slots_held=float(d.get("slots_held", 0)), resets=d.get("resets", 0), pgs=pgs,
                    decisions=decisions, new_decisions=new, unhooked_slots=float(d.get("unhooked_slots", 0)),
                    agent_errors=d.get("agent_errors", 0), health=health, lock=lock,
                    pool=tuple(pool) if pool is not None else None, leaks=leaks, dynmig=dyn)


def _decisions(v: Any, bad: Any, name: str) -> tuple:
    if not isinstance(v, list):
        raise bad(name, "a list")
    out = []
    for x in v:
        if not (isinstance(x, list) and len(x) == 4 and _is_num(x[0]) and _is_num(x[1])
                and isinstance(x[2], list) and all(_is_int(i) for i in x[2]) and _is_int(x[3])):
            raise bad(name, "a list of [time, us, devices, n_mig]")
        out.append((float(x[0]), float(x[1]), tuple(x[2]), x[3]))
    return tuple(out)


# ------------------------------------------------------------------ field checks
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int_text(k: Any) -> bool:
    return isinstance(k, str) and k.isdigit() and len(k) < 10






def _num(v: Any, where: str) -> float:
    if not _is_num(v):
        raise StateError("must be a number", where)
    return float(v)


def _text(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise StateError("must be a string", where)
    return v
