"""A node's NVLink domain: the (fabric cluster UUID, clique) all of its GPUs share.

A GB200/GB300 NVL72 rack is 18 compute trays (one OS each) whose GPUs NVSwitch trays join
into one NVLink domain; NVML tells each GPU which one (:class:`~rayaccel.topology.model.Fabric`).
NCCL treats two GPUs as multi-node-NVLink peers when both the cluster UUID and the clique id
match (NVIDIA/nccl#1301: "clique ID by itself is not unique"). This module applies the same
rule to a whole node:

* every NVIDIA GPU of the node reports a completed fabric with status success, and
* they all name one cluster UUID that is not all zeros, and one clique id.

Anything else is no domain, with the reason (:func:`nvlink_domain_reason`): no fabric info, a
registration not completed or failed, an all-zero cluster UUID (what a single-node NVSwitch
system such as HGX H100 reports: torchcomms#1385 found zero UUIDs matching across H100 nodes and
routing inter-node traffic over NVLink), or GPUs that disagree. Pure functions over data.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import Device
from .node import NodeTopology

#: The cluster UUID of a GPU in no multi-node NVLink cluster.
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True, slots=True)
class Domain:
    """One NVLink domain (an NVL72 rack, or one NVLink partition of it).

    Attributes:
        cluster_uuid: the fabric cluster's UUID (lower case). clique_id: the clique within it.
    """

    cluster_uuid: str
    clique_id: int

    @property
    def name(self) -> str:
        """``"<cluster UUID>.<clique id>"`` (47 characters at most: a valid Ray label value; the form
        NVIDIA's topograph uses for its ``cluster-id`` annotation)."""
        return f"{self.cluster_uuid}.{self.clique_id}"


def nvlink_domain(topology: NodeTopology) -> Domain | None:
    """The NVLink domain every NVIDIA GPU of ``topology`` belongs to, or None (see the module docstring;
    :func:`nvlink_domain_reason` says why)."""
    return _resolve(topology)[0]


def nvlink_domain_reason(topology: NodeTopology) -> str | None:
    """Why ``topology`` has no NVLink domain, one sentence; None when it has one."""
    return _resolve(topology)[1]


def _resolve(topology: NodeTopology) -> tuple[Domain | None, str | None]:
    gpus = sorted((d for d in topology.devices if d.vendor == "nvidia"), key=lambda d: d.index)
    if not gpus:
        return None, "no NVIDIA GPU on this node"
    missing = [d.index for d in gpus if d.fabric is None]
    if missing:
        return None, (f"{_gpus(missing, len(gpus))} report no NVLink fabric (NVML has none before Hopper, "
                      "without NVSwitch, or it was not discovered)")
    for d in gpus:
        why = _not_usable(d)
        if why:
            return None, f"GPU {d.index}: {why}"
    keys: dict[tuple[str, int], list[int]] = {}
    for d in gpus:
        keys.setdefault((d.fabric.cluster_uuid, d.fabric.clique_id), []).append(d.index)  # type: ignore[union-attr]
    if len(keys) > 1:
        parts = "; ".join(f"GPU {_list(ix)} in {u}.{c}" for (u, c), ix in keys.items())
        return None, f"the GPUs disagree on their NVLink domain ({parts})"
    (uuid, clique), = keys
    if uuid == ZERO_UUID:
        return None, ("the fabric's cluster UUID is all zeros: a single-node NVSwitch fabric (e.g. HGX H100), "
                      "no NVLink domain beyond this node")
    return Domain(uuid, clique), None


def _not_usable(d: Device) -> str | None:
    f = d.fabric
    assert f is not None
    if f.state != "completed":
        return f"fabric registration {f.state.replace('_', ' ')}"
    if f.status:
        return f"fabric registration failed (NVML error {f.status})"
    if f.cluster_uuid is None or f.clique_id is None:
        return "the fabric reports no cluster UUID or clique id"
    return None


def _gpus(ix: list[int], total: int) -> str:
    return "the GPUs" if len(ix) == total and total > 1 else ("GPU " if len(ix) == 1 else "GPUs ") + _list(ix)


def _list(ix: list[int]) -> str:
    return ", ".join(map(str, ix))
