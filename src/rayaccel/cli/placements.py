"""Placement maps as Rich tables (data is never markup): ``rayaccel status --placement-groups`` (each live
group's map) and ``rayaccel plan --bundles`` (the map a dry run would give, and its rank order)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text


def placement_group_tables(rows: list[dict]) -> list[Any]:
    """One table per placement group (:func:`rayaccel.ray.driver.placemap.placement_groups_status` rows)."""
    if not rows:
        return [Text("no placement groups")]
    out: list[Any] = []
    for r in rows:
        title = f"placement group {r['pg_id']}"
        if r.get("name"):
            title += f" ({r['name']})"
        title += f": {r.get('strategy') or '?'}, {r.get('state')}"
        m = r.get("map")
        if m is None:
            out.append(Text(title + (f" -- {r['error']}" if r.get("error") else " -- not placed yet")))
            continue
        out.extend(placement_map_view(m, title))
    return out


def placement_map_view(m: dict, title: str, node: bool = True) -> list[Any]:
    """A placement map (:meth:`rayaccel.PlacementMap.to_dict`): a table with one row per bundle -- its devices in
    the order its workers see them, the link class between them, NICs, NUMA nodes, CPUs, NVLink domain -- then
    one line per device (index, model, UUID, MIG instance). ``node=False`` leaves out the node column and the
    node in the device lines (a dry run on one machine)."""
    t = Table(title=Text(title), title_justify="left")
    cols = ["bundle", *(["node"] if node else []), "devices", "link", "NICs", "NUMA", "CPUs", "NVLink domain"]
    for col in cols:
        t.add_column(col, overflow="fold")
    seen: dict[tuple, str] = {}
    for b in m["bundles"]:
        idx = ",".join(str(d["index"]) for d in b["devices"])
        if b.get("visible") and b["visible"] != idx:
            idx += f" (visible {b['visible']})"
        row = [Text(str(b["bundle"]))]
        where = f"{b.get('node_ip') or '?'} {str(b['node_id'])[:8]}"
        if node:
            row.append(Text(where))
        row += [Text(idx or (b.get("why") or "-"), style="" if idx else "dim"),
                Text(b.get("link") or ("one device" if len(b["devices"]) == 1 else "-")),
                Text(",".join(b.get("nics") or []) or "-"),
                Text(",".join(map(str, b.get("numa_nodes") or [])) or "-"), Text(_ranges(b.get("cpus") or [])),
                Text(b.get("nvlink_domain") or "-")]
        t.add_row(*row)
        for d in b["devices"]:
            seen.setdefault((b["node_id"], d["index"]), (f"{where}: " if node else "") + _device(d))
    return [t, *(Text(f"  {line}", style="dim") for line in seen.values())]


def rank_order_table(ro: dict, m: dict) -> Table:
    """A rank order (:meth:`rayaccel.placement.ranks.RankOrder.to_dict`) over map ``m``: one row per group of
    ``group_size`` consecutive ranks, with its bundles, their devices, scope and modeled all-reduce."""
    k = ro["group_size"]
    devices = {b["bundle"]: [d["index"] for d in b["devices"]] for b in m["bundles"]}
    t = Table(title=Text(f"rank order (rank r runs in bundle order[r]): {ro['order']}; groups of {k} rank(s)"),
              title_justify="left")
    for col in ("ranks", "bundles", "devices", "scope", "all-reduce GB/s", "bottleneck"):
        t.add_column(col, overflow="fold")
    for i, g in enumerate(ro["groups"]):
        devs = [d for b in g["bundles"] for d in devices.get(b, [])]
        t.add_row(Text(f"{i * k}-{i * k + k - 1}" if k > 1 else str(i)),
                  Text(",".join(map(str, g["bundles"]))), Text(",".join(map(str, devs)) or "-"), Text(g["scope"]),
                  Text(f"{g['allreduce_bandwidth_gbps']:g}"), Text(g.get("bottleneck") or "-"))
    return t


def _device(d: dict) -> str:
    """``device 0: Tesla V100-SXM2-32GB GPU-cbe3...`` (index, model, UUID, MIG instance: what is known)."""
    parts = [f"device {d['index']}:", d.get("model") or "", d.get("uuid") or ""]
    if d.get("mig"):
        parts.append(f"MIG {d['mig']}")
    return " ".join(p for p in parts if p)


def _ranges(cpus: list[int]) -> str:
    """``0-3,8`` for ``[0, 1, 2, 3, 8]``; ``-`` for none."""
    if not cpus:
        return "-"
    out, start, prev = [], cpus[0], cpus[0]
    for c in [*cpus[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(f"{start}-{prev}" if prev > start else str(start))
        if c is not None:
            start = prev = c
    return ",".join(out)
