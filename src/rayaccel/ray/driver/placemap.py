"""The placement map: what each bundle of a placement group will see, before any task runs in it.

verl, OpenRLHF, SkyRL and slime start a probe actor in every bundle to learn its node and GPU,
then sort ranks by node IP and GPU id (Ray's bundle order is not stable: ray#51117, ray#29811).
On rayaccel the node's arbiter decides a group's devices; :func:`placement_map` asks it to decide
them now (:mod:`rayaccel.ray.node.placemap`: a small task pinned to each node with bundles of
the group reserves the group's set there exactly as its first member would -- the lock is held on
that node, by that node's worker, never by the driver) and returns, per bundle: the node (id, IP,
key), the devices (index, UUID, model, MIG instance), the NICs next to them (what
``get_devices().nics`` names), the NUMA nodes and CPUs, the NVLink domain. The answer is stable for
the group's life: a reservation stays until the group is removed, and members that arrive later get
exactly their bundle's devices (a fractional share of a ``{"GPU": 1}`` bundle included).

:func:`rank_order` turns the map into the bundle order ranks should follow
(:func:`rayaccel.placement.ranks.rank_order`: tensor-parallel groups on the best-linked devices).

Works for any placement group (``ray.util.placement_group``, ``rayaccel.gang``, Train's, vLLM's):
bundles on nodes rayaccel does not manage come back with their node and no devices, saying why.
"""

from __future__ import annotations

import time
from typing import Any

from rayaccel.arbiter.groupmap import (MAP_SCHEMA, NO_GPU, BundlePlacement, DeviceSite, PlacementMap, bundle_placement,
                                       rank_sites)
from rayaccel.arbiter.state import GPU
from rayaccel.errors import ClusterError, RequestError
from rayaccel.placement.domains import NodePlace
from rayaccel.placement.ranks import RankOrder, rank_order as _rank_order
from rayaccel.ray.driver import view as views
from rayaccel.ray.driver.places import place_of
from rayaccel.ray.node.placemap import ANSWER_SCHEMA, reserve_here

#: How long :func:`placement_map` waits for a group to be placed by default, seconds.
READY_TIMEOUT_S = 60.0
#: How long the reservation on one node may take (a fresh worker starts there), seconds.
NODE_TIMEOUT_S = 60.0


