"""rayaccel's Ray layer: the only package that imports ``ray`` (lazily, on first use).

* :func:`init` / :func:`shutdown` -- embedded local cluster or connect (:mod:`.node`)
* :func:`remote` -- tasks and actors with what ``num_gpus`` cannot say (:mod:`.tasks`)
* :func:`gang` -- co-scheduled workers with torch.distributed (:mod:`.gangs`)
* :func:`get_devices` -- inside any GPU worker of a rayaccel node (:mod:`.worker`)
* :func:`report_usage` -- inside a worker: the device memory and utilisation it uses (simulated nodes have no NVML)
* :func:`placement_map` / :func:`rank_order` -- a placement group's devices per bundle before any task
  runs in it, and the rank order that follows the fabric (:mod:`.driver.placemap`)
* :class:`SimulatedCluster` -- multi-node clusters of simulated nodes (:mod:`.cluster`)
* :mod:`.hook` / :mod:`.arbiter` -- in every worker: which devices stand behind Ray's grant
* :mod:`.claim` -- a request as Ray options; :mod:`.view` -- the cluster as drivers see it;
  :mod:`.agent` -- one per node: snapshots, health, drains; :mod:`.status` -- ``rayaccel status``
* :mod:`.rdt` -- the ``rayaccel`` tensor transport for Ray Direct Transport
* :mod:`._ray_private` -- every use of Ray's private API

Importing this package does not import ``ray``; it makes ``tensor_transport="rayaccel"``
known to Ray in this process (:func:`.rdt.install`: microseconds, and nothing is
registered until the process first uses Ray Direct Transport).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "init": "rayaccel.ray.driver.init",
    "shutdown": "rayaccel.ray.driver.init",
    "remote": "rayaccel.ray.driver.tasks",
    "gang": "rayaccel.ray.driver.gangs",
    "Gang": "rayaccel.ray.driver.gangs",
    "get_devices": "rayaccel.ray.worker.devices",
    "Assignment": "rayaccel.ray.worker.devices",
    "report_usage": "rayaccel.ray.worker.usage",
    "SimulatedCluster": "rayaccel.ray.driver.cluster",
    "cluster_status": "rayaccel.ray.driver.status",
    "placement_map": "rayaccel.ray.driver.placemap",
    "rank_order": "rayaccel.ray.driver.placemap",
    "PlacementMap": "rayaccel.ray.driver.placemap",
}

__all__ = sorted(_LAZY)

from rayaccel.ray import rdt as _rdt

_rdt.install()


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rayaccel.ray' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
