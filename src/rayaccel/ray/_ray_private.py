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

Every Ray release from 2.48 to 2.60 (what each lacks: :data:`FEATURES`,
:func:`capabilities`; the table: ``docs/compatibility-ray.md``). The variants:

* 2.48-2.49: ``set_visible_accelerator_ids`` returns nothing and there is no
  ``reset_visible_accelerator_env_vars``: a task's grant is released when its worker's next
  task starts or the worker exits (Ray reuses no GPU task's worker by default).
* 2.48: Ray's option tables are ``ray._private.ray_option_utils`` (``ray._common`` since 2.49).
* RDT: the ``rayaccel`` transport needs 2.56 (``ray.experimental.rdt`` with one-sided
  fetches). Before, the name ``"rayaccel"`` is let through Ray's own check of a transport
  name as "no transport" (the object store), with one warning: 2.55 checks it in
  ``ray.experimental.rdt.util``, 2.53-2.54 in ``ray.experimental.gpu_object_manager.util``,
  2.48-2.52 in ``ray._private.custom_types.TensorTransportEnum.from_str``.
* Ray's default ``custom_unit_instance_resources`` grew by release
  (:func:`unit_instance_default`).
* ``ray.init(address=...)`` attaches the driver to a raylet on its own host
  (``ray._private.services.get_node_to_connect_for_driver``): 2.49 and later prefer the head's
  when several run there (a simulated cluster); 2.48 takes any, so :func:`driver_on_head` steers it
  to the head's too (removing a node then never takes the driver's raylet with it).
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, NamedTuple

#: Ray's resource name for GPUs (NVIDIA, AMD, Intel all use it).
GPU = "GPU"
#: Raylet config read from the environment at node start: modules every Python worker imports.
PRELOAD_ENV = "RAY_preload_python_modules"
#: Raylet config: resources whose instances get per-slot ids (replaces Ray's default list).
UNIT_INSTANCE_ENV = "RAY_custom_unit_instance_resources"
#: Ray 2.60's default for ``custom_unit_instance_resources`` (src/ray/common/ray_config_def.h).
UNIT_INSTANCE_DEFAULT = ("neuron_cores", "TPU", "NPU", "HPU", "RBLN", "FURIOSA", "TTNPU", "MBLT")
#: The release that added each name to that default (read from each release's raylet binary).
_UNIT_INSTANCE_SINCE = {"RBLN": (2, 49), "FURIOSA": (2, 56), "TTNPU": (2, 58), "MBLT": (2, 59)}
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


def holder_identity(worker: Any) -> dict[str, str]:
    """Who the current holder is, for per-holder usage: ``id`` (actor or task id, hex), ``actor_class`` and
    ``actor_name`` in an actor (the name "" when it has none), ``task_function`` in a task (Ray's task name: the
    function's name unless ``.options(name=)`` gave another)."""
    core = worker.core_worker
    try:
        task_name = core.get_current_task_name() or ""
    except AttributeError:
        task_name = ""
    actor = core.get_actor_id()
    if not actor.is_nil():
        name = ""
        try:
            name = core.get_actor_name().decode("utf-8", "replace")
        except (AttributeError, UnicodeError):
            pass
        return {"id": actor.hex(), "actor_class": task_name.split(".")[0], "actor_name": name, "task_function": ""}
    return {"id": core.get_current_task_id().hex(), "actor_class": "", "actor_name": "", "task_function": task_name}


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


class RayGrant(NamedTuple):
    """One grant as Ray made it: every fact of it rayaccel needs, read from the worker in one call (:func:`grant_of`).

    Attributes:
        key: ``task:<id>`` / ``actor:<id>``. slots: managed resource -> ``((slot, fraction), ...)``.
        pg / bundle: the placement group (hex) and bundle index of a member's grant, else None.
        function: ``<module>.<qualname>`` of the function the worker runs (``rayaccel.remote`` work is
            recognised by it).
        info: what ``rayaccel status`` shows of the holder (``name``, ``kind``, ``job``).
        node_id: the worker's node (hex; read at the process's first grant).
    """

    key: str
    slots: dict
    pg: str | None
    bundle: int | None
    function: str
    info: dict
    node_id: str


