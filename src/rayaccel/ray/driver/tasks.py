"""``@rayaccel.remote``: Ray tasks and actors with what plain ``num_gpus`` cannot say.

::

    @rayaccel.remote(gpus=2, interconnect="nvlink")
    def train(x): ...
    ref = train.remote(1)                  # an ordinary ray.ObjectRef

    @rayaccel.remote(gpu_memory="16GiB")   # shares one device by memory
    class Server: ...
    h = Server.options(name="srv").remote()  # an ordinary ActorHandle

Each submit turns the request into a :class:`~.claim.Claim` (the node to prefer,
the nodes that could ever serve it) and then into ordinary Ray options
(``num_gpus``, MIG resources, a soft node pin, a label selector): Ray's own
ledger queues, schedules, retries and cancels the work like any Ray task. In the
worker, before user code runs, the node's arbiter maps the granted slots to devices
once, with the request's constraints Ray cannot express (interconnect, same NUMA,
NIC, model: :func:`.hook.decide_with`), waiting while no set meeting them is free.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from typing import Any, Callable

from rayaccel.errors import RequestError
from rayaccel.memory.handle import Handle
from rayaccel.placement import Request
from rayaccel.ray.driver import claim as claims
from rayaccel.ray.worker.devices import Assignment

#: rayaccel's own options: the fields of :class:`~rayaccel.placement.Request` a user may set (``near_node`` is
#: derived from ``near``); everything else goes to Ray (``num_gpus`` is a synonym of ``gpus``).
REQUEST_FIELDS = tuple(f.name for f in fields(Request) if f.name != "near_node")
_FORBIDDEN = {
    "scheduling_strategy": "rayaccel chooses the node (it soft-pins to the best one)",
    "placement_group": "use rayaccel.gang() for co-scheduled groups (or plain Ray: placement groups are gangs "
                       "on rayaccel nodes already)",
    "accelerator_type": "use model='H100' (a substring of the device model)",
}


@dataclass(frozen=True, slots=True)
class WorkSpec:
    """What travels with each rayaccel task/actor to the worker (small).

    Attributes:
        request: the placement request (the worker's set-up has the arbiter decide the grant with it).
        name: label for ``status``.
    """

    request: Any
    name: str


def build_request(fields: dict) -> Any:
    """A :class:`~rayaccel.placement.Request` from decorator fields.

    Defaults: nothing given -> one whole device; ``mig`` alone -> one MIG instance;
    ``gpu_memory`` alone -> a share of one device by memory (``exclusive=False``).

    Raises:
        RequestError: a bad field (names it and the allowed values).
    """
    f = {k: v for k, v in fields.items() if v is not None}
    if "near" in f:
        f["near"], f["near_node"] = near_devices(f["near"])
    if "required" in f and not isinstance(f["required"], (tuple, list)):
        f["required"] = (f["required"],)
    gpus = f.pop("gpus", None)
    if gpus is None and f.get("required"):
        gpus = len(f["required"])
    if gpus is None:
        if "mig" in f:
            gpus = 0
        elif "gpu_memory" in f and f.get("exclusive", False) is False:
            gpus = 0
            f.setdefault("exclusive", False)
        else:
            gpus = 1
    return Request(gpus=gpus, **f)


def near_devices(value: Any) -> tuple[tuple[int, ...], str | None]:
    """``near=`` as (device indices, Ray node id): where the task's input data already sits.

    Accepts a handle from ``rayaccel.store().put(...)`` (it names its node and device),
    an :class:`~.worker.Assignment` (``rayaccel.get_devices()`` of the producer), a
    ``(node_id, device or devices)`` pair, a device index (any node), or a list of those
    on one node.

    Raises:
        RequestError: anything else, or data on several nodes.
    """
    items = value if isinstance(value, list) else [value]
    nodes: set[str | None] = set()
    devs: set[int] = set()
    for v in items:
        if isinstance(v, Handle):
            sh = v.shared
            if sh is None or sh.device is None:
                raise RequestError("this handle does not say where its object lives (put it from a rayaccel task "
                                   "or actor, whose store knows its device)", "near")
            nodes.add(sh.node_id)
            devs.add(int(sh.device))
        elif isinstance(v, Assignment):
            nodes.add(v.node_id)
            devs.update(v.indices)
        elif isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
            nodes.add(v[0])
            devs.update((v[1],) if isinstance(v[1], int) else tuple(v[1]))
        elif isinstance(v, int) and not isinstance(v, bool):
            nodes.add(None)
            devs.add(v)
        else:
            raise RequestError(f"cannot tell where {type(v).__name__} data lives", "near",
                               "a store handle, rayaccel.get_devices(), (node_id, device) or a device index")
    named = {n for n in nodes if n is not None}
    if len(named) > 1:
        raise RequestError(f"the data sits on {len(named)} nodes; name the devices of one", "near")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devs):
        raise RequestError(f"device indices must be ints >= 0, got {sorted(devs, key=str)}", "near")
    return tuple(sorted(devs)), (named.pop() if named else None)


def _validate_ray_options(ray_opts: dict, kind: str) -> None:
    """Check Ray's options now (Ray itself would only complain at the first ``.remote()``).

    Raises:
        RequestError: an option Ray does not know for ``kind`` or a bad value (names the option).
    """
    from rayaccel.ray import _ray_private as rp

    rou = rp.option_utils()

    known = rou.task_options if kind == "task" else rou.actor_options
    validate = rou.validate_task_options if kind == "task" else rou.validate_actor_options
    for k, v in ray_opts.items():
        if k not in known:
            raise RequestError(f"unknown option {k!r} for a rayaccel {kind}", k,
                               "rayaccel's " + ", ".join(REQUEST_FIELDS) + " or a Ray option ("
                               + ", ".join(sorted(o for o in known if not o.startswith("_"))) + ")")
        try:
            validate({k: v}, in_options=False)
        except (ValueError, TypeError) as e:
            raise RequestError(f"bad value {v!r}: {e}", k) from None
    try:
        validate(dict(ray_opts), in_options=False)
    except (ValueError, TypeError) as e:
        raise RequestError(str(e), "options") from None


def split_options(options: dict, kind: str = "task") -> tuple[dict, dict]:
    """(rayaccel request fields, Ray options) of a decorator's keywords.

    Raises:
        RequestError: a forbidden or unknown option, ``gpus`` and ``num_gpus`` both given,
            or a resource rayaccel manages.
    """
    options = dict(options)
    if "num_gpus" in options:
        if "gpus" in options and options["gpus"] != options["num_gpus"]:
            raise RequestError("give gpus= or its synonym num_gpus=, not both", "num_gpus", "one of them")
        n = options.pop("num_gpus")
        if n is not None:
            if isinstance(n, float) and n.is_integer():
                n = int(n)
            if isinstance(n, float):
                raise RequestError(f"expected a whole number of devices, got {n}", "num_gpus",
                                   "an int; for a share of one device use gpu_memory='16GiB'")
            options["gpus"] = n
    req = {k: options[k] for k in REQUEST_FIELDS if k in options}
    ray_opts = {k: v for k, v in options.items() if k not in REQUEST_FIELDS}
    for k, why in _FORBIDDEN.items():
        if k in ray_opts:
            raise RequestError(f"not supported on rayaccel work: {why}", k)
    res = ray_opts.get("resources") or {}
    if not isinstance(res, dict):
        raise RequestError(f"expected a dict of custom resources, got {type(res).__name__}", "resources")
    bad = [r for r in res if isinstance(r, str) and (r.startswith(("mig_", "rayaccel_node_")) or r == "GPU")]
    if bad:
        raise RequestError(f"resource {bad[0]!r} is managed by rayaccel", "resources", "your own custom resources")
    _validate_ray_options(ray_opts, kind)
    return req, ray_opts


class RemoteFunction:
    """A function decorated with :func:`remote`; call ``.remote(...)`` / ``.options(...)``."""

    def __init__(self, fn: Callable, options: dict, _ray_fn: Any = None, _ray_fn_once: Any = None):
        self._fn = fn
        self._req_fields, self._ray_opts = split_options(options)
        self._request = build_request(self._req_fields)
        self._name = self._ray_opts.get("name") or getattr(fn, "__name__", "task")
        self._spec = WorkSpec(self._request, self._name)
        self._max_calls = self._ray_opts.pop("max_calls", None)
        self._ray_fn = _ray_fn
        self._ray_fn_once = _ray_fn_once
        self._cache: dict = {}
        functools.update_wrapper(self, fn)

    def _base(self, real: bool = False) -> Any:
        """Ray's remote function; on real hardware one that runs once per process (``max_calls=1``).

        CUDA cannot change its visible devices once initialised in a process, so, like
        Ray's own GPU tasks, a task on real devices gets a fresh worker (unless the
        user set ``max_calls``).
        """
        if self._ray_fn is None:
            import ray

            fn = self._fn

            def rayaccel_task(_rayaccel_spec, *args, **kwargs):
                from rayaccel.ray.worker.devices import run_task  # runs in the worker (this closure travels by value)

                return run_task(fn, _rayaccel_spec, args, kwargs)

            rayaccel_task.__name__ = getattr(fn, "__name__", "rayaccel_task")
            rayaccel_task.__qualname__ = getattr(fn, "__qualname__", rayaccel_task.__name__)
            self._ray_fn = ray.remote(max_calls=self._max_calls or 0)(rayaccel_task)
            self._ray_fn_once = ray.remote(max_calls=self._max_calls or 1)(rayaccel_task)
        return self._ray_fn_once if real else self._ray_fn

    @property
    def request(self) -> Any:
        """The placement request every call makes."""
        return self._request

    def _submitter(self, claim: Any) -> Any:
        # Ray's .options() builds a wrapper per call; one per (node, shape) is enough.
        key = (claim.node_id, claim.num_gpus, claim.resources, claim.node_keys, claim.every_node, claim.real)
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) > 256:
                self._cache.clear()
            opts = claim.ray_options(self._ray_opts)
            opts.setdefault("name", self._name)
            hit = self._cache[key] = self._base(claim.real).options(**opts)
        return hit

    def options(self, **options: Any) -> "RemoteFunction":
        """A copy with rayaccel fields and/or Ray options replaced (same rules as :func:`remote`)."""
        merged = {**self._req_fields, **self._ray_opts, **options}
        if self._max_calls is not None:
            merged.setdefault("max_calls", self._max_calls)
        if "num_gpus" in options:
            merged.pop("gpus", None)
        if "max_calls" in options:  # another variant of the Ray function
            return RemoteFunction(self._fn, merged)
        self._base()
        return RemoteFunction(self._fn, merged, _ray_fn=self._ray_fn, _ray_fn_once=self._ray_fn_once)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Plan and submit; return Ray's ObjectRef (or refs, with ``num_returns``).

        Raises:
            Unsatisfiable: no node could ever run this request.
            ClusterError: Ray is not initialised.
        """
        c = claims.plan(self._request)
        ref = self._submitter(c).remote(self._spec, *args, **kwargs)
        first = ref[0] if isinstance(ref, list) else ref
        claims.record(c, first if hasattr(first, "_on_completed") else None)
        return ref

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self._name} is a rayaccel remote function: call {self._name}.remote(...)")


