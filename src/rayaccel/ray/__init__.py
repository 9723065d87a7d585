"""rayaccel's Ray layer: the only package that imports ``ray`` (lazily, on first use).

* :func:`init` / :func:`shutdown` -- embedded local cluster or connect (:mod:`.node`)
* :func:`remote` -- accelerator-aware tasks and actors (:mod:`.tasks`)
* :func:`gang` -- co-scheduled workers with torch.distributed (:mod:`.gangs`)
* :func:`get_devices` -- inside a worker: the assigned devices (:mod:`.worker`)
* :class:`SimulatedCluster` -- multi-node clusters of simulated nodes (:mod:`.cluster`)
* :mod:`.resources` -- resource/label naming; :mod:`.kv` -- topology publication;
  :mod:`.view` / :mod:`.context` -- the cluster view and submit path;
  :mod:`.registry` -- who holds what; :mod:`.status` -- ``rayaccel status`` data.

Importing this package does not import ``ray``.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "init": "rayaccel.ray.node",
    "shutdown": "rayaccel.ray.node",
    "remote": "rayaccel.ray.tasks",
    "gang": "rayaccel.ray.gangs",
    "Gang": "rayaccel.ray.gangs",
    "get_devices": "rayaccel.ray.worker",
    "Assignment": "rayaccel.ray.worker",
    "SimulatedCluster": "rayaccel.ray.cluster",
    "cluster_status": "rayaccel.ray.status",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rayaccel.ray' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
