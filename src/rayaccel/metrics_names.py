"""The names of rayaccel's metrics, as given to ``ray.util.metrics`` (no ``ray`` import).

Ray's Prometheus endpoint prefixes custom metrics with ``ray_``: a dashboard queries
:func:`exported` names (``ray_rayaccel_device_state`` ...), and a histogram as its
``_bucket`` / ``_sum`` / ``_count`` series (:func:`series`). Exported by the node agent
(:mod:`rayaccel.ray.node.metrics`); used by ``dashboards/rayaccel-grafana.json``, whose test
checks that every query names only these. The tensor transport's counters
(``rayaccel_transport_*``) are exported by the process that pulls the tensors
(:mod:`rayaccel.ray.rdt.telemetry`), one series per node and path.
"""

from __future__ import annotations

#: gauge, tags node, device, state: 1 for the device's current state (free | busy | shared | mig | drained | leaked | failed), 0 for the others.
DEVICE_STATE = "rayaccel_device_state"
#: gauge, tags node, device: device memory reserved by its holders, bytes.
DEVICE_MEMORY_RESERVED_BYTES = "rayaccel_device_memory_reserved_bytes"
#: gauge, tags node, device: worst health seen, 0 ok, 1 warning, 2 critical.
DEVICE_HEALTH = "rayaccel_device_health"
#: gauge, tags node, device: 1 while the device is drained (no new work), else 0.
DEVICE_DRAINED = "rayaccel_device_drained"
#: gauge, tags node, device, holder: 1 per process holding the device (``name:pid``).
DEVICE_HOLDER_INFO = "rayaccel_device_holder_info"
#: histogram, tag node: the arbiter's time to decide one grant, seconds (buckets 0.0001 .. 0.1).
ARBITER_DECISION_SECONDS = "rayaccel_arbiter_decision_seconds"
#: gauge, tag node: the last decisions' modeled ring all-reduce over the best possible set of that size (0..1).
ARBITER_DECISION_QUALITY = "rayaccel_arbiter_decision_quality"
#: gauge, tag node: grants waiting for a suitable set of devices.
GRANTS_WAITING = "rayaccel_grants_waiting"
#: gauge, tag node: GPU slots held by workers that run without the rayaccel hook.
UNHOOKED_GPU_SLOTS = "rayaccel_unhooked_gpu_slots"
#: counter, tags node, device, kind: device health events (kinds: :data:`rayaccel.health.KINDS`).
HEALTH_EVENTS_TOTAL = "rayaccel_health_events_total"
# A leaked process uses a device but is no live holder's, nor started by one (a worker's child that outlived it;
# :mod:`rayaccel.ray.node.leaks`); the device is fenced (state ``leaked``) while the watcher sees one.
#: gauge, tags node, device: leaked processes on the device.
LEAKED_PROCESSES = "rayaccel_leaked_processes"
#: gauge, tags node, device: seconds the device's oldest leaked process has been seen (0: none).
LEAK_AGE_SECONDS = "rayaccel_leak_age_seconds"
# Per holder (a Ray actor or task) and device: NVML's per-process figures, its child processes included (a simulated
# node: what the worker reports); holders with the same tags are summed.
#: gauge, tags node, device, actor_class, actor_name, task_function: device memory the holder uses, bytes.
HOLDER_MEMORY_USED_BYTES = "rayaccel_holder_memory_used_bytes"
#: gauge, tags node, device, actor_class, actor_name, task_function: the device's SM utilisation by it, percent (0..100).
HOLDER_UTILIZATION_PERCENT = "rayaccel_holder_utilization_percent"
#: gauge, tags node, device, actor_class, actor_name, task_function: bytes its ``rayaccel``-transport objects spilled off the device.
HOLDER_SPILLED_BYTES = "rayaccel_holder_spilled_bytes"

