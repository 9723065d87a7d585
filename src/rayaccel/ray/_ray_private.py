"""Every use of Ray's private API, in one place (checked against the pinned Ray by a test).

rayaccel layers on Ray 2.60 without patching Ray's files. It relies on these
internals, each named here once, so that a Ray upgrade that moves one fails
``tests/ray/test_private_api.py`` loudly instead of silently misplacing work:

* ``ray._private.worker.Worker.get_accelerator_ids_for_accelerator_resource`` --
  the one function through which every in-worker view of a GPU grant passes
  (``ray.get_gpu_ids()``, ``get_runtime_context().get_accelerator_ids()`` and the
  ``CUDA_VISIBLE_DEVICES`` that Ray writes before each task). rayaccel's worker hook
  (:mod:`rayaccel.ray.worker.hook`) wraps it to name the arbiter's physical devices.
* ``ray._private.utils.set_visible_accelerator_ids`` -- called by ``_raylet.pyx``
  before every normal task and at actor creation; wrapped to apply the vendor's
  variable, CPU affinity and rayaccel's own variables after Ray's; and
  ``reset_visible_accelerator_env_vars``, called when a normal task's code returned:
  wrapped to release the task's grant at once.
* ``Worker.core_worker.resource_ids()`` -- the raylet slot indices of the grant
  (``GPU``, ``GPU_group_<pg>``, ``GPU_group_<i>_<pg>``, custom unit resources).
* the raylet config ``preload_python_modules`` (env ``RAY_preload_python_modules``):
  makes every Python worker a node starts import the hook before its first task,
  whatever driver submitted the work; a worker environment without rayaccel logs
  the import error and runs unhooked.
* the raylet config ``custom_unit_instance_resources`` (env
  ``RAY_custom_unit_instance_resources``; setting it replaces Ray's default list):
  gives each MIG-profile resource per-instance slot ids.
* ``ray._private.state`` (per-node available/total resources, placement group
  table) and ``ray.experimental.internal_kv`` (the GCS key-value store).
* Ray Direct Transport (``ray.experimental.rdt.util``), for the ``rayaccel`` tensor
  transport (:mod:`rayaccel.ray.rdt`): ``_ensure_default_transports_registered``, which
  every RDT code path calls first, is wrapped to register the transport on first use
  (so importing it costs nothing); ``transport_manager_info`` (what is registered);
  ``get_tensor_transport_manager("NIXL")`` and ``NixlCommunicatorMetadata`` (the
  transport reads across nodes through Ray's own NIXL manager); an actor's
  ``__ray_call__`` in the ``_ray_system_error`` concurrency group, which RDT adds to
  every actor with ``enable_tensor_transport=True`` (a producer serves the transport's
  requests there: that group only ever runs short calls, so a request never waits
  behind a transfer and two actors fetching from each other cannot deadlock).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

#: Ray's resource name for GPUs (NVIDIA, AMD, Intel all use it).
GPU = "GPU"
#: Raylet config read from the environment at node start: modules every Python worker imports.
PRELOAD_ENV = "RAY_preload_python_modules"
#: Raylet config: resources whose instances get per-slot ids (replaces Ray's default list).
UNIT_INSTANCE_ENV = "RAY_custom_unit_instance_resources"
#: Ray 2.60's default for ``custom_unit_instance_resources`` (src/ray/common/ray_config_def.h).
UNIT_INSTANCE_DEFAULT = ("neuron_cores", "TPU", "NPU", "HPU", "RBLN", "FURIOSA", "TTNPU", "MBLT")
#: Placement-group resources are ``<resource>_group_<i>_<pg>`` (a bundle's units) and
#: ``<resource>_group_<pg>`` (the group's wildcard); parsed without regular expressions (this
#: module is on every worker's start-up path).
_GROUP = "_group_"
_HEX = frozenset("0123456789abcdef")

_PATCHED = False


def worker_class() -> type:
    """``ray._private.worker.Worker``."""
    from ray._private import worker

    return worker.Worker


def global_worker() -> Any:
    """``ray._private.worker.global_worker`` (the process's Worker)."""
    from ray._private import worker

    return worker.global_worker


def resource_ids(worker: Any) -> dict[str, list[tuple[int, float]]]:
    """The raylet's grant to the current task/actor: resource -> [(slot, fraction)]."""
    return worker.core_worker.resource_ids()


def grant_key(worker: Any) -> str:
    """Identity of the current grant: the actor id in an actor, else the task id (hex)."""
    actor = worker.core_worker.get_actor_id()
    if not actor.is_nil():
        return "actor:" + actor.hex()
    return "task:" + worker.core_worker.get_current_task_id().hex()


def holder_info(worker: Any) -> dict[str, Any]:
    """What ``rayaccel status`` shows of the current holder (name, kind, job)."""
    core = worker.core_worker
    actor = core.get_actor_id()
    if not actor.is_nil():
        name = ""
        try:
            name = core.get_actor_name().decode("utf-8", "replace")
        except (AttributeError, UnicodeError):
            pass
        cls = ""
        try:
            cls = core.get_current_task_name() or ""
        except AttributeError:
            pass
        if not name and cls:
            name = cls.split(".")[0]
        return {"kind": "actor", "name": name or "actor", "id": actor.hex(), "job": core.get_current_job_id().hex()}
    name = ""
    try:
        name = core.get_current_task_name() or ""
    except AttributeError:
        pass
    return {"kind": "task", "name": name or "task", "id": core.get_current_task_id().hex(),
            "job": core.get_current_job_id().hex()}


def split_grant(ids: dict[str, list[tuple[int, float]]], managed: Any) -> tuple[dict[str, tuple[tuple[int, float], ...]],
                                                                              str | None, int | None]:
    """The grant of the ``managed`` resources: ``({resource: ((slot, fraction), ...)}, group hex or None, bundle or None)``.

    A placement-group grant names its slots twice (the bundle's ``<res>_group_<i>_<pg>``
    and the wildcard ``<res>_group_<pg>``); they are the same instances.
    """
    out: dict[str, dict[int, float]] = {}
    pg = bundle = None
    for name, assigned in ids.items():
        if not assigned:
            continue
        if name in managed:
            d = out.setdefault(name, {})
            for s, f in assigned:
                d[int(s)] = float(f)
            continue
        res, sep, tail = name.rpartition(_GROUP)
        if not sep or res not in managed or not tail:
            continue
        index, _, group = tail.partition("_")
        if group and index.isdigit() and _HEX.issuperset(group):  # a bundle's: <res>_group_<i>_<pg>
            bundle, pg = int(index), group
            d = out.setdefault(res, {})
            for s, f in assigned:
                d[int(s)] = float(f)
        elif not group and _HEX.issuperset(tail):  # the group's wildcard: <res>_group_<pg>
            pg = tail
            d = out.setdefault(res, {})
            for s, f in assigned:
                d.setdefault(int(s), float(f))
    return {r: tuple(sorted(d.items())) for r, d in out.items()}, pg, bundle


def task_function_name(worker: Any) -> str:
    """``<module>.<qualname>`` of the function the worker runs now (an actor's: its class's method)."""
    try:
        return worker.core_worker.get_current_task_function_name() or ""
    except AttributeError:
        return ""


def pg_bundles_on_node(pg_hex: str, node_id: str, resource: str = GPU) -> dict[int, float] | None:
    """``resource`` of each bundle of placement group ``pg_hex`` placed on ``node_id`` (None when the group is gone).

    One GCS request: call it outside any lock.
    """
    from ray._private import state

    table = state.state.placement_group_table(_pg_id(pg_hex))
    if not table or table.get("state") == "REMOVED":
        return None
    out = {}
    where = table.get("bundles_to_node_id") or {}
    for idx, res in (table.get("bundles") or {}).items():
        if where.get(idx) == node_id and res.get(resource):
            out[int(idx)] = float(res[resource])
    return out


def _pg_id(pg_hex: str) -> Any:
    from ray._raylet import PlacementGroupID

    return PlacementGroupID(bytes.fromhex(pg_hex))


def node_id(worker: Any) -> str:
    """Hex id of the worker's node."""
    return worker.core_worker.get_current_node_id().hex()


def install(get_ids: Callable, after_set_visible: Callable, after_task: Callable) -> bool:
    """Wrap Ray's GPU-id function and visible-devices setter/resetter in this (worker) process (idempotent).

    ``get_ids(original, worker, resource_name, regex)`` replaces
    ``Worker.get_accelerator_ids_for_accelerator_resource``; ``after_set_visible(saved)``
    runs after ``set_visible_accelerator_ids`` (before every normal task and at actor
    creation) and returns the (extended) saved variables; ``after_task()`` runs after
    ``reset_visible_accelerator_env_vars``, which ``_raylet.pyx`` calls when a normal
    task's code has returned (never for actors).

    Returns:
        True when installed now, False when it already was.
    """
    global _PATCHED
    if _PATCHED:
        return False
    from ray._private import utils

    cls = worker_class()
    original = cls.get_accelerator_ids_for_accelerator_resource

    @functools.wraps(original)
    def patched(self, resource_name, resource_regex):
        return get_ids(original, self, resource_name, resource_regex)

    cls.get_accelerator_ids_for_accelerator_resource = patched
    orig_set = utils.set_visible_accelerator_ids

    @functools.wraps(orig_set)
    def set_visible():
        return after_set_visible(orig_set())

    utils.set_visible_accelerator_ids = set_visible
    orig_reset = utils.reset_visible_accelerator_env_vars

    @functools.wraps(orig_reset)
    def reset(saved):
        try:
            return orig_reset(saved)
        finally:
            after_task()

    utils.reset_visible_accelerator_env_vars = reset
    _PATCHED = True
    return True


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """Every alive node's available resources (one GCS request)."""
    from ray._private import state

    return state.available_resources_per_node()


def total_resources_per_node() -> dict[str, dict[str, float]]:
    """Every alive node's total resources (one GCS request)."""
    from ray._private import state

    return state.total_resources_per_node()


def kv() -> Any:
    """``ray.experimental.internal_kv``, or None when this process is not connected."""
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():
        return None
    return internal_kv


def kv_get(key: str, namespace: str) -> bytes | None:
    return kv()._internal_kv_get(key, namespace=namespace)


def kv_put(key: str, value: str | bytes, namespace: str) -> None:
    kv()._internal_kv_put(key, value, overwrite=True, namespace=namespace)


def kv_del(key: str, namespace: str) -> None:
    kv()._internal_kv_del(key, namespace=namespace)


def kv_multi_get(keys: list[str], namespace: str) -> dict[str, bytes]:
    """Several keys in one GCS request (missing keys are absent from the result)."""
    from ray.experimental import internal_kv

    client = internal_kv.internal_kv_get_gcs_client()
    got = client.internal_kv_multi_get([k.encode() for k in keys], namespace.encode())
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in got.items()}


