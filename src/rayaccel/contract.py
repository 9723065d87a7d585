"""The node's contract: every name that crosses a process boundary, in one place (stdlib only).

A rayaccel node is a Ray node plus a few agreements between the processes that make it: the
``rayaccel start`` / ``rayaccel.init`` process that starts the raylet, the raylet's workers (the hook),
the node's agent, and any driver. This module holds those agreements -- environment variables,
the node directory's file names, GCS key-value keys, label keys, drain names and the format
version of every record another process reads -- so none of them is a literal anywhere else.
Nothing here imports anything of rayaccel or ``ray``: the worker hook pays for every line.

A rayaccel node advertises to Ray (:mod:`.record` computes it):

* ``GPU``: one per device of its GPU pool (devices not in MIG mode and not failed;
  :func:`rayaccel.placement.pools.gpu_pool`). This is Ray's own ledger: any Ray GPU work can use it.
* ``mig_<profile>`` (e.g. ``mig_1g.5gb``): one per MIG instance of that profile, a
  unit-instance resource (each instance gets its own slot id).
* the rest of what Ray itself advertises on that hardware (its accelerator family's unit
  resource, ``accelerator_type:<T>``, ...) -- and nothing else: no resource of rayaccel's own.

Labels (Ray's label syntax: <= 63 chars of ``[A-Za-z0-9._-]``) are rayaccel's only addition:
``rayaccel.io/node-key`` (a node-unique key naming the node's record in Ray's GCS key-value
store, namespace ``"rayaccel"``, key ``topology/<key>``, and its directory; work and gang
bundles are pinned to a node by selecting it), ``rayaccel.io/accelerator-model``,
``rayaccel.io/vendor``, ``rayaccel.io/devices``, ``rayaccel.io/mig-instances``,
``rayaccel.io/simulated``, ``rayaccel.io/topology``, ``rayaccel.io/nvlink-*``, ``rayaccel.io/net-l<n>``.
"""

from __future__ import annotations

import json
import os
import re
import uuid

# ---------------------------------------------------------------- environment variables
#: The node's private directory (record, table, arbiter state); set in the raylet's environment.
NODE_DIR_ENV = "RAYACCEL_NODE_DIR"
#: The node's key (12 hex chars); set in the raylet's environment.
NODE_KEY_ENV = "RAYACCEL_NODE_KEY"
#: A simulated topology for discovery (catalog name or file): ``RAYACCEL_TOPOLOGY=dgx1-v100``.
TOPOLOGY_ENV = "RAYACCEL_TOPOLOGY"
#: Where nodes keep their private directories and stores (default: /dev/shm or the temp dir).
STATE_DIR_ENV = "RAYACCEL_STATE_DIR"
#: A ``gpu_memory`` share's bytes, for the tiered store's device budget inside a worker.
GPU_MEMORY_ENV = "RAYACCEL_GPU_MEMORY_BYTES"
#: The device memory a producer's ``rayaccel``-transport objects may hold before the least recently used spill to
#: host memory and disk (``"8GiB"``; :mod:`rayaccel.memory.held`); unset: the worker's ``gpu_memory`` share
#: (:data:`GPU_MEMORY_ENV`), and without one no budget (objects stay on the device until freed, as in Ray).
RDT_DEVICE_BYTES_ENV = "RAYACCEL_RDT_DEVICE_BYTES"
#: Forces the tensor transport's path (diagnostics): ``ipc``, ``shm``, ``nixl`` or ``object_store``.
RDT_PATH_ENV = "RAYACCEL_RDT_PATH"
#: Where the kernel lists this host's RDMA devices, and the variable naming another place (a container
#: that mounts sysfs elsewhere). UCX is told only of NICs listed there: a NIC of a simulated topology is
#: not the host's, and UCX given one fails (NIXL: ``NIXL_ERR_BACKEND``).
IB_DIR = "/sys/class/infiniband"
IB_DIR_ENV = "RAYACCEL_IB_DIR"
#: The NIC variable UCX (and so NIXL, RDT's NIXL transport) reads.
UCX_NET_DEVICES = "UCX_NET_DEVICES"
#: The NIC variables of other libraries the hook writes at each grant, besides UCX's (``rayaccel start --nic-env``,
#: ``rayaccel.init(nic_env=)``, ``SimulatedCluster(nic_env=)``): a comma-separated subset of :data:`NIC_ENV_VARS`,
#: set in the raylet's environment so every worker reads it. Unset: only ``UCX_NET_DEVICES``.
NIC_ENV_ENV = "RAYACCEL_NIC_ENV"
#: The variables ``--nic-env`` may name, and the form each takes (NCCL's ``=`` asks for exact names, not prefixes):
#: RDMA devices as ``device:port`` (``NCCL_IB_HCA==mlx5_0:1,mlx5_1:1``, ``NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1``), or the
#: network interfaces of those devices, when the host's sysfs names them (``NCCL_SOCKET_IFNAME==ib0``, ...).
NIC_ENV_VARS = {"NCCL_IB_HCA": ("hca", "="), "NVSHMEM_HCA_LIST": ("hca", ""), "NCCL_SOCKET_IFNAME": ("netdev", "="),
                "GLOO_SOCKET_IFNAME": ("netdev", ""), "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": ("netdev1", "")}