def grant_of(worker: Any, managed: Any, last: RayGrant | None = None) -> RayGrant:
    """The current grant of ``managed`` resources in this worker (see :class:`RayGrant`): one call, every fact.

    ``last`` itself comes back when Ray's grant is still that one (the same key and slots): a grant
    asked about again (``ray.get_gpu_ids()`` in the task) reads only its identity from Ray.
    """
    core = worker.core_worker
    actor = core.get_actor_id()
    key = "task:" + core.get_current_task_id().hex() if actor.is_nil() else "actor:" + actor.hex()
    slots, pg, bundle = split_grant(core.resource_ids(), managed)
    if last is not None and last.key == key and last.slots == slots:
        return last
    try:
        function = core.get_current_task_function_name() or ""
    except AttributeError:
        function = ""
    try:
        task = core.get_current_task_name() or ""
    except AttributeError:
        task = ""
    if key[0] == "a":  # an actor: its name, else its class
        name = ""
        try:
            name = core.get_actor_name().decode("utf-8", "replace")
        except (AttributeError, UnicodeError):
            pass
        info = {"name": name or task.split(".")[0] or "actor", "kind": "actor"}
    else:
        info = {"name": task or "task", "kind": "task"}
    info["job"] = core.get_current_job_id().hex()
    global _NODE_ID
    if _NODE_ID is None:  # a worker's node never changes: read once per process
        _NODE_ID = core.get_current_node_id().hex()
    return RayGrant(key, slots, pg, bundle, function, info, _NODE_ID)


_NODE_ID: str | None = None


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


def install(get_ids: Callable, after_set_visible: Callable, after_task: Callable,
            resources: Any = None) -> bool:
    """Wrap Ray's GPU-id function and visible-devices setter/resetter in this (worker) process (idempotent).

    ``get_ids(original, worker, resource_name, regex)`` replaces
    ``Worker.get_accelerator_ids_for_accelerator_resource`` for the names in ``resources``
    (None: every name; Ray's other accelerators go straight to Ray's own); ``after_set_visible(saved)``
    runs after ``set_visible_accelerator_ids`` (before every normal task and at actor
    creation) and returns the (extended) saved variables; ``after_task()`` runs after
    ``reset_visible_accelerator_env_vars``, which ``_raylet.pyx`` calls when a normal
    task's code has returned (never for actors). Ray 2.48-2.49 have no reset (their
    ``set_visible_accelerator_ids`` saves nothing): ``after_set_visible`` gets ``{}`` and
    ``after_task`` is never called (the next grant or the worker's exit releases).

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
        if resources is not None and resource_name not in resources:
            return original(self, resource_name, resource_regex)
        return get_ids(original, self, resource_name, resource_regex)

    cls.get_accelerator_ids_for_accelerator_resource = patched
    orig_set = utils.set_visible_accelerator_ids

    @functools.wraps(orig_set)
    def set_visible():
        saved = orig_set()
        if saved is None:  # Ray < 2.50: nothing is restored after the task
            after_set_visible({})
            return None
        return after_set_visible(saved)

    utils.set_visible_accelerator_ids = set_visible
    orig_reset = getattr(utils, "reset_visible_accelerator_env_vars", None)  # Ray >= 2.50
    if orig_reset is not None:
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


def option_utils() -> Any:
    """Ray's table and checks of task/actor options (``ray._common.ray_option_utils``; 2.48: ``ray._private``)."""
    try:
        from ray._common import ray_option_utils
    except ImportError:  # Ray 2.48
        from ray._private import ray_option_utils
    return ray_option_utils


def node_temp_dir() -> str | None:
    """The temp dir of the Ray node this process belongs to (None when not connected)."""
    from ray._private import worker

    node = getattr(worker, "_global_node", None)
    if node is None:
        return None
    try:
        return node.get_temp_dir_path()
    except AttributeError:
        return None


def logs_dir() -> str | None:
    """The session's log directory of the Ray node this process is connected to (None when not connected)."""
    from ray._private import worker

    node = getattr(worker, "_global_node", None)
    try:
        return node.get_logs_dir_path() if node is not None else None
    except AttributeError:
        return None


def raylet_pid(node: Any = None) -> int | None:
    """The raylet's pid of ``node`` (a ``ray.cluster_utils.Cluster`` node; default: the node this process
    started, as ``ray.init()`` does), or None when this process did not start it."""
    from ray._private import ray_constants, worker

    node = node if node is not None else getattr(worker, "_global_node", None)
    try:
        procs = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET) or []
        return int(procs[0].process.pid) if procs else None
    except (AttributeError, IndexError):
        return None


