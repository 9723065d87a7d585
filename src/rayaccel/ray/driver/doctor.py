"""The cluster half of ``rayaccel doctor``: what the driver computes across the nodes.

Cluster-wide: the Ray and rayaccel versions of every node (and of this driver) agree; the Ray
features rayaccel uses that the installed release lacks (:func:`feature_row`, one line); every node
runs rayaccel (a node started with plain ``ray start`` fails); every node's record is usable;
the node agents answer; GPU requests that have waited longer than :data:`PENDING_S` and why no
node can meet them; and the NVLink domains (:func:`domain_rows`): their sizes, a rack's cluster
split into cliques, and trays of one Slurm block naming different cluster UUIDs.

Per node, from what its agent reports (:mod:`.doctor_node`): the worker hook, unhooked workers,
the arbiter's state, the health watcher, the node's NVLink domain (or why none) and the hardware
checks (``n/a`` on a simulated node).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from rayaccel._version import __version__ as _rayaccel_version
from rayaccel.errors import ClusterError

from rayaccel.ray import _ray_private as rp
from rayaccel.ray.node import agent
from rayaccel.ray.driver.view import view

#: GPU requests waiting longer than this are reported, seconds.
PENDING_S = 60.0
#: GPUs of one NVL72 rack: a domain larger than this spans racks.
RACK_GPUS = 72
#: The label naming a node's Slurm block (rayaccel.discovery.network), which NVL72 sites map to racks.
BLOCK_LABEL = "rayaccel.io/net-block"


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


def run(timeout_s: float = 15.0) -> list[Row]:
    """All rows for the connected cluster (see module docstring).

    Raises:
        ClusterError: not connected.
    """
    import ray

    v = view()
    nodes = v.nodes(fresh=True)
    rows: list[Row] = []
    handles = {}
    for n in nodes:
        h = agent.handle(n.node_key)
        if h is None:
            rows.append(Row(n.node_key, "agent", "fail", "the node agent is not running",
                            "restart the node with `rayaccel start`"))
            continue
        handles[n.node_key] = h
    facts: dict[str, dict] = {}
    for k, a in agent.ask_all(handles, "doctor", timeout_s=timeout_s).items():
        if isinstance(a, agent.AgentUnavailable):
            rows.append(Row(k, "agent", "fail", f"the node agent did not answer: {str(a)[:200]}",
                            "check the node (ray status); restart it with `rayaccel start`"))
        elif isinstance(a, Exception):
            rows.append(Row(k, "agent", "fail", f"the node agent failed: {str(a).splitlines()[0][:200]}",
                            "see the agent's log (its node's Ray log directory)"))
        else:
            facts[k] = a
    rows += version_rows(facts, ray_driver=ray.__version__, rayaccel_driver=_rayaccel_version)
    rows.append(feature_row(rp.capabilities(), ray.__version__))
    for nid in v.unmanaged:
        rows.append(Row(nid[:12], "rayaccel node", "fail", "this node runs without rayaccel (plain `ray start`): "
                        "its GPUs are handed out by Ray's lowest-index rule and it has no health watcher",
                        "restart it with `rayaccel start` (same flags as `ray start`)"))
    for k, (why, nid, _) in sorted(v.bad.items()):
        rows.append(Row(k, "record", "fail", f"unusable: {why}", "restart the node with `rayaccel start` "
                        "(it publishes a fresh record)"))
    for n in nodes:
        if n.record.host is not None:
            rows.append(Row(n.node_key, "devices given", "ok", f"manages devices {list(n.topology.indices)} of the "
                            f"host's {list(n.record.host)} ({n.record.given_by})"))
        f = facts.get(n.node_key)
        if f is None:
            continue
        rows += _node_rows(n.node_key, f)
    by_id = {n["NodeID"]: n.get("Labels") or {} for n in ray.nodes()}
    rows += domain_rows(facts, {n.node_key: by_id.get(n.node_id, {}) for n in nodes})
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


def feature_row(carried: Mapping[str, bool], release: str) -> Row:
    """One row: the Ray features rayaccel uses that this Ray ``release`` lacks, each with the release bringing it.

    ``carried``: :func:`rayaccel.ray._ray_private.capabilities` (feature name -> carried).
    """
    missing = [f for f in rp.FEATURES if not carried.get(f.name, False)]
    if not missing:
        return Row("cluster", "ray features", "ok",
                   f"Ray {release} carries every feature rayaccel uses ({', '.join(f.name for f in rp.FEATURES)})")
    need = max(f.since for f in missing)
    return Row("cluster", "ray features", "warn",
               f"Ray {release} lacks " + "; ".join(f"{f.name} (Ray >= {f.since_text}; meanwhile {f.without})"
                                                  for f in missing),
               f"pip install 'ray[serve,train]>={need[0]}.{need[1]},<2.61' on every node and restart them "
               "(docs/compatibility-ray.md)")


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
    if isinstance(f.get("leaks"), Mapping):
        rows.append(leak_row(key, f["leaks"]))
    d = f.get("domain")
    if isinstance(d, Mapping):
        rows.append(_domain_row(key, d))
    for c in f.get("checks", ()):
        rows.append(Row(key, c["name"], c["status"], c["detail"], c.get("fix")))
    return rows


def leak_row(key: str, lk: Mapping[str, Any]) -> Row:
    """The ``leaked processes`` row: the node's leak watcher, and each leaked device process it sees (a warning)."""
    if not lk.get("on"):
        return Row(key, "leaked processes", "warn", "no leak watcher on this node: a worker's child that outlives it "
                   "keeps its device's memory unseen", "restart the node with this rayaccel (`rayaccel start`)")
    after = lk.get("reclaim_after_s")
    how = f"ended by the agent after {after:g} s" if after else "ended by `rayaccel reclaim NODE:DEV`"
    rows = [r for r in lk.get("rows", ()) if isinstance(r, Mapping)]
    if lk.get("error"):
        return Row(key, "leaked processes", "warn", f"the leak watcher failed: {lk['error']}", "see the node agent's log")
    if not rows:
        return Row(key, "leaked processes", "ok", f"leak watcher on: no leaked device processes (leaks are fenced, {how})")
    listed = "; ".join(f"device {r.get('device')}: pid {r.get('pid')} ({str(r.get('command') or '?')[:50]}) from "
                       f"{r.get('holder') or '?'}" + ("" if r.get("ours") else f" [not ours: {r.get('why')}]")
                       for r in rows[:3]) + (f"; +{len(rows) - 3} more" if len(rows) > 3 else "")
    devs = sorted({r.get("device") for r in rows}, key=str)
    return Row(key, "leaked processes", "warn", f"{len(rows)} leaked device process(es), their devices fenced: {listed}",
               "; ".join(f"rayaccel reclaim {key}:{d}" for d in devs) + f" ({how})")


