"""rayaccel's keys in Ray's GCS key-value store (namespace ``"rayaccel"``).

* ``topology/<key>``: a node's :class:`~.names.NodeRecord`, written by whoever starts
  the node (:func:`publish`).
* ``state/<key>``: the node agent's latest snapshot (free and held devices, drains,
  health), rewritten about once a second (:mod:`.agent`).

Everything read back is validated before use: a record that does not parse, is
too large or too deeply nested, or does not match what its node advertises to
Ray, makes that one node unusable for rayaccel (named in ``status`` and
``doctor``) and never breaks the others.
"""

from __future__ import annotations

import json

from ..errors import ClusterError, TopologyError
from . import _ray_private as rp
from .names import NAMESPACE, NodeRecord, kv_key

STATE_PREFIX = "state/"
MAX_STATE_BYTES = 4 << 20


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


def publish_state(node_key: str, state: dict) -> None:
    """Write a node agent's snapshot."""
    rp.kv_put(STATE_PREFIX + node_key, json.dumps(state, separators=(",", ":")), NAMESPACE)


def parse_state(raw: bytes | None, node_key: str) -> dict | None:
    """A published snapshot, validated (None when absent).

    Raises:
        TopologyError: malformed (names the node key).
    """
    if raw is None:
        return None
    if len(raw) > MAX_STATE_BYTES:
        raise TopologyError(f"state snapshot is {len(raw)} bytes (at most {MAX_STATE_BYTES})", f"node {node_key}")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise TopologyError("state snapshot nested too deeply", f"node {node_key}") from None
    except ValueError as e:
        raise TopologyError(f"state snapshot is not JSON: {e}", f"node {node_key}") from None
    where = f"node {node_key}"
    if not isinstance(data, dict) or not isinstance(data.get("free"), list) \
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in data["free"]):
        raise TopologyError("state snapshot lacks a list of free device indices", where)
    _check_state(data, where)
    return data


def _check_state(data: dict, where: str) -> None:
    """Every field a reader uses has the type it expects (a damaged or forged snapshot is refused whole)."""
    def bad(field: str, what: str) -> TopologyError:
        return TopologyError(f"state snapshot: {field} must be {what}", where)

    holders = data.get("holders", [])
    if not isinstance(holders, list) or not all(isinstance(h, dict) for h in holders):
        raise bad("holders", "a list of objects")
    for h in holders:
        for key in ("devices", "partitions"):
            v = h.get(key, [])
            if not isinstance(v, list) or not all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in v):
                raise bad(f"holders[].{key}", "a list of device indices / instance keys")
        for key in ("name", "kind", "waiting", "job", "id"):
            if h.get(key) is not None and not isinstance(h[key], str):
                raise bad(f"holders[].{key}", "a string")
        if h.get("pid") is not None and (isinstance(h["pid"], bool) or not isinstance(h["pid"], int)):
            raise bad("holders[].pid", "an int")
    drained = data.get("drained", {})
    if not isinstance(drained, dict) or not all(isinstance(v, dict) for v in drained.values()):
        raise bad("drained", "an object of objects")
    shared = data.get("shared", {})
    if not isinstance(shared, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               for v in shared.values()):
        raise bad("shared", "an object of numbers")
    if not isinstance(data.get("mig_held", []), list) or not all(isinstance(x, str) for x in data.get("mig_held", [])):
        raise bad("mig_held", "a list of strings")
    for key in ("at", "unhooked_slots", "slots_held"):
        v = data.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad(key, "a number")


def fetch_states(node_keys: list[str]) -> dict[str, bytes]:
    """Raw snapshots of ``node_keys`` (one GCS request)."""
    if not node_keys:
        return {}
    got = rp.kv_multi_get([STATE_PREFIX + k for k in node_keys], NAMESPACE)
    return {k[len(STATE_PREFIX):]: v for k, v in got.items()}
