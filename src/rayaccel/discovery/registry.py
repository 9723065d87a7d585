"""The :class:`Backend` protocol and the registry of discovery backends.

Backends come from the entry-point group ``rayaccel.backends`` (the built-ins
``nvidia``, ``amd``, ``neuron``, ``tpu``, ``gaudi``, ``ascend`` and ``simulated`` are
declared there too, so they take the same path as any third-party plugin) and from
:func:`register_backend`. A backend may also declare how its accelerator appears to Ray
(an optional ``ray_spec`` attribute, see :mod:`.rayspec`).

A plugin is validated when it is loaded: a factory that cannot be imported,
raises, or returns an object that does not conform to :class:`Backend` (missing
or non-callable ``available``/``discover``, a ``name`` that is not the name it is
registered under) is turned into a :class:`~rayaccel.errors.PluginError` that
names the plugin and what is wrong. :func:`backends` keeps working when one
plugin is broken: the broken one is listed as an unavailable backend whose
``available()`` carries that error (``BackendInfo.broken``), and :func:`get_backend`
raises it.

A plugin is code rayaccel does not control, so every call into one is guarded: an
import that raises or calls ``sys.exit``, an ``available()`` that raises or returns
the wrong type, a ``discover()`` that raises or returns something other than a valid
:class:`~rayaccel.topology.NodeTopology`, each becomes a :class:`PluginError` naming
the plugin. One bad plugin degrades only itself: :func:`discover` without a backend
name skips it (with a :class:`PluginWarning` naming it) and goes on to the next one.
A plugin that *hangs* (an endless loop at import, in ``available()`` or ``discover()``)
is not timed out: Python cannot stop a thread, so that would need discovery in a
subprocess, which every ``topo`` command and node start would pay for.

Writing a plugin::

    # pyproject.toml of your package
    [project.entry-points."rayaccel.backends"]
    gaudi = "my_pkg.gaudi:GaudiBackend"

    # my_pkg/gaudi.py
    class GaudiBackend:
        name = "gaudi"
        def available(self) -> BackendInfo: ...
        def discover(self) -> NodeTopology: ...
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from .. import catalog
from ..errors import BackendError, BackendUnavailable, PluginError, RayaccelError
from ..topology import NodeTopology

#: Entry-point group that feeds the registry.
ENTRY_POINT_GROUP = "rayaccel.backends"
#: Hardware backends tried first, in this order, by :func:`discover` (GPUs, then the other
#: accelerators Ray knows: AWS Neuron, Google TPU, Intel Gaudi, Huawei Ascend).
HARDWARE_ORDER = ("nvidia", "amd", "neuron", "tpu", "gaudi", "ascend")
#: The backend that answers from a topology file or catalog name.
SIMULATED = "simulated"
#: Environment variable that makes :func:`discover` use the simulated backend.
TOPOLOGY_ENV = "RAYACCEL_TOPOLOGY"
#: What a plugin call may raise that is the plugin's fault (``sys.exit`` included); Ctrl-C still stops.
_PLUGIN_FAULTS = (Exception, SystemExit)
#: Longest reason or hint kept from a plugin's BackendInfo, characters.
_MAX_REASON = 500


class PluginWarning(UserWarning):
    """A backend was skipped by :func:`discover` because it is broken (the message names it)."""

__all__ = [
    "Backend",
    "BackendInfo",
    "ENTRY_POINT_GROUP",
    "PluginWarning",
    "backend_infos",
    "backends",
    "discover",
    "get_backend",
    "register_backend",
    "unregister_backend",
]


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """Whether a backend can run here, and if not, why and what to do.

    Attributes:
        name: the backend's registered name.
        available: True when :meth:`Backend.discover` can be expected to work.
        reason: why it is unavailable (None when available).
        hint: what to install or set to make it available (None when nothing helps).
        broken: True when the backend itself is at fault (a plugin that cannot be
            imported, does not conform, or whose ``available()`` raised), as opposed
            to a library or driver that is simply absent here.
    """

    name: str
    available: bool
    reason: str | None = None
    hint: str | None = None
    broken: bool = False


@runtime_checkable
class Backend(Protocol):
    """A source of :class:`~rayaccel.topology.NodeTopology` for this node.

    Implementations are plain classes with instance methods; they import their
    vendor library lazily (inside ``available``/``discover``), never at module
    import time.
    """

    name: str

    def available(self) -> BackendInfo:
        """Cheaply tell whether :meth:`discover` can work here. Never raises for a
        missing library or driver: that is ``BackendInfo(available=False, ...)``."""
        ...

    def discover(self) -> NodeTopology:
        """Describe this node's accelerators.

        Raises:
            BackendUnavailable: the library or driver is absent.
            BackendError: anything else went wrong (names the call and device).
        """
        ...


Factory = Callable[[], Any]


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    factory: Factory | str  # a callable, or "module:attr" loaded on first use
    origin: str  # "entry point my_pkg.x:Y" / "register_backend"


class _BrokenBackend:
    """Stands in for a plugin that failed validation, so it can still be listed."""

    def __init__(self, name: str, error: PluginError):
        self.name = name
        self.error = error

    def available(self) -> BackendInfo:
        return BackendInfo(self.name, False, str(self.error), "fix or uninstall the package that provides this plugin",
                           broken=True)

    def discover(self) -> NodeTopology:
        raise self.error

    def __repr__(self) -> str:
        return f"<broken backend {self.name!r}: {self.error}>"


_lock = threading.RLock()
_entries: dict[str, _Entry] = {}
_instances: dict[str, Any] = {}
_entry_points_loaded = False


def _entry_points() -> Iterable[Any]:
    """The installed ``rayaccel.backends`` entry points (a hook tests replace)."""
    return importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in _entry_points():
        # An explicit register_backend() wins over an entry point of the same name;
        # the same name declared twice (e.g. editable + regular install) keeps the first.
        if ep.name not in _entries:
            _entries[ep.name] = _Entry(ep.name, ep.value, f"entry point {ep.value}")


def register_backend(name: str, factory: Factory | str, clobber: bool = False) -> None:
    """Register a backend factory under ``name`` (fsspec-style).

    Args:
        name: the backend name (``[a-z0-9_-]+``), also what its instances' ``name`` must be.
        factory: a zero-argument callable returning a :class:`Backend` (usually the
            class), or a ``"module:attr"`` string imported on first use.
        clobber: replace an existing backend of that name instead of raising.

    Raises:
        PluginError: ``name`` is taken and ``clobber`` is False, ``name``/``factory``/``clobber``
            is malformed, or ``factory`` is a class without ``available``/``discover`` methods
            (anything else about the instance is checked when it is first created).
    """
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_" for c in name):
        raise PluginError(f"invalid backend name {name!r}: use letters, digits, '-' or '_'", backend=str(name))
    if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
        raise PluginError(f"factory must be callable or a 'module:attr' string, got {factory!r}", backend=name)
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        if not module.strip() or not attr.strip():
            raise PluginError(f"factory string {factory!r} must be 'module:attr' (e.g. 'my_pkg.gaudi:GaudiBackend')",
                              backend=name)
    if isinstance(factory, type):  # a class: its methods can be checked now, before any instance exists
        missing = [m for m in ("available", "discover") if not callable(getattr(factory, m, None))]
        if missing:
            raise PluginError(f"class {factory.__qualname__} does not conform to the Backend protocol: "
                              + "; ".join(f"missing method {m}()" for m in missing), backend=name)
    if not isinstance(clobber, bool):
        raise PluginError(f"clobber must be True or False, got {clobber!r}", backend=name)
    with _lock:
        _load_entry_points()
        if name in _entries and not clobber:
            raise PluginError(
                f"a backend named {name!r} is already registered ({_entries[name].origin}); "
                "pass clobber=True to replace it",
                backend=name,
            )
        _entries[name] = _Entry(name, factory, "register_backend")
        _instances.pop(name, None)


def unregister_backend(name: str) -> None:
    """Remove a backend (no error when absent). Mostly for tests."""
    with _lock:
        _load_entry_points()
        _entries.pop(name, None)
        _instances.pop(name, None)


def _reset() -> None:
    """Forget everything, so the next call reloads entry points (tests)."""
    global _entry_points_loaded
    with _lock:
        _entries.clear()
        _instances.clear()
        _entry_points_loaded = False


def _resolve(entry: _Entry) -> Factory:
    factory = entry.factory
    if callable(factory):
        return factory
    module, _, attr = factory.partition(":")
    try:
        obj: Any = importlib.import_module(module.strip())
        for part in attr.strip().split("."):
            obj = getattr(obj, part)
    except _PLUGIN_FAULTS as e:  # any failure to import a plugin (sys.exit too) is reported, typed, with its name
        raise PluginError(f"cannot import {factory!r} ({entry.origin}): {_describe(e)}", backend=entry.name) from e
    if not callable(obj):
        raise PluginError(f"{factory!r} is not callable (got {type(obj).__name__})", backend=entry.name)
    return obj


def _describe(e: BaseException) -> str:
    """``"ValueError: text"`` of a plugin's exception, kept to one short line."""
    if isinstance(e, SystemExit):
        return f"called sys.exit({e.code!r})"
    text = " ".join(str(e).split())
    if len(text) > _MAX_REASON:
        text = text[:_MAX_REASON - 1] + "…"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def validate_backend(obj: Any, name: str) -> Any:
    """Check that ``obj`` conforms to :class:`Backend` under ``name``; return it.

    Raises:
        PluginError: naming the plugin and every problem found.
    """
    try:
        return _validate(obj, name)
    except PluginError:
        raise
    except _PLUGIN_FAULTS as e:  # e.g. a 'name' property that raises
        raise PluginError(f"{type(obj).__name__} cannot be inspected: {_describe(e)}", backend=name) from e