#: The devices of a worker's current grant, in order (``0,3``), written by the hook at each grant: what
#: the tensor transport and the store inside the worker read (:func:`format_devices`, :func:`parse_devices`).
DEVICES_ENV = "RAYACCEL_DEVICES"
#: Who a worker's current grant belongs to, ``<pid>:<grant key>:<name>`` (``4242:actor:ab12...:Trainer``: the actor's
#: name or class, the task's function), written by the hook with
#: :data:`DEVICES_ENV` at each grant and removed when the worker holds nothing: a process the worker starts inherits
#: both, so the node agent's leak watcher (:mod:`rayaccel.ray.node.leaks`) knows which holder a process that outlives
#: its worker came from, even when its parent chain is broken (:func:`format_holder`, :func:`parse_holder`).
HOLDER_ENV = "RAYACCEL_HOLDER"
#: What a task that asked for no GPU sees on a GPU node (``rayaccel start --zero-gpu-tasks``,
#: ``rayaccel.init(zero_gpu_tasks=)``): one of :data:`ZERO_GPU_MODES`; absent means ``see-none``.
ZERO_GPU_ENV = "RAYACCEL_ZERO_GPU_TASKS"
#: ``see-none`` (the default): ``""``, no device (Ray's value with ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1``); ``see-all``: what plain Ray 2.60
#: leaves it (the visible-devices variable as the node was started with it: unset, or its preset).
ZERO_GPU_MODES = ("see-none", "see-all")
#: The GPUs' visible-devices variable as the node was given it (a ``see-all`` zero-GPU task gets it); absent: unset.
NODE_VISIBLE_ENV = "RAYACCEL_NODE_VISIBLE"
#: The module every worker of a rayaccel node preloads (``RAY_preload_python_modules``).
HOOK_MODULE = "rayaccel.ray.worker.hook"
#: Functions of this module are ``rayaccel.remote`` work: their set-up decides their grant.
REMOTE_MODULE = "rayaccel.ray.driver.tasks."
#: Placeholder ids the raylet's visible-devices variable holds, so unhooked workers see no GPU.
UNHOOKED_PREFIX = "rayaccel-unhooked-"

# ---------------------------------------------------------------- GCS, labels, names
NAMESPACE = "rayaccel"
LABEL_PREFIX = "rayaccel.io/"
NODE_KEY_LABEL = LABEL_PREFIX + "node-key"
#: Name prefix of drain placeholder actors: ``rayaccel-drain-<node key>-<device>``.
DRAIN_PREFIX = "rayaccel-drain-"
#: The Ray namespace the node agents connect in: Ray hides a ``_ray_internal_`` namespace's jobs from its views,
#: as it does its own dashboard's.
AGENT_NAMESPACE = "_ray_internal_rayaccel"
#: GCS KV key prefix (namespace :data:`NAMESPACE`) of where a node's agent answers: ``agent/<node key>``.
AGENT_PREFIX = "agent/"