# ------------------------------------------------------------------- Ray Direct Transport
#: Ray's RDT helpers module (imported by ``import ray`` itself).
RDT_UTIL = "ray.experimental.rdt.util"
#: The concurrency group RDT adds to tensor-transport actors for its abort calls (one thread).
RDT_SERVE_GROUP = "_ray_system_error"


def wrap_rdt_registration(util: Any, after: Callable[[], None]) -> bool:
    """Make ``after()`` run after Ray's ``_ensure_default_transports_registered`` in this process.

    Every RDT path (``ray.method(tensor_transport=...)``, ``ray.put(_tensor_transport=...)``,
    serialization, fetches, the registration Ray sends to new actors) calls it first.
    Idempotent; costs one attribute swap.

    Returns:
        True when wrapped now, False when it already was.
    """
    original = util._ensure_default_transports_registered
    if getattr(original, "__rayaccel_wrapped__", False):
        return False

    @functools.wraps(original)
    def ensure() -> None:
        original()
        after()

    ensure.__rayaccel_wrapped__ = True  # type: ignore[attr-defined]
    util._ensure_default_transports_registered = ensure
    return True


def rdt_registered(util: Any) -> dict:
    """The transports registered in this process (upper-case name -> Ray's info)."""
    return util.transport_manager_info


