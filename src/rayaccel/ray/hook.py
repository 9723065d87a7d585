"""The worker hook: every Python worker of a rayaccel node imports this before its first task.

A rayaccel node's raylet is started with ``RAY_preload_python_modules=rayaccel.ray.hook``
and ``RAYACCEL_NODE_DIR=<node directory>`` (see :mod:`.node`), so every worker it
spawns -- whatever driver submitted the work: a plain ``ray.init(address=...)``
driver, a Ray Job, Serve's or Train's controller -- imports this module. Importing
it wraps Ray's single in-worker GPU-id function (:func:`._ray_private.install`):

* at a grant (a new task, or an actor's creation) the raylet's slot indices are
  turned into physical devices by the node's :class:`~.arbiter.Arbiter`;
* ``ray.get_gpu_ids()``, ``get_runtime_context().get_accelerator_ids()``, the
  ``CUDA_VISIBLE_DEVICES`` Ray writes (ordered; MIG instances by UUID), the
  vendor's own variable (``HIP_VISIBLE_DEVICES`` on AMD), CPU affinity (the
  devices' NUMA-local CPUs) and :func:`rayaccel.get_devices` all name those devices.

A grant the arbiter cannot serve yet (a drained device, a constrained
``rayaccel.remote`` request) waits here, before user code, polling. Outside a
rayaccel node (no ``RAYACCEL_NODE_DIR``) importing this does nothing.

A worker whose environment lacks rayaccel (a ``runtime_env`` with its own
packages) cannot import this: Ray logs the import error and the worker runs
unhooked. It then sees only the placeholder ids the node's raylet was started
with (``CUDA_VISIBLE_DEVICES=rayaccel-unhooked-0,...``), i.e. no GPU at all --
never a device another worker holds; ``rayaccel status`` and ``doctor`` report
GPU slots held without the hook.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

NODE_DIR_ENV = "RAYACCEL_NODE_DIR"
#: Placeholder ids the raylet's visible-devices variable holds, so unhooked workers see no GPU.
UNHOOKED_PREFIX = "rayaccel-unhooked-"
#: Polling period while a grant waits (doubles up to the max), seconds.
WAIT_POLL_S = 0.02
WAIT_POLL_MAX_S = 0.25
#: Visible-devices variable per vendor.
VISIBLE_ENV = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "HIP_VISIBLE_DEVICES"}

_LOCK = threading.RLock()
_NODE: "_NodeSide | None" = None
_CURRENT: "Current | None" = None
_ORIGINAL_AFFINITY: set[int] | None = None
_REFINED: dict = {}  # grant key -> request applied by refine()


@dataclass(frozen=True, slots=True)
class Current:
    """This process's current grant (one at a time: a task, or the actor)."""

    sig: tuple
    ids: tuple
    devices: tuple[int, ...]
    partitions: tuple[str, ...]
    key: str


class _NodeSide:
    """What a worker knows of its node (loaded once per process from the node directory)."""

    def __init__(self, node_dir: str):
        from ..errors import TopologyError
        from .arbiter import Arbiter
        from .names import NodeRecord

        path = os.path.join(node_dir, "record.json")
        try:
            with open(path, "rb") as f:
                self.record = NodeRecord.from_json(f.read())
        except OSError as e:
            raise TopologyError(f"cannot read the node record {path}: {e.strerror}", path) from None
        self.dir = node_dir
        self.topology = self.record.topology
        self.arbiter = Arbiter(node_dir, self.topology)
        vendors = {d.vendor for d in self.topology.devices}
        self.vendor = vendors.pop() if len(vendors) == 1 else "nvidia"
        self.env_var = VISIBLE_ENV.get(self.vendor, "CUDA_VISIBLE_DEVICES")
        self.default_visible = os.environ.get(self.env_var)


def node() -> "_NodeSide | None":
    """This worker's node side, or None outside a rayaccel node.

    Raises:
        TopologyError / ClusterError: the node directory or its record is unreadable.
    """
    global _NODE
    if _NODE is None:
        d = os.environ.get(NODE_DIR_ENV)
        if not d:
            return None
        with _LOCK:
            if _NODE is None:
                _NODE = _NodeSide(d)
    return _NODE


def current() -> "Current | None":
    """The grant this process holds now, as the arbiter decided it (None: no devices)."""
    return _CURRENT