# ---------------------------------------------------------------- the node directory
#: The node's record (:class:`rayaccel.ray.record.NodeRecord`, JSON).
RECORD_FILE = "record.json"
#: The node table a worker reads (:mod:`rayaccel.arbiter.table`).
TABLE_FILE = "table.json"
#: The arbiter's state and its lock (:mod:`rayaccel.arbiter.statefile`).
STATE_FILE = "arbiter.state"
LOCK_FILE = "arbiter.lock"
#: What the node's agent does with the workers of a device its health watcher drains (``rayaccel start
#: --on-failed-gpu``; :mod:`rayaccel.ray.node.failpolicy`), format :data:`FAILED_GPU_SCHEMA`; absent: ``leave``.
FAILED_GPU_FILE = "on-failed-gpu.json"
#: ``leave`` (the default: work on it runs on, or hangs, until it ends); ``end-workers``: its holders are killed,
#: so Ray restarts them (``max_restarts``) or retries their tasks on a healthy device.
FAILED_GPU_MODES = ("leave", "end-workers")
#: Whether and when the node's agent ends leaked processes by itself (``rayaccel start --reclaim-leaks AFTER``;
#: :mod:`rayaccel.ray.node.leakpolicy`), format :data:`RECLAIM_LEAKS_SCHEMA`; absent: never (``rayaccel reclaim`` only).
RECLAIM_LEAKS_FILE = "reclaim-leaks.json"
#: The MIG instances that exist now on the node's dynamic-MIG GPUs (``rayaccel start --dynamic-mig``;
#: :mod:`rayaccel.ray.node.dynmig`): dynamic unit -> MIG UUID, format :data:`DYNMIG_SCHEMA`; written by the agent,
#: read by the arbiter at each MIG grant (a unit without an instance is never handed out).
DYNMIG_FILE = "dynmig.json"
#: The prefix of the placement groups that hold a dynamic-MIG GPU's units that have no instance in Ray's ledger.
DYNMIG_PREFIX = "rayaccel-mig-"
#: The ``by`` of a drain the leak watcher made (a fence): lifted by the watcher once the leaked processes are gone.
LEAK_DRAIN_BY = "leak"
#: The node directory's folder of per-worker usage files (``usage/<pid>.json``, format :data:`USAGE_SCHEMA`): what a
#: worker says it uses (``rayaccel.report_usage``, simulated nodes) and what its ``rayaccel``-transport objects spilled;
#: written by the worker (:mod:`rayaccel.ray.usagefile`), read and cleaned up by the node's agent.
USAGE_DIR = "usage"

# ---------------------------------------------------------------- formats another process reads
# Each carries its id in a ``schema`` field; a reader refuses an id it does not know, naming it. A record
# or snapshot without the field was written before formats carried one (rayaccel 0.1.0): read as ``/1``.
#: The node's record (node directory and GCS KV).
RECORD_SCHEMA = "rayaccel.record/1"
#: An agent's published snapshot of its node (GCS KV).
SNAPSHOT_SCHEMA = "rayaccel.snapshot/1"
#: The node table workers read.
TABLE_SCHEMA = "rayaccel.table/1"
#: Where a node's agent answers (GCS KV ``agent/<key>``: its address, pid and the connection's key).
AGENT_SCHEMA = "rayaccel.agent/1"
#: The arbiter's state file (marshal, with a checksum).
STATE_SCHEMA = "rayaccel.arbiter/2"
#: The node's failed-GPU policy (:data:`FAILED_GPU_FILE`).
FAILED_GPU_SCHEMA = "rayaccel.on-failed-gpu/1"
#: A worker's usage file (:data:`USAGE_DIR`).
USAGE_SCHEMA = "rayaccel.usage/1"
#: The node's leak reclaim policy (:data:`RECLAIM_LEAKS_FILE`).
RECLAIM_LEAKS_SCHEMA = "rayaccel.reclaim-leaks/1"
#: The dynamic-MIG instances file (:data:`DYNMIG_FILE`).
DYNMIG_SCHEMA = "rayaccel.dynmig/1"

_LABEL_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_KEY_OK = re.compile(r"^[0-9a-f]{12}$")

