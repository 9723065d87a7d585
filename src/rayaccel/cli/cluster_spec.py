"""A cluster described in a file, for ``rayaccel plan --cluster`` (offline: no Ray).

JSON (``rayaccel.cluster/1``)::

    {"schema": "rayaccel.cluster/1",
     "nodes": [
       {"name": "a", "topology": "gb200-nvl4", "count": 18, "domain": "rack-a", "clique": "1",
        "levels": {"block": "b0", "spine": "s0"}},
       {"name": "b", "topology": "gb200-nvl4", "count": 18, "domain": "rack-b",
        "levels": {"block": "b1", "spine": "s0"}, "busy": "0-3"}
     ]}

Each entry is ``count`` nodes (default 1) named ``<name><i>`` (``<name>`` alone when
``count`` is 1; default name ``node<entry>``) with the same topology (a catalog name, or a
topology / capture file, relative to the spec's folder), NVLink domain (the value of
``ray.io/gpu-domain``), clique, network ``levels`` (``rayaccel.io/net-<level>`` labels),
optional ``network_gbps`` / ``fabric_gbps`` and ``busy`` devices (``"0-3"``, ``[0, 1]`` or
``"all"``) on each of them. Anything else is an error naming the file and the field.

Each command imports what it needs inside itself, so ``rayaccel --help`` and the offline
commands never load Ray, matplotlib or the placer they do not use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import RayaccelError, RequestError, TopologyError
from ..placement import NodeState
from ..placement.domains import NodePlace
from ..topology import NodeTopology
from ._common import parse_index_list

SCHEMA = "rayaccel.cluster/1"
#: Most nodes a spec may describe, and the largest spec file, bytes.
MAX_NODES = 10_000
MAX_SPEC_BYTES = 4 << 20
_ENTRY_KEYS = {"name", "topology", "count", "domain", "clique", "levels", "busy", "network_gbps", "fabric_gbps"}


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The nodes of a spec file: states (busy devices applied), places, cliques (None: unknown), in order."""

    nodes: tuple[NodeState, ...]
    places: tuple[NodePlace, ...]
    cliques: tuple[str | None, ...]
    warnings: tuple[str, ...] = ()


