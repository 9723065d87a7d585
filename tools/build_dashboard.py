#!/usr/bin/env python3
"""Generate the Grafana dashboard ``dashboards/rayaccel-grafana.json`` from rayaccel's metric names.

Every query is written from :mod:`rayaccel.metrics_names` (``ray_`` prefixed as Ray's
Prometheus endpoint serves them) and filtered by the ``$node`` variable. Run from the
repository root::

    python tools/build_dashboard.py            # rewrite the JSON
    python tools/build_dashboard.py --check    # exit 1 if the JSON is stale

Import it in Grafana (Dashboards > New > Import) and pick the Prometheus data source
that scrapes Ray's metrics (each node's ``--metrics-export-port``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from rayaccel import metrics_names as M  # noqa: E402

OUT = ROOT / "dashboards" / "rayaccel-grafana.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
NODE = 'node=~"$node"'


def m(name: str, suffix: str = "") -> str:
    return M.exported(name) + suffix


STATE_CODES = {"free": 0, "busy": 1, "shared": 2, "mig": 3, "drained": 4, "leaked": 5}
STATE_COLORS = {"free": "green", "busy": "blue", "shared": "purple", "mig": "orange", "drained": "red",
                "leaked": "dark-red"}
HEALTH = {0: ("ok", "green"), 1: ("warning", "yellow"), 2: ("critical", "red")}


def mappings(values: dict[int, tuple[str, str]]) -> list[dict]:
    return [{"type": "value", "options": {str(v): {"text": text, "color": color, "index": i}
                                         for i, (v, (text, color)) in enumerate(values.items())}}]


class Layout:
    """Panels placed left to right, rows of 24 grid units."""

    def __init__(self) -> None:
        self.panels: list[dict] = []
        self.x = self.y = self.row_h = 0

    def row(self, title: str) -> None:
        self.newline()
        self.panels.append({"type": "row", "title": title, "collapsed": False, "id": len(self.panels) + 1,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x = self.row_h = 0

    def add(self, panel: dict, w: int, h: int) -> None:
        if self.x + w > 24:
            self.newline()
        panel["id"] = len(self.panels) + 1
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        panel.setdefault("datasource", DS)
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series") -> dict:
    t = {"datasource": DS, "expr": expr, "refId": ref, "legendFormat": legend, "format": fmt}
    if instant:
        t.update(instant=True, range=False)
    return t


def panel(kind: str, title: str, description: str, targets: list[dict], **extra) -> dict:
    p = {"type": kind, "title": title, "description": description, "targets": targets,
         "fieldConfig": {"defaults": {}, "overrides": []}, "options": {}}
    for k, v in extra.items():
        if k == "defaults":
            p["fieldConfig"]["defaults"].update(v)
        else:
            p[k] = v
    return p


def build() -> dict:
    L = Layout()
    state_code = " + ".join(
        f'{code} * sum by (node, device) ({m(M.DEVICE_STATE)}{{{NODE}, state="{state}"}})'
        for state, code in STATE_CODES.items() if code)
    L.row("Devices")
    L.add(panel("state-timeline", "Device state", "Each device's state over time (free, busy, shared by memory "
                "shares, MIG instances in use, drained, fenced for a leaked process).",
                [target(state_code, "{{node}} GPU {{device}}")],
                defaults={"mappings": mappings({c: (s, STATE_COLORS[s]) for s, c in STATE_CODES.items()}),
                          "color": {"mode": "thresholds"}},
                options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8}), 16, 10)
    L.add(panel("table", "Device state now", "One row per device and its current state.",
                [target(f"max by (node, device, state) ({m(M.DEVICE_STATE)}{{{NODE}}}) == 1", instant=True, fmt="table")],
                transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True},
                                                                "indexByName": {"node": 0, "device": 1, "state": 2}}}]),
          8, 10)
    L.add(panel("bargauge", "Devices per state", "How many devices are in each state.",
                [target(f"sum by (state) ({m(M.DEVICE_STATE)}{{{NODE}}})", "{{state}}", instant=True)],
                options={"displayMode": "basic", "orientation": "horizontal"}), 8, 7)
    L.add(panel("timeseries", "Device memory reserved", "Device memory reserved by the holders of each device.",
                [target(f"{m(M.DEVICE_MEMORY_RESERVED_BYTES)}{{{NODE}}}", "{{node}} GPU {{device}}")],
                defaults={"unit": "bytes", "min": 0}), 16, 7)
    L.add(panel("table", "Holders", "Which process (name:pid) holds which device.",
                [target(f"max by (node, device, holder) ({m(M.DEVICE_HOLDER_INFO)}{{{NODE}}}) == 1", instant=True,
                        fmt="table")],
                transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True},
                                                                "indexByName": {"node": 0, "device": 1, "holder": 2}}}]),
          12, 8)
    L.add(panel("stat", "Drained devices", "Devices taken out of service (by health or by an operator).",
                [target(f"sum({m(M.DEVICE_DRAINED)}{{{NODE}}}) or vector(0)", "drained", instant=True)],
                defaults={"thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None},
                                                                     {"color": "red", "value": 1}]}}), 4, 8)
    L.add(panel("table", "Drained", "The drained devices.",
                [target(f"max by (node, device) ({m(M.DEVICE_DRAINED)}{{{NODE}}}) == 1", instant=True, fmt="table")],
                transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}]),
          8, 8)
    L.row("Health")
    L.add(panel("state-timeline", "Device health", "Worst health seen per device: ok, warning (shown only), "
                "critical (the device is drained).",
                [target(f"max by (node, device) ({m(M.DEVICE_HEALTH)}{{{NODE}}})", "{{node}} GPU {{device}}")],
                defaults={"mappings": mappings(HEALTH), "color": {"mode": "thresholds"}},
                options={"showValue": "never", "mergeValues": True}), 12, 8)
    L.add(panel("timeseries", "Health events", "Health events per device and kind (Xid, ECC, row remapping, "
                "throttling, lost GPU ...).",
                [target(f"sum by (node, device, kind) (increase({m(M.HEALTH_EVENTS_TOTAL)}{{{NODE}}}[$__rate_interval]))",
                        "{{node}} GPU {{device}} {{kind}}")],
                defaults={"custom": {"drawStyle": "bars"}, "min": 0}), 12, 8)
    L.add(panel("table", "Health events in range", "Events per device and kind over the dashboard's time range.",
                [target(f"sum by (node, device, kind) (increase({m(M.HEALTH_EVENTS_TOTAL)}{{{NODE}}}[$__range])) > 0",
                        instant=True, fmt="table")],
                transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True}}}]), 24, 6)
    L.row("Leaks")
    L.add(panel("timeseries", "Leaked processes", "Processes using a device that are no live holder's nor started by "
                "one (a worker's child that outlived it): the device is fenced until they are gone "
                "(`rayaccel reclaim NODE:DEV`, `rayaccel start --reclaim-leaks`).",
                [target(f"sum by (node, device) ({m(M.LEAKED_PROCESSES)}{{{NODE}}}) > 0", "{{node}} GPU {{device}}")],
                defaults={"min": 0, "decimals": 0}), 12, 8)
    L.add(panel("timeseries", "Oldest leak", "How long each device's oldest leaked process has been seen.",
                [target(f"max by (node, device) ({m(M.LEAK_AGE_SECONDS)}{{{NODE}}}) > 0", "{{node}} GPU {{device}}")],
                defaults={"unit": "s", "min": 0}), 12, 8)
    L.row("Arbiter")
    bucket = f"{m(M.ARBITER_DECISION_SECONDS, '_bucket')}{{{NODE}}}"
    L.add(panel("timeseries", "Decision latency", "Time the arbiter takes to choose the devices of one grant.",
                [target(f"histogram_quantile(0.5, sum by (le, node) (rate({bucket}[$__rate_interval])))", "p50 {{node}}"),
                 target(f"histogram_quantile(0.99, sum by (le, node) (rate({bucket}[$__rate_interval])))", "p99 {{node}}",
                        ref="B")],
                defaults={"unit": "s", "min": 0}), 12, 8)
    L.add(panel("timeseries", "Decisions per second", "Grants decided per second.",
                [target(f"sum by (node) (rate({m(M.ARBITER_DECISION_SECONDS, '_count')}{{{NODE}}}[$__rate_interval]))",
                        "{{node}}")],
                defaults={"unit": "ops", "min": 0}), 12, 8)
    L.add(panel("timeseries", "Decision quality", "The chosen sets' modeled all-reduce bandwidth over the best "
                "possible set of the same size on the idle node (1 = optimal).",
                [target(f"{m(M.ARBITER_DECISION_QUALITY)}{{{NODE}}}", "{{node}}")],
                defaults={"unit": "percentunit", "min": 0, "max": 1}), 8, 8)
    L.add(panel("timeseries", "Waiting grants", "Grants waiting for a suitable set of devices.",
                [target(f"{m(M.GRANTS_WAITING)}{{{NODE}}}", "{{node}}")], defaults={"min": 0, "decimals": 0}), 8, 8)
    L.add(panel("stat", "Unhooked GPU slots", "GPU slots held by workers running without the rayaccel hook: "
                "rayaccel cannot choose their devices. Install rayaccel in those environments (`rayaccel doctor`).",
                [target(f"sum by (node) ({m(M.UNHOOKED_GPU_SLOTS)}{{{NODE}}})", "{{node}}", instant=True)],
                defaults={"thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None},
                                                                     {"color": "orange", "value": 1}]}}), 8, 8)
    L.row("Per holder")
    who = "{{node}} GPU {{device}} {{actor_class}} {{actor_name}} {{task_function}}"
    by = "node, device, actor_class, actor_name, task_function"
    L.add(panel("timeseries", "Device memory per actor / task", "Device memory each Ray actor (class, name) or task "
                "(function) uses per device: NVML's per-process figures, its child processes included; on simulated "
                "nodes what the worker reports (`rayaccel.report_usage`).",
                [target(f"sum by ({by}) ({m(M.HOLDER_MEMORY_USED_BYTES)}{{{NODE}}}) > 0", who)],
                defaults={"unit": "bytes", "min": 0}), 8, 8)
    L.add(panel("timeseries", "Utilisation per actor / task", "SM utilisation of each device by each Ray actor or "
                "task, percent.",
                [target(f"sum by ({by}) ({m(M.HOLDER_UTILIZATION_PERCENT)}{{{NODE}}}) > 0", who)],
                defaults={"unit": "percent", "min": 0, "max": 100}), 8, 8)
    L.add(panel("timeseries", "Spilled GPU objects per actor", "Bytes a producer's `rayaccel`-transport objects "
                "spilled off the device to host memory and disk under its device budget.",
                [target(f"sum by ({by}) ({m(M.HOLDER_SPILLED_BYTES)}{{{NODE}}}) > 0", who)],
                defaults={"unit": "bytes", "min": 0}), 8, 8)
    L.row("Tensor transport")
    tb, ts, to = m(M.TRANSPORT_BYTES_TOTAL), m(M.TRANSPORT_SECONDS_TOTAL), m(M.TRANSPORT_OBJECTS_TOTAL)
    L.add(panel("timeseries", "Tensor bytes per path", "Bytes the `rayaccel` tensor transport delivered per second, "
                "by path (cuda-ipc, shared-memory, nixl, object-store), counted by the receiving process's node.",
                [target(f"sum by (node, path) (rate({tb}{{{NODE}}}[$__rate_interval]))", "{{node}} {{path}}")],
                defaults={"unit": "Bps", "min": 0}), 12, 8)
    L.add(panel("timeseries", "Tensor bandwidth per path", "Bytes delivered over the seconds spent receiving them: "
                "the achieved bandwidth of each path.",
                [target(f"sum by (node, path) (rate({tb}{{{NODE}}}[$__rate_interval])) / "
                        f"sum by (node, path) (rate({ts}{{{NODE}}}[$__rate_interval]))", "{{node}} {{path}}")],
                defaults={"unit": "Bps", "min": 0}), 12, 8)
    L.add(panel("bargauge", "Objects per path", "Objects delivered per path over the dashboard's range; "
                "object-store means no faster path could serve (each such transfer logs why).",
                [target(f"sum by (path) (increase({to}{{{NODE}}}[$__range]))", "{{path}}", instant=True)],
                options={"displayMode": "basic", "orientation": "horizontal"}), 24, 6)
    node_query = f"label_values({m(M.DEVICE_STATE)}, node)"
    return {
        "title": "rayaccel", "uid": "rayaccel", "description": "rayaccel: devices, health, the arbiter and the tensor transport, per node "
        "(metrics exported through Ray's Prometheus endpoint).", "tags": ["ray", "rayaccel", "gpu"],
        "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
            {"name": "node", "label": "Node", "type": "query", "datasource": DS, "definition": node_query,
             "query": {"query": node_query, "refId": "node"}, "refresh": 2, "includeAll": True, "multi": True,
             "allValue": ".*", "current": {}, "sort": 1, "hide": 0},
        ]},
        "annotations": {"list": []},
        "panels": L.panels,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the JSON file is stale")
    args = ap.parse_args()
    text = json.dumps(build(), indent=2) + "\n"
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python tools/build_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)} ({len(build()['panels'])} panels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
