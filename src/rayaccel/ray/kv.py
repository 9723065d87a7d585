"""Publication of node topologies in Ray's GCS key-value store.

Scheme: every managed node carries a node-unique marker resource
``rayaccel_node_<key>`` (and the label ``rayaccel.io/node-key=<key>``). Its
:class:`~rayaccel.ray.resources.NodeRecord` (topology + simulated flag) is stored
under ``topology/<key>`` in namespace ``"rayaccel"``. Whoever starts the node
writes the record right after the node joins (``rayaccel start`` connects a
short-lived driver; :func:`rayaccel.init` and ``SimulatedCluster`` write it from
their own driver). Readers map Ray node ids to keys through the marker resource,
which comes with the per-node resource table they read anyway, so finding a
node's topology costs no extra call once its record is cached.
"""

from __future__ import annotations

from ..errors import ClusterError
from .resources import NAMESPACE, NodeRecord, kv_key


def _kv():
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():
        raise ClusterError("not connected to Ray: call rayaccel.init() (or ray.init()) first")
    return internal_kv


def publish(record: NodeRecord) -> None:
    """Write ``record`` (overwrites an older record of the same node key).

    Raises:
        ClusterError: not connected to Ray.
    """
    _kv()._internal_kv_put(kv_key(record.node_key), record.to_json(), overwrite=True, namespace=NAMESPACE)


def fetch_record(node_key: str) -> NodeRecord:
    """The record published for ``node_key``.

    Raises:
        ClusterError: not connected, or no record for that key (the node was started
            with plain ``ray start``, or its publication failed).
    """
    raw = _kv()._internal_kv_get(kv_key(node_key), namespace=NAMESPACE)
    if raw is None:
        raise ClusterError(f"no rayaccel topology published for node key {node_key!r} "
                           f"(start the node with `rayaccel start` or rayaccel.init())")
    return NodeRecord.from_json(raw)


def delete(node_key: str) -> None:
    """Remove the record of ``node_key`` (idempotent)."""
    _kv()._internal_kv_del(kv_key(node_key), namespace=NAMESPACE)


def published_keys() -> list[str]:
    """Node keys that have a record."""
    keys = _kv()._internal_kv_list("topology/", namespace=NAMESPACE)
    return sorted(k.decode()[len("topology/"):] if isinstance(k, bytes) else k[len("topology/"):] for k in keys)
