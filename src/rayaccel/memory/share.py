"""Passing stored objects to other processes on the same node (and, through a hook, across nodes).

A :class:`~rayaccel.memory.Handle` of a store with sharing enabled pickles to a
:class:`SharedObject`: the owner copies the object's bytes once into a named
POSIX shared-memory segment (``/dev/shm/rayaccel_<pid>-<start>_u<uid>_<n>``) and the
handle carries (node id, segment name, size, CRC-32). A receiver on the same
node attaches, copies the bytes into its own store and verifies the checksum;
no byte goes through Ray's object store. On a real GPU an object resident on
the device tier is exported as a CUDA IPC handle instead
(``torch.multiprocessing.reductions.reduce_tensor``), which a receiver on the
same node opens without any host copy. Across nodes, the Ray layer attaches a
Ray object reference (``SharedObject.ref``) and a fetch hook.

The owner unlinks a segment when the object is deleted or the store closes; the
sweeper (:mod:`rayaccel.memory.owners`) removes segments of owners that died.

Not guarded against: a receiver does not check who owns a segment it attaches. Names
carry 48 random bits and the bytes a CRC-32, which catches damage, not an adversary who
can write ``/dev/shm`` and guess a name (a per-node keyed MAC would).
"""

from __future__ import annotations

import secrets
import sys
import zlib
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptObject, UnknownObject
from .buffers import CudaBackend, from_cpu_bytes
from .entry import Entry
from .handle import STORES, Handle
from .owners import owner_tag, segment_prefix


@dataclass(frozen=True, slots=True)
class SharedObject:
    """What a pickled handle carries to another process.

    Attributes:
        node_id: node of the owner. owner: owner tag ``"<pid>-<start>"``.
        segment: shared-memory segment name, or None.
        nbytes: object size. crc32: CRC-32 of the object's bytes (None for CUDA IPC).
        ipc: ``(rebuild_function, args)`` of a CUDA IPC export, or None.
        ref: a Ray ObjectRef of the bytes (cross-node fallback), or None.
        device: the device index (on ``node_id``) whose store holds the object, or None.
    """

    node_id: str
    owner: str
    segment: str | None
    nbytes: int
    crc32: int | None
    ipc: tuple | None = None
    ref: Any = None
    device: int | None = None


def local_node_id() -> str:
    """This machine's identity when no Ray node id is known: hostname plus boot id."""
    import socket

    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "noboot"
    return f"{socket.gethostname()}:{boot}"


#: Python >= 3.13 can open a segment without the resource tracker (``track=False``).
_NO_TRACKER = {"track": False} if sys.version_info >= (3, 13) else {}


def _segment(name: str, create: bool, size: int = 0) -> shared_memory.SharedMemory:
    """Create or attach a segment that the resource tracker does not manage.

    The tracker would unlink the owner's segment when a *receiver* exits (Python < 3.13
    registers every attach); the lifetime is ours (owner unlinks, the sweeper cleans up).
    """
    shm = shared_memory.SharedMemory(name=name, create=create, size=size, **_NO_TRACKER)
    if not _NO_TRACKER:
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


def _unlink(shm: shared_memory.SharedMemory) -> None:
    """Unlink a segment opened by :func:`_segment`, without a tracker ``KeyError`` traceback.

    Before 3.13, ``SharedMemory.unlink()`` also unregisters the name from the resource
    tracker; ours was unregistered at open, so the tracker process printed a ``KeyError``
    traceback on every delete. Registering it again first keeps the tracker's books even.
    """
    if not _NO_TRACKER:
        resource_tracker.register(shm._name, "shared_memory")  # type: ignore[attr-defined]
    shm.unlink()


def export_bytes(data: np.ndarray) -> tuple[shared_memory.SharedMemory, int]:
    """Copy a flat uint8 CPU buffer into a new owner-tagged segment; return it and the CRC-32."""
    name = f"{segment_prefix()}{secrets.token_hex(6)}"
    shm = _segment(name, create=True, size=max(1, data.nbytes))
    dst = np.ndarray((data.nbytes,), dtype=np.uint8, buffer=shm.buf)
    np.copyto(dst, data)
    crc = zlib.crc32(memoryview(dst))
    del dst
    return shm, crc


