"""How a node's topology becomes Ray resources and labels (no ``ray`` import).

Resource naming (the contract every other part relies on):

* ``accel_<i>``            1.0 per device ``i`` (a whole, exclusive device);
* ``accel_<i>_mig<gi>``    1.0 per MIG instance (GPU-instance id ``gi``) of device ``i``;
* ``accel_mem_<i>``        device ``i``'s memory in MiB (whole MiB, rounded down);
* ``rayaccel_node_<key>``  1.0, a node-unique marker: the key under which the node's
  topology is published in Ray's GCS key-value store (namespace ``"rayaccel"``,
  key ``"topology/<key>"``). Gangs ask for 0.001 of it to pin a bundle to a node.

A task that rayaccel places asks for exactly:

* whole devices: ``accel_<i>: 1`` **and** all of ``accel_mem_<i>`` (so no memory
  sharer can be packed next to it) **and** every ``accel_<i>_mig*`` of the device;
* a MIG instance: ``accel_<i>_mig<gi>: 1`` plus the instance's memory from
  ``accel_mem_<i>`` (so the parent cannot be taken whole meanwhile);
* a memory share: ``accel_mem_<i>: <MiB>`` only.

Nodes start with ``num_gpus=0`` so Ray's own ``num_gpus`` cannot hand a managed
device out a second time. Labels (Ray label syntax: <= 63 chars of
``[A-Za-z0-9._-]``) describe the node: ``rayaccel.io/node-key``,
``rayaccel.io/accelerator-model``, ``rayaccel.io/vendor``, ``rayaccel.io/devices``,
``rayaccel.io/mig-instances``, ``rayaccel.io/simulated``. (``ray.io/...`` keys are
reserved by Ray for its own labels; pass ``--labels ray.io/gpu-domain=...`` through
``rayaccel start`` only where Ray accepts it.)
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Mapping

from ..topology import NodeTopology, Partition

MIB = 1 << 20
NAMESPACE = "rayaccel"
NODE_KEY_PREFIX = "rayaccel_node_"
LABEL_PREFIX = "rayaccel.io/"
#: Fraction of the node marker a gang bundle asks for (pins the bundle to its node).
NODE_PIN = 0.001

_LABEL_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def device_resource(index: int) -> str:
    """``accel_<index>``."""
    return f"accel_{index}"


def memory_resource(index: int) -> str:
    """``accel_mem_<index>`` (MiB)."""
    return f"accel_mem_{index}"


def mig_resource(partition: Partition) -> str:
    """``accel_<parent>_mig<gi>`` (falls back to a sanitised UUID when gi is unknown)."""
    if partition.gi_id is not None:
        return f"accel_{partition.parent}_mig{partition.gi_id}"
    tail = _LABEL_BAD.sub("_", partition.uuid or partition.profile).replace("-", "_").replace(".", "_")
    return f"accel_{partition.parent}_mig_{tail}"


def node_resource(node_key: str) -> str:
    """``rayaccel_node_<key>``."""
    return f"{NODE_KEY_PREFIX}{node_key}"


def kv_key(node_key: str) -> str:
    """GCS KV key of a node's topology record (namespace :data:`NAMESPACE`)."""
    return f"topology/{node_key}"


def new_node_key() -> str:
    """A fresh node key (12 hex chars)."""
    return uuid.uuid4().hex[:12]


def memory_mib(memory_bytes: int | None) -> int:
    """Whole MiB of ``memory_bytes`` (0 when unknown)."""
    return 0 if not memory_bytes else int(memory_bytes // MIB)


def label_value(text: str | None) -> str:
    """Sanitise ``text`` into a valid Ray label value (<= 63 chars, alnum at both ends)."""
    if not text:
        return ""
    v = _LABEL_BAD.sub("-", text).strip("-._")[:63].strip("-._")
    return v


def node_resources(topology: NodeTopology, node_key: str) -> dict[str, float]:
    """The custom resources a node with ``topology`` advertises (see module docstring)."""
    res: dict[str, float] = {node_resource(node_key): 1.0}
    for d in topology.devices:
        if d.health == "failed":
            continue
        res[device_resource(d.index)] = 1.0
        mib = memory_mib(d.memory_bytes)
        if mib:
            res[memory_resource(d.index)] = float(mib)
        for p in d.partitions:
            res[mig_resource(p)] = 1.0
    return res


def node_labels(topology: NodeTopology, node_key: str, *, simulated: bool) -> dict[str, str]:
    """The labels a node with ``topology`` carries (values sanitised to Ray's syntax)."""
    models = sorted({d.model for d in topology.devices if d.model})
    vendors = sorted({d.vendor for d in topology.devices})
    labels = {
        LABEL_PREFIX + "node-key": node_key,
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
    """What a node publishes in the GCS KV: its topology and how it was found.

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
    def from_json(cls, text: str | bytes) -> "NodeRecord":
        """Parse :meth:`to_json` output.

        Raises:
            TopologyError: the record or its topology is malformed.
        """
        from ..errors import TopologyError

        try:
            data = json.loads(text)
            return cls(node_key=str(data["node_key"]), simulated=bool(data["simulated"]),
                       topology=NodeTopology.from_dict(data["topology"]))
        except (ValueError, KeyError, TypeError) as e:
            raise TopologyError(f"bad rayaccel node record: {e}", "kv") from None


def allocation_resources(topology: NodeTopology, devices: tuple[int, ...] | list[int],
                         partitions: tuple[Partition, ...] | list[Partition] = (),
                         shared_memory: Mapping[int, int] | None = None) -> dict[str, float]:
    """The Ray resources a task placed on ``devices`` / ``partitions`` / memory shares asks for.

    Args:
        topology: the node's topology.
        devices: whole devices held exclusively.
        partitions: MIG instances held.
        shared_memory: device -> bytes reserved by a memory-sharing task (not exclusive).
    """
    res: dict[str, float] = {}
    for i in devices:
        d = topology.device(i)
        res[device_resource(i)] = 1.0
        mib = memory_mib(d.memory_bytes)
        if mib:
            res[memory_resource(i)] = float(mib)
        for p in d.partitions:
            res[mig_resource(p)] = 1.0
    for p in partitions:
        res[mig_resource(p)] = 1.0
        mib = memory_mib(p.memory_bytes)
        if mib:
            res[memory_resource(p.parent)] = res.get(memory_resource(p.parent), 0.0) + float(mib)
    for i, nbytes in (shared_memory or {}).items():
        # Round up: a share never gets less than it asked for.
        mib = max(1, -(-int(nbytes) // MIB))
        res[memory_resource(i)] = res.get(memory_resource(i), 0.0) + float(mib)
    return res
