"""rayaccel: make Ray accelerator-aware.

The public surface is listed in ``__all__``. Heavy parts (the Ray layer, vendor
libraries) are imported lazily on first use, so ``import rayaccel`` stays cheap
and never fails because a vendor library or driver is absent.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> module that defines it (imported on first access: every Ray worker of a rayaccel
# node imports this package through the hook, so nothing heavy loads here)
_LAZY = {
    "RayaccelError": "rayaccel.errors",
    "Device": "rayaccel.topology",
    "Link": "rayaccel.topology",
    "MigProfile": "rayaccel.topology",
    "Nic": "rayaccel.topology",
    "NodeTopology": "rayaccel.topology",
    "Partition": "rayaccel.topology",
    "load_topology": "rayaccel.discovery",
    "discover": "rayaccel.discovery",
    "plan": "rayaccel.placement",
    "Request": "rayaccel.placement",
    "Allocation": "rayaccel.placement",
    "Rejection": "rayaccel.placement",
    "NodeState": "rayaccel.placement",
    "init": "rayaccel.ray",
    "shutdown": "rayaccel.ray",
    "remote": "rayaccel.ray",
    "gang": "rayaccel.ray",
    "get_devices": "rayaccel.ray",
    "store": "rayaccel.ray.store",
}

__all__ = sorted(["__version__", *_LAZY])


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rayaccel' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