def close_segment(shm: shared_memory.SharedMemory) -> None:
    """Close and unlink an exported segment (idempotent)."""
    try:
        shm.close()
    except BufferError:  # a view is still alive in this process; unlink anyway
        pass
    try:
        _unlink(shm)
    except FileNotFoundError:
        pass


def import_bytes(shared: SharedObject, name: str) -> np.ndarray:
    """Copy the bytes of a same-node export into a new CPU buffer, verified.

    Raises:
        UnknownObject: the segment is gone (owner deleted the object or died).
        CorruptObject: the bytes fail the checksum.
    """
    if shared.segment is None:
        raise UnknownObject(f"object {name} has no shared-memory export")
    try:
        shm = _segment(shared.segment, create=False)
    except FileNotFoundError:
        raise UnknownObject(
            f"object {name}: shared segment {shared.segment} is gone (its owner {shared.owner} deleted it or exited)"
        ) from None
    try:
        src = np.ndarray((shared.nbytes,), dtype=np.uint8, buffer=shm.buf)
        out = np.empty(shared.nbytes, dtype=np.uint8)
        np.copyto(out, src)
        del src
    finally:
        shm.close()
    if shared.crc32 is not None and zlib.crc32(memoryview(out)) != shared.crc32:
        raise CorruptObject(f"object {name}: shared segment {shared.segment} fails its checksum", key=name)
    return out


def export_cuda_ipc(tensor: Any) -> tuple:
    """``(rebuild, args)`` for a CUDA tensor through torch's IPC reductions (same node only)."""
    from torch.multiprocessing.reductions import reduce_tensor  # lazy: vendor library

    return reduce_tensor(tensor)


def import_cuda_ipc(ipc: tuple) -> Any:
    """Open a CUDA IPC export (a tensor sharing the owner's device memory)."""
    rebuild, args = ipc
    return rebuild(*args)


class Sharing:
    """Export/import of stored objects; a mixin of :class:`~rayaccel.memory.Store`.

    Works on the store's ``_exports``, ``_segments``, ``_imports``,
    ``_backend``, ``node_id``, ``export_hook`` and ``remote_fetch`` under its lock.
    """

    def export(self, handle: Handle) -> SharedObject:
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
                shared = SharedObject(self.node_id, owner_tag(), None, e.layout.nbytes, None,
                                             ipc=export_cuda_ipc(e.data))
                data = None
            else:
                data = self._cpu_copy_or_view(e)
                shm, crc = export_bytes(data)
                self._segments[e.key] = shm
                shared = SharedObject(self.node_id, owner_tag(), shm.name, e.layout.nbytes, crc)
            if self.export_hook is not None:
                try:
                    shared = self.export_hook(shared, data if data is not None else self._cpu_copy_or_view(e))
                except BaseException:
                    shm = self._segments.pop(e.key, None)  # a retry makes a new one: do not leak this one
                    if shm is not None:
                        close_segment(shm)
                    raise
            self._exports[e.key] = shared
            return shared

    def _import(self, handle: Handle) -> Entry:
        local = self._imports.get((handle.store_id, handle.key))
        if local is not None and local in self._entries:
            return self._entries[local]
        other = STORES.get(handle.store_id)
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

    def _fetch(self, shared: SharedObject, name: str) -> np.ndarray:
        same_node = shared.node_id == self.node_id
        if same_node and shared.ipc is not None and isinstance(self._backend, CudaBackend):
            return import_cuda_ipc(shared.ipc).cpu().numpy()
        if same_node and shared.segment is not None:
            try:
                return import_bytes(shared, name)
            except UnknownObject:
                if shared.ref is None or self.remote_fetch is None:
                    raise
        if shared.ref is not None and self.remote_fetch is not None:
            return self.remote_fetch(shared, name)
        raise UnknownObject(f"object {name} lives on node {shared.node_id} and its handle carries no "
                            "cross-node copy (use rayaccel.store() inside Ray tasks)")

