"""Discovery: find out what accelerators a node has and how they are wired.

* :mod:`.registry` -- the :class:`Backend` protocol and the registry fed by the
  ``rayaccel.backends`` entry-point group (built-ins go through the same path).
* :mod:`.nvidia`, :mod:`.amd`, :mod:`.simulated` -- the built-in backends.
* :mod:`.tools`, :mod:`.tpu` -- Neuron, Gaudi and Ascend (their tools), TPU (sysfs + metadata).
* :mod:`.network` -- a node's network levels and NVLink domain, as Ray labels.

Device health lives in :mod:`rayaccel.health`; the public fakes of vendor libraries (``FakeNVML``,
``FakeAmdSmi``) in :mod:`rayaccel.testing`.
* :mod:`.capture` -- importers of text captures (``nvidia-smi topo -m`` and friends).
* :mod:`.load` -- :func:`load_topology`: a catalog name, a topology JSON file or text captures.
* :mod:`.rayspec` -- :class:`RaySpec`: how each accelerator family appears to Ray (resource,
  unit, visible variables, accelerator-type naming), declared by backends; :func:`ray_specs`.
"""

from __future__ import annotations

from .load import load_topology
from .rayspec import RaySpec, ray_accelerator_type, ray_node_resources, ray_specs, spec_for, tpu_ray_extras
from .registry import Backend, BackendInfo, backends, discover, get_backend, register_backend

__all__ = ["Backend", "BackendInfo", "RaySpec", "backends", "discover", "get_backend", "load_topology",
           "ray_accelerator_type", "ray_node_resources", "ray_specs", "register_backend", "spec_for",
           "tpu_ray_extras"]