# ------------------------------------------------------------------- releases and features
#: The releases rayaccel supports (``pyproject.toml``: ``ray>=2.48,<2.61``).
OLDEST = (2, 48)
NEWEST = (2, 60)


class Feature(NamedTuple):
    """A Ray feature rayaccel uses where the installed release carries it (a NamedTuple, not a frozen
    dataclass: ``import rayaccel`` imports this module, and ``dataclasses`` would add ~4 ms to it).

    Attributes:
        name: short name (doctor, the compatibility table). since: the first Ray release with it.
        gives: what rayaccel does with it. without: what happens on a release without it.
    """

    name: str
    since: tuple[int, int]
    gives: str
    without: str

    @property
    def since_text(self) -> str:
        return f"{self.since[0]}.{self.since[1]}"


TASK_END = Feature("task-end release", (2, 50), "a normal task's devices are free for the arbiter's choice the "
                   "moment its code returns (reset_visible_accelerator_env_vars)",
                   "a task's devices are released when its worker's next task starts or the worker exits")
LABEL_SELECTORS = Feature("label selectors", (2, 48), "rayaccel.remote names the nodes that could serve a request "
                          "(label_selector)", "rayaccel.remote cannot choose nodes")
TRANSPORT = Feature("rayaccel tensor transport", (2, 56), 'tensor_transport="rayaccel": one-sided Ray Direct '
                    "Transport, the fastest path per consumer", "its tensors go through Ray's object store")
TOPOLOGY_STRATEGY = Feature("topology_strategy", (2, 57), 'Ray\'s placement_group(topology_strategy={"ray.io/gpu-domain": '
                            '"STRICT_PACK", ...}) over the domain labels rayaccel sets',
                            "Ray's placement_group rejects topology_strategy (rayaccel.gang still keeps a gang in "
                            "one NVLink domain)")
#: Ray checks a bundle's label selector when it places a placement group's bundles from 2.50 (ray-project/ray#55599;
#: 2.48-2.49 accept ``bundle_label_selector`` and ignore it), and under STRICT_PACK only later (#60170): pinned
#: bundles therefore use PACK.
BUNDLE_LABELS = Feature("bundle label selectors", (2, 50), "rayaccel.gang pins each bundle to its planned node "
                        "(bundle_label_selector on rayaccel.io/node-key)", "rayaccel.gang's bundles are not pinned: "
                        "Ray places them by PACK (one-node gangs by STRICT_PACK), so the planned nodes (and NVLink "
                        "domain) are not enforced")
#: Every feature whose presence depends on the release, oldest first.
FEATURES = (LABEL_SELECTORS, TASK_END, BUNDLE_LABELS, TRANSPORT, TOPOLOGY_STRATEGY)


