"""rayaccel's metrics in Ray's dashboard and Prometheus endpoint (``ray.util.metrics``).

The node agent exports them once per period from its snapshot. Ray prefixes every
custom metric with ``ray_`` on its Prometheus endpoint (each node's metrics export
port), so the names scraped are ``ray_rayaccel_...`` (see
:mod:`rayaccel.metrics_names`, which the shipped Grafana dashboard uses):

* per device (tags ``node``, ``device``): ``rayaccel_device_state`` (1 for the
  current ``state`` tag: free / busy / shared / mig / drained / failed, the one
  classification :func:`rayaccel.arbiter.state.device_state` that ``status`` uses too),
  ``rayaccel_device_memory_reserved_bytes``, ``rayaccel_device_health`` (0 ok,
  1 warning, 2 critical), ``rayaccel_device_drained``, ``rayaccel_device_holder_info``
  (1 per ``holder`` tag);
* per node: ``rayaccel_arbiter_decision_seconds`` (histogram of the arbiter's time per
  grant), ``rayaccel_arbiter_decision_quality`` (the last decisions' modeled ring
  all-reduce over the best possible for their size on the idle node, 0..1),
  ``rayaccel_grants_waiting``, ``rayaccel_unhooked_gpu_slots``, and
  ``rayaccel_health_events_total`` (tags ``device``, ``kind``);
* per device, from the leak watcher (:mod:`.leaks`): ``rayaccel_leaked_processes`` (leaked processes on the
  device; its state is ``leaked`` while it is fenced) and ``rayaccel_leak_age_seconds`` (the oldest's age);
* per holder and device (tags ``node``, ``device``, ``actor_class``, ``actor_name``,
  ``task_function``; :mod:`.usage`): ``rayaccel_holder_memory_used_bytes``,
  ``rayaccel_holder_utilization_percent``, ``rayaccel_holder_spilled_bytes`` -- holders with the
  same tags summed; a series whose holders are gone is set to 0 once, as Ray does for its own
  per-component series.
"""

from __future__ import annotations

import logging
from typing import Any

from rayaccel import metrics_names as M
from rayaccel.arbiter.state import STATES, Snapshot, device_state
from rayaccel.placement import NodeState, Request, allocate, allreduce_bandwidth_gbps
from rayaccel.placement.pools import gpu_pool

log = logging.getLogger(__name__)
HEALTH_LEVEL = {None: 0, "warning": 1, "critical": 2}