def load_cluster_spec(path: str | Path) -> ClusterSpec:
    """Read a cluster spec file (see module docstring).

    Raises:
        TopologyError: unreadable, not JSON, a bad field (the message names the file and the field),
            or a topology that does not load (catalog name, topology file or capture).
    """
    from ..discovery.load import load_topology_with_warnings

    p = Path(path)
    where = str(p)
    try:
        if p.stat().st_size > MAX_SPEC_BYTES:
            raise TopologyError(f"{p.stat().st_size} bytes (at most {MAX_SPEC_BYTES})", where)
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TopologyError(f"cannot read the cluster spec ({e.strerror or e})", where) from None
    except UnicodeDecodeError:
        raise TopologyError("not UTF-8 text (expected a rayaccel.cluster/1 JSON file)", where) from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise TopologyError("nested too deeply to be a cluster spec", where) from None
    except ValueError as e:
        raise TopologyError(f"not JSON: {e}", where) from None
    if not isinstance(data, dict):
        raise TopologyError(f"expected a JSON object with \"nodes\", got {type(data).__name__}", where)
    if data.get("schema", SCHEMA) != SCHEMA:
        raise TopologyError(f"schema {str(data.get('schema'))[:80]!r} is not {SCHEMA!r}", f"{where}: schema")
    extra = sorted(set(data) - {"schema", "nodes"})
    if extra:
        raise TopologyError(f"unknown key {extra[0][:60]!r} (expected schema, nodes)", where)
    entries = data.get("nodes")
    if not isinstance(entries, list) or not entries:
        raise TopologyError("expected a non-empty list of node entries", f"{where}: nodes")
    topos: dict[str, NodeTopology] = {}
    states: list[NodeState] = []
    places: list[NodePlace] = []
    cliques: list[str | None] = []
    warnings: list[str] = []
    names: set[str] = set()
    for e, entry in enumerate(entries):
        field = f"{where}: nodes[{e}]"
        if not isinstance(entry, dict):
            raise TopologyError(f"expected an object, got {type(entry).__name__}", field)
        bad = sorted(set(entry) - _ENTRY_KEYS)
        if bad:
            raise TopologyError(f"unknown key {bad[0][:60]!r} (expected {', '.join(sorted(_ENTRY_KEYS))})", field)
        count = entry.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_NODES:
            raise TopologyError(f"expected an int from 1 to {MAX_NODES}, got {str(count)[:40]}", f"{field}.count")
        if len(states) + count > MAX_NODES:
            raise TopologyError(f"more than {MAX_NODES} nodes", f"{where}: nodes")
        src = entry.get("topology")
        if not isinstance(src, str) or not src.strip():
            raise TopologyError("expected a catalog name or a topology / capture file", f"{field}.topology")
        if src not in topos:
            local = p.parent / src
            try:
                topo, warn = load_topology_with_warnings(str(local) if local.is_file() else src)
            except RayaccelError as err:
                raise TopologyError(str(err), f"{field}.topology") from None
            topos[src] = topo
            warnings.extend(warn)
        topo = topos[src]
        name = entry.get("name", f"node{e}")
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise TopologyError("expected a non-empty name of at most 200 characters", f"{field}.name")
        clique = entry.get("clique")
        if clique is not None and (isinstance(clique, bool) or not isinstance(clique, (str, int))):
            raise TopologyError(f"expected a string or an int, got {type(clique).__name__}", f"{field}.clique")
        levels = entry.get("levels", {})
        if not isinstance(levels, dict):
            raise TopologyError(f"expected an object of level name -> value, got {type(levels).__name__}",
                                f"{field}.levels")
        try:
            place = NodePlace(entry.get("domain"), levels, entry.get("network_gbps"), entry.get("fabric_gbps"))
        except RequestError as err:
            raise TopologyError(str(err), field) from None
        busy_raw = entry.get("busy")
        try:
            if busy_raw is None:
                busy = set()
            elif busy_raw == "all":
                busy = set(topo.indices)
            elif isinstance(busy_raw, str):
                busy = parse_index_list(busy_raw, "busy", known=topo.indices)
            elif isinstance(busy_raw, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in busy_raw):
                busy = set(busy_raw)
                if busy - set(topo.indices):
                    raise RequestError(f"no device {min(busy - set(topo.indices))} on {topo.name or src}", "busy")
            else:
                raise RequestError(f"expected \"0-3\", [0, 1] or \"all\", got {str(busy_raw)[:40]}", "busy")
        except RequestError as err:
            raise TopologyError(str(err), field) from None
        for i in range(count):
            node = name if count == 1 else f"{name}{i}"
            if node in names:
                raise TopologyError(f"node name {node[:80]!r} used twice", f"{field}.name")
            names.add(node)
            states.append(NodeState(topo, busy=frozenset(busy), node_id=node))
            places.append(place)
            cliques.append(None if clique is None else str(clique))
    return ClusterSpec(tuple(states), tuple(places), tuple(cliques), tuple(warnings))


def domain_rows(spec: ClusterSpec) -> list[dict]:
    """One row per NVLink domain (and one for nodes without one), in order of first appearance:
    ``domain``, ``cliques``, ``nodes``, ``free_gpus``, ``gpus``, ``levels`` (name -> sorted values)."""
    rows: dict[str | None, dict] = {}
    for st, pl, cq in zip(spec.nodes, spec.places, spec.cliques):
        r = rows.setdefault(pl.domain, {"domain": pl.domain, "cliques": [], "nodes": 0, "free_gpus": 0,
                                        "gpus": 0, "levels": {}})
        r["nodes"] += 1
        r["gpus"] += len(st.topology.devices)
        r["free_gpus"] += len(st.topology.devices) - len(st.taken())
        if cq is not None and cq not in r["cliques"]:
            r["cliques"].append(cq)
        for k, v in pl.levels:
            vals = r["levels"].setdefault(k, [])
            if v not in vals:
                vals.append(v)
    return list(rows.values())