__all__ = ["AGENT_NAMESPACE", "AGENT_PREFIX", "AGENT_SCHEMA", "DEVICES_ENV", "DRAIN_PREFIX", "DYNMIG_FILE", "DYNMIG_PREFIX", "DYNMIG_SCHEMA", "FAILED_GPU_FILE", "FAILED_GPU_MODES", "FAILED_GPU_SCHEMA", "GPU_MEMORY_ENV", "HOLDER_ENV", "HOOK_MODULE", "IB_DIR", "IB_DIR_ENV", "LABEL_PREFIX", "LEAK_DRAIN_BY", "LOCK_FILE",
           "NAMESPACE", "NIC_ENV_ENV", "NODE_VISIBLE_ENV", "NIC_ENV_VARS", "NODE_DIR_ENV", "NODE_KEY_ENV", "NODE_KEY_LABEL",
           "RDT_DEVICE_BYTES_ENV", "RDT_PATH_ENV", "RECLAIM_LEAKS_FILE", "RECLAIM_LEAKS_SCHEMA", "RECORD_FILE", "RECORD_SCHEMA", "SNAPSHOT_SCHEMA", "STATE_SCHEMA", "TABLE_SCHEMA", "REMOTE_MODULE", "STATE_DIR_ENV", "STATE_FILE", "TABLE_FILE",
           "TOPOLOGY_ENV", "UCX_NET_DEVICES", "UNHOOKED_PREFIX", "USAGE_DIR", "USAGE_SCHEMA", "ZERO_GPU_ENV", "ZERO_GPU_MODES", "drain_name", "drain_target", "format_devices", "format_holder", "host_netdevs", "host_rdma_devices",
           "kv_key", "label_value", "load_json", "new_node_key", "nic_env_values", "parse_devices", "parse_holder", "parse_nic_env", "valid_key"]


def load_json(raw: bytes | str, *, what: str, max_bytes: int, error: type[Exception], where: str | None = None,
              schema: str | None = None, schema_optional: bool = False) -> dict:
    """Parse a JSON object another process wrote, guarded: its size, its nesting, its shape, its format id.

    Args:
        what: what the data is, for messages (``"rayaccel node record"``).
        max_bytes: refuse anything larger (before parsing).
        error: the error class to raise, called as ``error(message, where)``.
        schema: the format id its ``schema`` field must hold; ``schema_optional``: a missing field is
            read as that format (data written before formats carried an id).

    Raises:
        ``error``: too large, nested too deeply, not JSON, not an object, or another format (naming it).
    """
    if len(raw) > max_bytes:
        raise error(f"{what} is {len(raw)} bytes (at most {max_bytes})", where)
    try:
        data = json.loads(raw)
    except RecursionError:
        raise error(f"{what} is nested too deeply", where) from None
    except ValueError as e:
        raise error(f"{what} is not JSON: {e}", where) from None
    if not isinstance(data, dict):
        raise error(f"{what} must be a JSON object, got {type(data).__name__}", where)
    if schema is not None:
        got = data.get("schema")
        if got != schema and not (got is None and schema_optional):
            raise error(f"{what} has format {str(got)[:80]!r}; this rayaccel reads {schema!r} (is another "
                        f"rayaccel release running on this cluster? `rayaccel doctor` compares them)", where)
    return data


def format_devices(devices: "list[int] | tuple[int, ...]") -> str:
    """:data:`DEVICES_ENV`'s value for ``devices``: ``"0,3"``."""
    return ",".join(str(int(i)) for i in devices)


def parse_devices(text: str | None) -> tuple[int, ...] | None:
    """The devices :data:`DEVICES_ENV` names (``"0,3"``; the JSON list ``"[0, 3]"`` of earlier releases too);
    None when unset or not a list of device indices."""
    if not text:
        return None
    parts = text.strip().strip("[]").split(",")
    try:
        return tuple(int(p) for p in parts if p.strip())
    except ValueError:
        return None


def format_holder(pid: int, key: str, name: str = "") -> str:
    """:data:`HOLDER_ENV`'s value for the grant ``key`` (``actor:<hex>`` / ``task:<hex>``) of worker ``pid`` named
    ``name``: ``"4242:actor:ab12:Trainer"`` (the name shortened to 200 characters, NULs dropped)."""
    return f"{int(pid)}:{key}:{name.replace(chr(0), '')[:200]}"


