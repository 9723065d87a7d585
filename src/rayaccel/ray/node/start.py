"""Starting rayaccel nodes: :func:`init` (embedded or connect), :func:`shutdown`, :func:`start_node`.

A rayaccel node is an ordinary Ray node whose raylet is started with:

* ``num_gpus`` = its GPU pool (Ray's own ``GPU`` ledger; any Ray GPU work can use it),
  ``mig_<profile>`` unit-instance resources for MIG instances, the node marker
  ``rayaccel_node_<key>`` and ``rayaccel.io/...`` labels (:mod:`.names`);
* an environment that makes every worker it spawns import the worker hook
  (:mod:`.hook`) and find the node's directory (:func:`node_env`).

Which topology a node gets (``rayaccel.init()`` and ``rayaccel start``):

1. the ``topology`` argument / ``--topology NAME|FILE`` (simulated);
2. else :func:`rayaccel.discovery.discover`: ``RAYACCEL_TOPOLOGY`` set -> that
   simulated topology; else the first available hardware backend (real GPUs);
3. else (no hardware backend available) the catalog default
   (:data:`rayaccel.catalog.DEFAULT`), simulated, so a laptop works out of the box.

The node's record is written into its directory before the raylet starts (the hook
reads it at the first grant) and into Ray's GCS KV once the node is up (drivers read
it there); then the node's agent (:mod:`.agent`) is started on it.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .. import catalog
from ..arbiter.build import VISIBLE_ENV, build_table, gpu_vendor
from ..arbiter.table import TABLE_FILE, encode_table
from ..discovery import discover, load_topology
from ..errors import BackendUnavailable, ClusterError
from ..topology import NodeTopology
from . import _ray_private as rp, agent, kv, nodedir, view
from .hook import NODE_DIR_ENV, UNHOOKED_PREFIX
from .names import new_node_key
from .record import NodeRecord, node_labels, node_resources, node_spec

log = logging.getLogger(__name__)
HOOK_MODULE = "rayaccel.ray.hook"
NODE_KEY_ENV = "RAYACCEL_NODE_KEY"


def node_topology(topology: NodeTopology | str | None = None, *,
                  simulate_default: bool = True) -> tuple[NodeTopology, bool]:
    """The topology this node should advertise, and whether it is simulated (see module docstring).

    Args:
        topology: simulate this (NodeTopology, catalog name or file); None discovers.
        simulate_default: with no hardware found, simulate the catalog default (the
            embedded cluster) or else advertise no devices (``rayaccel start`` on a CPU
            machine: a real node never pretends to have GPUs it lacks).

    Raises:
        CatalogError / TopologyError: a bad ``topology`` name or file.
        BackendError: a hardware backend that is present failed.
    """
    if topology is not None:
        return resolve_topology(topology), True

    simulated = bool(os.environ.get("RAYACCEL_TOPOLOGY"))
    try:
        return discover(), simulated
    except BackendUnavailable as e:

        if not simulate_default:
            log.info("no accelerator found (%s); a node without devices", e)
            return NodeTopology(name=None, sources=(f"no accelerator found: {str(e)[:300]}",)), False
        log.info("no accelerator found (%s); simulating %s", e, catalog.DEFAULT)
        return catalog.load(catalog.DEFAULT), True


def resolve_topology(spec: NodeTopology | str) -> NodeTopology:
    """A topology from a value, a catalog name, a topology JSON file or a capture file.

    Raises:
        CatalogError / TopologyError / CaptureError / ClusterError: the value cannot be read.
    """
    if isinstance(spec, NodeTopology):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise ClusterError(f"expected a NodeTopology, catalog name or file, got {type(spec).__name__}")

    return load_topology(spec)


def node_env(topology: NodeTopology, node_key: str, directory: Path,
             base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables a rayaccel node's raylet (and so every worker) must start with.

    * ``RAY_preload_python_modules`` gains :data:`HOOK_MODULE` (kept: what was there);
    * ``RAYACCEL_NODE_DIR`` / ``RAYACCEL_NODE_KEY``: the node's directory and key;
    * ``RAY_custom_unit_instance_resources``: Ray's defaults plus the node's MIG resources and
      a plugin family's resource (Ray's list has Neuron, TPU, HPU and NPU already);
    * the vendor's visible-devices variable (and a non-GPU family's own): placeholder ids
      ``rayaccel-unhooked-<slot>``, so a worker that runs without the hook sees no device
      rather than a held one;
    * ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` on NVIDIA nodes: CUDA numbers devices like NVML.
    """
    base = dict(os.environ if base is None else base)
    pre = [m for m in (base.get(rp.PRELOAD_ENV) or "").split(",") if m and m != HOOK_MODULE]
    env = {rp.PRELOAD_ENV: ",".join([*pre, HOOK_MODULE]), NODE_DIR_ENV: str(directory), NODE_KEY_ENV: node_key}
    num_gpus, res = node_resources(topology, node_key)
    spec = node_spec(topology)
    unit = [spec.resource] if spec is not None and spec.resource != "GPU" else []
    migs = [r for r in res if r.startswith("mig_")]
    have = [r for r in (base.get(rp.UNIT_INSTANCE_ENV) or ",".join(rp.UNIT_INSTANCE_DEFAULT)).split(",") if r]
    extra = [r for r in (*migs, *unit) if r not in have]
    if extra:  # each instance of these needs its own slot id (Ray's default list has Neuron, TPU, HPU, NPU)
        env[rp.UNIT_INSTANCE_ENV] = ",".join(dict.fromkeys([*have, *extra]))
    var = VISIBLE_ENV.get(gpu_vendor(topology), "CUDA_VISIBLE_DEVICES")
    if num_gpus or migs:
        env[var] = ",".join(f"{UNHOOKED_PREFIX}{i}" for i in range(max(num_gpus, 1)))
    if unit:  # the family's own variables: placeholders too (a worker without the hook gets no unit)
        n = int(res.get(spec.resource, 0))
        for v in spec.visible_env:
            env[v] = ",".join(f"{UNHOOKED_PREFIX}{i}" for i in range(max(n, 1)))
    if var == "CUDA_VISIBLE_DEVICES":
        env.setdefault("CUDA_DEVICE_ORDER", base.get("CUDA_DEVICE_ORDER") or "PCI_BUS_ID")
    return env


