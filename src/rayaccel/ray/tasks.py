"""``@rayaccel.remote``: Ray tasks and actors placed on the best devices.

::

    @rayaccel.remote(gpus=2, interconnect="nvlink")
    def train(x): ...
    ref = train.remote(1)                  # an ordinary ray.ObjectRef

    @rayaccel.remote(gpu_memory="16GiB")   # shares one device by memory
    class Server: ...
    h = Server.options(name="srv").remote()  # an ordinary ActorHandle

At each submit rayaccel places the request on the cluster (see
:mod:`rayaccel.ray.context`) and hands Ray a task asking for exactly the chosen
device resources (:mod:`rayaccel.ray.resources`) with
``NodeAffinitySchedulingStrategy(node, soft=False)``; the worker side runs
:mod:`rayaccel.ray.worker` before user code. When no suitable set is free (or
this driver already has calls waiting), a task goes to the cluster's
dispatcher (:mod:`rayaccel.ray.dispatch`), which starts it on the first
suitable set that frees; the caller still gets an ordinary ObjectRef. Actors
queue in Ray on the least-loaded set chosen at creation. Tasks on real (non-simulated)
hardware default to ``max_calls=1`` like Ray's own GPU tasks, because CUDA
cannot change its visible devices once initialised in a process.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from ..errors import RequestError

#: rayaccel's own options; everything else goes to Ray.
REQUEST_FIELDS = ("gpus", "mig", "gpu_memory", "interconnect", "same_numa", "vendor", "model", "nic", "exclusive")
_FORBIDDEN = {
    "num_gpus": "rayaccel nodes advertise no Ray GPUs; ask with gpus=/mig=/gpu_memory= instead",
    "scheduling_strategy": "rayaccel pins the work to the node it chose",
    "placement_group": "use rayaccel.gang() for co-scheduled groups",
    "accelerator_type": "use model='H100' (a substring of the device model)",
}


def build_request(fields: dict) -> Any:
    """A :class:`~rayaccel.placement.Request` from decorator fields.

    Defaults: nothing given -> one whole device; ``mig`` alone -> one MIG instance;
    ``gpu_memory`` alone -> a share of one device by memory (``exclusive=False``).

    Raises:
        RequestError: a bad field (names it and the allowed values).
    """
    from ..placement import Request

    f = {k: v for k, v in fields.items() if v is not None}
    gpus = f.pop("gpus", None)
    if gpus is None:
        if "mig" in f:
            gpus = 0
        elif "gpu_memory" in f and f.get("exclusive", False) is False:
            gpus = 0
            f.setdefault("exclusive", False)
        else:
            gpus = 1
    return Request(gpus=gpus, **f)


def _validate_ray_options(ray_opts: dict, kind: str) -> None:
    """Check Ray's options now (Ray itself would only complain at the first ``.remote()``).

    Raises:
        RequestError: an option Ray does not know for ``kind`` or a bad value (names the option).
    """
    try:
        from ray._common import ray_option_utils as rou
    except ImportError:  # older Ray layout
        try:
            from ray._private import ray_option_utils as rou  # type: ignore[no-redef]
        except ImportError:  # no validator in this Ray: Ray checks at submit instead
            return
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


def _split(options: dict, kind: str = "task") -> tuple[dict, dict]:
    req = {k: options[k] for k in REQUEST_FIELDS if k in options}
    ray_opts = {k: v for k, v in options.items() if k not in REQUEST_FIELDS}
    for k, why in _FORBIDDEN.items():
        if k in ray_opts and not (k == "num_gpus" and not ray_opts[k]):
            raise RequestError(f"not supported on rayaccel work: {why}", k)
    ray_opts.pop("num_gpus", None)
    res = ray_opts.get("resources") or {}
    if not isinstance(res, dict):
        raise RequestError(f"expected a dict of custom resources, got {type(res).__name__}", "resources")
    bad = [r for r in res if isinstance(r, str) and r.startswith(("accel_", "rayaccel_node_"))]
    if bad:
        raise RequestError(f"resource {bad[0]!r} is managed by rayaccel", "resources", "your own custom resources")
    _validate_ray_options(ray_opts, kind)
    return req, ray_opts


#: ``ray.remote(max_calls=n)`` variants of base functions: (id(fn), n) -> (fn, variant).
_VARIANTS: dict[tuple[int, int], tuple[Any, Any]] = {}


def submitter(ray_fn: Any, opts: dict) -> Any:
    """``ray_fn.options(**opts)``; a ``max_calls`` in ``opts`` goes to a ``ray.remote(max_calls=n)`` variant.

    Ray accepts ``max_calls`` only in ``ray.remote(...)``, never in ``.options()``
    (it raises ValueError there), yet :func:`pin` sets it for tasks on real hardware
    and users may pass it. Shared by the direct path and the dispatcher.
    """
    opts = dict(opts)
    n = opts.pop("max_calls", None)
    fn = ray_fn
    if n is not None:
        key = (id(ray_fn), n)
        hit = _VARIANTS.get(key)
        if hit is None or hit[0] is not ray_fn:
            import ray

            if len(_VARIANTS) > 256:
                _VARIANTS.clear()
            hit = _VARIANTS[key] = (ray_fn, ray.remote(max_calls=n)(ray_fn._function))
        fn = hit[1]
    return fn.options(**opts)


def pin(request: Any, alloc: Any, node: Any, name: str, ray_opts: dict, *, task: bool,
        minus: dict | None = None) -> tuple[Any, dict, dict]:
    """The worker :class:`Spec`, the Ray options pinning the work to ``alloc`` on ``node``, and its resources.

    Shared by the direct path and the dispatcher (:mod:`rayaccel.ray.dispatch`).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .resources import allocation_resources
    from .worker import Spec

    shared = dict(alloc.memory_bytes) if request.kind == "shared" else {}
    res = allocation_resources(node.topology, alloc.devices if request.kind == "devices" else (),
                               alloc.partitions, shared)
    spec = Spec(node_key=node.node_key, node_id=node.node_id,
                devices=tuple(alloc.devices) if request.kind == "devices" else (),
                partitions=tuple(p.key for p in alloc.partitions),
                shared_memory=tuple(sorted(shared.items())),
                gpu_memory_bytes=request.gpu_memory, name=name)
    opts = dict(ray_opts)
    opts["resources"] = {**(opts.get("resources") or {}), **res}
    opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
    if task and not node.record.simulated:
        opts.setdefault("max_calls", 1)
    return spec, opts, res