def parse_holder(text: str | None) -> tuple[int, str, str] | None:
    """``(worker pid, grant key, name)`` from :data:`HOLDER_ENV`'s value; None when unset or malformed."""
    if not text or len(text) > 512:
        return None
    parts = text.split(":", 3)
    if len(parts) < 3 or not parts[0].isdigit() or len(parts[0]) > 10 or not parts[1] or not parts[2]:
        return None
    return int(parts[0]), f"{parts[1]}:{parts[2]}", parts[3] if len(parts) > 3 else ""


def host_rdma_devices() -> frozenset[str]:
    """The RDMA devices this host has (``mlx5_0``, ...), from sysfs (:data:`IB_DIR_ENV`); empty when none."""
    try:
        return frozenset(os.listdir(os.environ.get(IB_DIR_ENV) or IB_DIR))
    except OSError:
        return frozenset()


def parse_nic_env(text: str | None) -> tuple[str, ...]:
    """The variables :data:`NIC_ENV_ENV` (or ``--nic-env``) names, each once, in order.

    Raises:
        ValueError: a name that is not one of :data:`NIC_ENV_VARS` (the message names the accepted ones).
    """
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    bad = [n for n in names if n not in NIC_ENV_VARS]
    if bad:
        raise ValueError(f"--nic-env: unknown variable(s) {', '.join(bad)}; rayaccel can write "
                         f"{', '.join(NIC_ENV_VARS)} (UCX_NET_DEVICES is always written)")
    return tuple(dict.fromkeys(names))


def host_netdevs(rdma_device: str) -> tuple[str, ...]:
    """The network interfaces (``ib0``, ``ens1f0``) of an RDMA device of this host, from sysfs; empty when unknown."""
    base = os.environ.get(IB_DIR_ENV) or IB_DIR
    try:
        return tuple(sorted(os.listdir(os.path.join(base, rdma_device, "device", "net"))))
    except OSError:
        return ()


def nic_env_values(names: "tuple[str, ...] | list[str]", nics: "tuple[str, ...] | list[str]",
                   netdevs: "dict[str, tuple[str, ...]] | None" = None) -> dict[str, str | None]:
    """The value of each variable in ``names`` for the RDMA NICs ``nics`` (UCX ``device:port``), None when it has none.

    Args:
        netdevs: RDMA device -> its network interfaces (:func:`host_netdevs`); the interface variables need them.
    """
    netdevs = netdevs or {}
    ifs = list(dict.fromkeys(i for n in nics for i in netdevs.get(n.partition(":")[0], ())))
    out: dict[str, str | None] = {}
    for var in names:
        kind, prefix = NIC_ENV_VARS[var]
        if kind == "hca":
            out[var] = prefix + ",".join(nics) if nics else None
        elif kind == "netdev1":
            out[var] = ifs[0] if ifs else None
        else:
            out[var] = prefix + ",".join(ifs) if ifs else None
    return out


def kv_key(node_key: str) -> str:
    """GCS KV key of a node's topology record (namespace :data:`NAMESPACE`)."""
    return f"topology/{node_key}"


def new_node_key() -> str:
    """A fresh node key (12 hex chars)."""
    return uuid.uuid4().hex[:12]


def valid_key(node_key: str) -> bool:
    """True for a well-formed node key (12 lowercase hex chars)."""
    return isinstance(node_key, str) and bool(_KEY_OK.match(node_key))


def drain_name(node_key: str, device: int) -> str:
    """The name of the actor that holds drained ``device`` of node ``node_key`` in Ray's ledger."""
    return f"{DRAIN_PREFIX}{node_key}-{device}"


def drain_target(actor_name: str) -> int | None:
    """The device a drain placeholder actor holds (from its name), or None for any other actor."""
    if not actor_name.startswith(DRAIN_PREFIX):
        return None
    tail = actor_name[len(DRAIN_PREFIX):].rsplit("-", 1)
    if len(tail) != 2 or not tail[1].isdigit():
        return None
    return int(tail[1])


def label_value(text: str | None) -> str:
    """Sanitise ``text`` into a valid Ray label value (<= 63 chars, alnum at both ends)."""
    if not text:
        return ""
    return _LABEL_BAD.sub("-", text).strip("-._")[:63].strip("-._")
