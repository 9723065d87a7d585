"""The tiered store: device -> (pinned) host -> disk, with LRU spilling and transparent restore.

Contract (other code relies on it)::

    store = Store(device_bytes="1GiB", host_bytes="4GiB", spill_dir="/scratch", disk_bytes=None)
    h = store.put(tensor)            # -> Handle (reference count 1)
    x = store.get(h)                 # bit-identical; restored to the device tier if spilled
    with store.pinned(h) as x: ...   # resident on the device tier, never spilled meanwhile
    store.retain(h); store.release(h)  # reference counting; the object goes at count 0
    store.delete(h)                  # drop now, whatever the count
    store.stats()                    # spills, restores, bytes per tier, bytes moved, GB/s
    store.close()                    # idempotent; also a context manager

Placement: ``put`` stores on the highest tier that can make room (evicting
least-recently-used unpinned objects down one tier, recursively); an object
larger than a tier's budget skips it. A put that fits nowhere raises
:class:`~rayaccel.errors.StoreFull` and stores nothing. Every move of one
object is all-or-nothing: a full disk leaves the object where it was.

Zero-copy: on the device tier the store keeps the caller's tensor (``put``
does not copy it) and ``get`` returns a view of it; treat both as read-only,
like Ray's GPU objects.

Thread safety: one re-entrant lock guards all state; concurrent ``put``/``get``
from threads are serialized.
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import CorruptObject, StoreError, StoreFull, UnknownObject
from ..units import parse_bytes
from . import share as _share
from .buffers import CudaBackend, Layout, cpu_bytes, describe, from_cpu_bytes, make_backend, to_device
from .owners import owner_tag, sweep
from .spill import DEFAULT_CHUNK_BYTES, SpillRecord, read_spill, remove_later, write_spill
from .stats import Transfers

TIERS = ("device", "host", "disk")
_STORES: "weakref.WeakValueDictionary[str, Store]" = weakref.WeakValueDictionary()


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
        store = _STORES.get(self.store_id)
        if shared is None and store is not None and store.sharing:
            shared = store.export(self)
        return (Handle, (self.store_id, self.key, self.layout, self.name, shared))


@dataclass(slots=True, eq=False)
class _Entry:
    key: int
    name: str
    layout: Layout
    tier: str
    data: Any = None  # device tier: backend bytes; host tier: uint8 CPU buffer; disk: None
    pooled: bool = False  # data came from a buffer pool (may go back to it)
    record: SpillRecord | None = None
    refs: int = 1
    pins: int = 0
    lost: str | None = None


def _cleanup(spill_dir: Path, segments: dict) -> None:
    for shm in list(segments.values()):
        _share.close_segment(shm)
    segments.clear()
    shutil.rmtree(spill_dir, ignore_errors=True)


class Store:
    """A tiered object store for tensors and arrays; see the module docstring.

    Args:
        device_bytes: device-tier budget: bytes, a size string (``"64MiB"``), or
            a fraction ``0 < f <= 1`` of the GPU's memory (GPU only).
        host_bytes: host-tier budget (pinned memory on a GPU machine).
        spill_dir: directory under which this store makes its own spill directory
            (default: the system temp dir). disk_bytes: disk budget; None = the disk's size.
        device: None (CUDA when torch sees a GPU, else a simulated CPU device tier),
            ``"cpu"`` (force simulation) or ``"cuda:<i>"``.
        chunk_bytes: spill-file chunk size. node_id: identity used for sharing
            (default: hostname + boot id). share: pickle handles as shared exports.

    Raises:
        RequestError: a size that cannot be read. StoreError: a fraction without a
            GPU, or an unknown device.
    """

    def __init__(self, device_bytes: int | float | str, host_bytes: int | str, spill_dir: str | Path | None = None,
                 disk_bytes: int | str | None = None, *, device: str | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, node_id: str | None = None, share: bool = False):
        self._backend = make_backend(device)
        self.budgets: dict[str, int | None] = {
            "device": self._device_budget(device_bytes),
            "host": parse_bytes(host_bytes, "host_bytes"),
            "disk": None if disk_bytes is None else parse_bytes(disk_bytes, "disk_bytes"),
        }
        if not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
            raise StoreError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
        self.chunk_bytes = chunk_bytes
        root = Path(spill_dir) if spill_dir is not None else Path(tempfile.gettempdir()) / "rayaccel-spill"
        root.mkdir(parents=True, exist_ok=True)
        sweep(root)
        self.spill_dir = root / f"rayaccel-{owner_tag()}-{secrets.token_hex(4)}"
        self.spill_dir.mkdir()
        self.id = uuid.uuid4().hex
        self.node_id = node_id or _share.local_node_id()
        self.sharing = share
        #: hook the Ray layer sets: fetch a cross-node export's bytes (flat uint8 CPU array)
        self.remote_fetch: Callable[[Any, str], np.ndarray] | None = None
        #: hook the Ray layer sets: add a cross-node fallback to an export
        self.export_hook: Callable[[Any, np.ndarray | None], Any] | None = None
        self._entries: dict[int, _Entry] = {}
        self._lru: dict[str, OrderedDict[int, _Entry]] = {t: OrderedDict() for t in TIERS}
        self._used = dict.fromkeys(TIERS, 0)
        self._lock = threading.RLock()
        self._keys = itertools.count(1)
        self._transfers = Transfers()
        self._exports: dict[int, _share.SharedObject] = {}
        self._segments: dict[int, Any] = {}
        self._imports: dict[tuple[str, int], int] = {}
        self._closed = False
        self._spill_seq = 0
        self._finalizer = weakref.finalize(self, _cleanup, self.spill_dir, self._segments)
        _STORES[self.id] = self

    def _device_budget(self, value: int | float | str) -> int:
        if isinstance(value, float) and 0 < value <= 1:
            if not isinstance(self._backend, CudaBackend):
                raise StoreError(f"device_bytes={value} is a fraction of the GPU's memory, but no GPU is in use; "
                                 "give bytes (e.g. '512MiB') for the simulated device tier")
            total = self._backend.torch.cuda.mem_get_info(self._backend.device)[1]
            return int(total * value)
        return parse_bytes(value, "device_bytes")

    # ------------------------------------------------------------------ public
    @property
    def backend(self) -> str:
        """``"cuda"`` (real device memory, pinned host tier) or ``"simulated"``."""
        return self._backend.name

    def put(self, obj: Any, *, name: str | None = None) -> Handle:
        """Store a numpy array or torch tensor; return its handle (reference count 1).

        Raises:
            UnsupportedObject: not an array/tensor. StoreFull: no tier can hold it
                (nothing is stored, nothing already stored is lost). StoreError: closed.
        """
        layout = describe(obj)
        with self._lock:
            self._check_open()
            key = next(self._keys)
            e = _Entry(key=key, name=name or f"obj-{key}", layout=layout, tier="")
            tier = self._place(e)
            if tier == "device":
                e.data, e.pooled = self._backend.to_device_data(obj, layout)
            elif tier == "host":
                e.data, e.pooled = self._backend.host_alloc(layout.nbytes), True
                self._copy_in(e.data, obj)
            else:
                e.record = write_spill(self._spill_path(e), memoryview(self._cpu_bytes_of(obj)),
                                       self._meta(e), self.chunk_bytes)
            e.tier = tier
            self._entries[key] = e
            self._account(e, tier, +1)
            return Handle(self.id, key, layout, e.name)

    def get(self, handle: Handle, device: str | None = None) -> Any:
        """The object, bit-identical, restored to the device tier if it was spilled.

        Args:
            handle: from :meth:`put` (or a pickled handle from another process).
            device: None (where the device tier keeps it; numpy arrays come back as
                numpy arrays), or ``"cpu"`` / ``"cuda:<i>"`` to move it there.

        When the device tier cannot make room (everything pinned, or the object is
        larger than its budget), a copy is returned from the tier holding it.

        Raises:
            UnknownObject: deleted or never stored. CorruptObject: its spill file
                failed verification; the object is lost. StoreError: closed.
        """
        with self._lock:
            self._check_open()
            e = self._entry(handle)
            if e.tier != "device":
                try:
                    self._move(e, "device")
                except StoreFull:
                    return self._transient(e, device)
            self._lru["device"].move_to_end(e.key)
            return self._backend.materialize(e.data, e.layout, device)

    def delete(self, handle: Handle) -> None:
        """Remove the object now, whatever its reference count (spill file and exports too).

        Raises:
            UnknownObject: not in the store. StoreError: the object is pinned.
        """
        with self._lock:
            e = self._entry(handle, imports=False)
            if e.pins:
                raise StoreError(f"object {e.name} is pinned; leave the pinned() block before deleting it")
            self._drop(e)

    def retain(self, handle: Handle) -> Handle:
        """Add a reference; return the handle. Raises UnknownObject."""
        with self._lock:
            self._entry(handle, imports=False).refs += 1
            return handle

    def release(self, handle: Handle) -> int:
        """Drop a reference; the object is deleted when none remain. Returns the remaining count."""
        with self._lock:
            e = self._entry(handle, imports=False)
            e.refs -= 1
            if e.refs <= 0 and not e.pins:
                self._drop(e)
                return 0
            return e.refs

    def refcount(self, handle: Handle) -> int:
        """Current reference count. Raises UnknownObject."""
        with self._lock:
            return self._entry(handle, imports=False).refs

    def tier(self, handle: Handle) -> str:
        """``"device"``, ``"host"`` or ``"disk"``: where the object is now. Raises UnknownObject."""
        with self._lock:
            e = self._entry(handle, imports=False)
            if e.lost:
                raise CorruptObject(e.lost, key=e.name)
            return e.tier

    def __contains__(self, handle: object) -> bool:
        return isinstance(handle, Handle) and handle.store_id == self.id and handle.key in self._entries

    @contextmanager
    def pinned(self, handle: Handle) -> Iterator[Any]:
        """Keep the object on the device tier for the block; yields it (a device-tier view).

        A spilled object is restored first. Nestable; a pinned object is never spilled.

        Raises:
            StoreFull: the device tier cannot make room for it.
        """
        with self._lock:
            self._check_open()
            e = self._entry(handle)
            if e.tier != "device":
                self._move(e, "device")
            e.pins += 1
            obj = self._backend.materialize(e.data, e.layout, None)
        try:
            yield obj
        finally:
            with self._lock:
                e.pins -= 1

    def spill(self, handle: Handle, to: str = "host") -> None:
        """Move an object down to ``to`` (``"host"`` or ``"disk"``) now; no-op if already there or below.

        Raises:
            StoreError: pinned, or a bad tier. StoreFull: the target has no room (nothing moves).
        """
        if to not in ("host", "disk"):
            raise StoreError(f"cannot spill to {to!r}; use 'host' or 'disk'")
        with self._lock:
            e = self._entry(handle)
            if e.pins:
                raise StoreError(f"object {e.name} is pinned and cannot be spilled")
            if TIERS.index(e.tier) < TIERS.index(to):
                if to == "host" and e.layout.nbytes > self.budgets["host"]:
                    raise StoreFull(f"object {e.name} ({e.layout.nbytes} bytes) exceeds the host budget")
                if not self._make_room(to, e.layout.nbytes, e):
                    raise StoreFull(f"no room on the {to} tier for {e.name} ({e.layout.nbytes} bytes)")
                self._move(e, to)

    def set_budget(self, tier: str, nbytes: int | str) -> None:
        """Change the budget of ``"device"`` or ``"host"``; spills LRU objects down to fit.

        Raises:
            StoreError: a bad tier. StoreFull: pinned objects keep the tier above the
                new budget (the budget is left unchanged).
        """
        if tier not in ("device", "host"):
            raise StoreError(f"cannot set the budget of {tier!r}; use 'device' or 'host'")
        new = parse_bytes(nbytes, f"{tier}_bytes")
        with self._lock:
            old = self.budgets[tier]
            self.budgets[tier] = new
            try:
                if self._used[tier] > new and not self._make_room(tier, 0, None):
                    raise StoreFull(f"pinned objects hold {self._used[tier]} bytes on the {tier} tier, "
                                    f"more than the new budget {new}")
            except StoreFull:
                self.budgets[tier] = old
                raise

    def prefetch(self, handle: Handle) -> None:
        """Restore an object to the device tier now (as ``get`` would, without returning it)."""
        with self._lock:
            e = self._entry(handle)
            if e.tier != "device":
                self._move(e, "device")

    def stats(self) -> dict[str, Any]:
        """Counters: ``spills``, ``restores``, ``lost``, ``device_bytes``/``host_bytes``/``disk_bytes``
        (bytes held per tier), ``objects``, ``pinned``, budgets, ``moved_bytes`` and
        ``bandwidth_gbps`` per direction (e.g. ``"device->host"``), ``backend``."""
        with self._lock:
            return {
                "backend": self.backend,
                "objects": sum(1 for e in self._entries.values() if not e.lost),
                "pinned": sum(1 for e in self._entries.values() if e.pins),
                **{f"{t}_bytes": self._used[t] for t in TIERS},
                **{f"{t}_budget_bytes": self.budgets[t] for t in TIERS},
                "exports": len(self._exports),
                **self._transfers.snapshot(),
            }

    def close(self) -> None:
        """Drop every object, remove the spill directory and shared segments. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._entries.clear()
            for lru in self._lru.values():
                lru.clear()
            self._used = dict.fromkeys(TIERS, 0)
            self._exports.clear()
            self._finalizer()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Store({self.backend}, device {self._used['device']}/{self.budgets['device']} B, "
                f"host {self._used['host']}/{self.budgets['host']} B, disk {self._used['disk']} B, "
                f"{len(self._entries)} objects)")

    # ----------------------------------------------------------------- sharing
    def export(self, handle: Handle) -> _share.SharedObject:
        """Export an object for another process on this node (once; cached until deleted).

        Raises:
            UnknownObject, CorruptObject: as for :meth:`get`.
        """
        with self._lock:
            e = self._entry(handle, imports=False)
            if e.lost:
                raise CorruptObject(e.lost, key=e.name)
            done = self._exports.get(e.key)
            if done is not None:
                return done
            if e.tier == "device" and isinstance(self._backend, CudaBackend):
                shared = _share.SharedObject(self.node_id, owner_tag(), None, e.layout.nbytes, None,
                                             ipc=_share.export_cuda_ipc(e.data))
                data = None
            else:
                data = self._cpu_copy_or_view(e)
                shm, crc = _share.export_bytes(data)
                self._segments[e.key] = shm
                shared = _share.SharedObject(self.node_id, owner_tag(), shm.name, e.layout.nbytes, crc)
            if self.export_hook is not None:
                shared = self.export_hook(shared, data if data is not None else self._cpu_copy_or_view(e))
            self._exports[e.key] = shared
            return shared

    def _import(self, handle: Handle) -> _Entry:
        local = self._imports.get((handle.store_id, handle.key))
        if local is not None and local in self._entries:
            return self._entries[local]
        other = _STORES.get(handle.store_id)
        if other is not None and not other.closed:  # another store in this process
            obj = other.get(Handle(handle.store_id, handle.key, handle.layout, handle.name))
        else:
            shared = handle.shared
            if shared is None:
                raise UnknownObject(f"object {handle.name} belongs to another store that is not reachable "
                                    "from here (the handle was not exported; enable sharing on its store)")
            obj = from_cpu_bytes(self._fetch(shared, handle.name), handle.layout)
        h = self.put(obj, name=handle.name)
        self._imports[(handle.store_id, handle.key)] = h.key
        return self._entries[h.key]

    def _fetch(self, shared: _share.SharedObject, name: str) -> np.ndarray:
        same_node = shared.node_id == self.node_id
        if same_node and shared.ipc is not None and isinstance(self._backend, CudaBackend):
            return _share.import_cuda_ipc(shared.ipc).cpu().numpy()
        if same_node and shared.segment is not None:
            try:
                return _share.import_bytes(shared, name)
            except UnknownObject:
                if shared.ref is None or self.remote_fetch is None:
                    raise
        if shared.ref is not None and self.remote_fetch is not None:
            return self.remote_fetch(shared, name)
        raise UnknownObject(f"object {name} lives on node {shared.node_id} and its handle carries no "
                            "cross-node copy (use rayaccel.store() inside Ray tasks)")

    # ---------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    def _entry(self, handle: Handle, imports: bool = True) -> _Entry:
        if not isinstance(handle, Handle):
            raise UnknownObject(f"expected a Handle from Store.put, got {type(handle).__name__}")
        if handle.store_id != self.id:
            if not imports:
                raise UnknownObject(f"object {handle.name} belongs to another store")
            e = self._import(handle)
        else:
            e = self._entries.get(handle.key)
            if e is None:
                raise UnknownObject(f"object {handle.name} is not in the store (deleted or released)")
        if e.lost and imports:
            raise CorruptObject(e.lost, key=e.name)
        return e

    def _meta(self, e: _Entry) -> dict[str, Any]:
        return {"name": e.name, "kind": e.layout.kind, "dtype": e.layout.dtype, "shape": list(e.layout.shape)}

    def _spill_path(self, e: _Entry) -> Path:
        self._spill_seq += 1  # a fresh name each time: a file being removed later never collides
        return self.spill_dir / f"{e.key}-{self._spill_seq}.spill"

    def _account(self, e: _Entry, tier: str, sign: int) -> None:
        self._used[tier] += sign * e.layout.nbytes
        if sign > 0:
            self._lru[tier][e.key] = e
        else:
            self._lru[tier].pop(e.key, None)

    def _fits(self, tier: str, nbytes: int) -> bool:
        budget = self.budgets[tier]
        return budget is None or nbytes <= budget

    def _place(self, e: _Entry) -> str:
        reasons = []
        for tier in TIERS:
            if not self._fits(tier, e.layout.nbytes):
                reasons.append(f"{tier} budget {self.budgets[tier]} B is smaller than the object")
                continue
            try:
                if self._make_room(tier, e.layout.nbytes, None):
                    return tier
                reasons.append(f"{tier} tier full of pinned or unspillable objects")
            except StoreFull as err:
                reasons.append(f"{tier}: {err}")
        raise StoreFull(f"no tier can hold {e.name} ({e.layout.nbytes} bytes): " + "; ".join(reasons))

    def _make_room(self, tier: str, nbytes: int, exclude: _Entry | None) -> bool:
        """Evict LRU unpinned objects of ``tier`` down until ``nbytes`` fit. False if impossible."""
        budget = self.budgets[tier]
        if tier == "disk":
            return budget is None or self._used["disk"] + nbytes <= budget
        if nbytes > budget:
            return False
        victims = [v for v in self._lru[tier].values() if not v.pins and v is not exclude]
        if self._used[tier] - sum(v.layout.nbytes for v in victims) + nbytes > budget:
            return False
        for v in victims:
            if self._used[tier] + nbytes <= budget:
                break
            below = "host" if tier == "device" and self._fits("host", v.layout.nbytes) else "disk"
            if below == "host" and not self._make_room("host", v.layout.nbytes, exclude):
                below = "disk"
            if below == "disk" and not self._make_room("disk", v.layout.nbytes, exclude):
                raise StoreFull(f"the disk budget ({self.budgets['disk']} B) is full; cannot spill {v.name}")
            self._move(v, below)
        pool = self._backend.device_pool if tier == "device" else self._backend.host_pool
        if pool is not None:
            pool.trim(budget - self._used[tier] - nbytes)
        return True

    def _move(self, e: _Entry, target: str) -> None:
        """Move one object between tiers, all or nothing."""
        src, n, be = e.tier, e.layout.nbytes, self._backend
        if target == "device" and not self._make_room("device", n, e):
            raise StoreFull(f"the device tier cannot make room for {e.name} ({n} bytes)")
        start = time.perf_counter()
        if src == "disk":
            staged = target == "host" or isinstance(be, CudaBackend)
            buf = be.host_alloc(n) if staged else be.device_alloc(n)
            try:
                read_spill(e.record, memoryview(buf), e.name, e.key)
            except CorruptObject as err:
                self._lose(e, str(err))
                raise
            if target == "device" and staged:
                dev = be.device_alloc(n)
                be.copy_h2d(dev, buf)
                self._free(buf, "host")
                buf = dev
            remove_later(e.record.path)
            new, record = buf, None
        elif target == "disk":
            view = e.data if src == "host" else be.device_view(e.data)
            staging = None
            if view is None:  # real device memory: stage through pinned host
                staging = view = be.host_alloc(n)
                be.copy_d2h(staging, e.data)
            try:
                record = write_spill(self._spill_path(e), memoryview(view), self._meta(e), self.chunk_bytes)
            finally:
                del view
                if staging is not None:
                    self._free(staging, "host")
            new = None
        elif target == "host":  # device -> host
            new, record = be.host_alloc(n), None
            be.copy_d2h(new, e.data)
        else:  # host -> device
            new, record = be.device_alloc(n), None
            be.copy_h2d(new, e.data)
        seconds = time.perf_counter() - start
        old, pooled = e.data, e.pooled
        e.data, e.record = new, record
        e.pooled = new is not None
        self._account(e, src, -1)
        e.tier = target
        self._account(e, target, +1)
        if old is not None and pooled:
            self._free(old, src)
        del old
        self._transfers.record(f"{src}->{target}", n, seconds)

    def _free(self, buf: Any, tier: str) -> None:
        pool = self._backend.device_pool if tier == "device" else self._backend.host_pool
        if pool is not None and isinstance(buf, np.ndarray):
            budget = self.budgets[tier]
            pool.give(buf, max(0, budget - self._used[tier]), held=2)

    def _lose(self, e: _Entry, why: str) -> None:
        self._account(e, e.tier, -1)
        if e.record is not None:
            _unlink(e.record.path)
        e.data, e.record, e.lost = None, None, why
        self._transfers.lost += 1

    def _drop(self, e: _Entry) -> None:
        self._entries.pop(e.key, None)
        if not e.lost:
            self._account(e, e.tier, -1)
        if e.record is not None:
            _unlink(e.record.path)
        data, e.data, e.record = e.data, None, None
        if data is not None and e.pooled:
            self._free(data, e.tier)
        del data
        self._exports.pop(e.key, None)
        shm = self._segments.pop(e.key, None)
        if shm is not None:
            _share.close_segment(shm)

    def _copy_in(self, host_buf: np.ndarray, obj: Any) -> None:
        if isinstance(self._backend, CudaBackend) and not isinstance(obj, np.ndarray) and obj.device.type == "cuda":
            self._backend.copy_d2h(host_buf, obj.detach().contiguous().reshape(-1).view(self._backend.torch.uint8))
        else:
            np.copyto(host_buf, self._cpu_bytes_of(obj))

    def _cpu_bytes_of(self, obj: Any) -> np.ndarray:
        if not isinstance(obj, np.ndarray) and obj.device.type != "cpu":
            obj = obj.cpu()
        return cpu_bytes(obj)

    def _cpu_copy_or_view(self, e: _Entry) -> np.ndarray:
        """Flat uint8 CPU bytes of an object on any tier (a view when already in CPU memory)."""
        if e.tier == "host":
            return e.data
        if e.tier == "device":
            view = self._backend.device_view(e.data)
            return view if view is not None else e.data.cpu().numpy()
        out = np.empty(e.layout.nbytes, dtype=np.uint8)
        try:
            read_spill(e.record, memoryview(out), e.name, e.key)
        except CorruptObject as err:
            self._lose(e, str(err))
            raise
        return out

    def _transient(self, e: _Entry, device: str | None) -> Any:
        data = self._cpu_copy_or_view(e)
        obj = from_cpu_bytes(data.copy() if data is e.data else data, e.layout)
        if device is None and isinstance(self._backend, CudaBackend) and e.layout.kind == "torch":
            device = self._backend.device
        return obj if device in (None, "cpu") else to_device(obj, device)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
