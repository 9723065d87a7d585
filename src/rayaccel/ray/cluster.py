"""``SimulatedCluster``: a multi-node Ray cluster on one machine, one topology per node.

Built on ``ray.cluster_utils.Cluster``: every node is a real raylet advertising
its topology's resources and labels (:mod:`rayaccel.ray.resources`); the driver
this object connects publishes each node's record in the GCS KV. For tests, the
demo and benchmarks::

    with SimulatedCluster(["dgx1-v100", "hgx-h100"]) as c:
        ref = my_task.remote()
        c.remove_node(c.node_ids[1])
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import ClusterError
from ..topology import NodeTopology
from .resources import NodeRecord, new_node_key, node_labels, node_resources


@dataclass
class SimNode:
    """One node of a :class:`SimulatedCluster`."""

    node_id: str
    node_key: str
    topology: NodeTopology
    handle: Any


def resolve_topology(spec: NodeTopology | str) -> NodeTopology:
    """A topology from a value, a catalog name, a topology JSON file or a capture file.

    Raises:
        CatalogError / TopologyError / CaptureError: the name or file cannot be read.
    """
    if isinstance(spec, NodeTopology):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise ClusterError(f"expected a NodeTopology, catalog name or file, got {type(spec).__name__}")
    try:
        from ..discovery import load_topology
    except ImportError:  # discovery.load not present: catalog names and JSON files still work
        from .. import catalog

        if os.path.exists(spec):
            return NodeTopology.load(spec)
        return catalog.load(str(spec))
    return load_topology(spec)


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
        num_cpus: CPUs each node advertises (default 4).
        connect: connect this process as the driver (and publish the records).
        object_store_memory: per node, bytes (default 100 MiB).
        ray_gpus: also advertise Ray's own ``GPU`` resource (one per device). Only for
            benchmarks that compare with plain ``num_gpus`` on the same cluster: a real
            rayaccel node never does this (Ray could then hand a device out twice).
        ray_init_kwargs: passed to ``ray.init`` when connecting.

    Raises:
        ClusterError: no topology given, or Ray already initialised in this process.
    """

    def __init__(self, topologies: Sequence[NodeTopology | str], *, num_cpus: int = 4, connect: bool = True,
                 object_store_memory: int = 100 << 20, ray_gpus: bool = False, **ray_init_kwargs: Any):
        import ray
        from ray.cluster_utils import Cluster

        if not topologies:
            raise ClusterError("SimulatedCluster needs at least one topology (one per node)")
        if connect and ray.is_initialized():
            raise ClusterError("Ray is already initialised in this process; call rayaccel.shutdown() first")
        topos = [resolve_topology(t) for t in topologies]  # bad names fail before anything is made
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self._own_tmp = "RAY_TMPDIR" not in os.environ
        self.temp_dir = ray_tmpdir()
        self.num_cpus = num_cpus
        self.object_store_memory = object_store_memory
        self.ray_gpus = ray_gpus
        self.nodes: list[SimNode] = []
        self._connected = False
        try:
            head = self._node_args(topos[0])
            key = head.pop("_key")
            head.update(temp_dir=self.temp_dir, include_dashboard=False)
            self._cluster = Cluster(initialize_head=True, head_node_args=head)
            hn = self._cluster.head_node
            self.nodes.append(SimNode(node_id=hn.node_id, node_key=key, topology=topos[0], handle=hn))
            for t in topos[1:]:
                self._add(t)
            self._cluster.wait_for_nodes()
            if connect:
                ray.init(address=self._cluster.address, **ray_init_kwargs)
                self._connected = True
                for n in self.nodes:
                    self._publish(n)
        except BaseException:
            self.shutdown()
            raise

    # ----------------------------------------------------------------- nodes
    def _node_args(self, topo: NodeTopology) -> dict:
        key = new_node_key()
        return {"num_cpus": self.num_cpus, "num_gpus": len(topo.devices) if self.ray_gpus else 0, "object_store_memory": self.object_store_memory,
                "resources": node_resources(topo, key), "labels": node_labels(topo, key, simulated=True),
                "_key": key}

    def _add(self, topo: NodeTopology) -> SimNode:
        args = self._node_args(topo)
        key = args.pop("_key")
        handle = self._cluster.add_node(**args)
        node = SimNode(node_id=handle.node_id, node_key=key, topology=topo, handle=handle)
        self.nodes.append(node)
        return node

    @staticmethod
    def _publish(node: SimNode) -> None:
        from . import kv

        kv.publish(NodeRecord(node.node_key, node.topology, simulated=True))

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

    def add_node(self, topology: NodeTopology | str) -> str:
        """Start one more node with ``topology``; return its Ray node id."""
        node = self._add(resolve_topology(topology))
        self._cluster.wait_for_nodes()
        if self._connected:
            self._publish(node)
            from . import context

            context.view().invalidate()
        return node.node_id

    def remove_node(self, node: str | int) -> None:
        """Kill a (non-head) node's raylet and workers, as a node failure would.

        Raises:
            ClusterError: the head node (the driver is attached to it), or no such node.
        """
        n = self.node(node)
        if n is self.nodes[0]:
            raise ClusterError("cannot remove the head node: the driver is connected to it")
        self._cluster.remove_node(n.handle, allow_graceful=False)
        self.nodes.remove(n)
        if self._connected:
            from . import context, kv

            kv.delete(n.node_key)
            context.view().invalidate()

    # -------------------------------------------------------------- lifecycle
    def shutdown(self) -> None:
        """Disconnect and stop every node (idempotent)."""
        import ray

        from . import context

        if self._connected:
            ray.shutdown()
            self._connected = False
        context.reset()
        cluster = getattr(self, "_cluster", None)
        if cluster is not None:
            cluster.shutdown()
            self._cluster = None
        self.nodes = []
        if self._own_tmp and os.environ.get("RAY_TMPDIR") == self.temp_dir:
            os.environ.pop("RAY_TMPDIR", None)
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "SimulatedCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
