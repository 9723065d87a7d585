"""The one error tree of rayaccel.

Every error rayaccel raises on purpose derives from :class:`RayaccelError`, so a
caller can catch them all at once; each carries the context a person needs
(the field, the file and line, the backend, the object)::

    RayaccelError
    ├── TopologyError                  a topology file or value is invalid (names the field)
    ├── CaptureError                   a text capture cannot be read (names file, line, what was expected)
    ├── CatalogError                   unknown catalog name (lists close names)
    ├── BackendError                   a discovery backend failed
    │   ├── BackendUnavailable         its library/driver is missing (reason + hint)
    │   └── PluginError                a plugin does not conform (names the plugin)
    ├── RequestError                   an invalid placement request (names the field and allowed values)
    ├── OutputPathError                a picture or result cannot be written where asked (names the path, why)
    ├── ClusterError                   the Ray layer cannot do what was asked
    │   └── Unsatisfiable              a request no node can ever meet (fails fast)
    ├── StateError                     a node's arbiter state, table or published snapshot is malformed (names the field)
    ├── StoreError                     the tiered memory store
    │   ├── CorruptObject              a spill file failed its checksum or is truncated
    │   ├── StoreFull                  no tier has room (nothing is lost)
    │   └── UnknownObject              a handle that is not (or no longer) in the store
    └── TransportError                 the ``rayaccel`` tensor transport cannot deliver an object (names it, why)
        └── TransportUnavailable       a library a path needs is missing (names it and what to install)

An unsatisfiable placement on the current free state is *not* an error: it is a
:class:`rayaccel.placement.Rejection` with reasons.
"""

from __future__ import annotations


class RayaccelError(Exception):
    """Base class of every error rayaccel raises on purpose."""


class TopologyError(RayaccelError, ValueError):
    """A topology (JSON or value) is invalid.

    Attributes:
        field: dotted path of the bad field, e.g. ``devices[3].numa_node``.
    """

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


#: Longest capture-error message kept whole; longer ones keep their head and tail.
MAX_MESSAGE = 600


class CaptureError(RayaccelError, ValueError):
    """A text capture could not be imported.

    Attributes:
        path: the file (or ``<text>``), line: 1-based line number or None.
    """

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        self.path = path
        self.line = line
        where = path or "<text>"
        if line is not None:
            where += f", line {line}"
        if len(message) > MAX_MESSAGE:  # a damaged capture must not echo a whole 4,000-character row
            half = MAX_MESSAGE // 2
            message = f"{message[:half]}…{message[-half:]}"
        super().__init__(f"{where}: {message}")


class CatalogError(RayaccelError, KeyError):
    """An unknown catalog name."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class BackendError(RayaccelError):
    """A discovery backend failed for a reason other than a missing library."""

    def __init__(self, message: str, backend: str | None = None):
        self.backend = backend
        super().__init__(f"backend {backend!r}: {message}" if backend else message)


class BackendUnavailable(BackendError):
    """A backend cannot run here: its library or driver is absent.

    Attributes:
        reason: what is missing. hint: what to install or set.
        reasons: for automatic discovery (backend ``"auto"``), ``(backend, reason)`` of
            every backend that was tried; empty otherwise.
    """

    def __init__(self, backend: str, reason: str, hint: str = "", reasons: tuple[tuple[str, str], ...] = ()):
        self.reason = reason
        self.hint = hint
        self.reasons = tuple(reasons)
        msg = f"unavailable: {reason}" + (f" (hint: {hint})" if hint else "")
        super().__init__(msg, backend=backend)


class PluginError(BackendError):
    """A plugin registered under ``rayaccel.backends`` does not conform."""


class RequestError(RayaccelError, ValueError):
    """An invalid placement request.

    Attributes:
        field: the request field, allowed: a description of allowed values.
    """

    def __init__(self, message: str, field: str | None = None, allowed: str | None = None):
        self.field = field
        self.allowed = allowed
        text = f"{field}: {message}" if field else message
        if allowed:
            text += f" (allowed: {allowed})"
        super().__init__(text)


class OutputPathError(RayaccelError, ValueError):
    """An output file or folder cannot be written where asked (checked before any work).

    Attributes:
        path: the path as given.
    """

    def __init__(self, message: str, path: object = None):
        self.path = path
        super().__init__(message)


class ClusterError(RayaccelError):
    """The Ray layer cannot do what was asked."""


class Unsatisfiable(ClusterError):
    """A request that no node of the cluster can ever meet; raised at once."""


class StoreError(RayaccelError):
    """Base of the tiered memory store's errors."""


class CorruptObject(StoreError):
    """A spilled object failed its checksum or was truncated on restore."""

    def __init__(self, message: str, key: object = None):
        self.key = key
        super().__init__(message)


class StoreFull(StoreError):
    """No tier has room for an object; nothing already stored was lost."""


class UnknownObject(StoreError, KeyError):
    """A handle that is not (or no longer) in the store."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StateError(RayaccelError, ValueError):
    """A node's arbiter state file, node table or published snapshot does not have the shape it must.

    Attributes:
        field: dotted path of the bad field (or where the data came from), or None.
    """

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class TransportError(RayaccelError):
    """The ``rayaccel`` tensor transport (Ray Direct Transport) cannot deliver an object.

    Attributes:
        object: which object (and for whom), as the message names it; None when unknown.
    """

    def __init__(self, message: str, object: str | None = None):
        self.object = object
        super().__init__(message)

    def __reduce__(self):  # travels between Ray processes (a consumer's failed receive)
        return (type(self), (self.args[0], self.object))


class TransportUnavailable(TransportError):
    """A library the chosen path needs (NIXL, torch) is missing where it must run; the message says what to install."""