def _validate(obj: Any, name: str) -> Any:
    problems = []
    for method in ("available", "discover"):
        if not hasattr(obj, method):
            problems.append(f"missing method {method}()")
        elif not callable(getattr(obj, method)):
            problems.append(f"{method} is not callable")
    if not hasattr(obj, "name"):
        problems.append("missing attribute 'name'")
    elif not isinstance(obj.name, str):
        problems.append(f"'name' must be a str, got {type(obj.name).__name__}")
    elif obj.name != name:
        problems.append(f"'name' is {obj.name!r} but it is registered as {name!r}")
    if not problems and not isinstance(obj, Backend):  # pragma: no cover - belt and braces
        problems.append("does not conform to rayaccel.discovery.Backend")
    if problems:
        raise PluginError(f"{type(obj).__name__} does not conform to the Backend protocol: " + "; ".join(problems), backend=name)
    return obj


def _instantiate(entry: _Entry) -> Any:
    factory = _resolve(entry)
    try:
        obj = factory()
    except RayaccelError:
        raise
    except _PLUGIN_FAULTS as e:  # a factory bug is the plugin's: report it with its name
        what = "raised" if not isinstance(e, SystemExit) else "failed:"
        raise PluginError(f"factory {getattr(factory, '__qualname__', factory)!r} {what} {_describe(e)}",
                          backend=entry.name) from e
    return validate_backend(obj, entry.name)


