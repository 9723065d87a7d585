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

Modules: this one holds the public API; :mod:`.tiers` the placement, eviction
and moves between tiers; :mod:`.share` the export/import of objects between
processes; :mod:`.handle` the handles; :mod:`.spill` the spill files.
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import tempfile
import threading
import uuid
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import CorruptObject, StoreError, StoreFull, UnknownObject
from ..units import parse_bytes
from . import share as _share
from .buffers import CudaBackend, cpu_bytes, describe, from_cpu_bytes, make_backend, to_device
from .entry import Entry
from .handle import STORES, Handle
from .owners import default_spill_root, owner_tag, private_dir, sweep
from .spill import DEFAULT_CHUNK_BYTES, algorithm, read_spill, write_spill
from .stats import Transfers
from .tiers import TIERS, TierMoves

__all__ = ["TIERS", "Handle", "Store"]


def _spill_root(spill_dir: str | Path | None) -> Path:
    """The directory under which a store makes its own spill directory.

    None: this user's private root in the system temp dir (see
    :func:`~rayaccel.memory.owners.private_dir`). A given directory is the caller's
    choice (e.g. a shared ``/scratch``): created if missing, and it must be a directory.

    Raises:
        StoreError: the default root fails its ownership check, or ``spill_dir`` is not a
            directory / cannot be created (the message names the path).
    """
    if spill_dir is None:
        return private_dir(default_spill_root(tempfile.gettempdir()))
    root = Path(spill_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise StoreError(f"spill_dir {root} exists and is not a directory; give a directory") from None
    except OSError as e:
        raise StoreError(f"spill_dir {root} cannot be created: {e.strerror or e}; give a directory you can write")\
            from None
    return root


def _own_spill_dir(root: Path) -> Path:
    """Create this store's spill directory under ``root``: exclusive, mode 0700, owner-tagged."""
    for _ in range(8):
        path = root / f"rayaccel-{owner_tag()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # someone took the name (vanishingly rare): draw another
            continue
        except OSError as e:
            raise StoreError(f"cannot create a spill directory in {root}: {e.strerror or e}; "
                             "give spill_dir (RAYACCEL_SPILL_DIR) a directory you can write") from None
        return path
    raise StoreError(f"cannot create a spill directory in {root}: every name drawn was taken")


def _cleanup(spill_dir: Path, segments: dict) -> None:
    for shm in list(segments.values()):
        _share.close_segment(shm)
    segments.clear()
    shutil.rmtree(spill_dir, ignore_errors=True)


class Store(_share.Sharing, TierMoves):
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
        checksum: spill-file checksum, ``"xxh3_64"``, ``"xxh3_128"`` or ``"crc32"``
            (None: :data:`rayaccel.memory.spill.DEFAULT_ALGORITHM`, xxh3_64 when the
            ``xxhash`` package is installed, else crc32). Files of any of them restore.

    Raises:
        RequestError: a size that cannot be read. StoreError: a fraction without a
            GPU, an unknown device, or an unknown or unavailable checksum.
    """

    def __init__(self, device_bytes: int | float | str, host_bytes: int | str, spill_dir: str | Path | None = None,
                 disk_bytes: int | str | None = None, *, device: str | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, node_id: str | None = None, share: bool = False,
                 checksum: str | None = None):
        self.checksum = algorithm(checksum).name
        self._backend = make_backend(device)
        self.budgets: dict[str, int | None] = {
            "device": self._device_budget(device_bytes),
            "host": parse_bytes(host_bytes, "host_bytes"),
            "disk": None if disk_bytes is None else parse_bytes(disk_bytes, "disk_bytes"),
        }
        if not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
            raise StoreError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
        self.chunk_bytes = chunk_bytes
        root = _spill_root(spill_dir)
        sweep(root)
        self.spill_dir = _own_spill_dir(root)
        self.id = uuid.uuid4().hex
        self.node_id = node_id or _share.local_node_id()
        self.sharing = share
        #: hook the Ray layer sets: fetch a cross-node export's bytes (flat uint8 CPU array)
        self.remote_fetch: Callable[[Any, str], np.ndarray] | None = None
        #: hook the Ray layer sets: add a cross-node fallback to an export
        self.export_hook: Callable[[Any, np.ndarray | None], Any] | None = None
        #: called as ``on_move(key, from_tier, to_tier)`` after each move of one object, under the store's lock
        #: (:class:`~.held.HeldObjects` learns which of its objects left the device)
        self.on_move: Callable[[int, str, str], None] | None = None
        self._entries: dict[int, Entry] = {}
        self._lru: dict[str, OrderedDict[int, Entry]] = {t: OrderedDict() for t in TIERS}
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
        STORES[self.id] = self

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
            e = Entry(key=key, name=name or f"obj-{key}", layout=layout, tier="")
            tier = self._place(e)
            if tier == "device":
                e.data, e.pooled = self._backend.to_device_data(obj, layout)
            elif tier == "host":
                e.data, e.pooled = self._backend.host_alloc(layout.nbytes), True
                self._copy_in(e.data, obj)
            else:
                e.record = write_spill(self._spill_path(e), memoryview(self._cpu_bytes_of(obj)),
                                       self._meta(e), self.chunk_bytes, self.checksum)
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

    def close(self, timeout_s: float | None = None) -> None:
        """Drop every object, remove the spill directory and shared segments. Idempotent.

        Args:
            timeout_s: wait at most this long for another thread's operation to finish
                (None: as long as it takes). Past it the files and segments are removed
                anyway, so a thread stuck inside the store cannot hang process exit.
        """
        if not self._lock.acquire(timeout=-1 if timeout_s is None else max(0.0, timeout_s)):
            self._closed = True
            self._finalizer()
            return
        try:
            if self._closed:
                return
            self._closed = True
            self._entries.clear()
            for lru in self._lru.values():
                lru.clear()
            self._used = dict.fromkeys(TIERS, 0)
            self._exports.clear()
            self._finalizer()
        finally:
            self._lock.release()

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

    # ---------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    def _entry(self, handle: Handle, imports: bool = True) -> Entry:
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

    def _copy_in(self, host_buf: np.ndarray, obj: Any) -> None:
        if isinstance(self._backend, CudaBackend) and not isinstance(obj, np.ndarray) and obj.device.type == "cuda":
            self._backend.copy_d2h(host_buf, obj.detach().contiguous().reshape(-1).view(self._backend.torch.uint8))
        else:
            np.copyto(host_buf, self._cpu_bytes_of(obj))

    def _cpu_bytes_of(self, obj: Any) -> np.ndarray:
        if not isinstance(obj, np.ndarray) and obj.device.type != "cpu":
            obj = obj.cpu()
        return cpu_bytes(obj)

    def _cpu_copy_or_view(self, e: Entry) -> np.ndarray:
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

    def _transient(self, e: Entry, device: str | None) -> Any:
        data = self._cpu_copy_or_view(e)
        obj = from_cpu_bytes(data.copy() if data is e.data else data, e.layout)
        if device is None and isinstance(self._backend, CudaBackend) and e.layout.kind == "torch":
            device = self._backend.device
        return obj if device in (None, "cpu") else to_device(obj, device)


