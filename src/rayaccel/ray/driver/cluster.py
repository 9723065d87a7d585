"""``SimulatedCluster``: a multi-node Ray cluster on one machine, one topology per node.

Built on ``ray.cluster_utils.Cluster``: every node is a real raylet started the way
``rayaccel start`` starts one (:mod:`.node`): Ray's ``GPU`` resource for its GPU pool,
MIG-profile resources, labels, and the worker hook with the node's own directory.
For tests, the demo and benchmarks::

    with SimulatedCluster(["dgx1-v100", "hgx-h100"]) as c:
        ref = my_task.remote()
        c.remove_node(c.node_ids[1])

``plain=`` adds nodes the way plain ``ray start --num-gpus=N`` would (no rayaccel; another family's
resource counted as Ray's manager counts it, ``{"neuron_cores": 32}``): for side-by-side comparisons
and for ``doctor``'s mixed-cluster checks.

:func:`managed_node_args` is the one step that turns ``Cluster.add_node``'s arguments for a plain
node into a rayaccel node's (the caller's resources and labels kept): ``SimulatedCluster`` uses it,
and so does ``scripts/ray_own_tests.py``, which runs Ray's own tests on rayaccel nodes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rayaccel.errors import ClusterError
from rayaccel.topology import NodeTopology
from rayaccel.ray import _ray_private as rp, kv
from rayaccel.ray.node import agent, failpolicy, leakpolicy
from rayaccel.ray.node.dynmig import dynamic_gpus
from rayaccel.ray.node import nodedir
from rayaccel.ray.driver import view
from rayaccel.ray.driver.init import check_caller_args, with_caller_resources
from rayaccel.ray.node.preset import given
from rayaccel.ray.node.start import nic_env_names, node_env, prepare, resolve_topology, zero_gpu_mode
from rayaccel.ray.record import NodeRecord, node_labels, node_resources, node_spec


@dataclass
class SimNode:
    """One node of a :class:`SimulatedCluster` (``node_key``/``directory`` are None for a plain node)."""

    node_id: str
    node_key: str | None
    topology: NodeTopology
    handle: Any
    directory: Path | None = None
    agent: Any = None  # the node agent's process (a rayaccel node, once connected)

    @property
    def managed(self) -> bool:
        """True for a rayaccel node."""
        return self.node_key is not None


def ray_tmpdir() -> str:
    """A private, short Ray temp dir (Unix socket paths must stay short), with its ``ray/`` subdir."""
    base = os.environ.get("RAY_TMPDIR")
    if not base:
        base = tempfile.mkdtemp(prefix="rayaccel-", dir="/tmp")
        os.environ["RAY_TMPDIR"] = base
    os.makedirs(os.path.join(base, "ray"), exist_ok=True)
    return base


class SimulatedCluster:
    """A local multi-node Ray cluster whose nodes pretend to have the given topologies.

    Args:
        topologies: one per node (NodeTopology, catalog name or file); the first is the head.
        num_cpus: CPUs each node advertises (default 4), or one count per node.
        connect: connect this process as the driver (and publish the records, start the agents).
        object_store_memory: per node, bytes (default 100 MiB).
        plain: positions in ``topologies`` to start as plain Ray nodes (``num_gpus`` or the family's
            resource only, no rayaccel), e.g. to compare with Ray's own device choice on the same cluster.
        env: extra environment variables for every node's raylet (and workers).
        metrics_export_port: the head's Prometheus endpoint port (None: Ray picks one).
        dashboard: start Ray's dashboard on the head (what ``ray.util.state`` asks; off by default: it is slow
            to start).
        labels: extra Ray labels per node, in the order of ``topologies`` (None or a shorter
            list: none for the rest), e.g. ``ray.io/gpu-domain`` for trays of one NVLink domain
            (:func:`rayaccel.ray.driver.places.place_labels`). They override rayaccel's own labels.
        nic_env: other libraries' NIC variables the rayaccel nodes' workers get at each grant
            (``"NCCL_IB_HCA,NVSHMEM_HCA_LIST"``), as ``rayaccel start --nic-env``.
        zero_gpu_tasks: what a task asking no GPU sees on the rayaccel nodes (``see-none``, the default, or
            ``see-all``), as ``rayaccel start --zero-gpu-tasks``.
        on_failed_gpu: ``leave`` (default) or ``end-workers``, as ``rayaccel start --on-failed-gpu``.
        reclaim_leaks: end leaked device processes of the nodes' workers once a leak has lasted this long
            (``"30s"``, ``"5m"``; default: never), as ``rayaccel start --reclaim-leaks``.
        dynamic_mig: GPUs in MIG mode (``"0,1"``, ``"all"``, ``[0]``) whose instances each rayaccel node's agent makes
            for waiting ``mig_<profile>`` work, as ``rayaccel start --dynamic-mig`` (checked on every node first).
        ray_init_kwargs: passed to ``ray.init`` when connecting.

    A visible-devices variable in ``env`` (``CUDA_VISIBLE_DEVICES=4,5,6``) gives every node those devices of
    its topology, as it gives a plain Ray node (:mod:`rayaccel.ray.node.preset`); checked before anything starts.

    Raises:
        ClusterError: no topology given, more label sets than nodes or a label set that is not
            a mapping of strings, or Ray already initialised in this process.
    """

    def __init__(self, topologies: Sequence[NodeTopology | str], *, num_cpus: int | Sequence[int] = 4,
                 connect: bool = True,
                 object_store_memory: int = 100 << 20, plain: Sequence[int] = (), env: dict | None = None,
                 metrics_export_port: int | None = None, labels: Sequence[dict | None] | None = None,
                 nic_env: str | Sequence[str] | None = None, dashboard: bool = False,
                 zero_gpu_tasks: str | None = None, on_failed_gpu: str | None = None,
                 reclaim_leaks: str | float | None = None, dynamic_mig: str | Sequence[int] | None = None,
                 **ray_init_kwargs: Any):
        import ray
        from ray.cluster_utils import Cluster

        if not topologies:
            raise ClusterError("SimulatedCluster needs at least one topology (one per node)")
        if connect and ray.is_initialized():
            raise ClusterError("Ray is already initialised in this process; call rayaccel.shutdown() first")
        topos = [resolve_topology(t) for t in topologies]  # bad names fail before anything is made
        extra = _check_labels(labels, len(topos))
        self.nic_env = nic_env_names(nic_env)  # a bad name fails before anything starts
        self.zero_gpu_tasks = zero_gpu_mode(zero_gpu_tasks)
        self.on_failed_gpu = failpolicy.failed_gpu_mode(on_failed_gpu)
        self.reclaim_leaks = leakpolicy.reclaim_after(reclaim_leaks)
        self._given = [given(t, dict(env or {})) for t in topos]  # a bad preset fails before anything starts
        for i, (t, _) in enumerate(self._given):
            if i not in set(plain):
                dynamic_gpus(dynamic_mig, t)  # on every rayaccel node, before anything starts
        self.dynamic_mig = dynamic_mig
        self._records: dict[str, NodeRecord] = {}
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self._own_tmp = "RAY_TMPDIR" not in os.environ
        self.temp_dir = ray_tmpdir()
        if isinstance(num_cpus, int):
            cpus = [num_cpus] * len(topos)
        elif len(num_cpus) != len(topos) or not all(isinstance(n, int) and n >= 0 for n in num_cpus):
            raise ClusterError(f"num_cpus: expected an int >= 0 or one per node ({len(topos)}), got {num_cpus!r}")
        else:
            cpus = list(num_cpus)
        self.num_cpus = cpus[0]
        self.object_store_memory = object_store_memory
        self.env = dict(env or {})
        self.nodes: list[SimNode] = []
        self._connected = False
        self._cluster = None
        plain = set(plain)
        try:
            args, key, d = self._node_args(topos[0], 0 in plain, extra[0], cpus[0])
            args.update(temp_dir=self.temp_dir, include_dashboard=bool(dashboard))
            if metrics_export_port is not None:
                args["metrics_export_port"] = metrics_export_port
            self._cluster = Cluster(initialize_head=True, head_node_args=args)
            hn = self._cluster.head_node
            self.nodes.append(SimNode(hn.node_id, key, self._records[key].topology if key else topos[0], hn, d))
            for i, t in enumerate(topos[1:], start=1):
                self._add(t, i in plain, extra[i], cpus[i])
            self._cluster.wait_for_nodes()
            if connect:
                self.connect(**ray_init_kwargs)
                for n in self.nodes:  # the agents start side by side
                    self._publish(n, wait=False)
                managed = [n for n in self.nodes if n.managed]
                agent.wait_started([n.node_key for n in managed], [n.agent for n in managed])
        except BaseException:
            self.shutdown()
            raise

    # ----------------------------------------------------------------- nodes
    def _node_args(self, topo: NodeTopology, plain: bool, labels: dict | None = None, num_cpus: int | None = None
                   ) -> tuple[dict, str | None, Path | None]:
        base = {"num_cpus": self.num_cpus if num_cpus is None else num_cpus,
                "object_store_memory": self.object_store_memory}
        if plain:
            topo, preset = given(topo, self.env)
            # what plain Ray counts: the devices, or the MIG instances a preset names by UUID
            num_gpus, res = node_resources(topo, mig_gpus=preset.mig_gpus)
            base.update(num_gpus=num_gpus, env_vars=dict(self.env) or None)
            spec = node_spec(topo)
            if spec is not None and spec.resource != "GPU":  # what Ray's manager would count on that hardware
                base["resources"] = {spec.resource: res.get(spec.resource, 0.0)}
            if labels:
                base["labels"] = dict(labels)
            return base, None, None
        args, record, d = managed_node_args(topo, {**base, "env_vars": self.env}, nic_env=self.nic_env or None,
                                            zero_gpu_tasks=self.zero_gpu_tasks, on_failed_gpu=self.on_failed_gpu,
                                            reclaim_leaks=self.reclaim_leaks,
                                            preset_env=self.env, dynamic_mig=self.dynamic_mig)
        args["labels"].update(labels or {})  # a simulation's place labels may be rayaccel.io/ ones (net levels)
        self._records[record.node_key] = record
        return args, record.node_key, d

    def _add(self, topo: NodeTopology, plain: bool = False, labels: dict | None = None,
             num_cpus: int | None = None) -> SimNode:
        args, key, d = self._node_args(topo, plain, labels, num_cpus)
        handle = self._cluster.add_node(**args)
        node = SimNode(handle.node_id, key, self._records[key].topology if key else topo, handle, d)
        self.nodes.append(node)
        return node

    def _publish(self, node: SimNode, wait: bool = True) -> None:
        if not node.managed:
            return

        kv.publish(self._records.get(node.node_key) or NodeRecord(node.node_key, node.topology, simulated=True))
        node.agent = agent.start(node.node_key, node.node_id, node.directory, raylet_pid=rp.raylet_pid(node.handle),
                                 wait=wait)

    def connect(self, **ray_init_kwargs: Any) -> None:
        """Connect this process to the cluster as its driver (again, after ``ray.shutdown()``), on the head
        node's raylet: a driver exits with its raylet, so it must never sit on a node :meth:`remove_node`
        can take (Ray 2.48 attaches a driver to any raylet of its host: :func:`~rayaccel.ray._ray_private.driver_on_head`).

        Raises:
            ClusterError: Ray is already initialised in this process.
        """
        import ray

        if ray.is_initialized():
            raise ClusterError("Ray is already initialised in this process; call rayaccel.shutdown() first")
        with rp.driver_on_head(self._cluster.address, self.nodes[0].node_id):
            ray.init(address=self._cluster.address, **ray_init_kwargs)
        self._connected = True
        view.reset()

    @property
    def address(self) -> str:
        """The GCS address (``host:port``) to ``ray.init(address=...)`` from another process."""
        return self._cluster.address

    @property
    def node_ids(self) -> list[str]:
        """Ray node ids, head first."""
        return [n.node_id for n in self.nodes]

    def node(self, node_id_or_index: str | int) -> SimNode:
        """The node with that Ray node id (or position).

        Raises:
            ClusterError: no such node.
        """
        if isinstance(node_id_or_index, int):
            if 0 <= node_id_or_index < len(self.nodes):
                return self.nodes[node_id_or_index]
        else:
            for n in self.nodes:
                if n.node_id == node_id_or_index:
                    return n
        raise ClusterError(f"no node {node_id_or_index!r} (nodes: {self.node_ids})")

    def add_node(self, topology: NodeTopology | str, *, plain: bool = False, labels: dict | None = None) -> str:
        """Start one more node with ``topology`` (and extra Ray ``labels``); return its Ray node id once Ray's
        per-node resources (what placement plans with) list it."""
        node = self._add(resolve_topology(topology), plain, _check_labels([labels], 1)[0])
        self._cluster.wait_for_nodes()
        if self._connected:
            self._publish(node)
            self._wait_resources(node.node_id, present=True)
            view.view().invalidate()
        return node.node_id

    def _wait_resources(self, node_id: str, present: bool, timeout_s: float = 30.0) -> None:
        """Wait until Ray's per-node resource view (what placement reads) has ``node_id`` (or no longer has it):
        it follows the node table by a report (seconds on Ray 2.48), and a plan made in between misses the node."""
        import time

        def listed() -> bool:
            if present:  # both views: placement reads what is free, and checks the node's record against its totals
                return node_id in rp.available_resources_per_node() and node_id in rp.total_resources_per_node()
            return node_id in rp.available_resources_per_node()

        deadline = time.monotonic() + timeout_s
        while listed() != present and time.monotonic() < deadline:
            time.sleep(0.05)

    def remove_node(self, node: str | int) -> None:
        """Kill a (non-head) node's raylet and workers, as a node failure would.

        Raises:
            ClusterError: the head node (the driver is attached to it), or no such node.
        """
        n = self.node(node)
        if n is self.nodes[0]:
            raise ClusterError("cannot remove the head node: the driver is connected to it")
        self._cluster.remove_node(n.handle, allow_graceful=False)
        agent.stop(n.agent)  # it would exit by itself once its raylet is gone
        self.nodes.remove(n)
        if self._connected:
            self._wait_resources(n.node_id, present=False)
        if self._connected and n.managed:
            kv.delete(n.node_key)
            view.view().invalidate()
        if n.directory is not None:
            nodedir.remove(n.directory)

    # -------------------------------------------------------------- lifecycle
    def shutdown(self) -> None:
        """Disconnect and stop every node (idempotent)."""
        import ray

        for n in getattr(self, "nodes", ()):
            agent.stop(n.agent)
            n.agent = None
        if self._connected:
            ray.shutdown()
            self._connected = False
        view.reset()
        cluster = getattr(self, "_cluster", None)
        if cluster is not None:
            cluster.shutdown()
            self._cluster = None
        for n in self.nodes:
            if n.directory is not None:
                nodedir.remove(n.directory)
        self.nodes = []
        if self._own_tmp and os.environ.get("RAY_TMPDIR") == self.temp_dir:
            os.environ.pop("RAY_TMPDIR", None)
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "SimulatedCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def managed_node_args(topology: NodeTopology | str, node_args: dict[str, Any] | None = None, *,
                      simulated: bool = True, nic_env: str | Sequence[str] | None = None,
                      zero_gpu_tasks: str | None = None, on_failed_gpu: str | None = None,
                      reclaim_leaks: str | float | None = None, preset_env: dict[str, str] | None = None,
                      dynamic_mig: str | Sequence[int] | None = None) -> tuple[dict[str, Any], NodeRecord, Path]:
    """The keyword arguments that make ``ray.cluster_utils.Cluster.add_node`` start a rayaccel node.

    ``node_args`` are what a caller would give ``Cluster.add_node`` for a plain node (``num_cpus``,
    ``num_gpus``, ``resources``, ``labels``, ``env_vars``, ...): ``num_gpus`` and a visible-devices
    variable in ``env_vars`` (else this process's, as the raylet inherits it; ``preset_env``: read that
    mapping instead) give the node those devices of ``topology`` (:mod:`rayaccel.ray.node.preset`); the caller's ``resources`` and ``labels`` join rayaccel's
    (:func:`rayaccel.ray.driver.init.check_caller_args`); ``env_vars`` gain the node's raylet environment.
    The node's directory (record, table, fail policy) is made here: its record goes to the GCS KV and its
    agent starts once a driver is connected (as :class:`SimulatedCluster` does), and the directory is the
    caller's to remove (:func:`rayaccel.ray.node.nodedir.remove`) when the node is gone.

    Returns:
        ``(args for Cluster.add_node, the node's record, its directory)``.

    Raises:
        ClusterError: a bad topology, preset, count, resource or label (one line), before anything is made.
    """
    args = dict(node_args or {})
    topo = resolve_topology(topology)
    user_res, user_labels = args.pop("resources", None), args.pop("labels", None)
    check_caller_args(user_res, user_labels)
    env = dict(args.pop("env_vars", None) or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ClusterError("env_vars: expected a mapping of strings to strings")
    nic = nic_env_names(nic_env)
    zero = zero_gpu_mode(zero_gpu_tasks)
    policy = failpolicy.failed_gpu_mode(on_failed_gpu)
    after = leakpolicy.reclaim_after(reclaim_leaks)
    topo, preset = given(topo, {**os.environ, **env} if preset_env is None else preset_env, num_gpus=args.pop("num_gpus", None), resources=user_res)
    dyn = dynamic_gpus(dynamic_mig, topo)
    num_gpus, res = node_resources(topo, dyn, mig_gpus=preset.mig_gpus)
    res = with_caller_resources(res, user_res)
    record, d = prepare(topo, simulated=simulated, preset=preset, dynamic_mig=dyn)
    failpolicy.write(d, policy)
    leakpolicy.write(d, after)
    env.update(node_env(topo, record.node_key, d, base={**os.environ, **env}, nic_env=nic or None,
                        zero_gpu_tasks=zero, dynamic_mig=dyn, mig_gpus=record.mig_gpus))
    args.update(num_gpus=num_gpus, resources=res, env_vars=env,
                labels={**node_labels(topo, record.node_key, simulated=simulated), **(user_labels or {})})
    return args, record, d


def _check_labels(labels: Sequence[dict | None] | None, n: int) -> list[dict | None]:
    """One label set (or None) per node; Ray validates the keys and values themselves."""
    if labels is None:
        return [None] * n
    if isinstance(labels, (str, bytes, dict)) or not isinstance(labels, Sequence):
        raise ClusterError(f"labels: expected one mapping (or None) per node, got {type(labels).__name__}")
    if len(labels) > n:
        raise ClusterError(f"labels: {len(labels)} label sets for {n} node(s)")
    out: list[dict | None] = []
    for i, m in enumerate(labels):
        if m is not None and (not isinstance(m, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                                  for k, v in m.items())):
            raise ClusterError(f"labels[{i}]: expected a mapping of strings to strings, got {m!r}"[:200])
        out.append(dict(m) if m else None)
    return out + [None] * (n - len(out))
