"""``rayaccel status --placement-groups``: each placement group's map, as Rich tables (data is never markup)."""

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
        t = Table(title=Text(title), title_justify="left")
        for col in ("bundle", "node", "devices", "visible", "NICs", "NUMA", "CPUs", "NVLink domain"):
            t.add_column(col)
        for b in m["bundles"]:
            devs = ", ".join(f"{d['index']} {d.get('model') or ''}".strip() for d in b["devices"])
            t.add_row(Text(str(b["bundle"])), Text(f"{b.get('node_ip') or '?'} {str(b['node_id'])[:8]}"),
                      Text(devs or (b.get("why") or "-"), style="" if devs else "dim"),
                      Text(b.get("visible") or "-"), Text(",".join(b.get("nics") or []) or "-"),
                      Text(",".join(map(str, b.get("numa_nodes") or [])) or "-"), Text(_ranges(b.get("cpus") or [])),
                      Text(b.get("nvlink_domain") or "-"))
        out.append(t)
    return out


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