def _spec_and_options(request: Any, name: str, ray_opts: dict, *, task: bool,
                      queue: bool = True) -> tuple[Any, dict, Any] | None:
    from . import context

    context.ensure_connected()
    planned = context.plan(request, queue=queue)
    if planned is None:
        return None
    alloc, node, minus = planned
    spec, opts, res = pin(request, alloc, node, name, ray_opts, task=task)
    return spec, opts, (node.node_id, res, context.effective(node, res, minus))


class RemoteFunction:
    """A function decorated with :func:`remote`; call ``.remote(...)`` / ``.options(...)``."""

    def __init__(self, fn: Callable, options: dict, _ray_fn: Any = None):
        self._fn = fn
        self._req_fields, self._ray_opts = _split(options)
        self._request = build_request(self._req_fields)
        self._name = self._ray_opts.get("name") or getattr(fn, "__name__", "task")
        self._ray_fn = _ray_fn
        functools.update_wrapper(self, fn)

    def _base(self) -> Any:
        if self._ray_fn is None:
            import ray

            fn = self._fn

            def rayaccel_task(_rayaccel_spec, *args, **kwargs):
                from rayaccel.ray.worker import run_task

                return run_task(fn, _rayaccel_spec, args, kwargs)

            rayaccel_task.__name__ = getattr(fn, "__name__", "rayaccel_task")
            self._ray_fn = ray.remote(rayaccel_task)
        return self._ray_fn

    @property
    def request(self) -> Any:
        """The placement request every call makes."""
        return self._request

    def _submitter(self, opts: dict) -> Any:
        # Ray's .options() builds a wrapper per call; one per (node, device set) is enough.
        key = (opts["scheduling_strategy"].node_id, tuple(sorted(opts["resources"].items())))
        cache = self.__dict__.setdefault("_options_cache", {})
        hit = cache.get(key)
        if hit is None:
            if len(cache) > 512:
                cache.clear()
            hit = cache[key] = submitter(self._base(), opts)
        return hit

    def options(self, **options: Any) -> "RemoteFunction":
        """A copy with rayaccel fields and/or Ray options replaced (same rules as :func:`remote`)."""
        merged = {**self._req_fields, **self._ray_opts, **options}
        return RemoteFunction(self._fn, merged, _ray_fn=self._base())

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Place and submit; return Ray's ObjectRef (or refs, with ``num_returns``).

        Raises:
            Unsatisfiable: no node could ever run this request.
            ClusterError: Ray is not initialised.
        """
        from . import context, dispatch

        routable = dispatch.routable(self._ray_opts)
        planned = None
        if not (routable and dispatch.queued_here()):  # FIFO: never overtake this driver's queued calls
            planned = _spec_and_options(self._request, self._name, self._ray_opts, task=True, queue=not routable)
        if planned is None:
            # nothing suitable is free: wait at the dispatcher, not pinned behind one busy set
            return dispatch.submit(self._base(), self._request, self._name, self._ray_opts, args, kwargs)
        spec, opts, (node_id, res, before) = planned
        opts.setdefault("name", self._name)
        ref = self._submitter(opts).remote(spec, *args, **kwargs)
        first = ref[0] if isinstance(ref, list) else ref
        context.claims().add(node_id, res, first if hasattr(first, "_on_completed") else None, before)
        return ref

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self._name} is a rayaccel remote function: call {self._name}.remote(...)")


def _wrap_class(cls: type) -> type:
    class RayaccelActor(cls):  # type: ignore[misc, valid-type]
        def __init__(self, _rayaccel_spec, *args, **kwargs):
            from rayaccel.ray import registry
            from rayaccel.ray.worker import setup

            setup(_rayaccel_spec)
            registry.announce(_rayaccel_spec, "actor")
            super().__init__(*args, **kwargs)

    RayaccelActor.__name__ = cls.__name__
    RayaccelActor.__doc__ = cls.__doc__
    return RayaccelActor


class RemoteClass:
    """A class decorated with :func:`remote`; ``.remote(...)`` creates an actor."""

    def __init__(self, cls: type, options: dict, _ray_cls: Any = None):
        self._cls = cls
        self._req_fields, self._ray_opts = _split(options, "actor")
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
        return RemoteClass(self._cls, merged, _ray_cls=self._base())

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Place and create the actor; return Ray's ActorHandle.

        Raises:
            Unsatisfiable: no node could ever host this actor.
        """
        from . import context

        name = self._ray_opts.get("name") or self._cls.__name__
        spec, opts, (node_id, res, before) = _spec_and_options(self._request, name, self._ray_opts, task=False)
        handle = self._base().options(**opts).remote(spec, *args, **kwargs)
        context.claims().add(node_id, res, None, before)
        return handle


def remote(*args: Any, **options: Any) -> Any:
    """Decorate a function or class as rayaccel remote work.

    Use bare (``@rayaccel.remote``: one whole device) or with options: rayaccel's
    ``gpus``, ``mig``, ``gpu_memory``, ``interconnect``, ``same_numa``, ``vendor``,
    ``model``, ``nic``, ``exclusive``; any other keyword is a Ray option
    (``num_cpus``, ``max_retries``, ``name`` ...), except ``num_gpus``,
    ``scheduling_strategy``, ``placement_group`` and ``accelerator_type``.

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
