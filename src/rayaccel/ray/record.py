"""What a rayaccel node advertises to Ray and publishes about itself: resources, labels, its record.

* resources: ``GPU`` = the node's GPU pool (:func:`rayaccel.placement.pools.gpu_pool`),
  ``mig_<profile>`` per MIG profile, the rest as Ray itself would advertise on that hardware; no
  resource of rayaccel's own (a node given MIG UUIDs: ``GPU`` = those instances, as on plain Ray);
* labels: ``rayaccel.io/...`` (see :mod:`rayaccel.contract`): how rayaccel names and selects its nodes;
* :class:`NodeRecord`: its topology and how it was found (GCS KV and the node directory).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Mapping

from rayaccel.discovery.network import domain_labels
from rayaccel.discovery.rayspec import RaySpec, ray_node_resources, spec_for
from rayaccel.errors import BackendError, TopologyError
from rayaccel.placement.pools import gpu_pool, instance_pool, mig_pools
from rayaccel.topology import NodeTopology
from rayaccel.contract import RECORD_SCHEMA, LABEL_PREFIX, NODE_KEY_LABEL, label_value, load_json, valid_key

log = logging.getLogger(__name__)
GPU = "GPU"
#: The largest record (bytes) a reader accepts from the KV.
MAX_RECORD_BYTES = 16 << 20


def node_spec(topology: NodeTopology) -> RaySpec | None:
    """How the node's accelerators appear to Ray (:func:`rayaccel.discovery.spec_for`), or None for a
    node without devices -- or whose devices no backend declares (they are then GPUs, as before specs)."""
    try:
        return spec_for(topology)
    except BackendError as e:
        log.warning("rayaccel: %s; treating the node's devices as GPUs", e)
        return None


def node_resources(topology: NodeTopology, dynamic_mig: tuple[int, ...] = (), *,
                   mig_gpus: bool = False) -> tuple[int, dict[str, float]]:
    """``(num_gpus, custom resources)`` a node with ``topology`` advertises (see module docstring).

    What Ray itself would advertise on that hardware (:func:`rayaccel.discovery.ray_node_resources`:
    the family's resource counted by unit -- ``neuron_cores`` = devices x cores, ``TPU`` chips --,
    ``accelerator_type:<T>`` by Ray's naming, a TPU host's pod-slice resources), except that the
    ``GPU`` count is the GPU pool (devices in MIG mode and failed ones are not Ray's GPUs here) and
    MIG instances are ``mig_<profile>`` resources. Nothing else: a node is named and selected by its
    ``rayaccel.io/node-key`` label (:func:`node_labels`), not by a resource. A GPU in ``dynamic_mig``
    (``rayaccel start --dynamic-mig``) counts every instance it could hold (:func:`~rayaccel.placement.pools.mig_pools`).

    ``mig_gpus``: the node was given MIG instances by UUID (:attr:`rayaccel.ray.node.preset.Preset.mig_gpus`):
    as on plain Ray, ``GPU`` counts them (:func:`~rayaccel.placement.pools.instance_pool`) and no
    ``mig_<profile>`` resource is advertised (an instance is one ``GPU`` slot, never also a MIG slot).
    """
    spec = node_spec(topology)
    res: dict[str, float] = {}
    ray_res = ray_node_resources(topology, spec)[0] if spec is not None else {}
    if spec is None or spec.resource == GPU:
        if mig_gpus:
            num_gpus = len(instance_pool(topology))
        else:
            num_gpus = len(gpu_pool(topology))
            for r, units in mig_pools(topology, dynamic_mig).items():
                res[r] = float(len(units))
    else:
        num_gpus = 0
    res.update({k: v for k, v in ray_res.items() if k != GPU})
    return num_gpus, res


def node_labels(topology: NodeTopology, node_key: str, *, simulated: bool,
                network: Mapping[str, str] | None = None) -> dict[str, str]:
    """The labels a node with ``topology`` carries (values sanitised to Ray's syntax).

    Besides rayaccel's own: the node's NVLink domain as Ray's ``ray.io/gpu-domain`` (with
    ``rayaccel.io/nvlink-cluster`` / ``nvlink-clique``; none when its GPUs share no domain,
    :func:`rayaccel.discovery.network.domain_labels`) and its place in the network
    (``network``: ``rayaccel.io/net-l1`` ... from :func:`rayaccel.discovery.network.node_levels`).
    """
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
    spec = node_spec(topology)
    if spec is not None:
        labels.update(ray_node_resources(topology, spec)[1])  # ray.io/accelerator-type, TPU pod labels
    labels.update(domain_labels(topology))
    labels.update(network or {})
    return {k: v for k, v in labels.items() if v}


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What a node publishes (GCS KV and its node directory): its topology and how it was found.

    Attributes:
        node_key: the node marker key. topology: the node's topology.
        simulated: True when the hardware is simulated (no real devices behind it).
        host: the host's device indices when the node manages only some of them, else None.
        given_by: what gave the node those devices (``"CUDA_VISIBLE_DEVICES=4,5,6"``, ``"--num-gpus=2"``), or None.
        dynamic_mig: the GPUs the node's agent re-partitions (``rayaccel start --dynamic-mig``; :mod:`rayaccel.ray.node.dynmig`).
        mig_gpus: the node was given MIG instances by UUID: they are its ``GPU`` (:func:`node_resources`).
    """

    node_key: str
    topology: NodeTopology
    simulated: bool
    host: tuple[int, ...] | None = None
    given_by: str | None = None
    dynamic_mig: tuple[int, ...] = ()
    mig_gpus: bool = False

    def to_json(self) -> str:
        """Serialise (compact JSON)."""
        d = {"schema": RECORD_SCHEMA, "node_key": self.node_key, "simulated": self.simulated,
             "topology": self.topology.to_dict()}
        if self.host is not None:
            d.update(host=list(self.host), given_by=self.given_by)
        if self.dynamic_mig:
            d["dynamic_mig"] = list(self.dynamic_mig)
        if self.mig_gpus:
            d["mig_gpus"] = True
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "record") -> "NodeRecord":
        """Parse and validate :meth:`to_json` output.

        Raises:
            TopologyError: malformed, too large, too deeply nested, or a bad node key (names ``where``).
        """
        data = load_json(text, what="rayaccel node record", max_bytes=MAX_RECORD_BYTES, error=TopologyError,
                         where=where, schema=RECORD_SCHEMA, schema_optional=True)
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
        host, given_by = data.get("host"), data.get("given_by")
        if host is not None and (not isinstance(host, list) or len(host) > 4096
                                 or not all(isinstance(i, int) and not isinstance(i, bool) for i in host)):
            raise TopologyError("rayaccel node record: host must be a list of device indices", where)
        if given_by is not None and (not isinstance(given_by, str) or len(given_by) > 4096):
            raise TopologyError("rayaccel node record: given_by must be text", where)
        dyn = data.get("dynamic_mig") or []
        if not isinstance(dyn, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i in topo.indices
                                                for i in dyn):
            raise TopologyError("rayaccel node record: dynamic_mig must list devices of its topology", where)
        mig_gpus = data.get("mig_gpus", False)
        if not isinstance(mig_gpus, bool):
            raise TopologyError("rayaccel node record: mig_gpus must be true or false", where)
        return cls(node_key=key, simulated=data["simulated"], topology=topo,
                   host=tuple(host) if host is not None else None, given_by=given_by, dynamic_mig=tuple(dyn),
                   mig_gpus=mig_gpus)

    def mismatch(self, total: Mapping[str, float]) -> str | None:
        """Why this record does not describe a node advertising ``total`` resources, or None.

        A node's record must match what its raylet advertises: the GPU pool size, each
        MIG-profile count and its accelerator family's unit count.
        """
        num_gpus, res = node_resources(self.topology, self.dynamic_mig, mig_gpus=self.mig_gpus)
        have = float(total.get("GPU", 0.0))
        if abs(have - num_gpus) > 1e-6:
            return f"record lists {num_gpus} GPU(s) but the node advertises {have:g}"
        for r, v in res.items():
            if abs(float(total.get(r, 0.0)) - v) > 1e-6:
                return f"record lists {r}={v:g} but the node advertises {float(total.get(r, 0.0)):g}"
        return None