def _order(names: Iterable[str]) -> list[str]:
    builtin = [*HARDWARE_ORDER, SIMULATED]
    names = set(names)
    return [n for n in builtin if n in names] + sorted(names - set(builtin))


def _get(name: str) -> Any:
    """The instance for ``name``; a broken plugin becomes a :class:`_BrokenBackend`."""
    with _lock:
        _load_entry_points()
        if name in _instances:
            return _instances[name]
        entry = _entries.get(name)
        if entry is None:
            known = ", ".join(_order(_entries)) or "none"
            raise BackendError(f"unknown backend {name!r} (registered: {known})")
        try:
            inst = _instantiate(entry)
        except PluginError as e:
            inst = _BrokenBackend(name, e)
        _instances[name] = inst
        return inst


def get_backend(name: str) -> Backend:
    """The backend registered as ``name`` (instantiated once, then cached).

    Raises:
        BackendError: no backend of that name (lists the registered ones).
        PluginError: the plugin failed to load or does not conform.
    """
    inst = _get(name)
    if isinstance(inst, _BrokenBackend):
        raise inst.error
    return inst


def backends() -> dict[str, Backend]:
    """Every registered backend by name: built-ins first (:data:`HARDWARE_ORDER`, simulated), then plugins.

    A plugin that failed to load is included as a stand-in whose ``available()``
    reports the :class:`~rayaccel.errors.PluginError` and whose ``discover()`` raises it.
    """
    with _lock:
        _load_entry_points()
        names = _order(_entries)
    return {n: _get(n) for n in names}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = " ".join(str(value).split())
    return text if len(text) <= _MAX_REASON else text[:_MAX_REASON - 1] + "…"


