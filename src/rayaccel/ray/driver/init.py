"""The driver's way in: :func:`init` (an embedded one-node cluster whose node rayaccel manages, or a
connection to a running cluster) and :func:`shutdown`.

An embedded node starts like every rayaccel node (:mod:`rayaccel.ray.node.start`): its topology,
record, table and raylet environment; then its record goes to Ray's GCS KV and its agent starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from rayaccel.contract import LABEL_PREFIX
from rayaccel.errors import ClusterError
from rayaccel.topology import NodeTopology
from rayaccel.ray import _ray_private as rp, kv
from rayaccel.ray.driver import view
from rayaccel.ray.node import agent, leakpolicy, nodedir
from rayaccel.ray.node.dynmig import dynamic_gpus
from rayaccel.ray.node.preset import given
from rayaccel.ray.node.start import environ, node_env, node_topology, prepare, zero_gpu_mode
from rayaccel.ray.record import node_labels, node_resources


def init(address: str | None = None, topology: NodeTopology | str | None = None, *,
         nic_env: str | Sequence[str] | None = None, zero_gpu_tasks: str | None = None,
         reclaim_leaks: str | float | None = None, dynamic_mig: str | Sequence[int] | None = None,
         **ray_init_kwargs: Any) -> Any:
    """Connect to a Ray cluster, or start an embedded one-node cluster whose node rayaccel manages.

    Args:
        address: a Ray address (``"auto"``, ``"host:port"``, ``"ray://..."``) to connect to;
            None starts an embedded local cluster whose node advertises ``topology``.
        topology: for the embedded cluster: a NodeTopology, catalog name or file (simulated);
            None discovers (see module docstring). Not allowed with ``address``.
        nic_env: for the embedded cluster: other libraries' NIC variables its workers get at each grant,
            besides ``UCX_NET_DEVICES`` (``"NCCL_IB_HCA,NVSHMEM_HCA_LIST"``; never over a value the user set).
        zero_gpu_tasks: for the embedded cluster: what a task asking no GPU sees, ``"see-none"`` (default:
            no device) or ``"see-all"`` (plain Ray's: the variable as the node was started with it).
        reclaim_leaks: for the embedded cluster: end leaked device processes of the node's workers once a leak
            has lasted this long (``"30s"``, ``"5m"``; default: never, only ``rayaccel reclaim``), as
            ``rayaccel start --reclaim-leaks`` (:mod:`rayaccel.ray.node.leakpolicy`).
        dynamic_mig: for the embedded cluster: GPUs in MIG mode (``"0,1"``, ``"all"``) whose instances the node's
            agent makes for waiting ``mig_<profile>`` work, as ``rayaccel start --dynamic-mig``
            (:mod:`rayaccel.ray.node.dynmig`).
        ray_init_kwargs: passed to ``ray.init`` (``num_cpus``, ``namespace`` ...). ``num_gpus`` smaller
            than the host's count gives the node the first ``num_gpus`` devices (or of the preset), as Ray does.
            For an embedded cluster, ``resources=`` and ``labels=`` join what rayaccel advertises (the caller's
            labels win over rayaccel's, except ``rayaccel.io/`` ones); see :func:`check_caller_args`.

    The embedded node manages the devices it was given: a visible-devices variable set in this process
    (``CUDA_VISIBLE_DEVICES=4,5,6``, UUIDs, empty = none) and ``num_gpus`` (:mod:`rayaccel.ray.node.preset`).

    Returns:
        What ``ray.init`` returns.

    Raises:
        ClusterError: Ray already initialised, or a conflicting argument.
    """
    import ray

    if ray.is_initialized():
        raise ClusterError("Ray is already initialised in this process; call rayaccel.shutdown() first")
    view.reset()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address is not None and not isinstance(address, str):
        raise ClusterError(f"address= must be a string such as 'auto' or 'host:port', got {type(address).__name__}")
    if not (address or "").startswith("ray://"):  # Ray Client takes its own extra keywords
        _check_init_kwargs(ray_init_kwargs)
    if address is not None:
        node_only = {"zero_gpu_tasks": (zero_gpu_tasks, "take it from `rayaccel start --zero-gpu-tasks`"),
                     "nic_env": (nic_env, "take it from `rayaccel start --nic-env`"),
                     "reclaim_leaks": (reclaim_leaks, "take it from `rayaccel start --reclaim-leaks`"),
                     "dynamic_mig": (dynamic_mig, "take it from `rayaccel start --dynamic-mig`"),
                     "topology": (topology, "publish their own topology via `rayaccel start`")}
        for name, (value, there) in node_only.items():
            if value is not None:
                raise ClusterError(f"{name}= only applies to an embedded cluster (address=None); nodes of an "
                                   f"existing cluster {there}")
        return ray.init(address=address, **ray_init_kwargs)
    user_res, user_labels = ray_init_kwargs.pop("resources", None), ray_init_kwargs.pop("labels", None)
    check_caller_args(user_res, user_labels)  # before anything is made
    zero_gpu_mode(zero_gpu_tasks)
    leakpolicy.reclaim_after(reclaim_leaks)
    topo, simulated = node_topology(topology)
    topo, preset = given(topo, os.environ, num_gpus=ray_init_kwargs.pop("num_gpus", None), resources=user_res)
    dyn = dynamic_gpus(dynamic_mig, topo)
    num_gpus, res = node_resources(topo, dyn, mig_gpus=preset.mig_gpus)
    res = with_caller_resources(res, user_res)
    record, directory = prepare(topo, simulated, preset=preset, dynamic_mig=dyn)
    leakpolicy.write(directory, reclaim_leaks)
    ray_init_kwargs.setdefault("include_dashboard", False)
    labels = {**node_labels(topo, record.node_key, simulated=simulated), **(user_labels or {})}
    with environ(node_env(topo, record.node_key, directory, nic_env=nic_env, zero_gpu_tasks=zero_gpu_tasks,
                          dynamic_mig=dyn, mig_gpus=record.mig_gpus)):
        # address="local": always a new embedded cluster, never one found in RAY_ADDRESS or /tmp/ray
        ctx = ray.init(address="local", num_gpus=num_gpus, resources=res, labels=labels, **ray_init_kwargs)
    try:
        kv.publish(record)
        _AGENTS.append(agent.start(record.node_key, rp_node_id_of_driver(), directory, raylet_pid=rp.raylet_pid()))
    except BaseException:
        while _AGENTS:
            agent.stop(_AGENTS.pop())
        ray.shutdown()

        nodedir.remove(directory)
        raise
    _EMBEDDED.append(directory)
    return ctx


_EMBEDDED: list[Path] = []
#: The embedded node's agent process (stopped by :func:`shutdown`; it also ends with the raylet).
_AGENTS: list = []


def check_caller_args(resources: Any, labels: Any) -> None:
    """The ``resources=`` / ``labels=`` a caller gives a rayaccel node, checked before anything starts.

    Custom resources are numbers >= 0 by name, but never GPUs (``GPU`` comes from the topology: give
    ``num_gpus=``) nor MIG instances (``mig_*``: from the topology's MIG layout); labels are strings by
    name, never under ``rayaccel.io/`` (rayaccel's own). Ray checks the rest (``CPU``, label syntax) itself.

    Raises:
        ClusterError: one line naming the bad entry and what would be right.
    """
    if resources is not None:
        if not isinstance(resources, dict):
            raise ClusterError(f"resources= must be a dict of resource name -> number, got {type(resources).__name__}")
        for k, v in resources.items():
            if not isinstance(k, str):
                raise ClusterError(f"resources=: resource names are strings, got {k!r}")
            if k == "GPU":
                raise ClusterError("resources={'GPU': ...}: GPUs are not a custom resource on a rayaccel node; "
                                   "give num_gpus= (rayaccel advertises GPU from the node's devices)")
            if k.startswith("mig_"):
                raise ClusterError(f"resources={{{k!r}: ...}}: mig_* resources come from the node's MIG layout; "
                                   "drop it (rayaccel advertises one per MIG instance)")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e15:
                raise ClusterError(f"resources=: {k!r} must be a number >= 0, got {v!r}")
    if labels is not None:
        if not isinstance(labels, dict):
            raise ClusterError(f"labels= must be a dict of label name -> string, got {type(labels).__name__}")
        for k, v in labels.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ClusterError(f"labels=: expected strings, got {k!r}: {v!r}"[:200])
            if k.startswith(LABEL_PREFIX):
                raise ClusterError(f"labels=: {k!r} is rayaccel's own label (set from the node); use a key outside "
                                   f"{LABEL_PREFIX}")


def with_caller_resources(res: dict[str, float], resources: dict | None) -> dict[str, float]:
    """rayaccel's resources for a node plus the caller's (:func:`check_caller_args` first).

    Raises:
        ClusterError: the caller gives a resource rayaccel advertises for the node (``accelerator_type:...``,
            the family's resource) another value, which would contradict its devices.
    """
    clash = sorted(k for k, v in (resources or {}).items() if k in res and v != res[k])
    if clash:
        raise ClusterError(f"resources={{{clash[0]!r}: {resources[clash[0]]:g}}}: rayaccel advertises "
                           f"{res[clash[0]]:g} from the node's devices; drop it")
    return {**res, **(resources or {})}


def rp_node_id_of_driver() -> str:
    """The Ray node id of this (driver) process's node."""
    import ray

    return ray.get_runtime_context().get_node_id()


def _check_init_kwargs(kwargs: dict) -> None:
    """Reject a keyword ``ray.init`` does not take, naming it (Ray raises a bare RuntimeError/TypeError).

    Raises:
        ClusterError: an unknown keyword.
    """
    import inspect

    import ray

    params = inspect.signature(ray.init).parameters
    known = {n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    known |= {"object_spilling_directory", "allow_multiple", "storage"}  # taken through **kwargs
    for k in kwargs:
        if k not in known and not k.startswith("_"):  # ray.init takes private _options through **kwargs
            raise ClusterError(f"init(): unknown keyword {k!r} (not a ray.init option; known: "
                               f"{', '.join(sorted(n for n in known if not n.startswith('_')))})")


def shutdown() -> None:
    """Disconnect from Ray (stopping an embedded cluster) and forget cached cluster state."""
    import ray

    while _AGENTS:
        agent.stop(_AGENTS.pop())
    ray.shutdown()
    view.reset()
    while _EMBEDDED:
        nodedir.remove(_EMBEDDED.pop())


__all__ = ["init", "shutdown"]