# ----------------------------------------------------------------- the patch
def _get_ids(original: Any, worker: Any, resource_name: str, regex: str) -> list:
    from . import _ray_private as rp

    if resource_name != rp.GPU:
        return original(worker, resource_name, regex)
    try:
        ns = node()
    except Exception as e:  # noqa: BLE001 - never break Ray's worker; fail safe (unhooked ids: no GPU)
        log.error("rayaccel hook: node side unavailable (%s); this worker sees Ray's placeholder ids", e)
        return original(worker, resource_name, regex)
    if ns is None:
        return original(worker, resource_name, regex)
    ids = rp.resource_ids(worker)
    gpu, pg, bundle = rp.split_gpu_grant(ids)
    mig = tuple(sorted((r, int(s)) for r, assigned in ids.items() if r.startswith("mig_") for s, _ in assigned))
    key = rp.grant_key(worker)
    sig = (key, tuple(gpu), mig)
    cur = _CURRENT
    if cur is not None and cur.sig == sig:
        return list(cur.ids)
    with _LOCK:
        cur = _CURRENT
        if cur is not None and cur.sig == sig:
            return list(cur.ids)
        if not gpu and not mig:
            if cur is not None:
                _drop(ns)
            return []
        again = _same_as_last(ns, tuple(gpu), mig, pg, key)
        if again is not None:
            return list(again.ids)
        return list(_decide(ns, worker, key, sig, tuple(gpu), mig, pg, bundle, _REFINED.get(key)).ids)


#: (slots, MIG slots, Current, its key, state file mtime after our write, the key written in the state file)
#: of this worker's last grant.
_LAST: tuple | None = None


def _same_as_last(ns: _NodeSide, gpu: tuple, mig: tuple, pg: str | None, key: str) -> "Current | None":
    """A reused worker granted the very slots it just had, while nothing else changed on the node.

    Its record still holds those slots (its release was pending, now superseded), so they
    kept their devices; if the state file is untouched since this worker wrote it, no
    drain or other change happened either: the same devices, with no lock and no I/O.
    """
    global _CURRENT
    last = _LAST
    if last is None or pg is not None or key in _REFINED or last[0] != gpu or last[1] != mig:
        return None
    if last[5] not in _PENDING_RELEASE:
        return None
    try:
        if os.stat(ns.arbiter._state_path).st_mtime_ns != last[4]:
            return None
    except OSError:
        return None
    _PENDING_RELEASE.clear()
    prev = last[2]
    _CURRENT = Current(sig=(key, gpu, mig), ids=prev.ids, devices=prev.devices, partitions=prev.partitions, key=key)
    globals()["_LAST"] = (gpu, mig, _CURRENT, key, last[4], last[5])
    return _CURRENT


def _drop(ns: _NodeSide) -> None:
    global _CURRENT
    _CURRENT = None
    try:
        ns.arbiter.release(os.getpid())
    except OSError as e:
        log.warning("rayaccel hook: could not release this worker's grant: %s", e)


def _decide(ns: _NodeSide, worker: Any, key: str, sig: tuple, gpu: tuple, mig: tuple, pg: str | None,
            bundle: int | None, request: Any) -> Current:
    """Ask the arbiter (waiting while it cannot serve the grant); set :data:`_CURRENT`."""
    global _CURRENT
    from . import _ray_private as rp
    from .arbiter import GrantRequest

    _PENDING_RELEASE.clear()  # this grant replaces this worker's record: nothing else to release
    info = rp.holder_info(worker)
    drain = _drain_target(info)
    pg_bundles = None
    if pg is not None and bundle is not None and ns.arbiter.needs_pg(pg):
        try:
            pg_bundles = rp.pg_gpus_on_node(pg, rp.node_id(worker))
        except Exception as e:  # noqa: BLE001 - without the group's shape each member chooses alone
            log.warning("rayaccel hook: placement group %s unreadable (%s); choosing this bundle alone", pg, e)
    req = GrantRequest(pid=os.getpid(), key=key, gpu=gpu, mig=mig, pg=pg, bundle=bundle, pg_bundles=pg_bundles,
                       request=request, drain=drain, info=info)
    delay = WAIT_POLL_S
    warned = 0.0
    t0 = time.monotonic()
    while True:
        g = ns.arbiter.grant(req, pg_alive=_pg_alive)
        if g.waiting is None:
            break
        now = time.monotonic()
        if now - warned > 30.0:
            log.warning("rayaccel: grant %s waits (%.0f s so far): %s", key, now - t0, g.waiting)
            warned = now
        time.sleep(delay)
        delay = min(WAIT_POLL_MAX_S, delay * 2)
    ids: list = list(g.devices)
    ids += [ns.arbiter.uuid(k) or k for k in g.partitions]
    _CURRENT = Current(sig=sig, ids=tuple(ids), devices=tuple(g.devices), partitions=tuple(g.partitions), key=key)
    global _LAST
    _LAST = None
    if drain is None and request is None and pg is None:
        try:
            _LAST = (gpu, mig, _CURRENT, key, os.stat(ns.arbiter._state_path).st_mtime_ns, key)
        except OSError:
            pass
    return _CURRENT


