"""The dispatcher: tasks that find nothing free wait here, not pinned behind one busy set.

When a ``@rayaccel.remote`` task is submitted and no suitable device set is free,
the driver does not pin it behind one busy set (Ray would then keep it queued
there even if an equally good set frees first). It calls
``Dispatcher.run(...)`` on one named, detached async actor per cluster
(``rayaccel-dispatcher`` in namespace ``rayaccel``, ``num_cpus=0``); the
caller gets that call's ObjectRef at once, an ordinary ``ray.ObjectRef``.

Inside, the request waits in a queue. A scheduling pass runs on every arrival,
on every completion of a task the dispatcher submitted, and every
:data:`POLL_S` while the queue is not empty (so devices released by other
drivers, actors and gangs are noticed too). A pass reads Ray's available
resources (one GCS call), subtracts the dispatcher's own submissions Ray does not
show yet, and walks the queue oldest first: each request that fits is placed
on the best free set (the same :func:`~rayaccel.placement.place` as the direct
path) and submitted pinned to exactly those resources with
``NodeAffinitySchedulingStrategy`` — the same task the driver would have
submitted. ``run`` then awaits it and returns its value, so ``ray.get`` on the
caller's ref returns the value or raises the task's exception.

Fairness: requests are served FIFO by arrival; within one request class (equal
:class:`~rayaccel.placement.Request`) only the head is tried. A request that
fits is never held back for a different, older one, except by a reservation: a
request waiting longer than :data:`RESERVE_AFTER_S` reserves the best set it
could ever get (chosen once, kept), and younger requests may not take those
devices while they free up, so a stream of 1-GPU tasks cannot starve a queued
4-GPU task forever.

Failure: the actor restarts when it crashes (``max_restarts=-1``); calls it held
are retried there (``max_task_retries``, Ray's at-least-once task semantics). A
driver that finds the named actor gone (e.g. ``ray.kill``) creates a new one.

Only tasks take this path. Actors (``RemoteClass.remote`` must return an
ActorHandle at once) and streaming-generator tasks keep the queue-on-the-
least-loaded-set path of :mod:`rayaccel.ray.context`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict, deque
from typing import Any

log = logging.getLogger(__name__)
NAME = "rayaccel-dispatcher"
NAMESPACE = "rayaccel"
#: Scheduling-pass period while requests are queued (releases by others), seconds.
POLL_S = 0.05
#: A request queued longer than this reserves its set against younger requests, seconds.
RESERVE_AFTER_S = 2.0
#: How often a driver re-checks that its cached dispatcher handle is still alive, seconds.
HANDLE_CHECK_S = 0.5
#: Ray retries of a queued call when the dispatcher itself dies (like a task's max_retries).
MAX_TASK_RETRIES = 3

_LOCK = threading.Lock()  # guards handle creation (held across Ray calls)
# Guards _OUTSTANDING only. _done runs on Ray's callback thread: it must never wait for _LOCK, which
# handle() holds across ray.get_actor, itself served by that thread (a deadlock seen in tests).
_COUNT_LOCK = threading.Lock()
_HANDLE: Any = None
_HANDLE_AT = 0.0
_FN_REFS: dict[int, Any] = {}
_ACTOR_CLS: Any = None
_OUTSTANDING = 0
_DRIVER = uuid.uuid4().hex
_HINTED_UPTO = 0
_GEN = 0  # bumped by reset(): completions of calls from before a shutdown must not touch the new count
#: ``RAYACCEL_DISPATCH=0`` turns the dispatcher off: tasks then queue in Ray on the
#: least-loaded set chosen at submit (the behaviour of actors).
ENABLED = os.environ.get("RAYACCEL_DISPATCH", "1") != "0"
#: At most this many of the driver's young claims travel with each call (newest first).
MAX_HINTS = 64


class _Item:
    __slots__ = ("seq", "request", "name", "fn", "ray_opts", "args", "kwargs", "future", "since", "target")

    def __init__(self, seq, request, name, fn, ray_opts, args, kwargs, future):
        self.seq, self.request, self.name, self.fn = seq, request, name, fn
        self.ray_opts, self.args, self.kwargs, self.future = ray_opts, args, kwargs, future
        self.since = time.monotonic()
        self.target = None  # (node_id, resources) once reserved


class DispatcherCore:
    """The queue and scheduling passes (plain object; the actor wraps it, tests may drive it)."""

    def __init__(self, poll_s: float = POLL_S, reserve_after_s: float = RESERVE_AFTER_S):
        from .view import Claims, ClusterView

        self.poll_s = poll_s
        self.reserve_after_s = reserve_after_s
        self.view = ClusterView(ttl_s=0.0)
        self.claims = Claims(grace_s=1.0)
        # Submissions drivers made directly that Ray may not show yet (see submit()).
        self.hints = Claims(grace_s=1.0)
        self.hint_seen: "OrderedDict[tuple, None]" = OrderedDict()
        from concurrent.futures import ThreadPoolExecutor

        # GCS reads block: they run here, off the event loop.
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rayaccel-dispatch")
        self.queue: dict[Any, deque] = {}
        self.seq = 0
        self.fns: dict[str, Any] = {}
        self.submitters: dict[tuple, Any] = {}
        self.satisfiable: dict[tuple, Any] = {}
        self.kick: asyncio.Event | None = None
        self.loop_task: asyncio.Task | None = None
        self.stats = {"received": 0, "dispatched": 0, "completed": 0, "failed": 0, "passes": 0,
                      "missed": 0, "held_by_reservation": 0, "reservations": 0, "unsatisfiable": 0,
                      "max_wait_s": 0.0, "queued": 0}

    # ----------------------------------------------------------------- entry
    async def run(self, fn_box: tuple, request: Any, name: str, ray_opts: dict, payload: tuple,
                  hints: tuple = ()) -> Any:
        self.add_hints(hints)
        fn = await self._fn(fn_box[0])
        args, kwargs = payload
        loop = asyncio.get_running_loop()
        if self.kick is None:
            self.kick = asyncio.Event()
        self.seq += 1
        item = _Item(self.seq, request, name, fn, ray_opts, args, kwargs, loop.create_future())
        self.queue.setdefault(request, deque()).append(item)
        self.stats["received"] += 1
        self.stats["queued"] += 1
        if self.loop_task is None or self.loop_task.done():
            self.loop_task = asyncio.ensure_future(self._loop())
        self.kick.set()
        ref, cid, node_id, res = await item.future
        try:
            if isinstance(ref, list):
                return tuple(await asyncio.gather(*ref))
            return await ref
        except Exception:
            self.stats["failed"] += 1
            raise
        finally:
            self.stats["completed"] += 1
            self.claims.release(cid)
            self.kick.set()

    def add_hints(self, hints: tuple) -> None:
        """Count a driver's recent direct submissions against the free state until Ray shows them."""
        for driver, cid, node, res, before, age in hints:
            key = (driver, cid)
            if key in self.hint_seen:
                continue
            self.hint_seen[key] = None
            if len(self.hint_seen) > 4096:
                self.hint_seen.popitem(last=False)
            self.hints.add(node, res, None, before, age_s=age)

    async def _fn(self, ref: Any) -> Any:
        key = ref.hex()
        fn = self.fns.get(key)
        if fn is None:
            fn = self.fns[key] = await ref
        return fn

    def snapshot(self) -> dict:
        out = dict(self.stats)
        out["queued"] = sum(len(q) for q in self.queue.values())
        return out

    # ----------------------------------------------------------------- passes
    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while any(self.queue.values()):
            self.kick.clear()
            try:
                nodes = await loop.run_in_executor(self.pool, lambda: self.view.nodes(fresh=True))
                self.pass_once(nodes)
            except Exception:  # noqa: BLE001 - a dead loop would leave every queued call hanging
                # (a GCS hiccup, a placement bug): log it and try again on the next poll.
                self.stats["pass_errors"] = self.stats.get("pass_errors", 0) + 1
                log.exception("rayaccel dispatcher: scheduling pass failed; retrying in %.2f s", self.poll_s)
            if not any(self.queue.values()):
                break
            try:
                await asyncio.wait_for(self.kick.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass

    def _states(self, nodes, minus_extra: dict) -> list:
        from .view import node_state

        avail = {n.node_id: n.available for n in nodes}
        recent = self.claims.recent(avail)
        hinted = self.hints.recent(avail)
        out = []
        for n in nodes:
            m = dict(recent.get(n.node_id, {}))
            for extra in (hinted.get(n.node_id, {}), minus_extra.get(n.node_id, {})):
                for k, v in extra.items():
                    m[k] = m.get(k, 0.0) + v
            out.append(node_state(n, m))
        return out

    def pass_once(self, nodes: list | None = None) -> None:
        """One scheduling pass over the queue (see module docstring); ``nodes``: a fresh read of Ray."""
        from ..placement import place

        self.stats["passes"] += 1
        if nodes is None:
            nodes = self.view.nodes(fresh=True)
        by_id = {n.node_id: n for n in nodes}
        now = time.monotonic()
        reserved: dict[str, dict[str, float]] = {}
        heads = sorted((q[0] for q in self.queue.values() if q), key=lambda it: it.seq)
        for item in heads:
            q = self.queue[item.request]
            while q:
                item = q[0]
                if not self._still_satisfiable(item, nodes):
                    q.popleft()
                    continue
                alloc = place(self._states(nodes, reserved), item.request) if nodes else None
                if not alloc:
                    if now - item.since > self.reserve_after_s:
                        self._reserve(item, nodes, reserved)
                    break
                q.popleft()
                self._submit(item, alloc, by_id[alloc.node])
            if not q:
                self.queue.pop(item.request, None)
        self._audit(nodes, reserved)

    def _still_satisfiable(self, item: _Item, nodes: list) -> bool:
        from ..errors import Unsatisfiable
        from . import context

        try:
            context.check_satisfiable(item.request, nodes)
            return True
        except Unsatisfiable as e:
            self.stats["unsatisfiable"] += 1
            if not item.future.done():
                item.future.set_exception(e)
            return False

    def _reserve(self, item: _Item, nodes: list, reserved: dict) -> None:
        """Keep younger requests off the set ``item`` will take (chosen once, on the idle cluster)."""
        from ..placement import place
        from .resources import allocation_resources
        from .view import node_state

        by_id = {n.node_id: n for n in nodes}
        if item.target is None or item.target[0] not in by_id:
            states = [node_state(n, reserved.get(n.node_id), ignore_ray=True) for n in nodes]
            idle = place(states, item.request)
            if not idle:
                return
            topo = by_id[idle.node].topology
            shared = dict(idle.memory_bytes) if item.request.kind == "shared" else {}
            res = allocation_resources(topo, idle.devices if item.request.kind == "devices" else (),
                                       idle.partitions, shared)
            item.target = (idle.node, res)
            self.stats["reservations"] += 1
        node_id, res = item.target
        acc = reserved.setdefault(node_id, {})
        for k, v in res.items():
            acc[k] = acc.get(k, 0.0) + v

    def _audit(self, nodes: list, reserved: dict) -> None:
        """Count requests left queued although a matching set is free now (a scheduling bug if > 0)."""
        from ..placement import place

        if not any(self.queue.values()):
            return
        free = self._states(nodes, {})
        after_res = self._states(nodes, reserved) if reserved else free
        for q in self.queue.values():
            if not q:
                continue
            if place(after_res, q[0].request):
                self.stats["missed"] += 1
            elif reserved and place(free, q[0].request):
                self.stats["held_by_reservation"] += 1

    def _submit(self, item: _Item, alloc: Any, node: Any) -> None:
        from . import context
        from .tasks import pin, submitter

        try:
            spec, opts, res = pin(item.request, alloc, node, item.name, item.ray_opts, task=True)
            opts.setdefault("name", item.name)
            key = (id(item.fn), opts["scheduling_strategy"].node_id, tuple(sorted(opts["resources"].items())),
                   tuple(sorted((k, repr(v)) for k, v in item.ray_opts.items())))
            sub = self.submitters.get(key)
            if sub is None:
                if len(self.submitters) > 512:
                    self.submitters.clear()
                sub = self.submitters[key] = submitter(item.fn, opts)
            ref = sub.remote(spec, *item.args, **item.kwargs)
        except Exception as e:  # noqa: BLE001 - handed to the caller's ref (the item left the queue)
            item.future.set_exception(e)
            return
        cid = self.claims.add(node.node_id, res, None, context.effective(node, res, None))
        self.stats["dispatched"] += 1
        self.stats["max_wait_s"] = max(self.stats["max_wait_s"], time.monotonic() - item.since)
        item.future.set_result((ref, cid, node.node_id, res))


def _actor_cls() -> Any:
    global _ACTOR_CLS
    if _ACTOR_CLS is None:
        import ray

        @ray.remote(num_cpus=0, max_concurrency=100_000, max_restarts=-1, max_task_retries=MAX_TASK_RETRIES)
        class Dispatcher:
            def __init__(self):
                self.core = DispatcherCore()

            async def run(self, fn_box, request, name, ray_opts, payload, hints=()):
                return await self.core.run(fn_box, request, name, ray_opts, payload, hints)

            async def stats(self):
                return self.core.snapshot()

            async def configure(self, poll_s=None, reserve_after_s=None):
                if poll_s is not None:
                    self.core.poll_s = float(poll_s)
                if reserve_after_s is not None:
                    self.core.reserve_after_s = float(reserve_after_s)
                return self.core.snapshot()

        _ACTOR_CLS = Dispatcher
    return _ACTOR_CLS


def handle() -> Any:
    """The cluster's dispatcher actor (created on first use; re-created if it was killed)."""
    global _HANDLE, _HANDLE_AT
    import ray

    now = time.monotonic()
    h = _HANDLE
    if h is not None and now - _HANDLE_AT <= HANDLE_CHECK_S:
        return h
    with _LOCK:
        if _HANDLE is not None and time.monotonic() - _HANDLE_AT <= HANDLE_CHECK_S:
            return _HANDLE
        try:
            h = ray.get_actor(NAME, namespace=NAMESPACE)
        except ValueError:
            h = _actor_cls().options(name=NAME, namespace=NAMESPACE, lifetime="detached",
                                     get_if_exists=True).remote()
        _HANDLE, _HANDLE_AT = h, time.monotonic()
        return h


def _done(result: Any, gen: int | None = None) -> None:
    global _HANDLE, _OUTSTANDING
    import ray

    with _COUNT_LOCK:
        if gen is not None and gen != _GEN:
            return  # a call from before reset(): _OUTSTANDING was zeroed then
        _OUTSTANDING -= 1
    if isinstance(result, ray.exceptions.RayActorError):
        _HANDLE = None


def queued_here() -> bool:
    """Whether this driver has dispatcher calls not yet finished (new tasks then queue behind them)."""
    return _OUTSTANDING > 0


def reset() -> None:
    """Forget the cached handle and function refs (after ``ray.shutdown()``)."""
    global _HANDLE, _OUTSTANDING, _HINTED_UPTO, _GEN
    _HANDLE = None
    with _COUNT_LOCK:
        _GEN += 1
        _OUTSTANDING = 0
    _HINTED_UPTO = 0
    _FN_REFS.clear()


def routable(ray_opts: dict) -> bool:
    """Whether a task with these Ray options can go through the dispatcher (not generators)."""
    n = ray_opts.get("num_returns", 1)
    return ENABLED and isinstance(n, int) and n >= 1


def submit(ray_fn: Any, request: Any, name: str, ray_opts: dict, args: tuple, kwargs: dict) -> Any:
    """Queue a task at the dispatcher; return the caller's ObjectRef (a list for ``num_returns > 1``)."""
    import ray

    key = id(ray_fn)
    hit = _FN_REFS.get(key)
    if hit is None or hit[0] is not ray_fn:
        if len(_FN_REFS) > 256:
            _FN_REFS.clear()
        hit = _FN_REFS[key] = (ray_fn, ray.put(ray_fn))
    h = handle()
    n = ray_opts.get("num_returns", 1)
    method = h.run if n == 1 else h.run.options(num_returns=n)
    # refs nested in a tuple are passed through unresolved: the real task resolves them
    from . import context

    global _HINTED_UPTO
    # only claims not sent before (claim ids grow): the dispatcher keeps what it was told
    young = [y for y in context.claims().young()[:MAX_HINTS] if y[0] > _HINTED_UPTO]
    if young:
        _HINTED_UPTO = max(_HINTED_UPTO, young[0][0])
    hints = tuple((_DRIVER, cid, node, res, before, age) for cid, node, res, before, age, _ in young)
    ref = method.remote((hit[1],), request, name, ray_opts, (args, kwargs), hints)
    first = ref[0] if isinstance(ref, list) else ref
    if hasattr(first, "_on_completed"):
        global _OUTSTANDING
        with _COUNT_LOCK:
            _OUTSTANDING += 1
            gen = _GEN
        first._on_completed(lambda result, gen=gen: _done(result, gen))
    return ref


def stats(timeout_s: float = 10.0) -> dict:
    """The dispatcher's counters (received, dispatched, passes, missed, held_by_reservation, ...)."""
    import ray

    return ray.get(handle().stats.remote(), timeout=timeout_s)


def configure(poll_s: float | None = None, reserve_after_s: float | None = None) -> dict:
    """Change the dispatcher's poll period / reservation age at run time (tests, tuning)."""
    import ray

    return ray.get(handle().configure.remote(poll_s, reserve_after_s), timeout=10.0)
