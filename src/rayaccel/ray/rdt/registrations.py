"""NIXL registrations held for as long as a tensor's memory lives, not for one object (:class:`Registrations`).

Ray's NIXL manager registers a tensor's storage when an object holding it is prepared and
deregisters it when the last such object is freed. A trainer that returns its weights
every step, each object freed before the next is made, so registers and deregisters the
same memory every step -- and every deregistration bumps the agent's metadata version, so
each remote consumer drops and re-adds the producer's agent too.

Here a storage registered once stays registered while it lives: one extra count on Ray's
own registration (``register_nixl_memory``), keyed by the storage's address and size and
checked against a weak reference to the storage itself (``StorageWeakRef``: a new storage
at a freed one's address is another storage). When the storage is freed, the next
:meth:`Registrations.sweep` (run before every preparation and when an object is freed)
gives the count back (``deregister_nixl_memory``), before Ray could mistake a new storage
at that address for the registered one. Strided tensors' contiguous copies are made per
object and are not held.

Ray's ``deregister_nixl_memory`` reads only ``tensor.untyped_storage().data_ptr()``: once
the storage is gone, :class:`_AtAddress` stands in for it (Ray 2.60's NIXL manager).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence


class _AtAddress:
    """What Ray's NIXL manager reads of a tensor to find its registration: the storage's address."""

    def __init__(self, data_ptr: int) -> None:
        self._ptr = data_ptr

    def untyped_storage(self) -> "_AtAddress":
        return self

    def data_ptr(self) -> int:
        return self._ptr


class Registrations:
    """The storages this process keeps registered with NIXL. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[int, int], Any] = {}  # (address, bytes) -> StorageWeakRef

    def hold(self, mgr: Any, tensors: Sequence[Any]) -> int:
        """Keep the registrations of ``tensors``' storages (registered by ``mgr`` just now) past their object.

        Args:
            mgr: Ray's NIXL manager (``register_nixl_memory``, ``deregister_nixl_memory``).
            tensors: the tensors themselves, not per-object copies.

        Returns:
            How many storages were newly held (0 when all were already: no registration this step).
        """
        from torch.multiprocessing.reductions import StorageWeakRef

        new = 0
        for t in tensors:
            st = t.untyped_storage()
            key = (st.data_ptr(), st.nbytes())
            if not key[1]:
                continue
            with self._lock:
                ref = self._held.get(key)
                if ref is not None and not ref.expired() and ref.cdata == st._cdata:
                    continue
            mgr.register_nixl_memory(t)  # one more count on Ray's registration: not dropped with the object
            with self._lock:
                self._held[key] = StorageWeakRef(st)
            new += 1
        return new

    def sweep(self, mgr: Any) -> int:
        """Give back the registrations of storages freed since; how many."""
        with self._lock:
            gone = [key for key, ref in self._held.items() if ref.expired()]
            for key in gone:
                del self._held[key]
        for ptr, _ in gone:
            mgr.deregister_nixl_memory(_AtAddress(ptr))
        return len(gone)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)