#: counter, tags node, path: tensor bytes the ``rayaccel`` transport delivered, per path (:data:`rayaccel.transfer.TENSOR_PATHS`).
TRANSPORT_BYTES_TOTAL = "rayaccel_transport_bytes_total"
#: counter, tags node, path: seconds consumers spent receiving them, per path.
TRANSPORT_SECONDS_TOTAL = "rayaccel_transport_seconds_total"
#: counter, tags node, path: objects delivered, per path.
TRANSPORT_OBJECTS_TOTAL = "rayaccel_transport_objects_total"

ALL = (DEVICE_STATE, DEVICE_MEMORY_RESERVED_BYTES, DEVICE_HEALTH, DEVICE_DRAINED, DEVICE_HOLDER_INFO,
       ARBITER_DECISION_SECONDS, ARBITER_DECISION_QUALITY, GRANTS_WAITING, UNHOOKED_GPU_SLOTS, HEALTH_EVENTS_TOTAL,
       LEAKED_PROCESSES, LEAK_AGE_SECONDS, HOLDER_MEMORY_USED_BYTES, HOLDER_UTILIZATION_PERCENT, HOLDER_SPILLED_BYTES, TRANSPORT_BYTES_TOTAL, TRANSPORT_SECONDS_TOTAL, TRANSPORT_OBJECTS_TOTAL)

#: The metric type of each name.
TYPES = {DEVICE_STATE: "gauge", DEVICE_MEMORY_RESERVED_BYTES: "gauge", DEVICE_HEALTH: "gauge", DEVICE_DRAINED: "gauge",
         DEVICE_HOLDER_INFO: "gauge", ARBITER_DECISION_SECONDS: "histogram", ARBITER_DECISION_QUALITY: "gauge",
         GRANTS_WAITING: "gauge", UNHOOKED_GPU_SLOTS: "gauge", HEALTH_EVENTS_TOTAL: "counter",
         LEAKED_PROCESSES: "gauge", LEAK_AGE_SECONDS: "gauge",
         HOLDER_MEMORY_USED_BYTES: "gauge", HOLDER_UTILIZATION_PERCENT: "gauge", HOLDER_SPILLED_BYTES: "gauge",
         TRANSPORT_BYTES_TOTAL: "counter", TRANSPORT_SECONDS_TOTAL: "counter", TRANSPORT_OBJECTS_TOTAL: "counter"}

#: The tag keys of the per-holder metrics.
HOLDER_TAGS = ("node", "device", "actor_class", "actor_name", "task_function")

#: The tag keys rayaccel sets on each (Ray adds its own, e.g. ``SessionName``, ``instance``).
TAGS = {DEVICE_STATE: ("node", "device", "state"), DEVICE_MEMORY_RESERVED_BYTES: ("node", "device"),
        DEVICE_HEALTH: ("node", "device"), DEVICE_DRAINED: ("node", "device"),
        DEVICE_HOLDER_INFO: ("node", "device", "holder"), ARBITER_DECISION_SECONDS: ("node",),
        ARBITER_DECISION_QUALITY: ("node",), GRANTS_WAITING: ("node",), UNHOOKED_GPU_SLOTS: ("node",),
        HEALTH_EVENTS_TOTAL: ("node", "device", "kind"), LEAKED_PROCESSES: ("node", "device"),
        LEAK_AGE_SECONDS: ("node", "device"), HOLDER_MEMORY_USED_BYTES: HOLDER_TAGS,
        HOLDER_UTILIZATION_PERCENT: HOLDER_TAGS, HOLDER_SPILLED_BYTES: HOLDER_TAGS, TRANSPORT_BYTES_TOTAL: ("node", "path"),
        TRANSPORT_SECONDS_TOTAL: ("node", "path"), TRANSPORT_OBJECTS_TOTAL: ("node", "path")}


def exported(name: str) -> str:
    """The name Ray's Prometheus endpoint serves ``name`` under."""
    return f"ray_{name}"


def series(name: str) -> tuple[str, ...]:
    """The Prometheus series a query may name for ``name``: the exported name, and for a
    histogram its ``_bucket``, ``_sum`` and ``_count`` series."""
    base = exported(name)
    if TYPES.get(name) == "histogram":
        return (f"{base}_bucket", f"{base}_sum", f"{base}_count")
    return (base,)
