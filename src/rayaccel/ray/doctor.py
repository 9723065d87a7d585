"""``rayaccel doctor``: one row per node and check, ok / warn / fail / n/a, with what to do.

Cluster-wide (from the driver): the Ray and rayaccel versions of every node (and of
this driver) agree; every node runs rayaccel (a node started with plain ``ray
start`` fails); every node's record is usable; the node agents answer; GPU requests
that have waited longer than :data:`PENDING_S` and why no node can meet them.

Per node (run by its agent, on the node): the worker hook is installed in the
node's default worker environment, no GPU slot is held by an unhooked worker (a
``runtime_env`` without rayaccel), and the hardware checks of
:func:`rayaccel.doctor.local_checks` (driver, CUDA, NVML, torch, NCCL, MIG mode,
persistence mode, NVSwitch fabric, peer-to-peer access, GPUDirect RDMA). On a
simulated node every hardware check says so (``n/a``) instead of passing.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

#: GPU requests waiting longer than this are reported, seconds.
PENDING_S = 60.0


@dataclass(frozen=True, slots=True)
class Row:
    """One doctor row: ``node`` ("cluster" for cluster-wide checks), check name, status, detail, fix."""

    node: str
    name: str
    status: str
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def node_facts(agent: Any) -> dict:
    """What a node agent reports for the doctor (runs on the node)."""
    import platform
    import sys

    import ray

    import rayaccel

    from . import _ray_private as rp

    facts: dict[str, Any] = {"node_key": agent.node_key, "ray": ray.__version__, "rayaccel": rayaccel.__version__,
                             "python": platform.python_version(), "hook": "rayaccel.ray.hook" in sys.modules,
                             "patched": rp._PATCHED, "simulated": agent.record.simulated,
                             "unhooked_slots": agent.last.unhooked_slots if agent.last is not None else 0.0,
                             "health_error": agent.health_error,
                             "resets": agent.last.resets if agent.last is not None else 0}
    lock = agent.arbiter.lock_info()
    facts["lock"] = lock._asdict() if lock is not None else None
    try:
        from ..doctor import local_checks

        fake = getattr(agent.watcher, "fake", None)
        kw = {"nvml": fake} if fake is not None and agent.record.simulated else {}
        facts["checks"] = [c.to_dict() for c in local_checks(agent.record.topology,
                                                              simulated=agent.record.simulated, **kw)]
    except Exception as e:  # noqa: BLE001 - reported as one failed row, the other checks still run
        facts["checks"] = [{"name": "hardware checks", "status": "fail", "detail": f"could not run: {e}",
                            "fix": "see the node agent's log"}]
    return facts


def run(timeout_s: float = 15.0) -> list[Row]:
    """All rows for the connected cluster (see module docstring).

    Raises:
        ClusterError: not connected.
    """
    import ray

    import rayaccel

    from . import agent
    from .view import view

    v = view()
    nodes = v.nodes(fresh=True)
    rows: list[Row] = []
    refs = {}
    for n in nodes:
        h = agent.handle(n.node_key)
        if h is None:
            rows.append(Row(n.node_key, "agent", "fail", "the node agent is not running",
                            "restart the node with `rayaccel start`"))
            continue
        refs[n.node_key] = h.call.remote("doctor")
    facts: dict[str, dict] = {}
    if refs:
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        for k, r in refs.items():
            if r in ready:
                try:
                    facts[k] = ray.get(r)
                except ray.exceptions.RayError as e:
                    rows.append(Row(k, "agent", "fail", f"the node agent failed: {str(e).splitlines()[0][:200]}",
                                    "see the agent's log (ray logs)"))
            else:
                rows.append(Row(k, "agent", "fail", f"the node agent did not answer within {timeout_s:.0f} s",
                                "check the node (ray status); restart it with `rayaccel start`"))
    rows += version_rows(facts, ray_driver=ray.__version__, rayaccel_driver=rayaccel.__version__)
    for nid in v.unmanaged:
        rows.append(Row(nid[:12], "rayaccel node", "fail", "this node runs without rayaccel (plain `ray start`): "
                        "its GPUs are handed out by Ray's lowest-index rule and it has no health watcher",
                        "restart it with `rayaccel start` (same flags as `ray start`)"))
    for k, (why, nid, _) in sorted(v.bad.items()):
        rows.append(Row(k, "record", "fail", f"unusable: {why}", "restart the node with `rayaccel start` "
                        "(it publishes a fresh record)"))
    for n in nodes:
        f = facts.get(n.node_key)
        if f is None:
            continue
        rows += _node_rows(n.node_key, f)
    rows += _pending(nodes)
    return rows


def version_rows(facts: dict[str, dict], *, ray_driver: str, rayaccel_driver: str) -> list[Row]:
    """Ray and rayaccel versions of every node (``facts``: node key -> agent facts) and the driver agree."""
    rows = []
    versions_ray = {k: f["ray"] for k, f in facts.items()}
    versions_ra = {k: f["rayaccel"] for k, f in facts.items()}
    versions_ray["driver"], versions_ra["driver"] = ray_driver, rayaccel_driver
    for what, vs in (("ray version", versions_ray), ("rayaccel version", versions_ra)):
        distinct = sorted(set(vs.values()))
        if len(distinct) == 1:
            rows.append(Row("cluster", what, "ok", f"{distinct[0]} on every node and this driver"))
        else:
            by = ", ".join(f"{k}: {v}" for k, v in sorted(vs.items()))
            pkg = what.split()[0]
            rows.append(Row("cluster", what, "fail", f"mixed versions ({by})",
                            f"install the same {pkg} on every node (pip install '{pkg}=={distinct[-1]}') "
                            f"and restart them"))
    return rows


def _node_rows(key: str, f: dict) -> list[Row]:
    rows = []
    if f.get("hook") and f.get("patched"):
        rows.append(Row(key, "worker hook", "ok", "rayaccel's hook runs in the node's default worker environment"))
    else:
        rows.append(Row(key, "worker hook", "fail", "the node's workers do not import rayaccel's hook",
                        "start the node with `rayaccel start` (it sets RAY_preload_python_modules)"))
    if f.get("unhooked_slots"):
        rows.append(Row(key, "worker environments", "warn",
                        f"{f['unhooked_slots']:g} GPU slot(s) held by workers without rayaccel (they see no GPU)",
                        "add rayaccel to that runtime_env (pip: [\"rayaccel\"]) or use the default environment"))
    else:
        rows.append(Row(key, "worker environments", "ok", "every GPU worker runs the hook"))
    lock = f.get("lock")
    if lock:
        rows.append(Row(key, "node lock", "fail",
                        f"held for {lock['held_s']:.1f} s by pid {lock['pid']} ({lock['what'][:120]}): every GPU grant "
                        f"on this node waits", "find out why that process is stuck (py-spy dump --pid "
                        f"{lock['pid']}); killing it frees the lock"))
    else:
        rows.append(Row(key, "node lock", "ok", "the arbiter's lock is free or held only briefly"))
    if f.get("resets"):
        rows.append(Row(key, "arbiter state", "warn", "the arbiter's state file was damaged and rebuilt",
                        "see the node's log; a rebuilt state forgets holders that were running"))
    if f.get("health_error"):
        rows.append(Row(key, "health watcher", "warn", f"not running: {f['health_error']}",
                        "install the vendor library (nvidia-ml-py / amdsmi)"))
    for c in f.get("checks", ()):
        rows.append(Row(key, c["name"], c["status"], c["detail"], c.get("fix")))
    return rows


def _pending(nodes: list) -> list[Row]:
    """GPU requests waiting longer than PENDING_S (tracked by the head's agent), and why."""
    from . import agent

    heads = [n for n in nodes if "node:__internal_head__" in n.total]
    if not heads:
        return []
    h = agent.handle(heads[0].node_key)
    if h is None:
        return []
    import ray

    try:
        demand = ray.get(h.call.remote("gpu_demand"), timeout=10)
    except (ray.exceptions.RayError, TimeoutError):
        return [Row("cluster", "pending GPU requests", "warn", "could not read Ray's pending demand")]
    now = time.time()
    old = [d for d in demand if now - d["since"] > PENDING_S]
    if not old:
        return [Row("cluster", "pending GPU requests", "ok",
                    f"none waiting longer than {PENDING_S:.0f} s ({len(demand)} waiting less)")]
    rows = []
    for d in old:
        why = _why(d["bundle"], nodes)
        rows.append(Row("cluster", "pending GPU requests", "fail" if why.startswith("no node") else "warn",
                        f"{d['count']} x {d['bundle']} waiting {now - d['since']:.0f} s: {why}",
                        "add a node that can run it, or ask for less" if why.startswith("no node")
                        else "it runs when devices free (see `rayaccel status`)"))
    return rows


def _why(bundle: dict, nodes: list) -> str:
    gpus = float(bundle.get("GPU", 0))
    fits = [n for n in nodes if all(float(n.total.get(k, 0)) >= float(v) for k, v in bundle.items())]
    if not fits:
        most = max((float(n.total.get("GPU", 0)) for n in nodes), default=0)
        return f"no node can ever meet it (largest GPU count on a node: {most:g}; asks {gpus:g})"
    return f"{len(fits)} node(s) could run it once devices free"