def _drain_target(info: dict) -> int | None:
    from .names import drain_target

    if info.get("kind") != "actor":
        return None
    return drain_target(info.get("name") or "")


_PG_SEEN: dict[str, float] = {}  # group -> when it was last seen alive (a removed group stays removed)
_PG_ALIVE_TTL_S = 1.0


def _pg_alive(pg: str) -> bool:
    """Does placement group ``pg`` still exist? (One GCS read, remembered for a second.)"""
    from . import _ray_private as rp

    now = time.monotonic()
    seen = _PG_SEEN.get(pg)
    if seen is not None and now - seen < _PG_ALIVE_TTL_S:
        return True
    try:
        alive = rp.pg_gpus_on_node(pg, "") is not None
    except Exception:  # noqa: BLE001 - unknown: keep the reservation (conservative)
        return True
    if alive:
        if len(_PG_SEEN) > 1024:
            _PG_SEEN.clear()
        _PG_SEEN[pg] = now
    return alive


def _after_set_visible(saved: dict) -> dict:
    """After Ray wrote the visible-devices variable: the vendor's variable, rayaccel's, CPU affinity."""
    try:
        ns = node()
    except Exception:  # noqa: BLE001 - reported by _get_ids already
        return saved
    if ns is None:
        return saved
    cur = _CURRENT
    for var in (ns.env_var, "RAYACCEL_DEVICES"):
        saved.setdefault(var, os.environ.get(var))
    if cur is None:
        # No devices for this task: Ray leaves the variable as the last task set it; reset it.
        if ns.default_visible is None:
            os.environ.pop(ns.env_var, None)
        else:
            os.environ[ns.env_var] = ns.default_visible
        os.environ.pop("RAYACCEL_DEVICES", None)
        _apply_affinity(None)
        return saved
    os.environ[ns.env_var] = ",".join(str(i) for i in cur.ids)
    os.environ["RAYACCEL_DEVICES"] = json.dumps(list(cur.devices) or sorted({_parent(ns, k) for k in cur.partitions}))
    cpus: set[int] = set()
    for i in _indices(ns, cur):
        cpus.update(ns.topology.device(i).cpus or ())
    _apply_affinity(cpus or None)
    return saved


#: A finished task's grant is released this long after its code returned, unless the same
#: worker has taken a new grant by then (which replaces the record at no extra cost), seconds.
RELEASE_AFTER_S = 0.02
_PENDING_RELEASE: dict = {}  # grant key -> when it may be released


def _after_task() -> None:
    """A normal task's code returned: its devices are free for the arbiter soon (not when the worker exits).

    The release runs off the task's path (a timer thread) and a little later: a reused
    worker usually starts its next task first, and that grant replaces the record in
    one lock cycle. Until then other grants see the devices held -- the safe side.
    """
    global _CURRENT
    cur = _CURRENT
    if cur is None or not cur.key.startswith("task:"):
        return
    if _NODE is None:
        return
    with _LOCK:
        if _CURRENT is not cur:
            return
        _CURRENT = None
        _apply_affinity(None)
        last = _LAST
        written = last[5] if last is not None and last[2] is cur else cur.key  # the key the state file holds
        _PENDING_RELEASE[written] = time.monotonic() + RELEASE_AFTER_S
    _release_thread()


_RELEASE_EVENT: Any = None


