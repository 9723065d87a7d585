"""Starting nodes: :func:`init` (embedded or connect), :func:`shutdown`, :func:`start_node` / :func:`stop_node`.

Which topology a node gets (both for ``rayaccel.init()`` and ``rayaccel start``):

1. the ``topology`` argument / ``--topology NAME|FILE`` (simulated);
2. else :func:`rayaccel.discovery.discover`: ``RAYACCEL_TOPOLOGY`` set -> that
   simulated topology; else the first available hardware backend (real GPUs);
3. else (no hardware backend available) the catalog default
   (:data:`rayaccel.catalog.DEFAULT`), simulated, so a laptop works out of the box.

Publication (see :mod:`rayaccel.ray.kv`): ``init`` writes the record from its own
driver right after the embedded node is up; ``start_node`` runs ``ray start`` and
then connects a short-lived driver to write it (``rayaccel start`` fails, and
stops the node again, if that write fails, so a node never runs unpublished).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
from typing import Any, Sequence

from ..errors import BackendUnavailable, ClusterError
from ..topology import NodeTopology
from .resources import NodeRecord, new_node_key, node_labels, node_resources

log = logging.getLogger(__name__)


def node_topology(topology: NodeTopology | str | None = None) -> tuple[NodeTopology, bool]:
    """The topology this node should advertise, and whether it is simulated (see module docstring).

    Raises:
        CatalogError / TopologyError: a bad ``topology`` name or file.
        BackendError: a hardware backend that is present failed.
    """
    from .cluster import resolve_topology

    if topology is not None:
        return resolve_topology(topology), True
    from ..discovery import discover

    simulated = bool(os.environ.get("RAYACCEL_TOPOLOGY"))
    try:
        return discover(), simulated
    except BackendUnavailable as e:
        from .. import catalog

        log.info("no accelerator found (%s); simulating %s", e, catalog.DEFAULT)
        return catalog.load(catalog.DEFAULT), True


def init(address: str | None = None, topology: NodeTopology | str | None = None, **ray_init_kwargs: Any) -> Any:
    """Connect to a Ray cluster, or start an embedded one-node cluster managed by rayaccel.

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

    from . import context, kv

    if ray.is_initialized():
        raise ClusterError("Ray is already initialised in this process; call rayaccel.shutdown() first")
    context.reset()  # Ray is down: whatever is cached (e.g. after a plain ray.shutdown()) is stale
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address is not None and not isinstance(address, str):
        raise ClusterError(f"address= must be a string such as 'auto' or 'host:port', got {type(address).__name__}")
    if not (address or "").startswith("ray://"):  # Ray Client takes its own extra keywords
        _check_init_kwargs(ray_init_kwargs)
    if address is not None:
        if topology is not None:
            raise ClusterError("topology= only applies to an embedded cluster (address=None); nodes of an "
                               "existing cluster publish their own topology via `rayaccel start`")
        ctx = ray.init(address=address, **ray_init_kwargs)
        _connected_or_shutdown(context.ensure_connected)
        return ctx
    for k in ("num_gpus", "resources", "labels"):
        if k in ray_init_kwargs:
            raise ClusterError(f"{k}= is set by rayaccel for an embedded cluster (from the topology)")
    topo, simulated = node_topology(topology)
    key = new_node_key()
    ray_init_kwargs.setdefault("include_dashboard", False)
    ctx = ray.init(num_gpus=0, resources=node_resources(topo, key),
                   labels=node_labels(topo, key, simulated=simulated), **ray_init_kwargs)

    def finish() -> None:
        kv.publish(NodeRecord(key, topo, simulated))
        context.ensure_connected()

    _connected_or_shutdown(finish)
    return ctx


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


def _connected_or_shutdown(step: Any) -> None:
    """Run ``step`` after ``ray.init``; on failure shut Ray down again so a retry can start clean."""
    import ray

    from . import context

    try:
        step()
    except BaseException:
        ray.shutdown()
        context.reset()
        raise


