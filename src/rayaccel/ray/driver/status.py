"""What runs where: the data behind ``rayaccel status`` (and ``top``, ``doctor``, the metrics).

Each rayaccel node's agent reports its :class:`~rayaccel.arbiter.state.Snapshot`: which
devices are free, who holds which (pid, task or actor name, job, since when), memory
shares, MIG instances, drains with their reason, GPU slots held by workers without
the hook. Nodes whose agent does not answer fall back to the last published
snapshot; nodes whose record is bad, and plain Ray nodes, are listed as such.
"""

from __future__ import annotations

import time
from typing import Any

from rayaccel.arbiter.state import Snapshot, device_state
from rayaccel.placement.pools import gpu_pool
from rayaccel.ray.node import agent
from rayaccel.ray.record import node_spec
from rayaccel.ray.driver.view import view

#: How long ``status`` waits for each node agent, seconds.
AGENT_TIMEOUT_S = 5.0


def cluster_status(timeout_s: float = AGENT_TIMEOUT_S) -> dict[str, Any]:
    """The cluster's state: ``{"nodes": [...], "bad": [...], "unmanaged": [...]}``.

    Each node: ``node_id``, ``node_key``, ``name``, ``hostname``, ``simulated``,
    ``free``, ``devices`` (index, model, memory_bytes, state: free / busy / shared /
    mig / drained / failed -- :func:`rayaccel.arbiter.state.device_state`, holders, drain),
    ``holders``, ``unhooked_slots``, ``age_s`` (of the snapshot), ``agent`` (answered /
    published / missing), ``resource`` / ``unit`` (the node's Ray accelerator resource and what one
    slot of it is: ``GPU`` / device, ``neuron_cores`` / core, ``TPU`` / chip, ...), ``lock`` (a node lock held for seconds: pid, what, held_s; or None), ``labels`` (the node's Ray labels:
    ``ray.io/gpu-domain``, network levels), ``usage`` (per-holder usage, one row per holder and device: ``pid``,
    ``device``, ``partition``, ``kind``, ``holder``, ``id``, ``job``, ``actor_class``, ``actor_name``,
    ``task_function``, ``used_bytes``, ``utilization`` (percent), ``spilled_bytes`` (None: unknown), ``source``
    (``nvml`` / ``reported``), ``pids``; None when the agent did not answer -- :mod:`rayaccel.ray.node.usage`),
    ``leaks`` (leaked device processes, :mod:`rayaccel.ray.node.leaks`: ``device``, ``pid``, ``command``, ``holder``
    (the holder it came from), ``since`` / ``age_s``, ``ours`` (``rayaccel reclaim`` may end it) / ``why`` not,
    ``evidence``, ``used_bytes``, ``fenced``; None when the node has no leak watcher), ``leak_events`` (the
    watcher's fences, lifts and reclaims), ``reclaim_leaks_after_s`` (None: never by itself), ``dynamic_mig``
    (None on a node without ``--dynamic-mig``; else ``gpus``, ``instances`` (unit -> MIG UUID), ``held`` (units
    without an instance Ray's ledger holds, per resource), ``demand``, ``events`` (each create / destroy: ``at``,
    ``action``, ``gpu``, ``profile``, ``start``, ``uuid``, ``why``, ``ok``, ``error``), ``error``:
    :mod:`rayaccel.ray.node.dynmig`).

    Raises:
        ClusterError: not connected to Ray.
    """
    v = view()
    nodes = v.nodes(fresh=True)
    handles = {n.node_key: agent.handle(n.node_key) for n in nodes}
    answers = agent.ask_all({k: h for k, h in handles.items() if h is not None}, "snapshot", timeout_s=timeout_s)
    snaps: dict[str, Snapshot] = {}
    source: dict[str, str] = {}
    for k, a in answers.items():
        if not isinstance(a, Exception):
            snaps[k] = a
            source[k] = "answered"
    usage = agent.ask_all({k: h for k, h in handles.items() if k in snaps}, "usage", timeout_s=timeout_s)
    out = []
    now = time.time()
    for n in nodes:
        snap = snaps.get(n.node_key)
        if snap is None and n.state is not None:
            snap, source[n.node_key] = n.state, "published"
        rows = usage.get(n.node_key)
        out.append(_node_row(n, snap, source.get(n.node_key, "missing"), now,
                             rows if isinstance(rows, list) else None))
    bad = [{"node_key": k, "node_id": nid, "why": why} for k, (why, nid, _) in sorted(v.bad.items())]
    return {"nodes": out, "bad": bad, "unmanaged": list(v.unmanaged)}


