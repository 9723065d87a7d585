"""What a rayaccel node starts with: its topology, its directory, record and table, its raylet's environment.

Used by every way a node starts: ``rayaccel start`` (:mod:`.lifecycle`), the embedded cluster of
:func:`rayaccel.init` (:mod:`rayaccel.ray.driver.init`) and :class:`rayaccel.SimulatedCluster`.

A rayaccel node is an ordinary Ray node whose raylet is started with:

* ``num_gpus`` = its GPU pool (Ray's own ``GPU`` ledger; any Ray GPU work can use it),
  ``mig_<profile>`` unit-instance resources for MIG instances -- no resource Ray itself would not
  advertise -- and ``rayaccel.io/...`` labels (:mod:`rayaccel.contract`); a node given MIG UUIDs
  advertises those instances as ``GPU``, as plain Ray does (:mod:`.preset`);
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
from typing import Iterator, Sequence

from rayaccel import catalog
from rayaccel.arbiter.build import VISIBLE_ENV, build_table, gpu_vendor
from rayaccel.arbiter.table import encode_table
from rayaccel.discovery import discover, load_topology
from rayaccel.errors import BackendUnavailable, ClusterError
from rayaccel.topology import NodeTopology
from rayaccel.ray import _ray_private as rp
from rayaccel.ray.node import nodedir
from rayaccel.ray.node.preset import Preset, table_ids, table_spec
from rayaccel.contract import (NODE_VISIBLE_ENV, ZERO_GPU_ENV, ZERO_GPU_MODES)
from rayaccel.contract import (HOOK_MODULE, NIC_ENV_ENV, NODE_DIR_ENV, NODE_KEY_ENV, TABLE_FILE, UNHOOKED_PREFIX,
                               new_node_key, parse_nic_env)
from rayaccel.ray.record import NodeRecord, node_resources, node_spec

log = logging.getLogger(__name__)


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
        topo = catalog.load(catalog.DEFAULT)
        # a warning (stderr when logging is not configured): a quiet DGX-1 surprises whoever expected their GPUs
        log.warning("rayaccel: no accelerator found here, so this embedded cluster simulates %s %r: %s; choose "
                    "another with rayaccel.init(topology=NAME or a topology file), NAME from `rayaccel topo list`",
                    "the catalog's", catalog.DEFAULT, catalog.describe(catalog.DEFAULT))
        return topo, True


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
             base: dict[str, str] | None = None, nic_env: str | Sequence[str] | None = None,
             zero_gpu_tasks: str | None = None, dynamic_mig: tuple[int, ...] = (),
             mig_gpus: bool = False) -> dict[str, str]:
    """The environment variables a rayaccel node's raylet (and so every worker) must start with.

    * ``RAY_preload_python_modules`` gains :data:`HOOK_MODULE` (kept: what was there);
    * ``RAYACCEL_NODE_DIR`` / ``RAYACCEL_NODE_KEY``: the node's directory and key;
    * ``RAY_custom_unit_instance_resources``: Ray's defaults plus the node's MIG resources and
      a plugin family's resource (Ray's list has Neuron, TPU, HPU and NPU already);
    * the vendor's visible-devices variable (and a non-GPU family's own): placeholder ids
      ``rayaccel-unhooked-<slot>``, so a worker that runs without the hook sees no device
      rather than a held one;
    * ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` on NVIDIA nodes: CUDA numbers devices like NVML;
    * ``RAYACCEL_NIC_ENV`` when ``nic_env`` names other libraries' NIC variables (``NCCL_IB_HCA``,
      ``NVSHMEM_HCA_LIST``, ``NCCL_SOCKET_IFNAME``, ...): the hook writes them from the grant's near NICs.

    * ``RAYACCEL_ZERO_GPU_TASKS`` (``zero_gpu_tasks``: ``see-none``, the default, or ``see-all``) and
      ``RAYACCEL_NODE_VISIBLE`` (the variable as the node was given it): what a task asking no GPU sees.

    ``mig_gpus``: the node was given MIG instances by UUID, its ``GPU`` (:func:`~rayaccel.ray.record.node_resources`).

    Raises:
        ClusterError: ``nic_env`` names a variable rayaccel cannot write (the message lists those it can),
            or ``zero_gpu_tasks`` is not one of ``see-none`` / ``see-all``.
    """
    base = dict(os.environ if base is None else base)
    zero = zero_gpu_mode(zero_gpu_tasks)
    if not rp.capabilities()[rp.TASK_END.name]:  # Ray < 2.50: said once, at the first node this process starts
        rp.warn_missing(rp.TASK_END)
    pre = [m for m in (base.get(rp.PRELOAD_ENV) or "").split(",") if m and m != HOOK_MODULE]
    env = {rp.PRELOAD_ENV: ",".join([*pre, HOOK_MODULE]), NODE_DIR_ENV: str(directory), NODE_KEY_ENV: node_key}
    nic_vars = nic_env_names(nic_env)
    if nic_vars:
        env[NIC_ENV_ENV] = ",".join(nic_vars)
    num_gpus, res = node_resources(topology, dynamic_mig, mig_gpus=mig_gpus)
    spec = node_spec(topology)
    unit = [spec.resource] if spec is not None and spec.resource != "GPU" else []
    migs = [r for r in res if r.startswith("mig_")]
    have = [r for r in (base.get(rp.UNIT_INSTANCE_ENV) or ",".join(rp.unit_instance_default())).split(",") if r]
    extra = [r for r in (*migs, *unit) if r not in have]
    if extra:  # each instance of these needs its own slot id (Ray's default list has Neuron, TPU, HPU, NPU)
        env[rp.UNIT_INSTANCE_ENV] = ",".join(dict.fromkeys([*have, *extra]))
    var = VISIBLE_ENV.get(gpu_vendor(topology), "CUDA_VISIBLE_DEVICES")
    if num_gpus or migs:
        if base.get(var) is not None and not base[var].startswith(UNHOOKED_PREFIX):
            env[NODE_VISIBLE_ENV] = base[var]
        if zero != ZERO_GPU_MODES[0]:
            env[ZERO_GPU_ENV] = zero
        env[var] = ",".join(f"{UNHOOKED_PREFIX}{i}" for i in range(max(num_gpus, 1)))
    if unit:  # the family's own variables: placeholders too (a worker without the hook gets no unit)
        n = int(res.get(spec.resource, 0))
        for v in spec.visible_env:
            env[v] = ",".join(f"{UNHOOKED_PREFIX}{i}" for i in range(max(n, 1)))
    if var == "CUDA_VISIBLE_DEVICES":
        env.setdefault("CUDA_DEVICE_ORDER", base.get("CUDA_DEVICE_ORDER") or "PCI_BUS_ID")
    return env


def nic_env_names(nic_env: str | Sequence[str] | None) -> tuple[str, ...]:
    """The NIC variables ``nic_env`` names (``"NCCL_IB_HCA,NVSHMEM_HCA_LIST"`` or a list), checked.

    Raises:
        ClusterError: a name rayaccel cannot write (the message lists those it can).
    """
    if nic_env is None:
        return ()
    text = nic_env if isinstance(nic_env, str) else ",".join(str(v) for v in nic_env)
    try:
        return parse_nic_env(text)
    except ValueError as e:
        raise ClusterError(str(e)) from None


def zero_gpu_mode(mode: str | None) -> str:
    """``mode`` checked (None: the default, ``see-none``).

    Raises:
        ClusterError: not one of :data:`~rayaccel.contract.ZERO_GPU_MODES`.
    """
    if mode is None:
        return ZERO_GPU_MODES[0]
    if mode not in ZERO_GPU_MODES:
        raise ClusterError(f"zero-gpu-tasks={mode!r}: expected {' or '.join(ZERO_GPU_MODES)} (see-none: a task "
                           "asking no GPU sees none; see-all: it sees the node's GPUs, as on plain Ray)")
    return mode


@contextmanager
def environ(updates: dict[str, str]) -> Iterator[None]:
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


def prepare(topology: NodeTopology, simulated: bool, node_key: str | None = None,
            preset: Preset | None = None, dynamic_mig: tuple[int, ...] = ()) -> tuple[NodeRecord, Path]:
    """Make a node's key, directory, record and table (written there) before its raylet starts.

    The table (:mod:`rayaccel.arbiter.table`) is what the node's workers read at a grant;
    building it precomputes the placer's plain decisions for pools of up to 8 devices.
    ``preset``: the devices the node was given (:mod:`.preset`; ``topology`` is already restricted
    to them): the record names the host's devices too, the table the ids Ray hands out for each unit
    (:func:`~.preset.table_ids`). ``dynamic_mig``: GPUs the agent re-partitions (:mod:`.dynmig`; checked by
    :func:`.dynmig.dynamic_gpus`): the record names them, the table lists every instance they could hold.
    A preset of MIG UUIDs (:attr:`~.preset.Preset.mig_gpus`): the record says so, the table's ``GPU`` units are
    those instances in the preset's order (:func:`~rayaccel.arbiter.build.build_table`'s ``gpu_instances``).

    Raises:
        ClusterError: ``dynamic_mig`` on a node given MIG UUIDs (its instances are fixed: they are its GPUs).
    """
    mig_gpus = preset is not None and preset.mig_gpus
    if mig_gpus and dynamic_mig:
        raise ClusterError(f"--dynamic-mig with {preset.source}: a node given MIG instances by UUID uses exactly "
                           "those as its GPUs; drop --dynamic-mig, or give the node whole GPUs (indices or GPU UUIDs)")
    key = node_key or new_node_key()
    d = nodedir.node_dir(key)
    given = preset is not None and preset.restricted
    record = NodeRecord(key, topology, simulated, host=preset.host if given else None,
                        given_by=preset.source if given else None, dynamic_mig=tuple(dynamic_mig), mig_gpus=mig_gpus)
    spec = node_spec(topology)
    nodedir.write_record(d, record.to_json())
    nodedir.write_file(d, TABLE_FILE, encode_table(build_table(topology, key, simulated, table_spec(spec, preset),
                                                               ray_ids=table_ids(topology, spec, preset),
                                                               dynamic_mig=tuple(dynamic_mig),
                                                               gpu_instances=preset.partitions if mig_gpus else None)))
    return record, d


__all__ = ["environ", "nic_env_names", "node_env", "node_topology", "prepare", "resolve_topology", "zero_gpu_mode"]