def _wrap_class(cls: type) -> type:
    class RayaccelActor(cls):  # type: ignore[misc, valid-type]
        def __init__(self, _rayaccel_spec, *args, **kwargs):
            from rayaccel.ray.worker.devices import setup  # runs in the worker (the class travels by value)

            setup(_rayaccel_spec)
            super().__init__(*args, **kwargs)

    RayaccelActor.__name__ = cls.__name__
    RayaccelActor.__qualname__ = cls.__qualname__
    RayaccelActor.__doc__ = cls.__doc__
    return RayaccelActor


class RemoteClass:
    """A class decorated with :func:`remote`; ``.remote(...)`` creates an actor."""

    def __init__(self, cls: type, options: dict, _ray_cls: Any = None):
        self._cls = cls
        self._req_fields, self._ray_opts = split_options(options, "actor")
        self._request = build_request(self._req_fields)
        self._ray_cls = _ray_cls

    def _base(self) -> Any:
        if self._ray_cls is None:
            import ray

            self._ray_cls = ray.remote(_wrap_class(self._cls))
        return self._ray_cls

    @property
    def request(self) -> Any:
        """The placement request every actor makes."""
        return self._request

    def options(self, **options: Any) -> "RemoteClass":
        """A copy with rayaccel fields and/or Ray actor options replaced."""
        merged = {**self._req_fields, **self._ray_opts, **options}
        if "num_gpus" in options:
            merged.pop("gpus", None)
        return RemoteClass(self._cls, merged, _ray_cls=self._base())

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Plan and create the actor; return Ray's ActorHandle.

        Raises:
            Unsatisfiable: no node could ever host this actor.
        """
        name = self._ray_opts.get("name") or self._cls.__name__
        c = claims.plan(self._request)
        spec = WorkSpec(self._request, name)
        handle = self._base().options(**c.ray_options(self._ray_opts)).remote(spec, *args, **kwargs)
        claims.record(c)
        return handle


def remote(*args: Any, **options: Any) -> Any:
    """Decorate a function or class as rayaccel remote work.

    Use bare (``@rayaccel.remote``: one whole device) or with options: rayaccel's
    ``gpus`` (or its synonym ``num_gpus``), ``mig``, ``gpu_memory``, ``interconnect``,
    ``same_numa``, ``vendor``, ``model``, ``nic``, ``exclusive``; any other keyword is
    a Ray option (``num_cpus``, ``max_retries``, ``name``, ``label_selector`` ...),
    except ``scheduling_strategy``, ``placement_group`` and ``accelerator_type``.

    Raises:
        RequestError: a bad option (raised at decoration time).
    """
    if len(args) == 1 and not options and (inspect.isfunction(args[0]) or inspect.isclass(args[0])):
        return _make(args[0], {})
    if args:
        raise RequestError("use @rayaccel.remote or @rayaccel.remote(gpus=..., ...) with keyword options", "remote")
    return lambda obj: _make(obj, options)


def _make(obj: Any, options: dict) -> Any:
    if inspect.isclass(obj):
        return RemoteClass(obj, options)
    if callable(obj):
        return RemoteFunction(obj, options)
    raise RequestError(f"expected a function or class, got {type(obj).__name__}", "remote")
