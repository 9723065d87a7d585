"""The node-local arbiter: which physical devices stand behind the GPU slots Ray grants.

Ray's ``GPU`` resource is the only ledger of whole devices: Ray decides *how many*
devices a worker gets and when, and frees them when the worker ends, dies or its
node goes. Ray hands out the lowest free slot indices, whatever wires them. The
arbiter keeps, per node, a bijection **slot -> physical device** (and one per
MIG-profile resource: slot -> MIG instance) and, at each grant, under a file lock:

1. reads the state file of the node (``arbiter.json`` in the node directory);
2. finds the *candidate* slots: the granted ones plus every slot with no live
   holder (its last holder process is dead, or has since started another grant),
   plus slots of holders that are not using their devices yet (waiting for a
   constrained set, or drain placeholders);
3. chooses the best set among the candidates' devices with
   :func:`rayaccel.placement.allocate` (weakest link, bandwidth, NUMA,
   fragmentation), leaving out drained devices and devices reserved for the
   not-yet-arrived members of another placement group;
4. permutes the candidates' images so the granted slots get that set, and
   records the holder (pid, grant, name).

Slots in use never change their device, so the devices in use are exactly the
images of the slots in use: as long as every GPU worker of the node goes through
the arbiter, no device is held twice. A placement group is a gang: the first of
its members to arrive on a node reserves the best set for all of the group's
GPUs there, handed out in ring order by bundle index.

The state file is small JSON, replaced atomically; the lock is ``flock`` on
``arbiter.lock``. Nothing here imports ``ray``: the Ray side (:mod:`.hook`)
turns a grant into a :class:`GrantRequest`.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import ClusterError
from ..topology import NodeTopology

SCHEMA = "rayaccel.arbiter/1"
STATE_FILE = "arbiter.json"
LOCK_FILE = "arbiter.lock"
#: One JSON line per decision (time, microseconds, devices, MIG instances), appended; read by the agent.
DECISION_LOG = "decisions.log"
_EPS = 1e-6


def mig_resource(profile: str) -> str:
    """The Ray resource of MIG instances of ``profile``: ``mig_<profile>`` (e.g. ``mig_1g.5gb``)."""
    return f"mig_{profile}"


def gpu_pool(topology: NodeTopology) -> list[int]:
    """Devices behind Ray's ``GPU`` resource: every device not in MIG mode and not failed, by index."""
    return [d.index for d in sorted(topology.devices, key=lambda d: d.index)
            if not d.partitions and d.mig_mode is not True and d.health != "failed"]


def mig_pools(topology: NodeTopology) -> dict[str, list[str]]:
    """MIG resource -> its instances (``Partition.key``), ordered by parent device then GI id."""
    pools: dict[str, list[str]] = {}
    for d in sorted(topology.devices, key=lambda d: d.index):
        if d.health == "failed":
            continue
        for p in sorted(d.partitions, key=lambda p: (p.gi_id if p.gi_id is not None else 1 << 30, p.key)):
            pools.setdefault(mig_resource(p.profile), []).append(p.key)
    return pools