def release() -> str:
    """The installed Ray's version (``ray.__version__``; read without importing ray when it is not imported)."""
    ray = sys.modules.get("ray")
    version = getattr(ray, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("ray")
    return version


def release_tuple(text: str | None = None) -> tuple[int, int]:
    """``(major, minor)`` of ``text`` (default: the installed release)."""
    major, minor = (text or release()).split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def unit_instance_default() -> tuple[str, ...]:
    """The installed release's default ``custom_unit_instance_resources`` (setting the variable replaces it)."""
    have = release_tuple()
    return tuple(n for n in UNIT_INSTANCE_DEFAULT if have >= _UNIT_INSTANCE_SINCE.get(n, OLDEST))


def _carries(feature: Feature) -> bool:
    """Whether the installed Ray carries ``feature``, found in Ray itself (not from its version)."""
    import importlib.util
    import inspect

    if feature is TASK_END:
        from ray._private import utils

        return hasattr(utils, "reset_visible_accelerator_env_vars")
    if feature is LABEL_SELECTORS:
        return "label_selector" in option_utils().task_options
    if feature is TRANSPORT:
        if importlib.util.find_spec("ray.experimental.rdt") is None:
            return False
        from ray.experimental.rdt import util

        return _one_sided_rdt(util)
    if feature is BUNDLE_LABELS:  # a fix, not an API: the parameter and the release both
        from ray.util.placement_group import placement_group

        return ("bundle_label_selector" in inspect.signature(placement_group).parameters
                and release_tuple() >= BUNDLE_LABELS.since)
    if feature is TOPOLOGY_STRATEGY:
        from ray.util.placement_group import placement_group

        return "topology_strategy" in inspect.signature(placement_group).parameters
    raise ValueError(f"unknown feature {feature.name!r}")


@functools.lru_cache(maxsize=1)
def capabilities() -> dict[str, bool]:
    """Feature name -> whether the installed Ray carries it (every :data:`FEATURES`; imports ray)."""
    return {f.name: _carries(f) for f in FEATURES}


def can_pin_bundles() -> bool:
    """Whether this Ray pins a placement-group bundle to a node by its labels (:data:`BUNDLE_LABELS`)."""
    return capabilities()[BUNDLE_LABELS.name]


def missing_line(feature: Feature) -> str:
    """One line: ``feature`` needs which release, and what this one does instead."""
    return f"{feature.name} needs Ray >= {feature.since_text} (this is Ray {release()}): {feature.without}"


_warned: set[str] = set()


def warn_missing(feature: Feature) -> None:
    """Log :func:`missing_line` once per process (at the first use of a feature this Ray lacks)."""
    if feature.name in _warned:
        return
    _warned.add(feature.name)
    import logging

    logging.getLogger("rayaccel").warning("rayaccel: %s", missing_line(feature))


# ------------------------------------------------------------------- Ray Direct Transport
#: Ray's RDT helpers module (imported by ``import ray`` itself; Ray >= 2.55).
RDT_UTIL = "ray.experimental.rdt.util"
#: Where each release range checks a transport's name (newest first): 2.55+, 2.53-2.54, 2.48-2.52.
RDT_NAME_MODULES = (RDT_UTIL, "ray.experimental.gpu_object_manager.util", "ray._private.custom_types")


def adopt_rdt_module(module: Any, name: str, register: Callable[[], None]) -> bool:
    """A module of :data:`RDT_NAME_MODULES` has loaded: make ``tensor_transport=name`` work with this release.

    Ray >= 2.56: ``register()`` runs after ``_ensure_default_transports_registered``
    (:func:`wrap_rdt_registration`). Older: Ray's check of a transport's name lets ``name``
    through as "no transport" (the object store) with one warning (:func:`warn_missing`).
    Idempotent.

    Returns:
        True when this module settles it for the release (no other module needs watching).
    """
    if module.__name__ == RDT_UTIL:
        if _one_sided_rdt(module):
            wrap_rdt_registration(module, register)
        else:  # 2.55: custom transports, but not the one-sided fetches rayaccel's is built on
            _gate(module, "normalize_and_validate_tensor_transport", name, None)
        return True
    if module.__name__ == RDT_NAME_MODULES[1]:  # 2.53-2.54: 2.54 (registrable transports) means none by None
        instead = None if hasattr(module, "register_tensor_transport") else "OBJECT_STORE"
        return _gate(module, "normalize_and_validate_tensor_transport", name, instead)
    enum = getattr(module, "TensorTransportEnum", None)  # 2.48-2.52 (later releases keep the enum, unused)
    if enum is not None and hasattr(enum, "from_str") and hasattr(enum, "OBJECT_STORE"):
        orig = enum.from_str
        if not getattr(orig, "__rayaccel_wrapped__", False):
            def from_str(cls: Any, text: str) -> Any:
                if isinstance(text, str) and text.lower() == name:
                    warn_missing(TRANSPORT)
                    return cls.OBJECT_STORE
                return orig(text)

            from_str.__rayaccel_wrapped__ = True  # type: ignore[attr-defined]
            enum.from_str = classmethod(from_str)
    return False


def _one_sided_rdt(util: Any) -> bool:
    """Does this ``ray.experimental.rdt.util`` take custom one-sided transports (register, fetch requests)?"""
    import importlib

    ttm = importlib.import_module("ray.experimental.rdt.tensor_transport_manager")  # util imports it first
    return (hasattr(util, "register_tensor_transport") and hasattr(util, "_ensure_default_transports_registered")
            and hasattr(ttm, "FetchRequest"))


def _gate(module: Any, fn_name: str, name: str, instead: Any) -> bool:
    """Wrap ``module.fn_name`` (a transport name's check) so that ``name`` passes as ``instead``, warning once."""
    orig = getattr(module, fn_name, None)
    if orig is None:
        return False
    if getattr(orig, "__rayaccel_wrapped__", False):
        return True

    @functools.wraps(orig)
    def check(tensor_transport: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(tensor_transport, str) and tensor_transport.lower() == name:
            warn_missing(TRANSPORT)
            return instead
        return orig(tensor_transport, *args, **kwargs)

    check.__rayaccel_wrapped__ = True  # type: ignore[attr-defined]
    setattr(module, fn_name, check)
    return True


def rdt_interface() -> tuple[type, type, type, type]:
    """``(CommunicatorMetadata, FetchRequest, TensorTransportManager, TensorTransportMetadata)`` (Ray >= 2.56)."""
    from ray.experimental.rdt import tensor_transport_manager as m

    return m.CommunicatorMetadata, m.FetchRequest, m.TensorTransportManager, m.TensorTransportMetadata


def rdt_manager(name: str) -> Any:
    """This process's ``TensorTransportManager`` for transport ``name`` (Ray's singleton, made on first use)."""
    from ray.experimental.rdt.util import get_tensor_transport_manager

    return get_tensor_transport_manager(name)


def rdt_swap(obj_id: str, tensors: list) -> bool:
    """Make Ray's RDT store of this process reference ``tensors`` as object ``obj_id``'s (same count and order).

    The ``rayaccel`` transport spills a held object beyond its producer's device budget
    (:mod:`rayaccel.memory.held`): Ray's store must let go of the device tensors (it gets meta-device
    placeholders) and get the restored ones back. Ray 2.56+ keeps ``RDTStore._rdt_store[obj_id]``, a deque
    of ``_RDTObject(data, ...)`` whose first entry is the primary copy, and ``_tensor_to_object_ids``
    (``id(tensor)`` -> object ids, what ``wait_tensor_freed`` waits on), both under ``RDTStore._lock``.
    Returns False when Ray holds no such object here (or no RDT store exists in this process).
    """
    try:
        from ray._private.worker import global_worker

        store = global_worker.rdt_manager.rdt_store
    except (ImportError, AttributeError):
        return False
    with store._lock:
        queue = store._rdt_store.get(obj_id)
        if not queue:
            return False
        entry = queue[0]
        if len(entry.data) != len(tensors):
            return False
        for old in entry.data:
            ids = store._tensor_to_object_ids.get(id(old))
            if ids is not None:
                ids.discard(obj_id)
                if not ids:
                    store._tensor_to_object_ids.pop(id(old), None)
        for new in tensors:
            store._tensor_to_object_ids[id(new)].add(obj_id)
        entry.data = list(tensors)
        store._object_freed_cv.notify_all()
    return True


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
    return rdt_manager("NIXL")


def nixl_communicator() -> Any:
    """The (empty) communicator metadata Ray's NIXL manager expects."""
    from ray.experimental.rdt.nixl_tensor_transport import NixlCommunicatorMetadata

    return NixlCommunicatorMetadata()


def cpu_target_hint() -> str:
    """How a consumer without a GPU asks for an object's GPU tensors in host memory, in this release's words."""
    from ray import experimental

    if hasattr(experimental, "set_target_device_for_ref"):  # Ray >= 2.58
        return "ray.experimental.set_target_device_for_ref(ref, 'cpu') before ray.get"
    return "ray.experimental.set_target_for_ref(ref, [CPU tensors of the same shapes]) before ray.get"


def call_on_actor(actor: Any, fn: Callable, *args: Any) -> Any:
    """Run ``fn(actor_instance, *args)`` in ``actor`` in RDT's short-call group; an ObjectRef."""
    return actor.__ray_call__.options(concurrency_group=RDT_SERVE_GROUP).remote(fn, *args)


def driver_on_head(gcs_address: str, node_id: str) -> Any:
    """A context manager: inside, ``ray.init(address=gcs_address)`` attaches the driver to the head
    (node ``node_id``)'s raylet.

    2.49 and later prefer the head's raylet among those on the driver's host, so nothing is done
    there; 2.48's ``get_node_to_connect_for_driver(gcs_address, ip)`` returns any of them, and is
    answered with ``node_id``'s entry instead (same keys: ``services.get_node``).
    """
    import contextlib
    import inspect

    from ray._private import services

    @contextlib.contextmanager
    def steer() -> Any:
        original = services.get_node_to_connect_for_driver
        if next(iter(inspect.signature(original).parameters), "") != "gcs_address":
            yield  # 2.49+: the head's raylet is preferred already
            return

        def to_node(gcs: Any, *args: Any, **kwargs: Any) -> Any:
            return services.get_node(gcs, node_id) if gcs == gcs_address else original(gcs, *args, **kwargs)

        services.get_node_to_connect_for_driver = to_node
        try:
            yield
        finally:
            services.get_node_to_connect_for_driver = original

    return steer()


def local_gcs_addresses() -> list[str]:
    """The GCS addresses of every Ray cluster running on this machine, sorted.

    Ray's own search for ``address="auto"``: ``ray._private.services.find_gcs_addresses``
    reads the command lines of the local ``gcs_server`` processes (private API).
    """
    from ray._private import services

    return sorted(set(services.find_gcs_addresses()))


# ------------------------------------------------------------------ dynamic MIG (rayaccel.ray.node.dynmig)
def pending_demand(gcs_address: str, timeout_s: int = 5) -> list[tuple[dict[str, float], int, str | None]]:
    """What waits for resources now: ``[(bundle, count, pg), ...]``: Ray's queued task and actor demands
    (``pg`` None) and the bundles of placement groups not yet placed (``pg``: the group's hex id).

    The autoscaler's v2 SDK (``ray.autoscaler.v2.sdk.get_cluster_status``: the GCS's autoscaling state, which
    every raylet reports whichever autoscaler runs), present from 2.48 to 2.60. Where it is absent, Ray's
    older debug state (``ray._private.state.state.get_cluster_status``'s ``resource_demands``) is not a stable
    shape, so the demand is read as none with one warning (dynamic MIG then only serves what is already made).
    """
    try:
        from ray.autoscaler.v2.sdk import get_cluster_status
    except ImportError:  # pragma: no cover - every release 2.48-2.60 carries it
        _warn_once("pending_demand", "this Ray has no ray.autoscaler.v2.sdk: dynamic MIG sees no waiting work")
        return []
    cs = get_cluster_status(gcs_address, timeout=timeout_s)
    out: list[tuple[dict[str, float], int, str | None]] = []
    for dem in cs.resource_demands.ray_task_actor_demand:
        for rc in dem.bundles_by_count:
            out.append(({str(k): float(v) for k, v in rc.bundle.items()}, int(rc.count), None))
    for dem in getattr(cs.resource_demands, "placement_group_demand", ()):
        for rc in dem.bundles_by_count:
            out.append(({str(k): float(v) for k, v in rc.bundle.items()}, int(rc.count), dem.pg_id or ""))
    return out


def pinned_group(bundles: list[dict[str, float]], node_id: str, labels: dict[str, str], name: str) -> Any:
    """A detached STRICT_PACK placement group meant for node ``node_id``: its bundles pinned by ``labels``
    where this Ray honours a bundle's label selector (2.50+, :func:`can_pin_bundles`), else by the group's
    private ``_soft_target_node_id`` (2.48-2.49: soft; the caller checks where it landed, :func:`group_nodes`)."""
    from ray.util import placement_group

    if can_pin_bundles():
        return placement_group(bundles, strategy="STRICT_PACK", name=name, lifetime="detached",
                               bundle_label_selector=[dict(labels) for _ in bundles])
    return placement_group(bundles, strategy="STRICT_PACK", name=name, lifetime="detached",
                           _soft_target_node_id=node_id)


def group_nodes(pg_hex: str | None = None) -> dict[str, dict[str, Any]]:
    """Placement groups (hex id -> ``name``, ``state``, ``nodes``: the node id of each bundle) as the GCS knows them."""
    from ray.util import placement_group_table

    table = placement_group_table()
    out = {}
    for gid, row in table.items():
        nodes = row.get("bundles_to_node_id") or {}
        out[gid] = {"name": row.get("name", ""), "state": row.get("state", ""),
                    "nodes": [nodes[b] for b in sorted(nodes)]}
    return out


def group_handle(pg_hex: str) -> Any:
    """A handle of placement group ``pg_hex`` (to remove one another process made)."""
    from ray.util.placement_group import PlacementGroup

    return PlacementGroup(_pg_id(pg_hex))


_WARNED: set[str] = set()


def _warn_once(key: str, line: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        import logging

        logging.getLogger(__name__).warning("rayaccel: %s", line)
