"""Names every part of the Ray layer relies on (no ``ray`` import, nothing heavy: the worker hook uses it).

A rayaccel node advertises to Ray (:mod:`.record` computes it):

* ``GPU``: one per device of its GPU pool (devices not in MIG mode and not failed;
  :func:`rayaccel.placement.pools.gpu_pool`). This is Ray's own ledger: any Ray GPU work can use it.
* ``mig_<profile>`` (e.g. ``mig_1g.5gb``): one per MIG instance of that profile, a
  unit-instance resource (each instance gets its own slot id).
* ``rayaccel_node_<key>``: 1.0, a node-unique marker; its key names the node's record
  in Ray's GCS key-value store (namespace ``"rayaccel"``, key ``topology/<key>``) and
  its directory. Gang bundles ask for :data:`NODE_PIN` of it to pin to the node.

Labels (Ray's label syntax: <= 63 chars of ``[A-Za-z0-9._-]``): ``rayaccel.io/node-key``,
``rayaccel.io/accelerator-model``, ``rayaccel.io/vendor``, ``rayaccel.io/devices``,
``rayaccel.io/mig-instances``, ``rayaccel.io/simulated``, ``rayaccel.io/topology``.
"""

from __future__ import annotations

import re
import uuid

NAMESPACE = "rayaccel"
NODE_KEY_PREFIX = "rayaccel_node_"
LABEL_PREFIX = "rayaccel.io/"
NODE_KEY_LABEL = LABEL_PREFIX + "node-key"
#: Fraction of the node marker a gang bundle asks for (pins the bundle to its node).
NODE_PIN = 0.001
#: Name prefix of drain placeholder actors: ``rayaccel-drain-<node key>-<device>``.
DRAIN_PREFIX = "rayaccel-drain-"

_LABEL_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_KEY_OK = re.compile(r"^[0-9a-f]{12}$")

__all__ = ["NAMESPACE", "NODE_KEY_PREFIX", "NODE_PIN", "drain_name", "drain_target", "kv_key", "label_value",
           "new_node_key", "node_resource", "valid_key"]


def node_resource(node_key: str) -> str:
    """``rayaccel_node_<key>``."""
    return f"{NODE_KEY_PREFIX}{node_key}"


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
