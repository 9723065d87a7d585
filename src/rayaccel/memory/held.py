"""Objects a producer holds for its readers, under a device budget: LRU spilling through the tiered store.

A producer of the ``rayaccel`` tensor transport keeps every object it returned in its own
memory until the last consumer is done (Ray Direct Transport's contract). Unbounded, a
producer that runs ahead of its consumers runs out of device memory. :class:`HeldObjects`
counts those objects against a budget; beyond it the least recently used ones that nobody
is reading move to (pinned) host memory and then disk through a :class:`~.store.Store` of
their own (its device tier *is* the budget: the store's LRU, checksummed spill files and
throughput counters serve as they do for ``store.put``), and come back, bit-identical, when
a reader asks for them::

    held = HeldObjects(budget_bytes=8 << 30, swap=swap)   # swap(obj_id, tensors): who else references them
    held.add("obj-1", tensors)                              # may spill older objects
    with held.reading("obj-1") as ts: ...                   # restored and pinned while read
    held.keep("obj-1")                                      # never moved again (mapped by a reader)
    held.drop("obj-1")                                      # the producer freed it
    held.stats()                                            # held / spilled bytes, moves, GB/s

``swap(obj_id, tensors)`` is told the object's current tensors at every move: the restored
ones, or meta-device placeholders of the same shapes and dtypes while it is spilled (so the
producer's other references -- Ray's store of RDT objects -- let go of the device memory).
A tensor the producer's own code still references elsewhere keeps its memory: the bytes are
moved and accounted, the memory is freed when that reference goes.

Which tensors may be moved: contiguous, dense tensors on the store's device (CUDA; CPU
tensors stand in for device ones where no GPU is in use, the store's simulated device tier).
Any other object is held as it is and counted under ``unspillable_bytes``.

Thread safety: the store's lock guards both (the store calls back under it).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ..errors import StoreError
from .buffers import is_torch
from .store import Handle, Store

Swap = Callable[[str, list], None]


@dataclass(eq=False)
class _Held:
    obj_id: str
    nbytes: int
    handles: list  # one per tensor; empty when unspillable
    spec: list  # (shape, dtype) per tensor
    readers: int = 0
    kept: bool = False
    spilled: set = field(default_factory=set)  # indices of tensors off the device tier
    last: float = 0.0


class HeldObjects:
    """A producer's held objects under a device budget (see the module docstring).

    Args:
        budget_bytes: device memory the held objects may take (bytes, ``"8GiB"``).
        host_bytes: the pinned host tier's budget; beyond it objects go to disk.
        swap: told an object's current tensors after each move (None: nobody else references them).
        store: the store to use (tests); default: a new one (``device=None``: CUDA when torch sees a
            GPU, else the simulated device tier) with ``spill_dir`` / ``disk_bytes``.

    Raises:
        RequestError: a size that cannot be read. StoreError: as :class:`~.store.Store`.
    """

    def __init__(self, budget_bytes: int | str, host_bytes: int | str = 4 << 30, *, swap: Swap | None = None,
                 spill_dir: str | None = None, disk_bytes: int | str | None = None, device: str | None = None,
                 store: Store | None = None):
        self.store = store or Store(budget_bytes, host_bytes, spill_dir, disk_bytes, device=device)
        if store is not None:
            store.set_budget("device", budget_bytes)
        self.swap = swap
        self._lock = self.store._lock  # one lock: the store calls back under it (no order to get wrong)
        self._objects: OrderedDict[str, _Held] = OrderedDict()
        self._by_key: dict[int, tuple[_Held, int]] = {}
        self._unspillable = 0
        self.store.on_move = self._moved

    # ------------------------------------------------------------------ public
    def add(self, obj_id: str, tensors: list) -> bool:
        """Hold ``tensors`` as object ``obj_id`` (may spill least recently used others). True when it may move.

        Raises:
            StoreError: ``obj_id`` is held already.
        """
        with self._lock:
            if obj_id in self._objects:
                raise StoreError(f"object {obj_id} is held already")
            nbytes = sum(_nbytes(t) for t in tensors)
            h = _Held(obj_id, nbytes, [], [(tuple(t.shape), t.dtype) for t in tensors], last=time.monotonic())
            self._objects[obj_id] = h
            if not tensors or not all(self._movable(t) for t in tensors):
                self._unspillable += nbytes
                return False
            h.readers += 1  # not moved while being put
            try:
                for i, t in enumerate(tensors):
                    handle = self.store.put(t, name=f"{obj_id[:16]}/{i}")
                    h.handles.append(handle)
                    self._by_key[handle.key] = (h, i)
                    if self.store.tier(handle) != "device":  # larger than the budget: went straight down
                        h.spilled.add(i)
            except BaseException:
                self._forget(h)
                self._unspillable += nbytes
                return False
            finally:
                h.readers -= 1
            if h.spilled:
                self._swap(h)
            return True

    @contextmanager
    def reading(self, obj_id: str) -> Iterator[list | None]:
        """Restore ``obj_id`` to the device and keep it there for the block; yields its tensors.

        Yields None for an object this holder does not know (or holds as it is): the caller uses its own.
        """
        with self._lock:
            h = self._objects.get(obj_id)
            if h is None or not h.handles:
                pass
            else:
                h.readers += 1
                self._objects.move_to_end(obj_id)
                h.last = time.monotonic()
        if h is None or not h.handles:
            yield None
            return
        try:
            with ExitStack() as pins:
                was = set(h.spilled)
                tensors = [pins.enter_context(self.store.pinned(x)) for x in h.handles]
                with self._lock:
                    h.spilled.clear()
                    if was:
                        self._swap(h, tensors)
                yield tensors
        finally:
            with self._lock:
                h.readers -= 1

    def keep(self, obj_id: str) -> None:
        """Never move ``obj_id`` again (a reader maps its memory directly, e.g. through CUDA IPC)."""
        with self._lock:
            h = self._objects.get(obj_id)
            if h is not None:
                h.kept = True
                for x in h.handles:
                    self.store._entry(x, imports=False).pins += 1  # a pin that lasts until drop

    def drop(self, obj_id: str) -> None:
        """The producer freed ``obj_id``: forget it (its store copies go). Idempotent."""
        with self._lock:
            h = self._objects.pop(obj_id, None)
            if h is None:
                return
            if not h.handles:
                self._unspillable -= h.nbytes
                return
            self._forget(h)

    def spilled(self, obj_id: str) -> bool:
        """Is any of ``obj_id``'s tensors off the device now?"""
        with self._lock:
            h = self._objects.get(obj_id)
            return bool(h and h.spilled)

    def stats(self) -> dict[str, Any]:
        """``objects``, ``held_bytes`` (all), ``device_bytes`` (resident, movable), ``host_bytes`` /
        ``disk_bytes`` (spilled there), ``unspillable_bytes``, ``budget_bytes``, and the store's
        ``spills``, ``restores``, ``moved_bytes`` and ``bandwidth_gbps`` per direction."""
        with self._lock:
            st = self.store.stats()
            return {"objects": len(self._objects), "held_bytes": sum(h.nbytes for h in self._objects.values()),
                    "device_bytes": st["device_bytes"], "host_bytes": st["host_bytes"], "disk_bytes": st["disk_bytes"],
                    "spilled_bytes": st["host_bytes"] + st["disk_bytes"], "unspillable_bytes": self._unspillable,
                    "budget_bytes": st["device_budget_bytes"], "backend": st["backend"],
                    **{k: st[k] for k in ("spills", "restores", "moved_bytes", "bandwidth_gbps") if k in st}}

    def close(self) -> None:
        with self._lock:
            self._objects.clear()
            self._by_key.clear()
            self.store.close()

    # ---------------------------------------------------------------- internals
    def _movable(self, t: Any) -> bool:
        if not is_torch(t) or str(t.layout) != "torch.strided" or not t.is_contiguous():
            return False
        if self.store.backend == "cuda":
            return t.device.type == "cuda" and str(t.device) == self.store._backend.device
        return t.device.type == "cpu"  # the simulated device tier: CPU tensors stand in for device ones

    def _moved(self, key: int, src: str, dst: str) -> None:
        """The store moved one tensor (called under the store's lock)."""
        with self._lock:
            got = self._by_key.get(key)
            if got is None:
                return
            h, i = got
            if dst == "device":
                return  # the reader that restored it swaps the tensors back in (reading())
            if src == "device":
                first = not h.spilled
                h.spilled.add(i)
                if first or len(h.spilled) == len(h.handles):
                    self._swap(h)

    def _swap(self, h: _Held, tensors: list | None = None) -> None:
        if self.swap is None:
            return
        if tensors is None:
            tensors = [_placeholder(shape, dtype) for shape, dtype in h.spec]
        self.swap(h.obj_id, tensors)

    def _forget(self, h: _Held) -> None:
        for x in h.handles:
            self._by_key.pop(x.key, None)
            try:
                e = self.store._entry(x, imports=False)
                e.pins = 0
                self.store.delete(x)
            except StoreError:
                pass
        h.handles = []


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size()) if is_torch(t) else int(getattr(t, "nbytes", 0))


def _placeholder(shape: tuple, dtype: Any) -> Any:
    """A tensor of ``shape`` and ``dtype`` that holds no memory (the meta device)."""
    import torch  # only ever called with torch tensors held

    return torch.empty(shape, dtype=dtype, device="meta")


__all__ = ["HeldObjects", "Handle"]
