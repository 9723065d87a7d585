"""rayaccel's keys in Ray's GCS key-value store (namespace ``"rayaccel"``).

* ``topology/<key>``: a node's :class:`~.record.NodeRecord`, written by whoever starts
  the node (:func:`publish`).
* ``state/<key>``: the node agent's latest :class:`~rayaccel.arbiter.state.Snapshot` (free
  and held devices, drains, health), rewritten about once a second (:mod:`.agent`).

Everything read back is validated before use: a record that does not parse, is
too large or too deeply nested, or does not match what its node advertises to
Ray, makes that one node unusable for rayaccel (named in ``status`` and
``doctor``) and never breaks the others.
"""

from __future__ import annotations

from rayaccel.arbiter.state import Snapshot, decode_snapshot, encode_snapshot
from rayaccel.errors import ClusterError
from rayaccel.ray import _ray_private as rp
from rayaccel.contract import AGENT_PREFIX, NAMESPACE, kv_key
from rayaccel.ray.record import NodeRecord

STATE_PREFIX = "state/"


def _check() -> None:
    if rp.kv() is None:
        raise ClusterError("not connected to Ray: call rayaccel.init() (or ray.init()) first")


def publish(record: NodeRecord) -> None:
    """Write ``record`` (overwrites an older record of the same node key).

    Raises:
        ClusterError: not connected to Ray.
    """
    _check()
    rp.kv_put(kv_key(record.node_key), record.to_json(), NAMESPACE)


def fetch_record(node_key: str) -> NodeRecord:
    """The record published for ``node_key``.

    Raises:
        ClusterError: not connected, or no record for that key.
        TopologyError: the record is malformed (names the node key).
    """
    _check()
    raw = rp.kv_get(kv_key(node_key), NAMESPACE)
    if raw is None:
        raise ClusterError(f"no rayaccel topology published for node key {node_key!r} "
                           f"(start the node with `rayaccel start` or rayaccel.init())")
    return NodeRecord.from_json(raw, where=f"node {node_key}")


def delete(node_key: str) -> None:
    """Remove the record and state of ``node_key`` (idempotent)."""
    _check()
    rp.kv_del(kv_key(node_key), NAMESPACE)
    rp.kv_del(STATE_PREFIX + node_key, NAMESPACE)
    rp.kv_del(AGENT_PREFIX + node_key, NAMESPACE)


def publish_state(node_key: str, snapshot: Snapshot) -> None:
    """Write a node agent's snapshot."""
    rp.kv_put(STATE_PREFIX + node_key, encode_snapshot(snapshot), NAMESPACE)


def parse_state(raw: bytes | None, node_key: str) -> Snapshot | None:
    """A published snapshot, validated field by field (None when absent).

    Raises:
        StateError: malformed (names the node key and the field).
    """
    if raw is None:
        return None
    return decode_snapshot(raw, f"node {node_key}")


def fetch_states(node_keys: list[str]) -> dict[str, bytes]:
    """Raw snapshots of ``node_keys`` (one GCS request)."""
    if not node_keys:
        return {}
    got = rp.kv_multi_get([STATE_PREFIX + k for k in node_keys], NAMESPACE)
    return {k[len(STATE_PREFIX):]: v for k, v in got.items()}