def _info(backend: Any, name: str | None = None) -> BackendInfo:
    """``backend.available()``, with a misbehaving plugin reported (``broken=True``) rather than raised.

    The answer always carries the registered ``name`` and plain, bounded text fields.
    """
    name = name if name is not None else backend.name
    author = "report this to the plugin's author"
    try:
        info = backend.available()
    except BackendUnavailable as e:
        return BackendInfo(name, False, _text(e.reason), _text(e.hint) or None)
    except RayaccelError as e:
        return BackendInfo(name, False, _text(e), None, broken=isinstance(e, PluginError))
    except _PLUGIN_FAULTS as e:  # a plugin bug: report it as the reason, with its name
        return BackendInfo(name, False, f"available() raised {_describe(e)}", author, broken=True)
    if not isinstance(info, BackendInfo):
        return BackendInfo(name, False, f"available() returned {type(info).__name__}, expected BackendInfo", author,
                           broken=True)
    if info.name != name or not isinstance(info.available, bool) or not all(
            v is None or isinstance(v, str) for v in (info.reason, info.hint)):
        info = BackendInfo(name, bool(info.available), _text(info.reason), _text(info.hint), bool(info.broken))
    elif any(v is not None and len(v) > _MAX_REASON for v in (info.reason, info.hint)):
        info = BackendInfo(name, info.available, _text(info.reason), _text(info.hint), info.broken)
    return info


def backend_infos() -> list[BackendInfo]:
    """:class:`BackendInfo` of every registered backend, in :func:`backends` order (never raises for a plugin)."""
    return [_info(b, n) for n, b in backends().items()]


def _discover_with(name: str, backend: Any) -> NodeTopology:
    """``backend.discover()``, checked: a valid NodeTopology, or a typed error naming the backend.

    Raises:
        BackendUnavailable: as the backend raised it. BackendError, CatalogError, TopologyError,
            CaptureError: a RayaccelError the backend raised on purpose (passed on).
        PluginError: it raised anything else (``sys.exit`` included), or returned something
            that is not a valid NodeTopology.
    """
    try:
        topo = backend.discover()
    except RayaccelError:
        raise
    except _PLUGIN_FAULTS as e:
        raise PluginError(f"discover() raised {_describe(e)}", backend=name) from e
    if not isinstance(topo, NodeTopology):
        raise PluginError(f"discover() returned {type(topo).__name__}, expected a NodeTopology", backend=name)
    try:
        return topo.validate()
    except RayaccelError as e:
        raise PluginError(f"discover() returned an invalid topology: {e}", backend=name) from None
    except _PLUGIN_FAULTS as e:  # fields of the wrong type that validate() cannot even compare
        raise PluginError(f"discover() returned an invalid topology: {_describe(e)}", backend=name) from None


def _simulate_hint() -> str:
    try:
        example = getattr(catalog, "DEFAULT", None) or "dgx1-v100"
    except ImportError:
        example = "dgx1-v100"
    return f"set {TOPOLOGY_ENV}={example} (a catalog name, a topology JSON file or a capture file) to simulate a machine"


def discover(backend: str | None = None) -> NodeTopology:
    """Describe this node's accelerators.

    Args:
        backend: a backend name; None picks one: ``simulated`` when
            ``RAYACCEL_TOPOLOGY`` is set, else the first available hardware backend
            (:data:`HARDWARE_ORDER`, then plugins in name order).

    Raises:
        BackendUnavailable: no backend is available (lists each one's reason, and a hint).
        BackendError: the chosen backend failed, or ``backend`` is unknown.
    """
    if backend is not None:
        return _discover_with(backend, get_backend(backend))
    if os.environ.get(TOPOLOGY_ENV):
        return _discover_with(SIMULATED, get_backend(SIMULATED))
    reasons: list[tuple[str, str]] = []
    builtin = {*HARDWARE_ORDER, SIMULATED}
    for name, b in backends().items():
        if name == SIMULATED:
            continue
        info = _info(b, name)
        if not info.available:
            reasons.append((name, f"{info.reason}" + (f" ({info.hint})" if info.hint else "")))
            if info.broken:
                warnings.warn(f"backend {name!r} is broken and was skipped: {info.reason}", PluginWarning, stacklevel=2)
            continue
        try:
            return _discover_with(name, b)
        except BackendUnavailable as e:
            reasons.append((name, f"{e.reason}" + (f" ({e.hint})" if e.hint else "")))
        except RayaccelError as e:
            if name in builtin and not isinstance(e, PluginError):
                raise  # a built-in that fails on real hardware is an answer, not something to skip
            reasons.append((name, str(e)))
            warnings.warn(f"backend {name!r} failed and was skipped: {e}", PluginWarning, stacklevel=2)
    raise BackendUnavailable("auto", "no accelerator backend is available here: "
                             + "; ".join(f"{n}: {r}" for n, r in reasons), _simulate_hint(), reasons=tuple(reasons))
