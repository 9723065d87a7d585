"""The NVLink-domain part of ``rayaccel doctor`` (no ``ray`` import): a node's domain from its
topology, and the IMEX daemon and channels that cross-node NVLink memory needs.

Multi-node NVLink (a GB200/GB300 NVL72 rack) shares GPU memory across trays through IMEX: the
``nvidia-imex`` daemon on every node of the domain, and in a container the IMEX channel devices
``/dev/nvidia-caps-imex-channels/channel<N>`` (NVIDIA's DRA driver creates both per ComputeDomain).
Without them NCCL cannot use NVLink between trays and falls back to the network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..topology import NodeTopology, nvlink_domain, nvlink_domain_reason
from ._check import Check

#: The daemon's process name (``/proc/<pid>/comm``) and the channel directory under /dev.
IMEX_PROCESS = "nvidia-imex"
IMEX_CHANNELS = "nvidia-caps-imex-channels"
#: Reasons for no domain that are a problem on a fabric system (others just mean "no multi-node NVLink").
_TROUBLE = ("registration", "disagree", "reports no cluster UUID")


def domain_summary(topology: NodeTopology) -> dict[str, Any]:
    """What a node reports about its NVLink domain: ``{"domain", "cluster_uuid", "clique_id", "reason",
    "trouble", "gpus", "states"}`` (``states``: GPU index -> fabric state or None), JSON-ready."""
    d = nvlink_domain(topology)
    reason = nvlink_domain_reason(topology)
    gpus = [x for x in topology.devices if x.vendor == "nvidia"]
    return {"domain": d.name if d else None, "cluster_uuid": d.cluster_uuid if d else None,
            "clique_id": d.clique_id if d else None, "reason": reason,
            "trouble": bool(reason and any(t in reason for t in _TROUBLE)), "gpus": len(gpus),
            "states": {str(x.index): x.fabric.state if x.fabric else None for x in gpus}}


def imex_check(topology: NodeTopology, proc_dir: str | Path = "/proc", dev_dir: str | Path = "/dev") -> Check:
    """``imex``: on a node of a multi-node NVLink domain, the IMEX channels exist and the daemon runs.

    ok: channels present (and the daemon seen, or not visible from here: in a container it runs on
    the host); warn: no channel device; n/a: the node is in no multi-node NVLink domain.
    """
    d = nvlink_domain(topology)
    if d is None:
        return Check("imex", "n/a", f"no multi-node NVLink domain here ({nvlink_domain_reason(topology)})")
    channels = _channels(Path(dev_dir) / IMEX_CHANNELS)
    daemon = _running(Path(proc_dir), IMEX_PROCESS)
    where = f"NVLink domain {d.name}"
    if not channels:
        what = "the nvidia-imex daemon runs but" if daemon else "no nvidia-imex daemon is running and"
        return Check("imex", "warn", f"{where}: {what} /dev/{IMEX_CHANNELS} has no channel: GPU memory cannot be "
                     "shared over NVLink with the other nodes of the domain (NCCL uses the network between them)",
                     "run nvidia-imex on every node of the domain (`sudo systemctl enable --now nvidia-imex`, the "
                     "domain's node addresses in /etc/nvidia-imex/nodes_config.cfg) and create channel 0 "
                     "(NVreg_CreateImexChannel0=1, or `nvidia-modprobe -i 0`); in a container mount "
                     f"/dev/{IMEX_CHANNELS}/channel0 (NVIDIA's DRA driver ComputeDomains do both)")
    names = ", ".join(channels[:4]) + (" ..." if len(channels) > 4 else "")
    seen = "nvidia-imex running" if daemon else "nvidia-imex not visible from here (in a container it runs on the host)"
    return Check("imex", "ok", f"{where}: IMEX channels {names}; {seen}")


def _channels(d: Path) -> list[str]:
    try:
        return sorted(p.name for p in d.iterdir() if p.name.startswith("channel"))
    except OSError:  # absent, or not a directory: no channel
        return []


def _running(proc: Path, name: str) -> bool:
    try:
        entries = list(proc.iterdir())
    except OSError:
        return False
    for e in entries:
        if not e.name.isdigit():
            continue
        try:
            if (e / "comm").read_text().strip() == name:
                return True
        except OSError:  # the process ended, or is not ours to read
            continue
    return False
