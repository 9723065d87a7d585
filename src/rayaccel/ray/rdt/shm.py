"""POSIX shared-memory segments for the ``rayaccel`` tensor transport (one node, host memory).

The producer copies an object's tensors once, packed, into a new file in ``/dev/shm``
(:func:`write`); every consumer on the node maps that file copy-on-write
(:func:`read`): its tensors are views of the producer's pages, with no second copy,
and a consumer that writes into its tensors changes only its own pages -- never the
producer's nor another consumer's.

Names follow the tiered store's owner tags (``rayaccel_<pid>-<start>_u<uid>_rdt_<random>``,
:mod:`rayaccel.memory.owners`): the producer unlinks a segment when Ray frees the
object; a killed producer's segments are removed by :func:`rayaccel.memory.sweep`,
which producers run when they start and every minute. A consumer that mapped a
segment keeps its pages after the unlink, for as long as it holds the tensors.

A full ``/dev/shm`` is an :class:`OSError` (``ENOSPC``) from ``pwrite`` (or from
``posix_fallocate`` before a GPU tensor is copied through a mapping), never a ``SIGBUS``.
"""

from __future__ import annotations

import mmap
import os
import secrets
import stat
import time
from dataclasses import dataclass
from typing import Any, Sequence

from ..._proc import start_time, state
from ...errors import TransportError
from ...memory.owners import SHM_DIR, is_alive, segment_prefix, sweep

#: Each tensor starts on a multiple of this many bytes in a segment.
ALIGN = 64
_SWEEP_EVERY_S = 60.0
_last_sweep = 0.0


@dataclass(frozen=True, slots=True)
class Packed:
    """Where an object's tensors sit in one segment.

    Attributes:
        name: file name in ``/dev/shm``. nbytes: size of the segment.
        offsets: byte offset of each tensor. sizes: bytes of each tensor.
        owner: ``(pid, start time)`` of the producer.
    """

    name: str
    nbytes: int
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    owner: tuple[int, int]


def available() -> tuple[bool, str]:
    """Whether segments can be made here, and why not."""
    if not SHM_DIR.is_dir():
        return False, f"{SHM_DIR} does not exist"
    if not os.access(SHM_DIR, os.W_OK | os.X_OK):
        return False, f"{SHM_DIR} is not writable"
    return True, ""


def layout(sizes: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """Offsets of tensors of ``sizes`` bytes packed at :data:`ALIGN`, and the total."""
    offsets, end = [], 0
    for n in sizes:
        end = -(-end // ALIGN) * ALIGN
        offsets.append(end)
        end += n
    return tuple(offsets), end


def _maybe_sweep() -> None:
    global _last_sweep
    now = time.monotonic()
    if now - _last_sweep > _SWEEP_EVERY_S:
        _last_sweep = now
        sweep(None)


def write(tensors: Sequence[Any]) -> tuple[Packed, list[Any]]:
    """Copy ``tensors`` (any strides; CPU or GPU) into a new segment, once.

    CPU tensors go in with ``pwrite`` (the kernel fills the segment's pages directly: on this
    project's VMs about 3x faster than writing through a fresh mapping, which takes a page
    fault per 4 KiB); a strided one is first made contiguous, and that copy is returned so the
    caller can reuse it. GPU tensors are copied straight into a mapping of the segment (one
    device-to-host copy).

    Returns:
        (where they are, per tensor the contiguous CPU copy made of it or None).

    Raises:
        OSError: no room in ``/dev/shm`` (``ENOSPC``) or it cannot be written; nothing is left behind.
    """
    _maybe_sweep()
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets, total = layout(sizes)
    name = f"{segment_prefix()}rdt_{secrets.token_hex(8)}"
    path = SHM_DIR / name
    size = max(total, 1)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    made: list[Any] = []
    try:
        if any(t.device.type != "cpu" for t in tensors):
            os.posix_fallocate(fd, 0, size)  # a full /dev/shm fails here, not with SIGBUS in the copy
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            for t, off, n in zip(tensors, offsets, sizes):
                if n:
                    _view(mm, off, n, t.dtype, tuple(t.shape)).copy_(t)
                made.append(None)
            del mm
        else:
            os.ftruncate(fd, size)
            for t, off, n in zip(tensors, offsets, sizes):
                c = t.contiguous()  # itself when contiguous, else the one copy a strided tensor needs
                made.append(None if c is t else c)
                flat = c.reshape(-1)
                if n:
                    _pwrite_all(fd, memoryview(flat.view(torch_uint8()).numpy()), off)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    pid = os.getpid()
    return Packed(name, size, offsets, tuple(sizes), (pid, start_time(pid) or 0)), made


def torch_uint8() -> Any:
    import torch

    return torch.uint8


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)  # ENOSPC raises OSError: nothing mapped, no SIGBUS


def _view(mm: Any, offset: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    import torch

    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype).view(shape)


def read(packed: Packed, meta: Sequence[tuple[Any, Any]], what: str) -> list[Any]:
    """Map a segment copy-on-write and return its tensors (no copy).

    Args:
        packed: from the producer. meta: ``(shape, dtype)`` of each tensor. what: names the object in errors.

    Raises:
        TransportError: the segment is gone (the producer died or freed the object), is not this
            user's, or is shorter than the producer wrote.
    """
    path = SHM_DIR / packed.name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        dead = not alive(packed)
        raise TransportError(f"{what}: its shared-memory segment {path} is gone "
                             + ("(the producer, pid %d, died)" % packed.owner[0] if dead else
                                "(the producer freed the object)"), what) from None
    except OSError as e:
        raise TransportError(f"{what}: cannot open its shared-memory segment {path}: {e.strerror}", what) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size < packed.nbytes:
            raise TransportError(f"{what}: {path} is not the producer's segment (owner uid {st.st_uid}, "
                                 f"{st.st_size} of {packed.nbytes} bytes)", what)
        # private: a consumer's writes stay its own (copy-on-write), the producer's pages are shared
        mm = mmap.mmap(fd, packed.nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return [_view(mm, off, n, dtype, tuple(shape))
            for (shape, dtype), off, n in zip(meta, packed.offsets, packed.sizes)]


def unlink(packed: Packed) -> None:
    """Remove a segment's name (idempotent); mappings keep their pages until dropped."""
    try:
        os.unlink(SHM_DIR / packed.name)
    except FileNotFoundError:
        pass


def alive(packed: Packed) -> bool:
    """Whether the producer that wrote ``packed`` still runs (a zombie does not: its objects are gone)."""
    return is_alive(*packed.owner) and state(packed.owner[0]) not in ("Z", "X")
