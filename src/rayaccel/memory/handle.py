"""Handles: cheap, picklable references to objects in a :class:`~rayaccel.memory.Store`.

``STORES`` maps each open store's id to the store (weakly), so a handle being
pickled can ask its store for a shared export, and a handle arriving from
another store in the same process is resolved without copying through shared
memory.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from .buffers import Layout


class OpenStore(Protocol):
    """What handles and other stores of the process use of a :class:`~rayaccel.memory.Store`."""

    sharing: bool
    closed: bool

    def export(self, handle: "Handle") -> Any: ...

    def get(self, handle: "Handle", device: str | None = None) -> Any: ...


#: open stores of this process by id (weak: a store that is garbage collected drops out)
STORES: "weakref.WeakValueDictionary[str, OpenStore]" = weakref.WeakValueDictionary()


@dataclass(frozen=True, slots=True)
class Handle:
    """A reference to a stored object. Cheap, hashable, picklable.

    Pickled while its store has sharing enabled, a handle carries a
    :class:`~rayaccel.memory.share.SharedObject` so that a store in another
    process can fetch the object (see :meth:`Store.get`).

    Attributes:
        store_id: the owning store. key: the object's number in it.
        layout: kind, dtype, shape, nbytes. name: used in messages (``obj-<key>``).
        shared: the export, on handles that crossed a process boundary.
    """

    store_id: str
    key: int
    layout: Layout
    name: str
    shared: Any = None

    @property
    def nbytes(self) -> int:
        """Size of the object in bytes."""
        return self.layout.nbytes

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    def __reduce__(self):
        shared = self.shared
        store = STORES.get(self.store_id)
        if shared is None and store is not None and store.sharing:
            shared = store.export(self)
        return (Handle, (self.store_id, self.key, self.layout, self.name, shared))

