"""Public fakes for testing code that talks to accelerators, without them (httpx's ``MockTransport`` idea).

* :class:`~.fakenvml.FakeNVML` answers nvidia-ml-py's calls from a :class:`~rayaccel.topology.NodeTopology`
  (devices, links, NVLink fabric, MIG instances and their create/destroy rules) and injects health faults;
* :class:`~.fakeamdsmi.FakeAmdSmi` does the same for ``amdsmi``.

Pass one to a backend (``NvidiaBackend(nvml=FakeNVML(topo))``) or to a health probe. Importing this
package imports neither fake (~20 ms); each is fetched on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"FakeNVML": "rayaccel.testing.fakenvml", "FakeAmdSmi": "rayaccel.testing.fakeamdsmi"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rayaccel.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value
