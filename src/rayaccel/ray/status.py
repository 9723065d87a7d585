"""What runs where: the data behind ``rayaccel status``.

Free/busy comes from Ray's available resources (the source of truth); names of
holders come from the registry (:mod:`rayaccel.ray.registry`). A registry entry
whose devices Ray shows free for longer than ``stale_s`` belongs to a worker that
died without retiring it and is dropped.
"""

from __future__ import annotations

import time
from typing import Any

STALE_S = 5.0


def cluster_status(prune: bool = True) -> list[dict[str, Any]]:
    """One dict per managed node: id, name, hostname, simulated, devices with state and holders.

    Device ``state`` is ``"free"``, ``"busy"`` (held whole), ``"mig"`` (some MIG
    instances held) or ``"shared"`` (memory reserved by sharers).

    Raises:
        ClusterError: not connected to Ray.
    """
    from . import context, registry
    from .view import node_state

    context.ensure_connected()
    nodes = context.view().nodes(fresh=True)
    entries = registry.holders()
    now = time.time()
    used_tokens: set[str] = set()
    out = []
    for n in nodes:
        st = node_state(n)
        mine = {t: e for t, e in entries.items() if e.get("node_id") == n.node_id}
        devices = []
        for d in sorted(n.topology.devices, key=lambda d: d.index):
            held_parts = sorted(p.key for p in d.partitions if p.key in st.busy_partitions)
            if d.index in st.busy:
                state = "busy"
            elif held_parts:
                state = "mig"
            elif st.memory_used.get(d.index):
                state = "shared"
            else:
                state = "free"
            names = []
            if state != "free":
                for t, e in mine.items():
                    touches = (d.index in e.get("devices", ())
                               or any(int(k.split(":")[0]) == d.index for k in e.get("partitions", ()))
                               or any(i == d.index for i, _ in e.get("shared_memory", ())))
                    if touches:
                        names.append(f"{e.get('name') or e.get('kind')} (pid {e.get('pid')})")
                        used_tokens.add(t)
            devices.append({
                "index": d.index, "model": d.model, "memory_bytes": d.memory_bytes, "state": state,
                "memory_used_bytes": st.memory_used.get(d.index, 0) if state != "busy" else d.memory_bytes,
                "mig_held": held_parts, "holders": names,
            })
        out.append({"node_id": n.node_id, "node_key": n.node_key, "name": n.topology.name,
                    "hostname": n.topology.hostname, "simulated": n.record.simulated,
                    "free": sum(1 for x in devices if x["state"] == "free"), "devices": devices})
    if prune:
        stale = [t for t, e in entries.items() if t not in used_tokens and now - e.get("since", now) > STALE_S]
        registry.drop(stale)
    return out
