"""What runs where: the data behind ``rayaccel status`` (and ``top``, ``doctor``, the metrics).

Each rayaccel node's agent reports its snapshot (:func:`.agent.snapshot_of`): which
devices are free, who holds which (pid, task or actor name, job, since when), memory
shares, MIG instances, drains with their reason, GPU slots held by workers without
the hook. Nodes whose agent does not answer fall back to the last published
snapshot; nodes whose record is bad, and plain Ray nodes, are listed as such.
"""

from __future__ import annotations

import time
from typing import Any

#: How long ``status`` waits for each node agent, seconds.
AGENT_TIMEOUT_S = 5.0


def cluster_status(timeout_s: float = AGENT_TIMEOUT_S) -> dict[str, Any]:
    """The cluster's state: ``{"nodes": [...], "bad": [...], "unmanaged": [...]}``.

    Each node: ``node_id``, ``node_key``, ``name``, ``hostname``, ``simulated``,
    ``free``, ``devices`` (index, model, memory_bytes, state: free / busy / shared /
    mig / drained, holders, drain), ``holders``, ``unhooked_slots``, ``age_s`` (of
    the snapshot), ``agent`` (answered / published / missing), ``labels`` (the node's Ray labels:
    ``ray.io/gpu-domain``, network levels).

    Raises:
        ClusterError: not connected to Ray.
    """
    import ray

    from . import agent
    from .view import view

    v = view()
    nodes = v.nodes(fresh=True)
    handles = {n.node_key: agent.handle(n.node_key) for n in nodes}
    refs = {k: h.snapshot.remote() for k, h in handles.items() if h is not None}
    snaps: dict[str, dict] = {}
    source: dict[str, str] = {}
    if refs:
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        ready_set = set(ready)
        for k, r in refs.items():
            if r in ready_set:
                try:
                    snaps[k] = ray.get(r)
                    source[k] = "answered"
                except ray.exceptions.RayError:
                    pass
    out = []
    now = time.time()
    for n in nodes:
        snap = snaps.get(n.node_key)
        if snap is None and n.state is not None:
            snap, source[n.node_key] = n.state, "published"
        out.append(_node_row(n, snap, source.get(n.node_key, "missing"), now))
    bad = [{"node_key": k, "node_id": nid, "why": why} for k, (why, nid, _) in sorted(v.bad.items())]
    return {"nodes": out, "bad": bad, "unmanaged": list(v.unmanaged)}


def _node_row(n: Any, snap: dict | None, source: str, now: float) -> dict:
    from .arbiter import gpu_pool

    topo = n.topology
    snap = snap or {}
    free = set(snap.get("free", gpu_pool(topo) if not snap else ()))
    drained = snap.get("drained", {})
    holders = snap.get("holders", [])
    shared = snap.get("shared", {})
    mig_held = set(snap.get("mig_held", ()))
    by_dev: dict[int, list[str]] = {}
    for h in holders:
        label = f"{h.get('name') or h.get('kind')} (pid {h.get('pid')})"
        if h.get("waiting"):
            continue
        if h.get("drain") is not None:
            label = f"drain placeholder (pid {h.get('pid')})"
        for d in h.get("devices", ()):
            by_dev.setdefault(d, []).append(label)
        for k in h.get("partitions", ()):
            try:
                by_dev.setdefault(int(str(k).split(":")[0]), []).append(f"{label} [MIG {k}]")
            except ValueError:
                continue
    pool = set(gpu_pool(topo))
    worst = (snap.get("health") or {}).get("worst", {})
    devices = []
    for d in sorted(topo.devices, key=lambda d: d.index):
        held_parts = sorted(p.key for p in d.partitions if p.key in mig_held)
        if str(d.index) in drained:
            state = "drained"
        elif d.index not in pool and not d.partitions:
            state = "failed"
        elif d.partitions:
            state = "mig" if held_parts else "free"
        elif str(d.index) in shared:
            state = "shared"
        elif d.index in free:
            state = "free"
        else:
            state = "busy"
        devices.append({"index": d.index, "model": d.model, "memory_bytes": d.memory_bytes, "state": state,
                        "share": shared.get(str(d.index)), "mig_held": held_parts,
                        "holders": by_dev.get(d.index, []), "drain": drained.get(str(d.index)),
                        "health": worst.get(str(d.index)) or d.health})
    return {"node_id": n.node_id, "node_key": n.node_key, "name": topo.name, "hostname": topo.hostname,
            "simulated": n.record.simulated, "free": sum(1 for x in devices if x["state"] == "free"),
            "devices": devices, "holders": holders, "unhooked_slots": snap.get("unhooked_slots", 0.0),
            "waiting": [h for h in holders if h.get("waiting")],
            "age_s": round(now - snap["at"], 3) if snap.get("at") else None, "agent": source,
            "gpus_available": n.gpus_available, "health_events": (snap.get("health") or {}).get("events", [])[-10:],
            "labels": dict(n.labels)}
