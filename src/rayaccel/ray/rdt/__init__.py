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

Modules: :mod:`.transport` (the manager), :mod:`.shm` (segments), :mod:`.pool` (segments
reused across a producer's objects), :mod:`.maps` (a consumer's mappings kept between objects), :mod:`.local`
(what an end knows of itself), :mod:`.telemetry` (bytes and seconds per path).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from .name import NAME

_lock = threading.Lock()
_registered = False
_installed = False


def install() -> bool:
    """Make ``tensor_transport="rayaccel"`` known to Ray in this process (idempotent, microseconds).

    Never imports ``ray``: the modules where Ray checks a transport's name
    (:data:`~rayaccel.ray._ray_private.RDT_NAME_MODULES`, one per release range) are adopted
    when they are imported already, else the moment they are (an import hook that removes
    itself once the release's module is seen). On Ray < 2.56 the name means Ray's object
    store, with one warning at first use (:func:`~rayaccel.ray._ray_private.adopt_rdt_module`).

    Returns:
        True when this call installed it (now or on Ray's import), False when it already was.
    """
    global _installed
    from .. import _ray_private as rp  # imports no ray

    with _lock:
        if _installed:
            return False
        _installed = True
    for name in rp.RDT_NAME_MODULES:
        module = sys.modules.get(name)
        if module is not None and rp.adopt_rdt_module(module, NAME, _register):
            return True
    with _lock:
        if not any(isinstance(f, _WhenImported) for f in sys.meta_path):
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

        util = sys.modules[rp.RDT_UTIL]
        if NAME.upper() not in rp.rdt_registered(util):
            try:
                import torch
            except ImportError:  # no torch: no tensors to move (Ray's own transports skip too)
                _registered = True
                rp._warn_once("rayaccel tensor transport: torch", "tensor_transport='rayaccel' is not registered: torch is "
                              "not installed in this process (pip install torch), so Ray will call the name invalid")
                return
            from .transport import RayaccelTransport

            util.register_tensor_transport(NAME, ["cpu", "cuda"], RayaccelTransport, torch.Tensor)
        _registered = True


class _WhenImported:
    """A ``sys.meta_path`` finder that finds nothing itself: when one of the modules where Ray checks a
    transport's name is imported, it adopts it once loaded; it leaves once the release's module is seen
    (duck-typed: ``importlib.abc`` costs an import)."""

    def __init__(self) -> None:
        from .. import _ray_private as rp

        self._names = frozenset(rp.RDT_NAME_MODULES)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self._names:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, self)
        return spec


class _Loader:
    """Ray's own loader, plus the adoption after the module ran."""

    def __init__(self, inner: Any, finder: _WhenImported):
        self._inner = inner
        self._finder = finder

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        from .. import _ray_private as rp

        if rp.adopt_rdt_module(module, NAME, _register):
            try:
                sys.meta_path.remove(self._finder)
            except ValueError:
                pass

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


def pooled() -> int:
    """How many segments of freed objects this process keeps for its later objects (:mod:`.pool`)."""
    if not _registered:
        return 0
    from .transport import manager

    m = manager(create=False)
    return sum(m.pool.stats().free.values()) if m is not None else 0