def _node_row(n: Any, snap: Snapshot | None, source: str, now: float, usage: list | None = None) -> dict:
    topo = n.topology
    pool = frozenset(gpu_pool(topo))
    # a dynamic-MIG GPU is partitioned even while it holds no instance (its instances are made for waiting work)
    partitioned = frozenset(d.index for d in topo.devices if d.partitions) | frozenset(n.record.dynamic_mig)
    holders = [_holder_row(h) for h in (snap.holders if snap is not None else ())]
    by_dev: dict[int, list[str]] = {}
    for h in holders:
        if h["waiting"]:
            continue
        label = f"{h['name'] or h['kind']} (pid {h['pid']})"
        if h["drain"] is not None:
            label = f"drain placeholder (pid {h['pid']})"
        parents = {str(k).split(":")[0] for k in h["partitions"]}
        for d in h["devices"]:
            if str(d) not in parents:  # a node given MIG UUIDs: its GPUs' devices are named with the instance below
                by_dev.setdefault(d, []).append(label)
        for k in h["partitions"]:
            try:
                by_dev.setdefault(int(str(k).split(":")[0]), []).append(f"{label} [MIG {k}]")
            except ValueError:
                continue
    health = dict(snap.health) if snap is not None else {}
    worst = health.get("worst", {}) or {}
    mig_held = set(snap.mig_held) if snap is not None else set()
    drained = snap.drained if snap is not None else {}
    shared = snap.shared if snap is not None else {}
    devices = []
    for d in sorted(topo.devices, key=lambda d: d.index):
        drain = drained.get(d.index)
        devices.append({"index": d.index, "model": d.model, "memory_bytes": d.memory_bytes,
                        "state": device_state(d.index, snap, pool=pool, partitioned=partitioned),
                        "share": shared.get(d.index), "mig_held": sorted(k for k in mig_held if str(k).split(":")[0] == str(d.index)),
                        "holders": by_dev.get(d.index, []), "drain": drain._asdict() if drain is not None else None,
                        "health": worst.get(str(d.index)) or d.health})
    lock = snap.lock._asdict() if snap is not None and snap.lock is not None else None
    lw = dict(snap.leaks) if snap is not None and snap.leaks else None
    leaks = None if lw is None else [dict(r, age_s=round(now - r["since"], 1) if r.get("since") else None)
                                      for r in lw.get("rows", [])]
    spec = node_spec(topo)
    return {"node_id": n.node_id, "node_key": n.node_key, "name": topo.name, "hostname": topo.hostname,
            "simulated": n.record.simulated,
            "host_devices": list(n.record.host) if n.record.host is not None else [d["index"] for d in devices],
            "given_by": n.record.given_by, "free": sum(1 for x in devices if x["state"] == "free"),
            "devices": devices, "holders": holders, "unhooked_slots": snap.unhooked_slots if snap is not None else 0.0,
            "waiting": [h for h in holders if h["waiting"]],
            "age_s": round(now - snap.at, 3) if snap is not None and snap.at else None, "agent": source,
            "gpus_available": n.gpus_available, "health_events": list(health.get("events", []))[-10:],
            "lock": lock, "labels": dict(n.labels), "usage": usage, "leaks": leaks,
            "leak_events": list((lw or {}).get("events", []))[-10:],
            "reclaim_leaks_after_s": (lw or {}).get("reclaim_after_s"),
            "dynamic_mig": dict(snap.dynmig) if snap is not None and snap.dynmig else None,
            "resource": spec.resource if spec is not None else "GPU", "unit": spec.unit if spec is not None else "device"}


def _holder_row(h: Any) -> dict:
    row = h._asdict()
    row["devices"], row["partitions"] = list(h.devices), list(h.partitions)
    return row
