"""The worker hook: every Python worker of a rayaccel node imports this before its first task.

A rayaccel node's raylet is started with ``RAY_preload_python_modules=rayaccel.ray.worker.hook``
and ``RAYACCEL_NODE_DIR=<node directory>`` (see :mod:`rayaccel.ray.node.start`), so every worker it
spawns -- whatever driver submitted the work: a plain ``ray.init(address=...)``
driver, a Ray Job, Serve's or Train's controller -- imports this module. Importing
it wraps Ray's single in-worker accelerator-id function (:func:`._ray_private.install`):

* at a grant (a new task, or an actor's creation) the raylet's slot indices are
  turned into physical units by the node's arbiter (:mod:`rayaccel.arbiter`), from the
  node table written at node start -- no topology objects and no placer in the worker
  unless the table has no answer or someone asks :func:`rayaccel.get_devices`;
* ``ray.get_gpu_ids()``, ``get_runtime_context().get_accelerator_ids()``, the
  ``CUDA_VISIBLE_DEVICES`` Ray writes (ordered; MIG instances by UUID), the vendor's
  own variable (``HIP_VISIBLE_DEVICES`` on AMD), CPU affinity (the devices' NUMA-local
  CPUs) and :func:`rayaccel.get_devices` all name those units.

``rayaccel.remote`` work is decided once, with its constraints: the hook leaves its
grant to the task's own set-up (:func:`decide_with`, before user code), which knows
the request. A grant the arbiter cannot serve yet (a drained device, a constrained
request) waits there, before user code, polling. Outside a rayaccel node (no
``RAYACCEL_NODE_DIR``) importing this does nothing.

A worker whose environment lacks rayaccel (a ``runtime_env`` with its own packages)
cannot import this: Ray logs the import error and the worker runs unhooked. It then
sees only the placeholder ids the node's raylet was started with
(``CUDA_VISIBLE_DEVICES=rayaccel-unhooked-0,...``), i.e. no GPU at all -- never a device
another worker holds; ``rayaccel status`` and ``doctor`` report GPU slots held without the hook.

Start-up cost is what every Ray worker of the node pays, so this module imports only
the standard library, :mod:`._ray_private` and the arbiter's small worker-side modules.
It reads the node table, opens the arbiter's files, rehearses one grant (nothing saved, and
without the node's lock: a new worker never waits for the node's grants, nor they for it)
and starts its releaser thread when it installs, at worker start (a worker Ray keeps idle
does it before any task reaches it), not at the first grant.

One grant, one value: Ray's grant is read in one call (:func:`._ray_private.grant_of`, a
:class:`~._ray_private.RayGrant`), turned once into the arbiter's
:class:`~rayaccel.arbiter.decide.GrantRequest`, and the arbiter's answer, a
:class:`~rayaccel.arbiter.decide.Grant` that carries that request as ``asked``, is all this
process keeps (:func:`current`); the ids Ray reads back and every variable are derived from it,
each variable written once.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

from rayaccel.arbiter.decide import Grant, GrantRequest
from rayaccel.arbiter.state import GPU
from rayaccel.arbiter.statefile import Arbiter
from rayaccel.arbiter.table import NodeTable, decode_table
from rayaccel.errors import ClusterError
from rayaccel.ray import _ray_private as rp
from rayaccel.contract import NODE_VISIBLE_ENV, ZERO_GPU_ENV
from rayaccel.contract import (DEVICES_ENV, HOLDER_ENV, NIC_ENV_ENV, NODE_DIR_ENV, RECORD_FILE, REMOTE_MODULE,
                               TABLE_FILE, UCX_NET_DEVICES, drain_target, format_devices, format_holder, host_netdevs,
                               host_rdma_devices, nic_env_values, parse_nic_env)

log = logging.getLogger(__name__)

#: Polling period while a grant waits (doubles up to the max), seconds.
WAIT_POLL_S = 0.02
WAIT_POLL_MAX_S = 0.25
#: A finished task's grant is released this long after its code returned, unless the same
#: worker has taken a new grant by then (which replaces the record at no extra cost), seconds.
RELEASE_AFTER_S = 0.02
#: How long a placement group seen alive is trusted to be alive, seconds.
PG_ALIVE_TTL_S = 1.0


class _NodeSide:
    """What a worker knows of its node: the table (loaded when the hook installs, at worker start) and the arbiter."""

    def __init__(self, node_dir: str):
        self.dir = node_dir
        path = os.path.join(node_dir, TABLE_FILE)
        try:
            with open(path, "rb") as f:
                self.table: NodeTable = decode_table(f.read())
        except OSError as e:
            raise ClusterError(f"cannot read the node table {path}: {e.strerror}") from None
        self.arbiter = Arbiter(node_dir, self.table, topology=self._topology)
        self.managed = frozenset(self.table.resources)
        self.unit_resources = frozenset(self.table.unit_resources())
        self.gpus = GPU in self.table.resources or any(r.startswith("mig_") for r in self.table.resources)
        #: the node's other family (NeuronCores, TPU chips, ...): its resource tables
        self.families = tuple(t for t in self.table.resources.values() if t.spec)
        self.family_defaults = {v: os.environ.get(v) for t in self.families for v in t.visible_env()}
        self.env_var = self.table.visible_env
        # What a task asking no GPU gets: see-none (default) "", no device, as Ray writes it with
        # RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1; see-all: the variable as the node was given it (Ray 2.60's default)
        self.default_visible: str | None = ""
        if os.environ.get(ZERO_GPU_ENV) == "see-all":
            self.default_visible = os.environ.get(NODE_VISIBLE_ENV)
        self.user_ucx = os.environ.get(UCX_NET_DEVICES)
        host = host_rdma_devices() if any(self.table.nics.values()) else frozenset()
        #: device -> its near NICs that this host has: what UCX may be given (``table.nics`` names them all)
        self.ucx_nics = {i: tuple(n for n in nics if n.partition(":")[0] in host)
                         for i, nics in self.table.nics.items()}
        try:  # other libraries' NIC variables the node was started to write (--nic-env), with UCX's NICs
            self.nic_env = parse_nic_env(os.environ.get(NIC_ENV_ENV))
        except ValueError as e:
            log.error("rayaccel hook: %s=%s: %s; writing none of them", NIC_ENV_ENV, os.environ.get(NIC_ENV_ENV), e)
            self.nic_env = ()
        self.user_nic_env = {v: os.environ.get(v) for v in self.nic_env}  # a value the user set is kept
        self.netdevs = {n.partition(":")[0]: host_netdevs(n.partition(":")[0])
                        for ns in self.ucx_nics.values() for n in ns} if self.nic_env else {}
        self._record: Any = None

    @property
    def record(self) -> Any:
        """The node's :class:`~.record.NodeRecord` (parsed on first use: topology objects cost start-up time)."""
        if self._record is None:
            from rayaccel.ray.record import NodeRecord  # the topology model loads only when someone needs it

            path = os.path.join(self.dir, RECORD_FILE)
            try:
                with open(path, "rb") as f:
                    self._record = NodeRecord.from_json(f.read(), where=path)
            except OSError as e:
                raise ClusterError(f"cannot read the node record {path}: {e.strerror}") from None
        return self._record

    @property
    def topology(self) -> Any:
        return self.record.topology

    def _topology(self) -> Any:
        return self.record.topology