def _release_thread() -> None:
    """Wake (start on first use) this process's releaser: it releases pending grants that are due."""
    global _RELEASE_EVENT
    if _RELEASE_EVENT is None:
        ev = threading.Event()

        def run() -> None:
            while True:
                ev.wait()
                ev.clear()
                while True:
                    with _LOCK:
                        if not _PENDING_RELEASE:
                            break
                        key, due = min(_PENDING_RELEASE.items(), key=lambda kv: kv[1])
                    wait = due - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                        continue
                    with _LOCK:
                        if _PENDING_RELEASE.pop(key, None) is None:
                            continue  # superseded by a new grant of this worker
                    ns = _NODE
                    if ns is None:
                        continue
                    try:
                        ns.arbiter.release(os.getpid(), key=key)
                    except OSError as e:
                        log.warning("rayaccel hook: could not release a finished task's grant: %s", e)

        threading.Thread(target=run, name="rayaccel-release", daemon=True).start()
        _RELEASE_EVENT = ev
    _RELEASE_EVENT.set()


def _parent(ns: _NodeSide, key: str) -> int:
    return int(key.split(":")[0])


def _indices(ns: _NodeSide, cur: Current) -> list[int]:
    out = list(cur.devices)
    for k in cur.partitions:
        p = _parent(ns, k)
        if p not in out:
            out.append(p)
    return out


def _apply_affinity(cpus: set[int] | None) -> tuple[int, ...] | None:
    """Pin to ``cpus`` intersected with the CPUs this process may use (restore when None or empty)."""
    global _ORIGINAL_AFFINITY
    if not hasattr(os, "sched_setaffinity"):
        return None
    if _ORIGINAL_AFFINITY is None:
        _ORIGINAL_AFFINITY = set(os.sched_getaffinity(0))
    target = (cpus or set()) & _ORIGINAL_AFFINITY
    want = target or _ORIGINAL_AFFINITY
    try:
        if set(os.sched_getaffinity(0)) != want:
            os.sched_setaffinity(0, want)
    except OSError as e:
        log.warning("rayaccel hook: cannot set CPU affinity: %s", e)
        return None
    return tuple(sorted(target)) if target else None


def affinity() -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(NUMA-local CPUs of the current devices by the topology, the CPUs actually pinned) -- None when not pinned."""
    ns, cur = node(), _CURRENT
    if ns is None or cur is None:
        return None, None
    cpus: set[int] = set()
    for i in _indices(ns, cur):
        cpus.update(ns.topology.device(i).cpus or ())
    applied = cpus & (_ORIGINAL_AFFINITY or set())
    return (tuple(sorted(cpus)) or None), (tuple(sorted(applied)) or None)


def refine(request: Any) -> Current | None:
    """Re-decide the current grant with ``request``'s constraints (``rayaccel.remote`` work, before user code).

    The grant's slots are Ray's; only which devices stand behind them may change,
    and only now, before the task's code runs. Waits while no set meeting the
    constraints is free. Returns the (new) current grant.
    """
    from . import _ray_private as rp

    ns = node()
    if ns is None:
        return None
    worker = rp.global_worker()
    if getattr(request, "near_node", None) is not None:
        from dataclasses import replace

        here = rp.node_id(worker) == request.near_node
        # the data's devices matter only on the node that holds them
        request = replace(request, near=request.near if here else (), near_node=None)
    with _LOCK:
        cur = _CURRENT
        if cur is None:
            return None
        key = cur.key
        if _REFINED.get(key) == request:
            return cur
        _REFINED.clear()
        _REFINED[key] = request
        ids = rp.resource_ids(worker)
        gpu, pg, bundle = rp.split_gpu_grant(ids)
        new = _decide(ns, worker, key, cur.sig, tuple(gpu), cur.sig[2], pg, bundle, request)
    _after_set_visible({})
    return new


def _install() -> bool:
    if not os.environ.get(NODE_DIR_ENV):
        return False
    from . import _ray_private as rp

    installed = rp.install(_get_ids, _after_set_visible, _after_task)
    # The topology and the placer load beside the worker's start-up, not on its path (the
    # worker registers with the raylet meanwhile) and not in its first grant.
    threading.Thread(target=_warm, name="rayaccel-warm", daemon=True).start()
    return installed


def _warm() -> None:
    try:
        ns = node()
        if ns is not None:
            ns.arbiter.warm()
    except Exception as e:  # noqa: BLE001 - reported again (fail safe) at the first grant
        log.error("rayaccel hook: %s", e)


_install()
