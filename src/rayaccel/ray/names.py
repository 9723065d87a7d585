"""Names every part of the Ray layer relies on (no ``ray`` import).

A rayaccel node advertises to Ray:

* ``GPU``: one per device of its GPU pool (devices not in MIG mode and not failed;
  :func:`.arbiter.gpu_pool`). This is Ray's own ledger: any Ray GPU work can use it.
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

import json
import re
import uuid
from dataclasses import dataclass
from typing import Mapping

from ..errors import TopologyError
from ..topology import NodeTopology
from .arbiter import gpu_pool, mig_pools, mig_resource

NAMESPACE = "rayaccel"
NODE_KEY_PREFIX = "rayaccel_node_"
LABEL_PREFIX = "rayaccel.io/"
NODE_KEY_LABEL = LABEL_PREFIX + "node-key"
#: Fraction of the node marker a gang bundle asks for (pins the bundle to its node).
NODE_PIN = 0.001
#: Name prefix of drain placeholder actors: ``rayaccel-drain-<node key>-<device>``.
DRAIN_PREFIX = "rayaccel-drain-"
#: The largest record (bytes) a reader accepts from the KV.
MAX_RECORD_BYTES = 16 << 20

_LABEL_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_KEY_OK = re.compile(r"^[0-9a-f]{12}$")

__all__ = ["NAMESPACE", "NODE_KEY_PREFIX", "NODE_PIN", "NodeRecord", "drain_name", "drain_target", "kv_key",
           "mig_resource", "new_node_key", "node_labels", "node_resource", "node_resources", "valid_key"]


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


def node_resources(topology: NodeTopology, node_key: str) -> tuple[int, dict[str, float]]:
    """``(num_gpus, custom resources)`` a node with ``topology`` advertises (see module docstring)."""
    res: dict[str, float] = {node_resource(node_key): 1.0}
    for r, units in mig_pools(topology).items():
        res[r] = float(len(units))
    return len(gpu_pool(topology)), res


def node_labels(topology: NodeTopology, node_key: str, *, simulated: bool) -> dict[str, str]:
    """The labels a node with ``topology`` carries (values sanitised to Ray's syntax)."""
    models = sorted({d.model for d in topology.devices if d.model})
    vendors = sorted({d.vendor for d in topology.devices})
    labels = {
        NODE_KEY_LABEL: node_key,
        LABEL_PREFIX + "devices": str(len(topology.devices)),
        LABEL_PREFIX + "mig-instances": str(len(topology.partitions())),
        LABEL_PREFIX + "simulated": "true" if simulated else "false",
    }
    if models:
        labels[LABEL_PREFIX + "accelerator-model"] = label_value(models[0] if len(models) == 1 else "mixed")
    if vendors:
        labels[LABEL_PREFIX + "vendor"] = label_value(vendors[0] if len(vendors) == 1 else "mixed")
    if topology.name:
        labels[LABEL_PREFIX + "topology"] = label_value(topology.name)
    return {k: v for k, v in labels.items() if v}


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What a node publishes (GCS KV and its node directory): its topology and how it was found.

    Attributes:
        node_key: the node marker key. topology: the node's topology.
        simulated: True when the hardware is simulated (no real devices behind it).
    """

    node_key: str
    topology: NodeTopology
    simulated: bool

    def to_json(self) -> str:
        """Serialise (compact JSON)."""
        return json.dumps({"node_key": self.node_key, "simulated": self.simulated,
                           "topology": self.topology.to_dict()}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "record") -> "NodeRecord":
        """Parse and validate :meth:`to_json` output.

        Raises:
            TopologyError: malformed, too large, too deeply nested, or a bad node key (names ``where``).
        """
        if len(text) > MAX_RECORD_BYTES:
            raise TopologyError(f"rayaccel node record is {len(text)} bytes (at most {MAX_RECORD_BYTES})", where)
        try:
            data = json.loads(text)
        except RecursionError:
            raise TopologyError("rayaccel node record is nested too deeply to be a record", where) from None
        except ValueError as e:
            raise TopologyError(f"rayaccel node record is not JSON: {e}", where) from None
        if not isinstance(data, dict):
            raise TopologyError(f"rayaccel node record must be a JSON object, got {type(data).__name__}", where)
        key = data.get("node_key")
        if not valid_key(key):
            raise TopologyError(f"rayaccel node record: bad node_key {key!r} (12 hex chars)", where)
        if not isinstance(data.get("simulated"), bool):
            raise TopologyError("rayaccel node record: simulated must be true or false", where)
        try:
            topo = NodeTopology.from_dict(data.get("topology"))
        except RecursionError:
            raise TopologyError("rayaccel node record: topology nested too deeply", where) from None
        except TopologyError as e:
            raise TopologyError(f"rayaccel node record: {e}", where) from None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise TopologyError(f"rayaccel node record: bad topology: {e}", where) from None
        return cls(node_key=key, simulated=data["simulated"], topology=topo)

    def mismatch(self, total: Mapping[str, float]) -> str | None:
        """Why this record does not describe a node advertising ``total`` resources, or None.

        A node's record must match what its raylet advertises: the GPU pool size,
        each MIG-profile count, and the node marker.
        """
        num_gpus, res = node_resources(self.topology, self.node_key)
        have = float(total.get("GPU", 0.0))
        if abs(have - num_gpus) > 1e-6:
            return f"record lists {num_gpus} GPU(s) but the node advertises {have:g}"
        for r, v in res.items():
            if abs(float(total.get(r, 0.0)) - v) > 1e-6:
                return f"record lists {r}={v:g} but the node advertises {float(total.get(r, 0.0)):g}"
        return None
