"""The names of rayaccel's metrics, as given to ``ray.util.metrics`` (no ``ray`` import).

Ray's Prometheus endpoint prefixes custom metrics with ``ray_``: a dashboard queries
:func:`exported` names (``ray_rayaccel_device_state`` ...). Exported by the node agent
(:mod:`rayaccel.ray.metrics`); used by ``dashboards/rayaccel-grafana.json``.
"""

from __future__ import annotations

DEVICE_STATE = "rayaccel_device_state"
DEVICE_MEMORY_RESERVED_BYTES = "rayaccel_device_memory_reserved_bytes"
DEVICE_HEALTH = "rayaccel_device_health"
DEVICE_DRAINED = "rayaccel_device_drained"
DEVICE_HOLDER_INFO = "rayaccel_device_holder_info"
ARBITER_DECISION_SECONDS = "rayaccel_arbiter_decision_seconds"
ARBITER_DECISION_QUALITY = "rayaccel_arbiter_decision_quality"
GRANTS_WAITING = "rayaccel_grants_waiting"
UNHOOKED_GPU_SLOTS = "rayaccel_unhooked_gpu_slots"
HEALTH_EVENTS_TOTAL = "rayaccel_health_events_total"

ALL = (DEVICE_STATE, DEVICE_MEMORY_RESERVED_BYTES, DEVICE_HEALTH, DEVICE_DRAINED, DEVICE_HOLDER_INFO,
       ARBITER_DECISION_SECONDS, ARBITER_DECISION_QUALITY, GRANTS_WAITING, UNHOOKED_GPU_SLOTS, HEALTH_EVENTS_TOTAL)


def exported(name: str) -> str:
    """The name Ray's Prometheus endpoint serves ``name`` under."""
    return f"ray_{name}"
