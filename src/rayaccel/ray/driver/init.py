"""The driver's way in: :func:`init` (an embedded one-node cluster whose node rayaccel manages, or a
connection to a running cluster) and :func:`shutdown`.

An embedded node starts like every rayaccel node (:mod:`rayaccel.ray.node.start`): its topology,
record, table and raylet environment; then its record goes to Ray's GCS KV and its agent starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from rayaccel.errors import ClusterError
from rayaccel.topology import NodeTopology
from rayaccel.ray import _ray_private as rp, kv
from rayaccel.ray.driver import view
from rayaccel.ray.node import agent, nodedir
from rayaccel.ray.node.preset import given
from rayaccel.ray.node.start import environ, node_env, node_topology, prepare, zero_gpu_mode
from rayaccel.ray.record import node_labels, node_resources


def init(address: str | None = None, topology: NodeTopology | str | None = None, *,
         nic_env: str | Sequence[str] | None = None, zero_gpu_tasks: str | None = None,
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
        ray_init_kwargs: passed to ``ray.init`` (``num_cpus``, ``namespace`` ...; not
            ``resources``/``labels`` for an embedded cluster: rayaccel sets those). ``num_gpus`` smaller
            than the host's count gives the node the first ``num_gpus`` devices (or of the preset), as Ray does.

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
        if zero_gpu_tasks is not None:
            raise ClusterError("zero_gpu_tasks= only applies to an embedded cluster (address=None); nodes of an "
                               "existing cluster take it from `rayaccel start --zero-gpu-tasks`")
        if nic_env is not None:
            raise ClusterError("nic_env= only applies to an embedded cluster (address=None); nodes of an existing "
                               "cluster take it from `rayaccel start --nic-env`")
        if topology is not None:
            raise ClusterError("topology= only applies to an embedded cluster (address=None); nodes of an "
                               "existing cluster publish their own topology via `rayaccel start`")
        return ray.init(address=address, **ray_init_kwargs)
    for k in ("resources", "labels"):
        if k in ray_init_kwargs:
            raise ClusterError(f"{k}= is set by rayaccel for an embedded cluster (from the topology)")
    zero_gpu_mode(zero_gpu_tasks)
    topo, simulated = node_topology(topology)
    topo, preset = given(topo, os.environ, num_gpus=ray_init_kwargs.pop("num_gpus", None))
    record, directory = prepare(topo, simulated, preset=preset)
    num_gpus, res = node_resources(topo)
    ray_init_kwargs.setdefault("include_dashboard", False)
    with environ(node_env(topo, record.node_key, directory, nic_env=nic_env, zero_gpu_tasks=zero_gpu_tasks)):
        # address="local": always a new embedded cluster, never one found in RAY_ADDRESS or /tmp/ray
        ctx = ray.init(address="local", num_gpus=num_gpus, resources=res,
                       labels=node_labels(topo, record.node_key, simulated=simulated), **ray_init_kwargs)
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
