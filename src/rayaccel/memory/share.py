"""Passing stored objects to other processes on the same node (and, through a hook, across nodes).

A :class:`~rayaccel.memory.Handle` of a store with sharing enabled pickles to a
:class:`SharedObject`: the owner copies the object's bytes once into a named
POSIX shared-memory segment (``/dev/shm/rayaccel_<pid>-<start>_<n>``) and the
handle carries (node id, segment name, size, CRC-32). A receiver on the same
node attaches, copies the bytes into its own store and verifies the checksum;
no byte goes through Ray's object store. On a real GPU an object resident on
the device tier is exported as a CUDA IPC handle instead
(``torch.multiprocessing.reductions.reduce_tensor``), which a receiver on the
same node opens without any host copy. Across nodes, the Ray layer attaches a
Ray object reference (``SharedObject.ref``) and a fetch hook.

The owner unlinks a segment when the object is deleted or the store closes; the
sweeper (:mod:`rayaccel.memory.owners`) removes segments of owners that died.
"""

from __future__ import annotations

import secrets
import zlib
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptObject, UnknownObject
from .owners import SHM_PREFIX, owner_tag


@dataclass(frozen=True, slots=True)
class SharedObject:
    """What a pickled handle carries to another process.

    Attributes:
        node_id: node of the owner. owner: owner tag ``"<pid>-<start>"``.
        segment: shared-memory segment name, or None.
        nbytes: object size. crc32: CRC-32 of the object's bytes (None for CUDA IPC).
        ipc: ``(rebuild_function, args)`` of a CUDA IPC export, or None.
        ref: a Ray ObjectRef of the bytes (cross-node fallback), or None.
    """

    node_id: str
    owner: str
    segment: str | None
    nbytes: int
    crc32: int | None
    ipc: tuple | None = None
    ref: Any = None


def local_node_id() -> str:
    """This machine's identity when no Ray node id is known: hostname plus boot id."""
    import socket

    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "noboot"
    return f"{socket.gethostname()}:{boot}"


def _untrack(shm: shared_memory.SharedMemory) -> None:
    # Python < 3.13 registers every attach with the resource tracker, which would
    # unlink the owner's segment when a *receiver* exits; lifetime is ours to manage.
    try:
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    except (KeyError, ValueError, AttributeError):
        pass


def export_bytes(data: np.ndarray) -> tuple[shared_memory.SharedMemory, int]:
    """Copy a flat uint8 CPU buffer into a new owner-tagged segment; return it and the CRC-32."""
    name = f"{SHM_PREFIX}{owner_tag()}_{secrets.token_hex(6)}"
    shm = shared_memory.SharedMemory(name=name, create=True, size=max(1, data.nbytes))
    _untrack(shm)
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
        shm.unlink()
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
        shm = shared_memory.SharedMemory(name=shared.segment, create=False)
    except FileNotFoundError:
        raise UnknownObject(
            f"object {name}: shared segment {shared.segment} is gone (its owner {shared.owner} deleted it or exited)"
        ) from None
    _untrack(shm)
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