class _Worker:
    """This process's side of the hook: its node, its grant, its pending release (one object, not globals)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.node: _NodeSide | None = None
        #: Ray's grant this process serves now (None: none seen, or one left to a rayaccel.remote task's set-up)
        self.ray: rp.RayGrant | None = None
        #: the arbiter's answer to it (None: no units); ``current.asked.key`` is the key the state file holds
        self.current: Grant | None = None
        self.last: Grant | None = None  # the last grant decided plainly (what _same_as_last compares with)
        self.pending: dict[str, float] = {}  # grant key -> when it may be released
        self.release_event: threading.Event | None = None
        self.original_affinity: set[int] | None = None
        self.pg_seen: dict[str, float] = {}  # group -> when last seen alive


_W = _Worker()


def node() -> _NodeSide | None:
    """This worker's node side, or None outside a rayaccel node.

    Raises:
        ClusterError / StateError: the node directory or its table is unreadable.
    """
    ns = _W.node
    if ns is None:
        d = os.environ.get(NODE_DIR_ENV)
        if not d:
            return None
        with _W.lock:
            if _W.node is None:
                _W.node = _NodeSide(d)
            ns = _W.node
    return ns


def current() -> Grant | None:
    """The grant this process holds now, as the arbiter decided it (``asked``: as Ray made it); None: no devices."""
    return _W.current


# ----------------------------------------------------------------- the patch
#: What :func:`_ensure` returns for ``rayaccel.remote`` work before its set-up decides it.
_DEFERRED: Any = object()


def _get_ids(original: Any, worker: Any, resource_name: str, regex: str) -> list:
    try:
        ns = node()
    except Exception as e:  # noqa: BLE001 - never break Ray's worker; fail safe (unhooked ids: no device)
        log.error("rayaccel hook: node side unavailable (%s); this worker sees Ray's placeholder ids", e)
        return original(worker, resource_name, regex)
    if ns is None or resource_name not in ns.unit_resources:
        return original(worker, resource_name, regex)
    g = _ensure(ns, worker)
    if g is _DEFERRED:
        return original(worker, resource_name, regex)
    return _ids_for(ns, g, resource_name)


def _ids_for(ns: _NodeSide, g: Grant | None, resource: str) -> list:
    """What Ray's accelerator-id function returns for ``resource``: GPUs then MIG instances, as the node names
    them (a preset node: the preset's own text; MIG: UUIDs), or the family's unit ids (a preset's text)."""
    if g is None:
        return []
    t = ns.arbiter.table.resources  # the arbiter's: a dynamic-MIG instance's UUID as of the grant
    if resource != GPU:
        named = t[resource].uuid_of if resource in t else {}
        return [named.get(u, u) for u in g.units.get(resource, ())]
    ids: list = [t[GPU].uuid_of.get(d, d) for d in g.units.get(GPU, ())] if GPU in t else []
    for r, us in g.units.items():
        if r.startswith("mig_"):
            ids += [t[r].uuid_of.get(u, u) for u in us]
    return ids


def _ensure(ns: _NodeSide, worker: Any) -> Grant | None:
    """This worker's current grant, decided now if Ray's grant changed (or :data:`_DEFERRED`)."""
    seen = _W.ray
    rg = rp.grant_of(worker, ns.managed, seen)
    if rg is seen:
        return _W.current
    with _W.lock:
        if rg.key == getattr(_W.ray, "key", None) and rg.slots == _W.ray.slots:
            return _W.current  # another thread decided it meanwhile
        if not rg.slots:
            if _W.current is not None:
                _drop(ns)
            _W.ray = rg
            return None
        if rg.function.startswith(REMOTE_MODULE):
            # rayaccel.remote work: its set-up (decide_with) decides once, with its constraints.
            # Until then (before user code) Ray's placeholder ids stand: no device.
            _W.current = _W.ray = None
            return _DEFERRED
        if not _same_as_last(ns, rg):
            _decide(ns, rg, None)
        return _W.current


def _same_as_last(ns: _NodeSide, rg: rp.RayGrant) -> bool:
    """A reused worker granted the very slots it just had, while nothing else changed on the node.

    Its record still holds those slots (its release was pending, now superseded), so they
    kept their units; if the state file is untouched since this worker wrote it, no
    drain or other change happened either: the same units, with no lock and no I/O.
    The grant stays the record's (its key is the state file's); Ray's new grant is what it serves.
    """
    last = _W.last
    if last is None or rg.pg is not None or last.asked.slots != rg.slots or last.asked.key not in _W.pending \
            or last.state_mtime_ns is None or ns.arbiter.state_mtime_ns() != last.state_mtime_ns:
        return False
    _W.pending.clear()
    _W.current, _W.ray = last, rg
    return True


def _drop(ns: _NodeSide) -> None:
    _W.current = None
    try:
        ns.arbiter.release(os.getpid())
    except OSError as e:
        log.warning("rayaccel hook: could not release this worker's grant: %s", e)


def _decide(ns: _NodeSide, rg: rp.RayGrant, request: Any) -> Grant:
    """Ask the arbiter for Ray's grant ``rg``, waiting while it cannot serve it; it is the current grant."""
    _W.pending.clear()  # this grant replaces this worker's record: nothing else to release
    drain = drain_target(rg.info["name"]) if rg.info["kind"] == "actor" else None  # a drain placeholder's device
    pg_bundles = None
    if rg.pg is not None and rg.bundle is not None:
        st = ns.arbiter.peek()
        if st is None or rg.pg not in st.pgs:
            res = next(iter(rg.slots))
            try:  # one GCS read, before the lock
                pg_bundles = rp.pg_bundles_on_node(rg.pg, rg.node_id, res)
            except Exception as e:  # noqa: BLE001 - without the group's shape each member chooses alone
                log.warning("rayaccel hook: placement group %s unreadable (%s); choosing this bundle alone", rg.pg, e)
    g = _grant_waiting(ns, GrantRequest(os.getpid(), rg.key, rg.slots, rg.pg, rg.bundle, pg_bundles, request, drain,
                                        rg.info))
    _W.current, _W.ray = g, rg
    _W.last = g if drain is None and request is None and rg.pg is None else None
    return g


def _grant_waiting(ns: _NodeSide, req: GrantRequest) -> Grant:
    """Grant ``req``, retrying while it waits; ask Ray (outside the lock) about groups that block it."""
    delay, warned, t0 = WAIT_POLL_S, 0.0, time.monotonic()
    while True:
        g = ns.arbiter.grant(req)
        if g.waiting is None:
            return g
        if g.blocked_by:
            gone = frozenset(p for p in g.blocked_by if not _pg_alive(p))
            if gone - req.gone:
                req = req._replace(gone=req.gone | gone)
                continue
        now = time.monotonic()
        if now - warned > 30.0:
            log.warning("rayaccel: grant %s waits (%.0f s so far): %s", req.key, now - t0, g.waiting)
            warned = now
        time.sleep(delay)
        delay = min(WAIT_POLL_MAX_S, delay * 2)


def _pg_alive(pg: str) -> bool:
    """Does placement group ``pg`` still exist? (One GCS read, remembered for a second; never under the lock.)"""
    now = time.monotonic()
    seen = _W.pg_seen.get(pg)
    if seen is not None and now - seen < PG_ALIVE_TTL_S:
        return True
    try:
        alive = rp.pg_bundles_on_node(pg, "") is not None
    except Exception:  # noqa: BLE001 - unknown: keep the reservation (conservative)
        return True
    if alive:
        if len(_W.pg_seen) > 1024:
            _W.pg_seen.clear()
        _W.pg_seen[pg] = now
    return alive


def pg_alive(pg: str) -> bool:
    """Public form of :func:`_pg_alive` (the node agent uses it for reservations nobody claims)."""
    return _pg_alive(pg)


def _after_set_visible(saved: dict) -> dict:
    """After Ray wrote the visible-devices variable: the vendor's variable (and a non-GPU family's), rayaccel's,
    CPU affinity, UCX's NICs. A family Ray has no manager for (a plugin's) is decided here: Ray never asks."""
    try:
        ns = node()
    except Exception:  # noqa: BLE001 - reported by _get_ids already
        return saved
    if ns is None:
        return saved
    cur = _ensure(ns, rp.global_worker()) if ns.families else _W.current  # Ray asked for the GPUs' already
    if cur is _DEFERRED:
        cur = None
    for var in (*((ns.env_var,) if ns.gpus else ()), *ns.family_defaults, DEVICES_ENV, HOLDER_ENV, UCX_NET_DEVICES,
                *ns.nic_env):
        saved.setdefault(var, os.environ.get(var))
    for t in ns.families:
        _family_env(ns, t, cur.units.get(t.name) if cur is not None else None)
    if cur is None:
        # No devices for this task: Ray leaves the variable as the last task set it; reset it.
        if ns.gpus:
            _restore(ns.env_var, ns.default_visible)
        _restore(UCX_NET_DEVICES, ns.user_ucx)
        for var, value in ns.user_nic_env.items():
            _restore(var, value)
        os.environ.pop(DEVICES_ENV, None)
        os.environ.pop(HOLDER_ENV, None)
        _apply_affinity(None)
        if ns.gpus:
            _memory_cap(ns, None)
        return saved
    if ns.gpus:  # Ray wrote CUDA_VISIBLE_DEVICES from these ids already: written again only if it did not
        _restore(ns.env_var, ",".join(map(str, _ids_for(ns, cur, GPU))))
        _memory_cap(ns, cur)
    devs = _indices(ns, cur)
    os.environ[DEVICES_ENV] = format_devices(devs)
    # who this grant is: a process the task starts inherits it (the node agent's leak watcher reads it there)
    os.environ[HOLDER_ENV] = format_holder(os.getpid(), cur.asked.key, str(cur.asked.info.get("name") or ""))
    cpus: set[int] = set()
    for i in devs:
        cpus.update(ns.table.cpus.get(i, ()))
    _apply_affinity(cpus or None)
    nics = list(dict.fromkeys(n for i in devs for n in ns.ucx_nics.get(i, ())))
    if ns.user_ucx is not None:
        os.environ[UCX_NET_DEVICES] = ns.user_ucx  # a value the user set is kept
    elif nics:
        os.environ[UCX_NET_DEVICES] = ",".join(nics)
    else:
        os.environ.pop(UCX_NET_DEVICES, None)
    if ns.nic_env:
        for var, value in nic_env_values(ns.nic_env, nics, ns.netdevs).items():
            user = ns.user_nic_env.get(var)
            _restore(var, user if user is not None else value)
    return saved


def _memory_cap(ns: _NodeSide, cur: Grant | None) -> None:
    """A share of a GPU (a slot fraction < 1, or ``gpu_memory``): cap this worker's memory (:mod:`.memcap`).
    A whole-GPU grant in a worker that never held a share returns at once (memcap is not even imported)."""
    fr = cur.asked.slots.get(GPU, ()) if cur is not None else ()
    gm = getattr(cur.asked.request, "gpu_memory", None) if cur is not None else None
    if not (fr and fr[0][1] < 1 - 1e-6) and gm is None and "rayaccel.ray.worker.memcap" not in sys.modules:
        return
    from rayaccel.ray.worker import memcap

    try:
        share = memcap.share_of(tuple(f for _, f in fr), cur.devices, device_bytes(ns, cur), gm) if cur is not None else None
        memcap.apply(share, simulated=ns.record.simulated)
    except Exception as e:  # noqa: BLE001 - never break the task for its cap: say so, it runs uncapped
        log.error("rayaccel hook: could not cap this worker's share of its GPU: %s", e)


def device_bytes(ns: _NodeSide, cur: Grant | None = None) -> dict[int, int]:
    """Device index -> memory in bytes, from the node's topology (loads the record: shares only).

    On a node given MIG UUIDs (``cur.parents``: its ``GPU`` units are MIG instances) a device of ``cur``
    counts the memory of the grant's instances on it, where the topology knows each (else the device's own).
    """
    out = {d.index: d.memory_bytes for d in ns.topology.devices if d.memory_bytes}
    if cur is not None and cur.parents is not None:
        mine = set(cur.units.get(GPU, ()))
        by_dev: dict[int, list] = {}
        for p in ns.topology.partitions():
            if p.key in mine:
                by_dev.setdefault(p.parent, []).append(p.memory_bytes)
        for d, sizes in by_dev.items():
            if all(sizes):
                out[d] = sum(sizes)
    return out


def _family_env(ns: _NodeSide, t: Any, units: tuple | None) -> None:
    """Write a non-GPU family's variables for ``units`` as Ray's manager would (TPU: bounds of the actual
    block); nothing when the worker set ``RAY_EXPERIMENTAL_NOSET_<VAR>``; defaults when it holds none."""
    if any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in t.noset_env()):
        return
    if not units:
        for v in t.visible_env():
            _restore(v, ns.family_defaults.get(v))
        return
    if t.needs_topology_for_env():
        # the block's extent needs the chips' grid: the topology and the unit placer load here (TPU grants)
        from rayaccel.arbiter.placer import spec_of
        from rayaccel.placement.units import visible_env

        env = visible_env(ns.topology, spec_of(t.spec), units)
    else:
        text = ",".join(str(t.uuid_of.get(u, u)) for u in units)  # a preset node: the preset's ids
        env = {v: text for v in t.visible_env()}
    for v, value in env.items():
        _restore(v, value)


def _restore(var: str, value: str | None) -> None:
    """Set ``var`` to ``value`` (unset it for None), writing only when it changes: Ray's manager wrote the family's
    variable from the same units already, and a variable is written once per grant."""
    if value is None:
        os.environ.pop(var, None)
    elif os.environ.get(var) != value:
        os.environ[var] = value


def _after_task() -> None:
    """A normal task's code returned: its devices are free for the arbiter soon (not when the worker exits).

    The release runs off the task's path (a timer thread) and a little later: a reused
    worker usually starts its next task first, and that grant replaces the record in
    one lock cycle. Until then other grants see the devices held -- the safe side.
    """
    cur = _W.current
    if cur is None or not cur.asked.key.startswith("task:") or _W.node is None:
        return
    with _W.lock:
        if _W.current is not cur:
            return
        _W.current = _W.ray = None
        _apply_affinity(None)
        # the key the state file holds (a reused worker's fast path keeps its first record)
        _W.pending[cur.asked.key] = time.monotonic() + RELEASE_AFTER_S
    _release_thread()


def _release_thread() -> None:
    """Wake (start if not started) this process's releaser: it releases pending grants that are due."""
    _start_releaser().set()


def _start_releaser() -> threading.Event:
    """The releaser's wake-up event, its thread started now if it was not (the hook does at worker start:
    a thread's start costs ~0.1 ms, which a new worker's only task would otherwise pay when it ends)."""
    with _W.lock:
        if _W.release_event is None:
            ev = threading.Event()
            threading.Thread(target=_releaser, args=(ev,), name="rayaccel-release", daemon=True).start()
            _W.release_event = ev
        return _W.release_event


def _releaser(ev: threading.Event) -> None:
    while True:
        ev.wait()
        ev.clear()
        while True:
            with _W.lock:
                if not _W.pending:
                    break
                key, due = min(_W.pending.items(), key=lambda kv: kv[1])
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
                continue
            with _W.lock:
                if _W.pending.pop(key, None) is None:
                    continue  # superseded by a new grant of this worker
            ns = _W.node
            if ns is None:
                continue
            try:
                ns.arbiter.release(os.getpid(), key=key)
            except Exception as e:  # noqa: BLE001 - this thread must live on: later grants need it
                log.warning("rayaccel hook: could not release a finished task's grant: %s", e)


def _indices(ns: _NodeSide, cur: Grant) -> list[int]:
    """The devices of the grant: its GPUs (on a node given MIG UUIDs, their instances' parents), then the
    parents of its MIG instances, then the devices of the family's units (NeuronCores, TPU chips, ...), each
    once, in that order."""
    out = list(cur.devices)
    for r, t in ns.table.resources.items():
        if r == GPU:
            continue
        for k in cur.units.get(r, ()):
            p = t.device_of.get(k)
            if p is not None and p not in out:
                out.append(p)
    return out


def _apply_affinity(cpus: set[int] | None) -> tuple[int, ...] | None:
    """Pin to ``cpus`` intersected with the CPUs this process may use (restore when None or empty)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    if _W.original_affinity is None:
        _W.original_affinity = set(os.sched_getaffinity(0))
    target = (cpus or set()) & _W.original_affinity
    want = target or _W.original_affinity
    try:
        if set(os.sched_getaffinity(0)) != want:
            os.sched_setaffinity(0, want)
    except OSError as e:
        log.warning("rayaccel hook: cannot set CPU affinity: %s", e)
        return None
    return tuple(sorted(target)) if target else None


def affinity() -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(NUMA-local CPUs of the current devices by the topology, the CPUs actually pinned) -- None when not pinned."""
    ns, cur = node(), _W.current
    if ns is None or cur is None:
        return None, None
    cpus: set[int] = set()
    for i in _indices(ns, cur):
        cpus.update(ns.table.cpus.get(i, ()))
    applied = cpus & (_W.original_affinity or set())
    return (tuple(sorted(cpus)) or None), (tuple(sorted(applied)) or None)


def nics() -> tuple[str, ...]:
    """The RDMA NICs nearest the current devices (UCX ``device:port`` names), in device order."""
    ns, cur = node(), _W.current
    if ns is None or cur is None:
        return ()
    return tuple(dict.fromkeys(n for i in _indices(ns, cur) for n in ns.table.nics.get(i, ())))


def decide_with(request: Any) -> Grant | None:
    """Decide the current grant with ``request``'s constraints (``rayaccel.remote`` work, before user code).

    The one decision for such work: the hook left its grant undecided (see the module
    docstring). The grant's slots are Ray's; only which units stand behind them is
    chosen here. Waits while no set meeting the constraints is free. Returns the grant
    (None when the work holds no units).
    """
    ns = node()
    if ns is None:
        return None
    seen = _W.ray
    rg = rp.grant_of(rp.global_worker(), ns.managed, seen)
    if getattr(request, "near_node", None) is not None:
        from dataclasses import replace

        here = rg.node_id == request.near_node
        # the data's devices matter only on the node that holds them
        request = replace(request, near=request.near if here else (), near_node=None)
    if request is not None and not _constrained(request):
        request = None
    with _W.lock:
        cur = _W.current
        if cur is not None and rg is seen and cur.asked.request == request:
            return cur
        if not rg.slots:
            if cur is not None:
                _drop(ns)
            _W.ray = rg
            return None
        new = _decide(ns, rg, request)
    _after_set_visible({})
    return new


def _constrained(request: Any) -> bool:
    """Does the request say more than Ray's count (so the placer must see it)?"""
    return request.kind == "devices" and (request.interconnect != "any" or request.same_numa or request.nic
                                          or request.model is not None or request.vendor is not None
                                          or request.gpu_memory is not None or bool(request.required)
                                          or bool(request.near))


def _install() -> bool:
    if not os.environ.get(NODE_DIR_ENV):
        return False
    ns = None
    try:  # the node table and the arbiter's files at worker start, not on the first task's path
        ns = node()
        if ns is not None:
            ns.arbiter.open()
            if ns.gpus:
                ns.arbiter.rehearse(GPU)  # no lock: a new worker never waits for the node's grants
            _start_releaser()
    except Exception:  # noqa: BLE001 - the first grant reports it (node() raises there again)
        _W.node = ns = None
    # Ray asks the hook only about the resources the node's arbiter maps (every one while the table is unreadable)
    return rp.install(_get_ids, _after_set_visible, _after_task, resources=ns.unit_resources if ns else None)


_install()
