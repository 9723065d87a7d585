"""Rich renderings of cluster state, shared by ``status`` and ``top`` (data is never markup).

Each command imports what it needs inside itself, so ``rayaccel --help`` and the offline
commands never load Ray, matplotlib or the placer they do not use.
"""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table
from rich.text import Text

from ..units import format_bytes

STATE_STYLE = {"free": "green", "busy": "red", "shared": "yellow", "mig": "magenta", "drained": "bold red",
               "leaked": "bold magenta", "failed": "red"}


def _since(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    s = max(0.0, time.time() - ts)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def _lock_line(lock: dict) -> str:
    return (f"the node lock has been held for {lock.get('held_s', 0):.1f} s by pid {lock.get('pid')} "
            f"({str(lock.get('what') or '?')[:100]}): every GPU grant on this node waits")


def domain_groups(nodes: list[dict]) -> list[tuple[Text | None, list[dict]]]:
    """Status rows grouped by NVLink domain (``ray.io/gpu-domain``), groups in order of first appearance,
    nodes without a domain last; each group with a header line. No node in a domain: one group, no header."""
    from ..ray.driver.places import CLIQUE_LABEL, place_of

    groups: dict[str | None, list[dict]] = {}
    places = {}
    for n in nodes:
        pl = place_of(n.get("labels") or {}, f"node {n.get('node_key')}")
        places[id(n)] = pl
        groups.setdefault(pl.domain, []).append(n)
    if list(groups) == [None]:
        return [(None, nodes)]
    out: list[tuple[Text | None, list[dict]]] = []
    for dom in sorted(groups, key=lambda d: (d is None, list(groups).index(d))):
        members = groups[dom]
        free = sum(m["free"] for m in members)
        total = sum(len(m["devices"]) for m in members)
        cliques = sorted({str((m.get("labels") or {}).get(CLIQUE_LABEL)) for m in members
                          if (m.get("labels") or {}).get(CLIQUE_LABEL)})
        levels: dict[str, list[str]] = {}
        for m in members:
            for k, v in places[id(m)].levels:
                if v not in levels.setdefault(k, []):
                    levels[k].append(v)
        head = f"NVLink domain {dom}" if dom is not None else "no NVLink domain"
        if cliques:
            head += f" (clique {', '.join(cliques)})"
        head += f": {len(members)} node(s), {free}/{total} GPUs free"
        if levels:
            head += "; " + ", ".join(f"{k}={'/'.join(v[:3])}{'/...' if len(v) > 3 else ''}" for k, v in levels.items())
        out.append((Text(head, style="bold"), members))
    return out


def status_tables(data: dict) -> list[Any]:
    """One table per node, grouped by NVLink domain, then lines for unusable and plain Ray nodes."""
    out: list[Any] = []
    if not data["nodes"] and not data["bad"]:
        out.append(Text("no rayaccel nodes in this cluster (start them with `rayaccel start`)"))
    for head, members in domain_groups(data["nodes"]):
        if head is not None:
            out.append(head)
        out.extend(_node_tables(members))
    for b in data.get("bad", []):
        out.append(Text(f"node {b['node_key']} (Ray node {b['node_id'][:12]}): unusable: {b['why']}", style="red"))
    if data.get("unmanaged"):
        out.append(Text(f"{len(data['unmanaged'])} plain Ray node(s) without rayaccel: "
                        + ", ".join(x[:12] for x in data["unmanaged"]), style="dim"))
    return out


def _node_tables(nodes: list[dict]) -> list[Any]:
    out: list[Any] = []
    for n in nodes:
        res = n.get("resource") or "GPU"
        title = Text(f"{n['name'] or n['node_key']} (node {n['node_id'][:12]}, key {n['node_key']}"
                     f"{', simulated' if n['simulated'] else ''}): {n['free']}/{len(n['devices'])} free"
                     + (f", Ray resource {res} (one per {n.get('unit') or 'device'})" if res != "GPU" else "")
                     + (f"; manages devices {[d['index'] for d in n['devices']]} of the host's "
                        f"{n.get('host_devices')} ({n['given_by']})" if n.get("given_by") else ""))
        t = Table(title=title, title_justify="left")
        for col in ("dev", "model", "memory", "state", "held by", "note"):
            t.add_column(col)
        for d in n["devices"]:
            note = ""
            if d.get("drain"):
                dr = d["drain"]
                note = _drain_note(dr)
            elif d.get("share"):
                note = f"{d['share'] * 100:.0f}% shared"
            elif d.get("mig_held"):
                note = "MIG " + ", ".join(d["mig_held"])
            t.add_row(str(d["index"]), Text(d["model"] or "N/A"), format_bytes(d["memory_bytes"]),
                      Text(d["state"], style=STATE_STYLE.get(d["state"], "")),
                      Text(", ".join(d["holders"]) or "-"), Text(note))
        out.append(t)
        extra = []
        if n.get("waiting"):
            extra.append(f"{len(n['waiting'])} grant(s) waiting: " + "; ".join(
                f"{w.get('name')} (pid {w.get('pid')}): {w.get('waiting')}" for w in n["waiting"][:3]))
        if n.get("unhooked_slots"):
            extra.append(f"{n['unhooked_slots']:g} GPU slot(s) held by workers without the rayaccel hook "
                         f"(a runtime_env without rayaccel?): they see no GPU")
        if n.get("agent") != "answered":
            extra.append(f"agent: {n.get('agent')}" + (f" (snapshot {n['age_s']:.0f} s old)" if n.get("age_s") else ""))
        if n.get("lock"):
            extra.append(_lock_line(n["lock"]))
        for line in extra:
            out.append(Text("  " + line, style="yellow"))
        if n.get("usage"):
            out.append(usage_table(n["usage"]))
        if n.get("leaks"):
            out.append(leaks_table(n["leaks"]))
        if n.get("dynamic_mig"):
            out.extend(dynmig_lines(n["dynamic_mig"]))
    return out


def dynmig_lines(dm: dict) -> list:
    """Dynamic MIG on a node (``status``): its GPUs, instances, holds, and each create / destroy with its reason."""
    held = ", ".join(f"{r}={n}" for r, n in sorted((dm.get("held") or {}).items()))
    out: list = [Text(f"  dynamic MIG on GPU(s) {', '.join(map(str, dm.get('gpus') or []))}: "
                      f"{len(dm.get('instances') or {})} instance(s); held without an instance: {held or 'none'}")]
    if dm.get("error"):
        out.append(Text(f"  dynamic MIG: {dm['error']}", style="yellow"))
    events = dm.get("events") or []
    if events:
        t = Table(title=Text("  dynamic MIG steps", style="bold"), title_justify="left", expand=False, pad_edge=False)
        for col in ("age", "step", "gpu", "profile", "slice", "uuid", "why"):
            t.add_column(col, overflow="fold")
        for e in events[-10:]:
            t.add_row(Text(_since(e.get("at"))), Text(str(e.get("action")) + ("" if e.get("ok") else " (failed)"),
                                                       style=None if e.get("ok") else "red"),
                      Text(str(e.get("gpu"))), Text(str(e.get("profile"))), Text(str(e.get("start"))),
                      Text(str(e.get("uuid") or "-")), Text(str(e.get("error") or e.get("why") or "")))
        out.append(t)
    return out


def _drain_note(dr: dict) -> str:
    if dr.get("by") == "leak":
        return f"fenced {_since(dr.get('since'))} ago: {dr.get('reason')}"
    return f"drained by {dr.get('by')} {_since(dr.get('since'))} ago: {dr.get('reason')}"


def leaks_table(rows: list[dict]) -> Table:
    """Leaked device processes (``status`` and ``top``): a worker's child that outlived it, or a stranger."""
    t = Table(title=Text("  leaked device processes (rayaccel reclaim NODE:DEV ends those marked ours)", style="yellow"),
              title_justify="left", expand=False, pad_edge=False)
    for col in ("dev", "pid", "command", "from holder", "age", "memory", "ours", "fence"):
        t.add_column(col, overflow="fold")
    for r in rows:
        fence = "fenced" if r.get("fenced") else "acknowledged" if r.get("acknowledged") else (
            f"drained by {r['drained_by']}" if r.get("drained_by") else "-")
        t.add_row(Text(str(r.get("device"))), Text(str(r.get("pid"))), Text(str(r.get("command") or "?")[:80]),
                  Text(str(r.get("holder") or "?")), Text(_since(r.get("since"))),
                  Text(format_bytes(r["used_bytes"]) if r.get("used_bytes") is not None else "?"),
                  Text("yes" if r.get("ours") else f"no: {r.get('why') or '?'}"), Text(fence))
    return t


def usage_who(r: dict) -> str:
    """A usage row's holder by Ray's names: ``actor Trainer "t0"``, ``task train``."""
    if r.get("kind") == "actor":
        return f"actor {r.get('actor_class') or r.get('holder') or '?'}" + (
            f" {r['actor_name']!r}" if r.get("actor_name") else "")
    return f"task {r.get('task_function') or r.get('holder') or '?'}"


def usage_table(rows: list[dict]) -> Table:
    """Per-holder usage: one row per holder and device (``status`` and ``top``)."""
    t = Table(title=Text("  per-holder usage"), title_justify="left", expand=False, pad_edge=False)
    for col in ("holder", "pid", "dev", "memory used", "util", "spilled", "from"):
        t.add_column(col, overflow="fold")
    for r in rows:
        util = r.get("utilization")
        dev = str(r.get("device")) + (f" [{r['partition']}]" if r.get("partition") else "")
        pids = [p for p in r.get("pids") or () if p != r.get("pid")]
        t.add_row(Text(usage_who(r)), Text(str(r.get("pid")) + (f" (+{len(pids)})" if pids else "")), Text(dev),
                  Text(format_bytes(r["used_bytes"]) if r.get("used_bytes") is not None else "?"),
                  Text(f"{util:.0f}%" if util is not None else "?"),
                  Text(format_bytes(r["spilled_bytes"]) if r.get("spilled_bytes") else "-"),
                  Text(r.get("source") or ""))
    return t


def _neighbours(topo: Any, index: int) -> str:
    """A device's direct links, strongest first: ``NV2:3,4 NV1:1,2``."""
    groups: dict[str, list[int]] = {}
    for other in topo.indices:
        if other == index:
            continue
        l = topo.link(min(index, other), max(index, other))
        if l is not None and l.direct:
            groups.setdefault(l.label, []).append(other)
    order = sorted(groups, key=lambda lab: -topo.link(min(index, groups[lab][0]), max(index, groups[lab][0])).rank[1])
    text = " ".join(f"{lab}:{','.join(map(str, groups[lab]))}" for lab in order)
    return text if len(text) <= 40 else text[:39] + "…"


def top_frame(data: dict, topologies: dict | None = None, address: str | None = None, live: bool = False) -> Any:
    """One frame of ``rayaccel top``: every node's devices, links, holders, health, drains and waiting grants, and
    each holder's usage (memory, utilisation, spilled bytes per device).

    ``address`` (the cluster's) is in the title line; ``live`` adds "(q quits)", which only the
    live view answers (``--once`` and piped output print a plain frame).
    """
    from rich.console import Group

    from ..ray.driver.view import view

    topos = topologies if topologies is not None else {n.node_key: n.topology for n in view().nodes()}
    title = f"rayaccel top  {address + '  ' if address else ''}{time.strftime('%H:%M:%S')}"
    parts: list[Any] = [Text(title + ("  (q quits)" if live else ""), style="bold")]
    for head, members in domain_groups(data["nodes"]):
        if head is not None:
            parts.append(head)
        parts.extend(_top_tables(members, topos))
    for b in data.get("bad", []):
        parts.append(Text(f"node {b['node_key']}: unusable: {b['why']}", style="red"))
    if data.get("unmanaged"):
        parts.append(Text(f"{len(data['unmanaged'])} plain Ray node(s) without rayaccel", style="dim"))
    return Group(*parts)


def _top_tables(nodes: list[dict], topos: dict) -> list[Any]:
    parts: list[Any] = []
    for n in nodes:
        topo = topos.get(n["node_key"])
        worst = {}
        t = Table(title=Text(f"{n['name'] or n['node_key']}  key {n['node_key']}  {n['free']}/{len(n['devices'])} "
                             f"free" + ("  simulated" if n["simulated"] else "")), title_justify="left",
                  expand=False, pad_edge=False)
        for col in ("dev", "state", "health", "held by", "links"):
            t.add_column(col, overflow="fold")
        for d in n["devices"]:
            health = d.get("health") or "ok"
            if d.get("drain"):
                dr = d["drain"]
                held = _drain_note(dr)
            else:
                held = ", ".join(d["holders"]) or "-"
            t.add_row(str(d["index"]), Text(d["state"], style=STATE_STYLE.get(d["state"], "")),
                      Text(worst.get(d["index"], health)), Text(held),
                      Text(_neighbours(topo, d["index"]) if topo is not None else ""))
        parts.append(t)
        for w in n.get("waiting", [])[:5]:
            parts.append(Text(f"  waiting: {w.get('name')} (pid {w.get('pid')}): {w.get('waiting')}", style="yellow"))
        if n.get("unhooked_slots"):
            parts.append(Text(f"  {n['unhooked_slots']:g} GPU slot(s) held without the hook", style="yellow"))
        if n.get("lock"):
            parts.append(Text("  " + _lock_line(n["lock"]), style="bold red"))
        if n.get("usage"):
            parts.append(usage_table(n["usage"]))
        if n.get("leaks"):
            parts.append(leaks_table(n["leaks"]))
    return parts