@contextmanager
def _environ(updates: dict[str, str]) -> Iterator[None]:
    """Set ``updates`` in os.environ for the duration (processes started meanwhile inherit them)."""
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def prepare(topology: NodeTopology, simulated: bool, node_key: str | None = None) -> tuple[NodeRecord, Path]:
    """Make a node's key, directory, record and table (written there) before its raylet starts.

    The table (:mod:`rayaccel.arbiter.table`) is what the node's workers read at a grant;
    building it precomputes the placer's plain decisions for pools of up to 8 devices.
    """

    key = node_key or new_node_key()
    d = nodedir.node_dir(key)
    record = NodeRecord(key, topology, simulated)
    nodedir.write_record(d, record.to_json())
    nodedir.write_file(d, TABLE_FILE, encode_table(build_table(topology, key, simulated, node_spec(topology))))
    return record, d


def init(address: str | None = None, topology: NodeTopology | str | None = None, **ray_init_kwargs: Any) -> Any:
    """Connect to a Ray cluster, or start an embedded one-node cluster whose node rayaccel manages.

    Args:
        address: a Ray address (``"auto"``, ``"host:port"``, ``"ray://..."``) to connect to;
            None starts an embedded local cluster whose node advertises ``topology``.
        topology: for the embedded cluster: a NodeTopology, catalog name or file (simulated);
            None discovers (see module docstring). Not allowed with ``address``.
        ray_init_kwargs: passed to ``ray.init`` (``num_cpus``, ``namespace`` ...; not
            ``num_gpus``/``resources``/``labels`` for an embedded cluster: rayaccel sets those).

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
        if topology is not None:
            raise ClusterError("topology= only applies to an embedded cluster (address=None); nodes of an "
                               "existing cluster publish their own topology via `rayaccel start`")
        return ray.init(address=address, **ray_init_kwargs)
    for k in ("num_gpus", "resources", "labels"):
        if k in ray_init_kwargs:
            raise ClusterError(f"{k}= is set by rayaccel for an embedded cluster (from the topology)")
    topo, simulated = node_topology(topology)
    record, directory = prepare(topo, simulated)
    num_gpus, res = node_resources(topo, record.node_key)
    ray_init_kwargs.setdefault("include_dashboard", False)
    with _environ(node_env(topo, record.node_key, directory)):
        # address="local": always a new embedded cluster, never one found in RAY_ADDRESS or /tmp/ray
        ctx = ray.init(address="local", num_gpus=num_gpus, resources=res,
                       labels=node_labels(topo, record.node_key, simulated=simulated), **ray_init_kwargs)
    try:
        kv.publish(record)
        agent.start(record.node_key, rp_node_id_of_driver(), directory)
    except BaseException:
        ray.shutdown()

        nodedir.remove(directory)
        raise
    _EMBEDDED.append(directory)
    return ctx


_EMBEDDED: list[Path] = []


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

    ray.shutdown()
    view.reset()
    while _EMBEDDED:
        nodedir.remove(_EMBEDDED.pop())


__all__ = ["init", "node_env", "node_topology", "prepare", "resolve_topology", "shutdown"]