def _domain_row(key: str, d: Mapping[str, Any]) -> Row:
    if d.get("domain"):
        return Row(key, "nvlink domain", "ok", f"{d.get('gpus')} GPU(s) in NVLink domain {d['domain']}")
    if d.get("trouble"):
        return Row(key, "nvlink domain", "warn", f"no NVLink domain: {d.get('reason')}",
                   "check `nvidia-smi -q | grep -A6 Fabric` and the fabric manager (NVLink switch trays: NMX); "
                   "restart the node with `rayaccel start` once the fabric is up so it is rediscovered")
    return Row(key, "nvlink domain", "n/a", f"no multi-node NVLink domain: {d.get('reason')}")


def domain_rows(facts: Mapping[str, Mapping[str, Any]],
                labels: Mapping[str, Mapping[str, str]] | None = None) -> list[Row]:
    """The NVLink domains across nodes (``facts``: node key -> agent facts; ``labels``: node key -> Ray labels).

    One ``nvlink domains`` row listing each domain's nodes and GPUs (warn when a domain holds more
    GPUs than one NVL72 rack, or its nodes show different GPU counts); a ``nvlink cliques`` warning
    for a cluster UUID split into several cliques (NVLink partitions: a gang across them uses the
    network); a ``rack fabric`` failure for nodes of one Slurm block (``rayaccel.io/net-block``)
    whose GPUs name different cluster UUIDs.
    """
    labels = labels or {}
    doms: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for key, f in sorted(facts.items()):
        d = f.get("domain") if isinstance(f, Mapping) else None
        if isinstance(d, Mapping) and d.get("domain"):
            doms.setdefault((str(d["cluster_uuid"]), int(d["clique_id"])), []).append((key, int(d.get("gpus") or 0)))
    if not doms:
        return [Row("cluster", "nvlink domains", "n/a", "no node is in a multi-node NVLink domain")]
    rows = []
    parts, warns = [], []
    for (uuid, clique), members in sorted(doms.items()):
        gpus = sum(g for _, g in members)
        parts.append(f"{uuid}.{clique}: {len(members)} node(s), {gpus} GPU(s)")
        if gpus > RACK_GPUS:
            warns.append(f"{uuid}.{clique} holds {gpus} GPUs, more than one NVL72 rack's {RACK_GPUS}: do trays of "
                         "different racks share a cluster UUID?")
        counts = sorted({g for _, g in members})
        if len(counts) > 1:
            low = [k for k, g in members if g == counts[0]]
            warns.append(f"{uuid}.{clique}: nodes with {' and '.join(map(str, counts))} GPUs "
                         f"({', '.join(low)} with {counts[0]}: a GPU failed or left out?)")
    detail = f"{len(doms)} domain(s): " + "; ".join(parts)
    if warns:
        rows.append(Row("cluster", "nvlink domains", "warn", detail + ". " + "; ".join(warns),
                        "check each tray's `nvidia-smi -q | grep -A6 Fabric` and the NVLink partition configuration "
                        "(NMX / fabric manager)"))
    else:
        rows.append(Row("cluster", "nvlink domains", "ok", detail))
    cliques: dict[str, dict[int, list[str]]] = {}
    for (uuid, clique), members in doms.items():
        cliques.setdefault(uuid, {})[clique] = [k for k, _ in members]
    for uuid, by in sorted(cliques.items()):
        if len(by) > 1:
            split = "; ".join(f"clique {c}: {', '.join(ks)}" for c, ks in sorted(by.items()))
            rows.append(Row("cluster", "nvlink cliques", "warn", f"cluster {uuid} is split into {len(by)} NVLink "
                            f"partitions ({split}): a gang across them talks over the network, not NVLink",
                            "intended when the rack is partitioned; else check the NVLink partitions (NMX)"))
    blocks: dict[str, dict[str, list[str]]] = {}
    for (uuid, _), members in doms.items():
        for key, _ in members:
            block = (labels.get(key) or {}).get(BLOCK_LABEL)
            if block:
                blocks.setdefault(block, {}).setdefault(uuid, []).append(key)
    for block, by in sorted(blocks.items()):
        if len(by) > 1:
            who = "; ".join(f"{u}: {', '.join(sorted(ks))}" for u, ks in sorted(by.items()))
            rows.append(Row("cluster", "rack fabric", "fail", f"the trays of block {block} name {len(by)} different "
                            f"NVLink cluster UUIDs ({who})",
                            "one rack is one NVLink cluster: check the trays' fabric registration and NVLink cabling, "
                            "or the Slurm topology.conf that puts them in one block"))
    return rows


def _pending(nodes: list) -> list[Row]:
    """GPU requests waiting longer than PENDING_S (tracked by the head's agent), and why."""
    heads = [n for n in nodes if "node:__internal_head__" in n.total]
    if not heads:
        return []
    h = agent.handle(heads[0].node_key)
    if h is None:
        return []
    try:
        demand = h.ask("gpu_demand", timeout_s=10)
    except ClusterError:
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
