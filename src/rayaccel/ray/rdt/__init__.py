"""The ``rayaccel`` tensor transport for Ray Direct Transport: the fastest path, chosen per consumer.

Ray code, unchanged but for the transport's name::

    @ray.remote(enable_tensor_transport=True)
    class Producer:
        @ray.method(tensor_transport="rayaccel")
        def weights(self):
            return self.model.state_dict()        # tensors stay in this actor

    ref = producer.weights.remote()
    consumer.load.remote(ref)                     # each consumer pulls over its own best path

The consumer pulls (one-sided) and the path is chosen when it fetches, from both
ends' devices and the node's topology (:func:`rayaccel.transfer.tensor_path`): CUDA
IPC on one node between GPUs with a peer path (NVLink, PCIe PIX/PXB) or on one GPU;
a shared-memory segment on one node otherwise (CPU tensors: one copy, mapped by
every consumer); NIXL (UCX) through the nearest NICs across nodes; Ray's object
store when nothing else can serve, with one warning line saying why.

Registration costs nothing until a process uses RDT: :func:`install` (called by the
worker hook and when ``rayaccel`` is imported in a driver) wraps the function every
RDT path calls first, and the transport registers itself there, importing torch as
Ray's own transports do. Ray sends a driver's registrations to every actor it
creates with ``enable_tensor_transport=True``.

Modules: :mod:`.transport` (the manager), :mod:`.shm` (segments), :mod:`.local`
(what an end knows of itself), :mod:`.telemetry` (bytes and seconds per path).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from .name import NAME

_UTIL = "ray.experimental.rdt.util"

_lock = threading.Lock()
_registered = False


def install() -> bool:
    """Make ``tensor_transport="rayaccel"`` known to Ray in this process (idempotent, microseconds).

    Never imports ``ray``: when Ray's RDT module is not imported yet, the wrap is done
    the moment it is (an import hook that removes itself).

    Returns:
        True when this call installed it (now or on Ray's import), False when it already was.
    """
    util = sys.modules.get(_UTIL)
    if util is not None:
        from .. import _ray_private as rp

        return rp.wrap_rdt_registration(util, _register)
    with _lock:
        if any(isinstance(f, _WhenImported) for f in sys.meta_path):
            return False
        sys.meta_path.insert(0, _WhenImported())
    return True


def _register() -> None:
    """Register the transport (first RDT use in this process; a cheap flag check after that)."""
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        from .. import _ray_private as rp

        util = sys.modules[_UTIL]
        if NAME.upper() not in rp.rdt_registered(util):
            try:
                import torch
            except ImportError:  # no torch: no tensors to move (Ray's own transports skip too)
                _registered = True
                return
            from .transport import RayaccelTransport

            util.register_tensor_transport(NAME, ["cpu", "cuda"], RayaccelTransport, torch.Tensor)
        _registered = True


class _WhenImported:
    """A ``sys.meta_path`` finder that finds nothing itself: when Ray's RDT module is imported,
    it wraps it once loaded, then leaves (duck-typed: ``importlib.abc`` costs an import)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _UTIL:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


class _Loader:
    """Ray's own loader, plus the wrap after the module ran."""

    def __init__(self, inner: Any):
        self._inner = inner

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        from .. import _ray_private as rp

        rp.wrap_rdt_registration(module, _register)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... for tracebacks and inspect
        return getattr(self._inner, name)


def stats() -> dict:
    """Per path, what this process received: ``bytes``, ``seconds``, ``objects``, ``last_reason``."""
    from .telemetry import stats as _stats

    return _stats()


def produced() -> int:
    """How many objects this process produced that Ray has not freed yet (0 when none leak)."""
    if not _registered:
        return 0
    from .transport import manager

    m = manager(create=False)
    return m.live_objects() if m is not None else 0