@dataclass(frozen=True, slots=True)
class GrantRequest:
    """One grant as the worker sees it.

    Attributes:
        pid: the worker process. key: the grant's identity (``task:<id>`` / ``actor:<id>``);
            a new key from the same pid releases the previous grant.
        gpu: ``((slot, fraction), ...)`` of Ray's ``GPU`` pool (fraction 1.0 = whole device).
        mig: ``((resource, slot), ...)`` of MIG-profile resources.
        pg / bundle: placement group (hex) and bundle index, when the grant comes from one.
        pg_bundles: the group's GPUs per bundle on this node (``{bundle: gpus}``), given
            by the caller when it is the group's first member here (see :meth:`Arbiter.needs_pg`).
        request: a :class:`~rayaccel.placement.Request` with extra constraints
            (``rayaccel.remote``'s interconnect, same_numa, ...), or None.
        drain: for a drain placeholder, the device it must end up holding.
        info: holder description for status (name, kind, job, id).
    """

    pid: int
    key: str
    gpu: tuple[tuple[int, float], ...] = ()
    mig: tuple[tuple[str, int], ...] = ()
    pg: str | None = None
    bundle: int | None = None
    pg_bundles: dict[int, float] | None = None
    request: Any = None
    drain: int | None = None
    info: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Grant:
    """What the arbiter decided.

    Attributes:
        devices: physical device indices behind the GPU slots, in ring order.
        partitions: MIG instance keys behind the MIG slots.
        waiting: why the grant cannot be served yet (None when served): the caller
            retries; meanwhile its slots are not pinned, so others may rearrange them.
        seconds: time spent deciding (lock held).
    """

    devices: tuple[int, ...] = ()
    partitions: tuple[str, ...] = ()
    waiting: str | None = None
    seconds: float = 0.0


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` exists (a zombie or another user's process counts as alive: conservative)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Arbiter:
    """The arbiter of one node (see module docstring).

    Args:
        node_dir: the node's directory (holds the state and lock files).
        topology: the node's topology.
        alive: liveness test for holder pids (tests inject one).

    Raises:
        ClusterError: the node directory does not exist.
    """

    def __init__(self, node_dir: str | Path, topology: NodeTopology, *, alive: Callable[[int], bool] = pid_alive):
        self.dir = Path(node_dir)
        if not self.dir.is_dir():
            raise ClusterError(f"rayaccel node directory {self.dir} does not exist (was the node started by "
                               f"`rayaccel start`?)")
        self.topology = topology
        self.alive = alive
        self.pool = gpu_pool(topology)
        self.migs = mig_pools(topology)
        self._parent = {p.key: p.parent for p in topology.partitions()}
        self._uuid = {p.key: p.uuid for p in topology.partitions()}
        self._state_path = self.dir / STATE_FILE
        self._lock_path = self.dir / LOCK_FILE

    # ------------------------------------------------------------------ state
    def _fresh(self) -> dict:
        return {"schema": SCHEMA, "pools": {"GPU": list(self.pool), **{r: list(u) for r, u in self.migs.items()}},
                "holders": {}, "pgs": {}, "drained": {}, "resets": 0}

    def _load(self) -> dict:
        try:
            raw = self._state_path.read_bytes()
        except FileNotFoundError:
            return self._fresh()
        try:
            st = json.loads(raw)
            self._check(st)
            return st
        except (ValueError, TypeError, KeyError) as e:
            # A damaged state file cannot be trusted; rebuild it from what is verifiable.
            return self._rebuild(f"{self._state_path}: {e}")

    def _check(self, st: dict) -> None:
        if st.get("schema") != SCHEMA:
            raise ValueError(f"schema {st.get('schema')!r}, expected {SCHEMA!r}")
        pools = st["pools"]
        if sorted(pools["GPU"]) != sorted(self.pool):
            raise ValueError("GPU pool is not a permutation of the node's devices")
        for r, units in self.migs.items():
            if sorted(pools.get(r, ())) != sorted(units):
                raise ValueError(f"{r} pool is not a permutation of the node's MIG instances")
        if not isinstance(st["holders"], dict) or not isinstance(st["pgs"], dict) or not isinstance(st["drained"], dict):
            raise ValueError("holders/pgs/drained must be objects")

    def _rebuild(self, why: str) -> dict:
        import logging

        logging.getLogger(__name__).error("rayaccel arbiter: state file unreadable (%s); starting a fresh one", why)
        st = self._fresh()
        st["resets"] = 1
        st["reset_reason"] = why[:500]
        return st

    def _save(self, st: dict) -> None:
        tmp = self._state_path.with_name(f".{STATE_FILE}.{os.getpid()}")
        data = json.dumps(st, separators=(",", ":")).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, self._state_path)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def read(self) -> dict:
        """A copy of the state (under the lock)."""
        with self._locked():
            return self._load()

    # -------------------------------------------------------------- decisions
    def needs_pg(self, pg: str) -> bool:
        """True when no reservation exists yet for placement group ``pg`` (the caller should pass ``pg_bundles``)."""
        try:
            st = json.loads(self._state_path.read_bytes())
            return pg not in st.get("pgs", {})
        except (OSError, ValueError, AttributeError):
            return True

    def grant(self, req: GrantRequest, pg_alive: Callable[[str], bool] | None = None) -> Grant:
        """Decide which devices stand behind ``req``'s slots (see module docstring).

        Args:
            req: the grant.
            pg_alive: ``pg_alive(pg_hex)`` is False for a removed placement group; asked only
                when the free devices cannot serve a grant because of reservations (stale
                reservations of removed groups are then dropped).

        Returns:
            The :class:`Grant`; ``waiting`` set when it cannot be served now (retry).
        """
        t0 = time.perf_counter()
        with self._locked():
            st = self._load()
            g = self._decide(st, req, pg_alive)
            self._save(st)
        dt = time.perf_counter() - t0
        if g.waiting is None and (req.gpu or req.mig):
            self._log_decision(dt, g)
        return Grant(g.devices, g.partitions, g.waiting, dt)

    def _log_decision(self, seconds: float, g: Grant) -> None:
        line = json.dumps([round(time.time(), 4), round(seconds * 1e6), list(g.devices), len(g.partitions)]) + "\n"
        try:
            fd = os.open(self.dir / DECISION_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:
            pass  # the log only feeds metrics

    def decisions(self, since: int = 0, max_bytes: int = 1 << 20) -> tuple[list, int]:
        """Decisions logged after byte offset ``since``: ``([[time, us, devices, n_mig], ...], new offset)``.

        The log is truncated once it passes ``max_bytes`` (the caller's offset then restarts at 0).
        """
        path = self.dir / DECISION_LOG
        try:
            size = os.path.getsize(path)
        except OSError:
            return [], 0
        if size < since:
            since = 0
        with open(path, "rb") as f:
            f.seek(since)
            data = f.read()
        out = []
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        offset = since + end
        if offset > max_bytes:
            try:
                os.truncate(path, 0)
                offset = 0
            except OSError:
                pass
        return out, offset

    def release(self, pid: int, key: str | None = None) -> None:
        """Forget ``pid``'s grant (its task ended, or it moved on to work without devices). Idempotent.

        With ``key``, only that grant (a newer grant of the same process stays).
        """
        with self._locked():
            st = self._load()
            h = st["holders"].get(str(pid))
            if h is not None and (key is None or h.get("key") == key):
                del st["holders"][str(pid)]
                self._save(st)

    def reap(self) -> int:
        """Drop holders whose process is gone; return how many."""
        with self._locked():
            st = self._load()
            dead = [p for p in st["holders"] if not self.alive(int(p))]
            for p in dead:
                del st["holders"][p]
            if dead:
                self._save(st)
            return len(dead)

    def forget_removed_groups(self, pg_alive: Callable[[str], bool]) -> list[str]:
        """Drop reservations of placement groups with no member here that Ray says are gone; return them."""
        with self._locked():
            st = self._load()
            before = set(st["pgs"])
            self._drop_removed_groups(st, st["holders"], GrantRequest(pid=-1, key=""), pg_alive)
            gone = sorted(before - set(st["pgs"]))
            if gone:
                self._save(st)
            return gone

    def drain(self, device: int, reason: str, by: str = "operator") -> bool:
        """Mark ``device`` drained (no new grant maps to it); return False when it already was."""
        if device not in self.topology.indices:
            raise ClusterError(f"no device {device} on this node (devices {list(self.topology.indices)})")
        with self._locked():
            st = self._load()
            if str(device) in st["drained"]:
                return False
            st["drained"][str(device)] = {"reason": reason, "since": time.time(), "by": by}
            self._save(st)
            return True

    def undrain(self, device: int) -> bool:
        """Lift a drain; return False when ``device`` was not drained."""
        with self._locked():
            st = self._load()
            if st["drained"].pop(str(device), None) is None:
                return False
            self._save(st)
            return True

    # ---------------------------------------------------------------- the core
    def _decide(self, st: dict, req: GrantRequest, pg_alive: Callable[[str], bool] | None) -> Grant:
        me = str(req.pid)
        holders: dict = st["holders"]
        mine_before = holders.pop(me, None)
        for p in [p for p in holders if not self.alive(int(p))]:
            del holders[p]
        if not req.gpu and not req.mig:
            return Grant()
        gpu = st["pools"]["GPU"]
        whole = {s for s, f in req.gpu if f >= 1 - _EPS}
        # Ray granted these slots whole: any other record of them is stale (its task ended).
        if whole:
            for h in holders.values():
                if any(s in whole for s, _ in h.get("gpu", ())):
                    h["gpu"] = [[s, f] for s, f in h["gpu"] if s not in whole]
        drained = {int(d) for d in st["drained"]}
        placeholder = req.drain is not None and bool(req.gpu)
        pinned: set[int] = set()
        for h in holders.values():
            if self._pins(h, gpu):
                pinned.update(s for s, _ in h.get("gpu", ()))
        devices: tuple[int, ...] = ()
        waiting = None
        if placeholder:
            # A drain placeholder never uses a device: it records its slot and is moved onto its target.
            holders[me] = {"gpu": [[s, f] for s, f in req.gpu], "key": req.key, "drain": req.drain,
                           "since": time.time(), **{k: v for k, v in req.info.items() if k != "id"}}
            self._settle_drains(st, holders, pinned, req)
            return Grant(tuple(gpu[s] for s, _ in req.gpu))
        # Drain placeholders move onto their target as soon as it is not in use.
        self._settle_drains(st, holders, pinned, req)
        if req.gpu:
            devices, waiting = self._gpu(st, req, pinned, drained, whole, pg_alive)
        parts: tuple[str, ...] = ()
        if req.mig and waiting is None:
            parts, waiting = self._mig(st, req, holders, drained)
        rec = {"gpu": [[s, f] for s, f in req.gpu], "key": req.key,
               "since": (mine_before or {}).get("since") if (mine_before or {}).get("key") == req.key else time.time(),
               **{k: v for k, v in req.info.items() if k != "id"}}
        if req.mig:
            rec["mig"] = [[r, s] for r, s in req.mig]
        if req.pg is not None:
            rec["pg"], rec["bundle"] = req.pg, req.bundle
        if waiting is not None:
            rec["waiting"] = waiting
        if rec["since"] is None:
            rec["since"] = time.time()
        holders[me] = rec
        return Grant(devices if waiting is None else (), parts if waiting is None else (), waiting)

    @staticmethod
    def _pins(h: dict, gpu: list[int]) -> bool:
        """Does holder ``h`` pin the images of its GPU slots? (Not while waiting; a placeholder once on target.)"""
        if h.get("waiting"):
            return False
        target = h.get("drain")
        if target is not None:
            return any(gpu[s] == target for s, _ in h.get("gpu", ()))
        return True

    def _settle_drains(self, st: dict, holders: dict, pinned: set[int], req: GrantRequest) -> None:
        gpu = st["pools"]["GPU"]
        where = {d: s for s, d in enumerate(gpu)}
        for h in holders.values():
            target = h.get("drain")
            slots = [s for s, _ in h.get("gpu", ())]
            if target is None or not slots or target not in where or any(gpu[s] == target for s in slots):
                continue
            u = where[target]
            if u in pinned:
                continue  # still in use: the placeholder moves there once it frees
            t = slots[0]
            gpu[t], gpu[u] = gpu[u], gpu[t]
            where[gpu[t]], where[gpu[u]] = t, u
            pinned.add(t)

    @staticmethod
    def _drop_removed_groups(st: dict, holders: dict, req: GrantRequest, pg_alive: Callable[[str], bool]) -> None:
        """Forget reservations of groups none of whose members is here and that Ray says are gone."""
        present = {h.get("pg") for h in holders.values() if h.get("pg") is not None}
        for pg in [pg for pg in st["pgs"] if pg not in present and pg != req.pg]:
            if not pg_alive(pg):
                del st["pgs"][pg]

    def _reserved(self, st: dict, holders: dict, req: GrantRequest) -> dict[int, str]:
        """device -> placement group, for devices reserved to members of other groups (or other bundles) not here yet."""
        present: dict[str, set[int]] = {}
        for h in holders.values():
            if h.get("pg") is not None and not h.get("waiting"):
                present.setdefault(h["pg"], set()).add(h.get("bundle"))
        out: dict[int, str] = {}
        for pg, r in st["pgs"].items():
            for b, devs in r["bundles"].items():
                if pg == req.pg and int(b) == req.bundle:
                    continue
                if int(b) in present.get(pg, ()):
                    continue  # that member holds its devices: they are pinned anyway
                for d in devs:
                    out[d] = pg
        return out

    def _gpu(self, st: dict, req: GrantRequest, pinned: set[int], drained: set[int], whole: set[int],
             pg_alive: Callable[[str], bool] | None) -> tuple[tuple[int, ...], str | None]:
        gpu = st["pools"]["GPU"]
        holders = st["holders"]
        frac = [(s, f) for s, f in req.gpu if f < 1 - _EPS]
        if frac and frac[0][0] in pinned:
            # Sharing a slot that live holders already use: its device is fixed.
            s = frac[0][0]
            if gpu[s] in drained:
                return (), f"device {gpu[s]} is drained; this share waits until its other sharers end"
            return (gpu[s],), None
        mine = sorted(s for s, _ in req.gpu)
        cand = [s for s in range(len(gpu)) if s not in pinned]
        if pg_alive is not None:
            self._drop_removed_groups(st, holders, req, pg_alive)
        for attempt in (0, 1):
            reserved = self._reserved(st, holders, req)
            avail = {gpu[s] for s in cand} - drained - set(reserved)
            want, why = self._choose(st, req, avail, len(mine), bool(frac))
            if want is not None or attempt or pg_alive is None or not reserved:
                break
            gone = [pg for pg in {*reserved.values()} if not pg_alive(pg)]
            if not gone:
                break
            for pg in gone:
                st["pgs"].pop(pg, None)
        if want is None:
            return (), why
        self._assign(gpu, cand, mine, want)
        return tuple(want), None

    def _choose(self, st: dict, req: GrantRequest, avail: set[int], k: int, shared: bool) -> tuple[list[int] | None, str]:
        """The devices for the grant's ``k`` slots among ``avail`` (ring order), or (None, why)."""
        from ..placement import Request

        if len(avail) < k:
            return None, f"{k} device(s) granted by Ray but only {len(avail)} free here that are neither drained nor reserved"
        if req.pg is not None and req.bundle is not None and not shared:
            r = st["pgs"].get(req.pg)
            if r is None and req.pg_bundles:
                r = self._reserve(st, req, avail)
            if r is not None:
                devs = r["bundles"].get(str(req.bundle))
                if devs is not None and len(devs) == k and set(devs) <= avail:
                    return list(devs), ""
                # the reservation cannot be honoured (a device drained or taken meanwhile): choose afresh
        request = req.request
        if request is None or shared:
            request = Request(gpus=k)
        elif request.gpus != k:
            request = _with_gpus(request, k)
        alloc = self._allocate(avail, request)
        if not alloc:
            return None, "; ".join(getattr(alloc, "reasons", ()) or ("no suitable set among the free devices",))
        return list(alloc.devices), ""

    def _allocate(self, avail: set[int], request: Any) -> Any:
        from ..placement import NodeState, allocate

        busy = frozenset(set(self.topology.indices) - avail)
        return allocate(NodeState(self.topology, busy=busy), request)

    def _reserve(self, st: dict, req: GrantRequest, avail: set[int]) -> dict | None:
        """Reserve the best set for all of the group's whole GPUs on this node, in ring order by bundle index."""
        from ..placement import Request

        bundles = {int(b): g for b, g in (req.pg_bundles or {}).items()}
        whole_b = {b: int(round(g)) for b, g in bundles.items() if g >= 1 - _EPS and abs(g - round(g)) < _EPS}
        if req.bundle not in whole_b:
            return None
        n = sum(whole_b.values())
        alloc = self._allocate(avail, Request(gpus=n)) if n <= len(avail) else None
        if not alloc:
            return None
        sizes = [whole_b[b] for b in sorted(whole_b)]
        order = bundle_order(self.topology, list(alloc.devices), sizes)
        out, i = {}, 0
        for b in sorted(whole_b):
            out[str(b)] = order[i:i + whole_b[b]]
            i += whole_b[b]
        r = {"bundles": out, "since": time.time()}
        st["pgs"][req.pg] = r
        return r

    @staticmethod
    def _assign(gpu: list[int], cand: list[int], mine: list[int], want: list[int]) -> None:
        """Give ``mine`` (sorted slots) the devices ``want`` by permuting images among ``cand`` only."""
        wanted = set(want)
        freed = [gpu[s] for s in mine if gpu[s] not in wanted]
        mine_set = set(mine)
        displaced = [s for s in cand if s not in mine_set and gpu[s] in wanted]
        for s, d in zip(displaced, freed):
            gpu[s] = d
        for s, d in zip(mine, want):
            gpu[s] = d

    def _mig(self, st: dict, req: GrantRequest, holders: dict, drained: set[int]) -> tuple[tuple[str, ...], str | None]:
        out = []
        for res, slot in req.mig:
            units = st["pools"].get(res)
            if units is None or not 0 <= slot < len(units):
                return (), f"{res} slot {slot} is not a MIG instance of this node"
            pinned = {s for h in holders.values() if not h.get("waiting")
                      for r, s in h.get("mig", ()) if r == res}
            pinned.discard(slot)
            ok = [s for s in range(len(units)) if s not in pinned and self._parent.get(units[s]) not in drained]
            if slot in ok:
                out.append(units[slot])
                continue
            if not ok:
                return (), f"no free {res} instance outside drained devices"
            other = ok[0]
            units[slot], units[other] = units[other], units[slot]
            out.append(units[slot])
        return tuple(out), None

    def warm(self) -> None:
        """Import the placer and build this topology's tables (a worker does this while it starts)."""
        from ..placement import Request

        self.read()  # the lock and the state file's path through the JSON decoder
        if self.pool:
            self._allocate(set(self.pool), Request(gpus=1))
            if len(self.pool) > 1:
                self._allocate(set(self.pool), Request(gpus=2))
                self._allocate(set(self.pool[1:]), Request(gpus=1))

    # ------------------------------------------------------------------ views
    def uuid(self, partition_key: str) -> str | None:
        """The MIG UUID of an instance (None when the topology has none)."""
        return self._uuid.get(partition_key)

    def snapshot(self) -> dict:
        """Holders (live only), drains, reservations and the slot maps, for status and metrics."""
        st = self.read()
        live = {p: h for p, h in st["holders"].items() if self.alive(int(p))}
        st["holders"] = live
        return st


def _with_gpus(request: Any, k: int) -> Any:
    from dataclasses import replace

    return replace(request, gpus=k)


def bundle_order(topology: NodeTopology, order: list[int], sizes: list[int]) -> list[int]:
    """The devices of a best ring ``order``, arranged for bundles of ``sizes`` taken consecutively.

    Bundles of several devices first get the rotation/direction of the ring whose
    bundles are internally best linked (weakest intra-bundle link, then their total).
    Among orders as good, the ascending one wins when it is also a best ring: Ray
    Train ranks a node's workers by their lowest GPU id, so the ranks then follow the ring.
    """
    n = len(order)
    if n <= 1:
        return list(order)

    def ring_q(o: list[int]) -> tuple[float, float]:
        bws = [topology.bandwidth_gbps(o[i], o[(i + 1) % n]) for i in range(n)] if n > 2 else \
            [topology.bandwidth_gbps(o[0], o[1])]
        return (min(bws), sum(bws))

    def bundle_q(o: list[int]) -> tuple[float, float]:
        worst, total, i = float("inf"), 0.0, 0
        for k in sizes:
            part = o[i:i + k]
            i += k
            for a in range(len(part)):
                for b in range(a + 1, len(part)):
                    bw = topology.bandwidth_gbps(part[a], part[b])
                    worst, total = min(worst, bw), total + bw
        return (worst if worst != float("inf") else 0.0, total)

    best_ring = ring_q(order)
    variants = [sorted(order)]
    for seq in (list(order), list(reversed(order))):
        for r in range(n):
            variants.append(seq[r:] + seq[:r])

    def key(o: list[int]) -> tuple:
        rq = ring_q(o)
        is_best = rq[0] >= best_ring[0] - 1e-9 and rq[1] >= best_ring[1] - 1e-9
        return (bundle_q(o), is_best, o == sorted(o))

    return list(max(variants, key=key))