class Exporter:
    """Turns a node agent's snapshots into ``ray.util.metrics`` values."""

    def __init__(self, agent: Any):
        from ray.util.metrics import Counter, Gauge, Histogram

        self.agent = agent
        node = ("node",)
        dev = ("node", "device")
        self.state = Gauge(M.DEVICE_STATE, "1 for the device's current state", tag_keys=dev + ("state",))
        self.memory = Gauge(M.DEVICE_MEMORY_RESERVED_BYTES, "device memory reserved by holders (bytes)", tag_keys=dev)
        self.health = Gauge(M.DEVICE_HEALTH, "0 ok, 1 warning, 2 critical", tag_keys=dev)
        self.drained = Gauge(M.DEVICE_DRAINED, "1 when the device is drained", tag_keys=dev)
        self.holder = Gauge(M.DEVICE_HOLDER_INFO, "1 per holder of the device", tag_keys=dev + ("holder",))
        self.latency = Histogram(M.ARBITER_DECISION_SECONDS, "arbiter time per grant (s)",
                                 boundaries=[1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2, 1e-1], tag_keys=node)
        self.quality = Gauge(M.ARBITER_DECISION_QUALITY, "chosen set's all-reduce / best possible (0..1)",
                             tag_keys=node)
        self.waiting = Gauge(M.GRANTS_WAITING, "grants waiting for a suitable set", tag_keys=node)
        self.unhooked = Gauge(M.UNHOOKED_GPU_SLOTS, "GPU slots held by workers without the hook", tag_keys=node)
        self.events = Counter(M.HEALTH_EVENTS_TOTAL, "device health events", tag_keys=dev + ("kind",))
        self.leaked = Gauge(M.LEAKED_PROCESSES, "leaked processes on the device (no live holder's)", tag_keys=dev)
        self.leak_age = Gauge(M.LEAK_AGE_SECONDS, "age of the device's oldest leaked process (s)", tag_keys=dev)
        self.used = Gauge(M.HOLDER_MEMORY_USED_BYTES, "device memory a Ray actor or task uses (bytes)",
                          tag_keys=M.HOLDER_TAGS)
        self.util = Gauge(M.HOLDER_UTILIZATION_PERCENT, "device utilisation by a Ray actor or task (%)",
                          tag_keys=M.HOLDER_TAGS)
        self.spilled = Gauge(M.HOLDER_SPILLED_BYTES, "bytes a Ray actor's GPU objects spilled off the device",
                             tag_keys=M.HOLDER_TAGS)
        self._usage_keys: dict[str, set[tuple]] = {"used": set(), "util": set(), "spilled": set()}
        self._event_at = 0.0
        self._holders: set[tuple] = set()
        self._best: dict[int, float] = {}

    def __call__(self, agent: Any) -> None:
        snap = agent.last
        if snap is not None:
            self.export(snap)
        self.export_usage(getattr(agent, "usage_rows", ()) or ())

    def export_usage(self, rows: Any) -> None:
        """The per-holder gauges from :class:`.usage.HolderUsage` rows (unknown figures are not exported)."""
        sums: dict[str, dict[tuple, float]] = {"used": {}, "util": {}, "spilled": {}}
        for r in rows:
            key = (str(r.device), r.actor_class, r.actor_name, r.task_function)
            for what, v in (("used", r.used_bytes), ("util", r.utilization), ("spilled", r.spilled_bytes)):
                if v is not None:
                    sums[what][key] = sums[what].get(key, 0.0) + float(v)
        sums["util"] = {k: min(100.0, v) for k, v in sums["util"].items()}
        node = self.agent.node_key
        for what, gauge in (("used", self.used), ("util", self.util), ("spilled", self.spilled)):
            now = sums[what]
            for key in set(now) | self._usage_keys[what]:
                tags = dict(zip(M.HOLDER_TAGS, (node, *key)))
                gauge.set(now.get(key, 0.0), tags=tags)
            self._usage_keys[what] = set(now)

    def _best_gbps(self, k: int) -> float:
        hit = self._best.get(k)
        if hit is None:
            topo = self.agent.record.topology
            a = allocate(NodeState(topo), Request(gpus=k))
            hit = self._best[k] = allreduce_bandwidth_gbps(topo, a.devices) if a else 0.0
        return hit

    def export(self, snap: Snapshot) -> None:
        node = self.agent.node_key
        topo = self.agent.record.topology
        pool = frozenset(gpu_pool(topo))
        partitioned = frozenset(d.index for d in topo.devices if d.partitions) | frozenset(self.agent.record.dynamic_mig)
        worst = (snap.health or {}).get("worst", {}) or {}
        leaks = [r for r in (snap.leaks or {}).get("rows", ()) if isinstance(r, dict)]
        holders: dict[int, list[str]] = {}
        for h in snap.holders:
            if h.waiting or h.drain is not None:
                continue
            for d in h.devices:
                holders.setdefault(d, []).append(f"{h.name}:{h.pid}")
        current = set()
        for d in topo.devices:
            tags = {"node": node, "device": str(d.index)}
            state = device_state(d.index, snap, pool=pool, partitioned=partitioned)
            for s in STATES:
                self.state.set(1.0 if s == state else 0.0, tags={**tags, "state": s})
            frac = snap.shared.get(d.index)
            reserved = (d.memory_bytes or 0) * (frac if frac else (1.0 if state == "busy" else 0.0))
            self.memory.set(float(reserved), tags=tags)
            self.health.set(float(HEALTH_LEVEL.get(worst.get(str(d.index)), 0)), tags=tags)
            self.drained.set(1.0 if state in ("drained", "leaked") else 0.0, tags=tags)
            mine = [r for r in leaks if r.get("device") == d.index]
            self.leaked.set(float(len(mine)), tags=tags)
            oldest = min((r["since"] for r in mine if isinstance(r.get("since"), (int, float))), default=None)
            self.leak_age.set(max(0.0, snap.at - oldest) if oldest is not None else 0.0, tags=tags)
            for who in holders.get(d.index, ()):
                current.add((str(d.index), who))
        for dev, who in current | self._holders:
            self.holder.set(1.0 if (dev, who) in current else 0.0, tags={"node": node, "device": dev, "holder": who})
        self._holders = current
        ntags = {"node": node}
        qual = []
        for _, us, devs, _ in snap.new_decisions:
            self.latency.observe(us / 1e6, tags=ntags)
            if len(devs) > 1:
                best = self._best_gbps(len(devs))
                if best:
                    qual.append(allreduce_bandwidth_gbps(topo, devs) / best)
        if qual:
            self.quality.set(round(sum(qual) / len(qual), 4), tags=ntags)
        self.waiting.set(float(len(snap.waiting())), tags=ntags)
        self.unhooked.set(float(snap.unhooked_slots), tags=ntags)
        for ev in (snap.health or {}).get("events", ()):
            if ev["at"] > self._event_at:
                self._event_at = ev["at"]
                self.events.inc(1.0, tags={"node": node, "device": str(ev["device"]), "kind": ev["kind"]})


def attach(agent: Any) -> Exporter | None:
    """Export ``agent``'s snapshots as metrics every period (None when Ray's metrics are unavailable)."""
    try:
        exp = Exporter(agent)
    except Exception as e:  # noqa: BLE001 - metrics are optional: the node works without them
        log.warning("rayaccel: metrics disabled on node %s: %s", agent.node_key, e)
        return None
    agent.extensions.append(exp)
    return exp
