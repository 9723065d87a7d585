"""rayaccel: make Ray accelerator-aware.

Public surface (``__all__``; tests/test_api.py holds ``__all__`` to this list):

* topology data: ``Device``, ``Link``, ``MigProfile``, ``Nic``, ``NodeTopology``, ``Partition``
* discovery: ``discover``, ``load_topology``
* placement: ``plan``, ``Request``, ``Allocation``, ``Rejection``, ``NodeState``
* on Ray: ``init``, ``shutdown``, ``remote``, ``gang``, ``get_devices``, ``store``, ``placement_map``,
  ``rank_order``, ``report_usage``
* errors, the tree drawn in :mod:`rayaccel.errors`: ``RayaccelError``, ``TopologyError``,
  ``CaptureError``, ``CatalogError``, ``BackendError``, ``BackendUnavailable``, ``PluginError``,
  ``RequestError``, ``OutputPathError``, ``ClusterError``, ``Unsatisfiable``, ``StoreError``,
  ``CorruptObject``, ``StoreFull``, ``UnknownObject``, ``StateError``, ``TransportError``,
  ``TransportUnavailable``
* ``__version__``

``import rayaccel`` imports nothing else but the tensor transport's registration
(:mod:`rayaccel.ray.rdt`: standard library only, it never imports ray; a driver that imports
rayaccel can use ``tensor_transport="rayaccel"``): every name is fetched from its module on
first access (PEP 562 ``__getattr__``), so the import is cheap -- every worker of a rayaccel
node pays it -- and never fails because a vendor library or driver is absent.
``from rayaccel import Device`` works as usual.
"""

from ._version import __version__

_ERRORS = ("RayaccelError", "TopologyError", "CaptureError", "CatalogError", "BackendError", "BackendUnavailable",
           "PluginError", "RequestError", "OutputPathError", "ClusterError", "Unsatisfiable", "StoreError",
           "CorruptObject", "StoreFull", "UnknownObject", "StateError", "TransportError", "TransportUnavailable")

# name -> module that defines it (imported on first access)
_LAZY = {
    **{name: "rayaccel.topology" for name in ("Device", "Link", "MigProfile", "Nic", "NodeTopology", "Partition")},
    **{name: "rayaccel.errors" for name in _ERRORS},
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
    "placement_map": "rayaccel.ray",
    "rank_order": "rayaccel.ray",
    "report_usage": "rayaccel.ray",
    "store": "rayaccel.ray.worker.store",
}

__all__ = sorted(["__version__", *_LAZY])


from .ray import rdt as _rdt  # noqa: E402 - stdlib only, never imports ray (see the module docstring)

_rdt.install()


def __getattr__(name: str) -> object:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rayaccel' has no attribute {name!r}")
    from importlib import import_module  # stdlib, on first access only: `import rayaccel` stays bare

    value = getattr(import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