def placement_map(pg: Any, timeout_s: float = READY_TIMEOUT_S) -> PlacementMap:
    """What each bundle of ``pg`` will see (module docstring); waits up to ``timeout_s`` for the group to be placed.

    Args:
        pg: a ``PlacementGroup`` (``ray.util.placement_group``, ``rayaccel.gang(...).pg``, ...) or its hex id.
        timeout_s: how long to wait for the group to be placed, seconds.

    Raises:
        ClusterError: not connected to Ray; the group is unknown, removed, or not placed within
            ``timeout_s`` (each naming the group); a node could not answer in time.
    """
    import ray

    pg_hex = _pg_hex(pg)
    if not ray.is_initialized():
        raise ClusterError("not connected to Ray: call rayaccel.init() (or ray.init()) first")
    entry = _wait_created(pg_hex, timeout_s)
    bundles = {int(b): dict(r) for b, r in (entry.get("bundles") or {}).items()}
    where = {int(b): n for b, n in (entry.get("bundles_to_node_id") or {}).items()}
    ips = {n["NodeID"]: n.get("NodeManagerAddress") for n in ray.nodes()}
    managed = {v.node_id: v for v in views.view().nodes(fresh=True)}
    asked: dict[str, dict] = {}
    refs = {}
    for nid in sorted(set(where.values())):
        gpus = {b: float(r.get(GPU, 0.0)) for b, r in bundles.items() if where.get(b) == nid and r.get(GPU)}
        if nid in managed and gpus:
            refs[nid] = _ask(nid, pg_hex, gpus)
    for nid, ref in refs.items():
        try:
            asked[nid] = ray.get(ref, timeout=NODE_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - one node's answer fails: say so for its bundles
            asked[nid] = {"bundles": {}, "why": f"its node did not answer: {type(e).__name__}: {str(e)[:200]}"}
        if asked[nid].get("schema", ANSWER_SCHEMA) != ANSWER_SCHEMA:
            asked[nid] = {"bundles": {}, "why": f"its node answered in format {asked[nid].get('schema')!r}; this "
                                                f"rayaccel reads {ANSWER_SCHEMA!r} (`rayaccel doctor` compares releases)"}
    out = []
    for b in sorted(bundles):
        nid = where.get(b, "")
        out.append(_bundle(b, nid, ips.get(nid), bundles[b], managed.get(nid), asked.get(nid)))
    return PlacementMap(pg_hex, str(entry.get("name") or ""), str(entry.get("strategy") or ""), tuple(out))


def rank_order(pg: Any, group_size: int = 1, timeout_s: float = READY_TIMEOUT_S) -> RankOrder:
    """The bundle order ranks should follow on ``pg``: groups of ``group_size`` consecutive ranks on the best links.

    ``rank_order(pg, group_size=4).order[r]`` is the bundle for rank ``r``; each group of 4 ranks (a
    tensor-parallel group) sits inside one NVLink island, node or NVLink domain as the topology allows,
    with its modeled all-reduce (:func:`rayaccel.placement.ranks.rank_order`). Nodes are ordered by IP.

    Raises:
        ClusterError: as :func:`placement_map`. RequestError: ``group_size`` does not divide the bundles.
    """
    m = placement_map(pg, timeout_s)
    managed = {v.node_id: v for v in views.view().nodes()}
    sites = rank_sites(m)
    topologies = {nid: v.topology for nid, v in managed.items()}
    places: dict[str, NodePlace] = {nid: place_of(v.labels, nid) for nid, v in managed.items()}
    return _rank_order(sites, group_size, topologies, places)


def placement_groups_status(timeout_s: float = 0.0) -> list[dict]:
    """Every placement group Ray knows that is not removed, with its map once it is placed.

    For ``rayaccel status --placement-groups``: each row is ``{"pg_id", "name", "state", "strategy",
    "map"}`` (``map``: :meth:`PlacementMap.to_dict`, or None while the group is pending; ``error``: why a
    map could not be made). Asking for a placed group's map reserves its devices as its first member would
    (idempotent).
    """
    from ray.util import placement_group_table

    rows = []
    for pg_hex, e in sorted(placement_group_table().items()):
        state = e.get("state")
        if state == "REMOVED":
            continue
        row = {"pg_id": pg_hex, "name": e.get("name") or "", "state": state, "strategy": e.get("strategy"),
               "map": None}
        if state == "CREATED":
            try:
                row["map"] = placement_map(pg_hex, timeout_s).to_dict()
            except ClusterError as err:  # removed meanwhile, or a node did not answer
                row["error"] = str(err)
        rows.append(row)
    return rows


def _pg_hex(pg: Any) -> str:
    h = pg if isinstance(pg, str) else getattr(getattr(pg, "id", None), "hex", lambda: None)()
    if not isinstance(h, str) or not h or any(c not in "0123456789abcdef" for c in h.lower()):
        raise RequestError(f"expected a placement group or its hex id, got {type(pg).__name__} {str(pg)[:80]!r}",
                           "pg", "ray.util.placement_group(...) or placement_group.id.hex()")
    return h.lower()


def _wait_created(pg_hex: str, timeout_s: float) -> dict:
    """The group's GCS entry once it is placed; one error naming the group when unknown, removed or too slow."""
    from ray.util import placement_group_table

    deadline = time.monotonic() + max(0.0, float(timeout_s))
    delay = 0.02
    while True:
        entry = placement_group_table().get(pg_hex)
        state = (entry or {}).get("state")
        if not entry:
            raise ClusterError(f"placement group {pg_hex} is unknown to this cluster (a typo, or another cluster's)")
        if state == "REMOVED":
            raise ClusterError(f"placement group {pg_hex} ({entry.get('name') or 'unnamed'}) is removed")
        if state == "CREATED":
            return entry
        if time.monotonic() >= deadline:
            raise ClusterError(f"placement group {pg_hex} ({entry.get('name') or 'unnamed'}) is not placed after "
                               f"{timeout_s:g} s (state {state}): the cluster has no room for its bundles yet; "
                               f"wait longer (timeout_s=) or free resources")
        time.sleep(delay)
        delay = min(0.25, delay * 2)


_ASK: Any = None


def _ask(node_id: str, pg_hex: str, gpus: dict[int, float]) -> Any:
    global _ASK
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if _ASK is None:
        _ASK = ray.remote(num_cpus=0, max_retries=0)(reserve_here)
    return _ASK.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(pg_hex, gpus)


def _bundle(b: int, nid: str, ip: str | None, resources: dict, node: Any, answer: dict | None) -> BundlePlacement:
    base = {"bundle": b, "node_id": nid, "node_ip": ip, "resources": resources}
    if node is None:
        return BundlePlacement(node_key=None, **base, why="its node is not managed by rayaccel: Ray's own GPU ids")
    domain = place_of(node.labels, nid).domain
    if not resources.get(GPU):
        return BundlePlacement(node_key=node.node_key, nvlink_domain=domain, **base, why=NO_GPU)
    got = (answer or {}).get("bundles", {}).get(b) or (answer or {}).get("bundles", {}).get(str(b))
    if not got:
        return BundlePlacement(node_key=node.node_key, nvlink_domain=domain, **base,
                               why=(answer or {}).get("why") or "its node's arbiter reserved nothing for it")
    return bundle_placement(b, nid, ip, node.node_key, resources, node.topology, got, domain)


__all__ = ["MAP_SCHEMA", "BundlePlacement", "DeviceSite", "PlacementMap", "placement_groups_status", "placement_map",
           "rank_order"]