def nixl_manager() -> Any:
    """This process's NIXL ``TensorTransportManager`` (Ray's singleton; its agent starts on first use)."""
    from ray.experimental.rdt.util import get_tensor_transport_manager

    return get_tensor_transport_manager("NIXL")


def nixl_communicator() -> Any:
    """The (empty) communicator metadata Ray's NIXL manager expects."""
    from ray.experimental.rdt.nixl_tensor_transport import NixlCommunicatorMetadata

    return NixlCommunicatorMetadata()


def call_on_actor(actor: Any, fn: Callable, *args: Any) -> Any:
    """Run ``fn(actor_instance, *args)`` in ``actor`` in RDT's short-call group; an ObjectRef."""
    return actor.__ray_call__.options(concurrency_group=RDT_SERVE_GROUP).remote(fn, *args)


class RayGrant:
    """One grant as Ray made it, read from the worker in one call (:func:`grant_of`): the facts of one event.

    Attributes:
        key: ``task:<id>`` / ``actor:<id>``. slots: managed resource -> ``((slot, fraction), ...)``.
        pg / bundle: the placement group (hex) and bundle index of a member's grant, else None.
        function: ``<module>.<qualname>`` of the function the worker runs (``rayaccel.remote`` work is
            recognised by it). ``function``, ``info`` (what status shows of the holder) and ``node_id``
            are read from Ray only when asked: a grant on the fast path (the same as the last) needs none.
    """

    __slots__ = ("key", "slots", "pg", "bundle", "_worker", "_function", "_info", "_node")

    def __init__(self, worker: Any, managed: Any):
        self._worker = worker
        self._info: dict[str, Any] | None = None
        self._node: str | None = None
        self._function: str | None = None
        self.key = grant_key(worker)
        self.slots, self.pg, self.bundle = split_grant(resource_ids(worker), managed)

    @property
    def sig(self) -> tuple:
        """(key, slots): a grant with the same sig is the same grant."""
        return self.key, tuple(sorted(self.slots.items()))

    @property
    def function(self) -> str:
        if self._function is None:
            self._function = task_function_name(self._worker)
        return self._function

    @property
    def info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = holder_info(self._worker)
        return self._info

    @property
    def node_id(self) -> str:
        if self._node is None:
            self._node = node_id(self._worker)
        return self._node


def grant_of(worker: Any, managed: Any) -> RayGrant:
    """The current grant of ``managed`` resources in this worker (see :class:`RayGrant`)."""
    return RayGrant(worker, managed)