def shutdown() -> None:
    """Disconnect from Ray (stopping an embedded cluster) and forget cached cluster state."""
    import ray

    from . import context

    ray.shutdown()
    context.reset()


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def ray_start_command(topology: NodeTopology, node_key: str, ray_args: Sequence[str], *,
                      simulated: bool) -> list[str]:
    """The ``ray start`` command line for a node advertising ``topology``.

    Raises:
        ClusterError: ``ray_args`` already sets ``--num-gpus`` (must be 0) or ``--resources``
            naming rayaccel's resources.
    """
    args = list(ray_args)
    gpus = _flag_value(args, "--num-gpus")
    if gpus not in (None, "0"):
        raise ClusterError(f"--num-gpus={gpus}: rayaccel nodes start with --num-gpus=0 so Ray cannot hand a "
                           f"managed device out a second time; drop the flag")
    res = node_resources(topology, node_key)
    user_res = _flag_value(args, "--resources")
    if user_res is not None:
        try:
            extra = json.loads(user_res)
        except json.JSONDecodeError as e:
            raise ClusterError(f"--resources is not valid JSON: {e.msg}") from None
        clash = sorted(set(extra) & set(res))
        if clash:
            raise ClusterError(f"--resources names {clash[0]!r}, which rayaccel manages")
        res.update(extra)
        args = [a for i, a in enumerate(args) if not (a.startswith("--resources")
                                                      or (i > 0 and args[i - 1] == "--resources"))]
    labels = node_labels(topology, node_key, simulated=simulated)
    user_labels = _flag_value(args, "--labels")
    if user_labels:
        args = [a for i, a in enumerate(args) if not (a.startswith("--labels")
                                                      or (i > 0 and args[i - 1] == "--labels"))]
        for item in user_labels.split(","):
            if "=" in item:
                k, v = item.split("=", 1)
                labels[k.strip()] = v.strip()
    label_text = ",".join(f"{k}={v}" for k, v in labels.items())
    return ["ray", "start", *args, "--num-gpus=0", f"--resources={json.dumps(res)}", f"--labels={label_text}"]


def start_node(ray_args: Sequence[str] = (), topology: NodeTopology | str | None = None,
               *, publish: bool = True) -> tuple[NodeRecord, str]:
    """Run ``ray start`` for this node with rayaccel's resources and labels, then publish its record.

    Args:
        ray_args: ``ray start`` flags passed through (``--head``, ``--address=...``, ``--port`` ...).
        topology: simulate this topology instead of discovering (sets ``RAYACCEL_TOPOLOGY``
            for the node's processes).
        publish: write the record into the GCS KV (connects a short-lived driver).

    Returns:
        The record and ``ray start``'s output.

    Raises:
        ClusterError: ``ray start`` failed, or publication failed (the node is stopped again).
    """
    topo, simulated = node_topology(topology)
    key = new_node_key()
    cmd = ray_start_command(topo, key, ray_args, simulated=simulated)
    env = dict(os.environ)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if simulated and topology is not None:
        env["RAYACCEL_TOPOLOGY"] = str(topology) if not isinstance(topology, NodeTopology) else (topo.name or "")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"`{shlex.join(cmd[:3])} ...` failed (exit {proc.returncode}):\n"
                           f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
    record = NodeRecord(key, topo, simulated)
    if publish:
        address = _flag_value(ray_args, "--address") or "auto"
        code = ("import sys, ray; from rayaccel.ray import kv; from rayaccel.ray.resources import NodeRecord;"
                "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False);"
                "kv.publish(NodeRecord.from_json(sys.stdin.read())); ray.shutdown()")
        pub = subprocess.run([sys.executable, "-c", code, address], input=record.to_json(), env=env,
                             capture_output=True, text=True)
        if pub.returncode != 0:
            subprocess.run(["ray", "stop"], env=env, capture_output=True)
            raise ClusterError(f"the node started but its topology could not be published at {address} "
                               f"(node stopped again):\n{pub.stderr.strip()[-2000:]}")
    return record, proc.stdout


def stop_node(force: bool = False) -> str:
    """Run ``ray stop`` (``--force`` when asked); return its output.

    Raises:
        ClusterError: ``ray stop`` failed.
    """
    cmd = ["ray", "stop"] + (["--force"] if force else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip()[-1000:]}")
    return proc.stdout + proc.stderr
