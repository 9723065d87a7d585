"""POSIX shared-memory segments for the ``rayaccel`` tensor transport (one node, host memory).

The producer copies an object's tensors once, packed, into a file in ``/dev/shm``
(:func:`write` makes a new one; :class:`~.pool.Pool` refills one of its own that no
consumer maps any more); every consumer on the node maps that file copy-on-write
(:func:`read`): its tensors are views of the producer's pages, with no second copy,
and a consumer that writes into its tensors changes only its own pages -- never the
producer's nor another consumer's.

Who reads a segment is known from file locks: a consumer holds a shared ``flock`` on the
segment for as long as its tensors live (on a descriptor of the read's own, closed when the
last tensor is freed), and a producer refills a segment only under an exclusive one it could
take (:func:`try_lock`). The consumer keeps its mapping after that, without the lock, for its
next read of the same segment (:mod:`.maps`: a refilled segment is read through page tables
already filled, the pages it wrote into dropped first). Each segment starts with a
header (:data:`MAGIC`: the format and its version, then the object's generation), so a
consumer that maps a segment refilled for a later object gets an error, never another
object's bytes.

Names follow the tiered store's owner tags (``rayaccel_<pid>-<start>_u<uid>_rdt_<random>``,
:mod:`rayaccel.memory.owners`): the producer unlinks a segment when Ray frees the
object; a killed producer's segments are removed by :func:`rayaccel.memory.sweep`,
which producers run when they start and every minute. A consumer that mapped a
segment keeps its pages after the unlink, for as long as it holds the tensors.

A full ``/dev/shm`` is an :class:`OSError` (``ENOSPC``) from ``pwrite`` (or from
``posix_fallocate`` before a GPU tensor is copied through a mapping), never a ``SIGBUS``.
"""

from __future__ import annotations

import fcntl
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
from .maps import Mappings

#: Each tensor starts on a multiple of this many bytes in a segment.
ALIGN = 64
#: The first bytes of every segment: the format and its version (a reader refuses others).
MAGIC = b"RAYACCL1"
#: Bytes before the first tensor: MAGIC, then the generation (8 bytes, little-endian), then zeros.
HEADER_BYTES = ALIGN
#: ``madvise`` advice that fills a mapping's page tables without writing (Linux 5.14+).
MADV_POPULATE_READ = 22
MADV_POPULATE_WRITE = 23
#: The generation a producer writes when it could not fill a segment.
FAILED = (1 << 64) - 1
#: How long a consumer waits for a segment still being filled, seconds (the copy of its bytes).
FILL_WAIT_S = 120.0
_SWEEP_EVERY_S = 60.0
_last_sweep = 0.0
#: This process's kept mappings of segments it read (:mod:`.maps`).
MAPPINGS = Mappings()


@dataclass(frozen=True, slots=True)
class Packed:
    """Where an object's tensors sit in one segment.

    Attributes:
        name: file name in ``/dev/shm``. nbytes: size of the segment.
        offsets: byte offset of each tensor. sizes: bytes of each tensor.
        owner: ``(pid, start time)`` of the producer.
        generation: which object of the producer's the segment holds (in its header; 0: unchecked).
    """

    name: str
    nbytes: int
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    owner: tuple[int, int]
    generation: int = 0


def available() -> tuple[bool, str]:
    """Whether segments can be made here, and why not."""
    if not SHM_DIR.is_dir():
        return False, f"{SHM_DIR} does not exist"
    if not os.access(SHM_DIR, os.W_OK | os.X_OK):
        return False, f"{SHM_DIR} is not writable"
    return True, ""


def layout(sizes: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """Offsets of tensors of ``sizes`` bytes packed at :data:`ALIGN` after the header, and the total."""
    offsets, end = [], HEADER_BYTES
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


def header(generation: int) -> bytes:
    """The first :data:`HEADER_BYTES` of a segment holding object ``generation``."""
    return MAGIC + generation.to_bytes(8, "little") + bytes(HEADER_BYTES - len(MAGIC) - 8)


def new_name() -> str:
    """A fresh segment name carrying this process's owner tag (what :func:`sweep` reads)."""
    return f"{segment_prefix()}rdt_{secrets.token_hex(8)}"


def write(tensors: Sequence[Any], generation: int = 0) -> tuple[Packed, list[Any]]:
    """Copy ``tensors`` (any strides; CPU or GPU) into a new segment, once.

    CPU tensors go in with ``pwrite`` (the kernel fills the segment's pages directly: on this
    project's VMs about 3x faster than writing through a fresh mapping, which takes a page
    fault per 4 KiB); a strided one is first made contiguous, and that copy is returned so the
    caller can reuse it. GPU tensors are copied straight into a mapping of the segment (one
    device-to-host copy).

    Args:
        tensors: what to copy. generation: written into the header, for :func:`read` to check.

    Returns:
        (where they are, per tensor the contiguous CPU copy made of it or None).

    Raises:
        OSError: no room in ``/dev/shm`` (``ENOSPC``) or it cannot be written; nothing is left behind.
    """
    _maybe_sweep()
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets, total = layout(sizes)
    name = new_name()
    path = SHM_DIR / name
    size = total
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
            mm[:HEADER_BYTES] = header(generation)
            del mm
        else:
            os.ftruncate(fd, size)
            _pwrite_all(fd, memoryview(header(generation)), 0)
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
    return Packed(name, size, offsets, tuple(sizes), (pid, start_time(pid) or 0), generation), made


def fill(mm: Any, tensors: Sequence[Any], offsets: Sequence[int], generation: int) -> list[Any]:
    """Copy ``tensors`` into an existing shared mapping ``mm`` at ``offsets`` (one copy each, no page
    faults once the mapping's pages are in), then its header. The caller holds the segment's exclusive lock.

    Returns:
        Per tensor the contiguous CPU copy made of a strided CPU one (else None), as :func:`write`.
    """
    made: list[Any] = []
    for t, off in zip(tensors, offsets):
        n = t.numel() * t.element_size()
        c = t if t.device.type != "cpu" else t.contiguous()
        made.append(None if c is t else c)
        if n:
            _view(mm, off, n, t.dtype, tuple(t.shape)).copy_(c)
    mm[:HEADER_BYTES] = header(generation)
    return made


def try_lock(fd: int) -> bool:
    """Take ``fd``'s segment exclusively, without waiting: False while any consumer maps it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def populate(mm: Any, advice: int) -> None:
    """Fill a mapping's page tables in one call (instead of a fault per 4 KiB); a kernel without
    ``MADV_POPULATE_*`` (before 5.14) faults them in on first touch instead."""
    try:
        mm.madvise(advice)
    except OSError:
        pass  # EINVAL on an older kernel: the pages come in by faults, as before


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


def read(packed: Packed, meta: Sequence[tuple[Any, Any]], what: str, wait_s: float = FILL_WAIT_S) -> list[Any]:
    """Map a segment copy-on-write and return its tensors (no copy).

    The tensors hold a shared lock on the segment while they live (the producer does not refill
    it until they are freed). A mapping this process kept from its last read of the segment is
    reused (:data:`MAPPINGS`), else a new one's page tables are filled at once. A segment the producer
    is still filling (it holds the exclusive lock: :meth:`~.pool.Pool.write` in the background)
    is waited for, up to ``wait_s``.

    Args:
        packed: from the producer. meta: ``(shape, dtype)`` of each tensor. what: names the object in errors.
        wait_s: how long to wait for the producer's fill, seconds.

    Raises:
        TransportError: the segment is gone (the producer died or freed the object), is not this
            user's, is shorter than the producer wrote, holds another format, or was refilled for a
            later object (this one was freed).
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
        _lock_shared(fd, wait_s, path, what)  # held on fd until the tensors are freed (maps.Mappings)
        _check_header(os.pread(fd, HEADER_BYTES, 0), packed, path, what)
    except BaseException:
        os.close(fd)
        raise
    # private: a consumer's writes stay its own (copy-on-write), the producer's pages are shared;
    # kept from this consumer's last read of the segment when it can be (no page tables to fill again)
    buf, mm, kept = MAPPINGS.map(fd, st, packed.nbytes)
    if not kept:  # a kept one has its pages in already (asking again walks them all: ~2 ms per 64 MiB)
        populate(mm, MADV_POPULATE_READ)
    return [_view(buf, off, n, dtype, tuple(shape))
            for (shape, dtype), off, n in zip(meta, packed.offsets, packed.sizes)]


def _check_header(head: bytes, packed: Packed, path: Any, what: str) -> None:
    if head[:len(MAGIC)] != MAGIC:
        raise TransportError(f"{what}: {path} holds format {head[:len(MAGIC)]!r}, not {MAGIC!r} (a producer of "
                             "another rayaccel release?)", what)
    gen = int.from_bytes(head[len(MAGIC):len(MAGIC) + 8], "little")
    if gen == FAILED:
        raise TransportError(f"{what}: its producer could not fill its shared-memory segment {path} (its log "
                             "says why)", what)
    if packed.generation and gen != packed.generation and not alive(packed):
        raise TransportError(f"{what}: its producer (pid {packed.owner[0]}) died while filling its shared-memory "
                             f"segment {path}", what)
    if packed.generation and gen != packed.generation:
        raise TransportError(f"{what}: its shared-memory segment {path} was refilled for a later object "
                             f"(generation {gen}, not {packed.generation}): this one was freed", what)


def _lock_shared(fd: int, wait_s: float, path: Any, what: str) -> None:
    """A shared lock on a segment, once the producer's fill (its exclusive lock) is done."""
    deadline = time.monotonic() + wait_s
    pause = 50e-6
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TransportError(f"{what}: its shared-memory segment {path} was still being filled after "
                                     f"{wait_s:.0f} s", what) from None
            time.sleep(pause)  # a fill is a copy: milliseconds; back off to 0.5 ms (a waiting reader wakes
            pause = min(pause * 2, 5e-4)  # at most that long after the fill: ~20 wakeups per 10 ms copy


def unlink(packed: Packed) -> None:
    """Remove a segment's name (idempotent); mappings keep their pages until dropped."""
    try:
        os.unlink(SHM_DIR / packed.name)
    except FileNotFoundError:
        pass


def alive(packed: Packed) -> bool:
    """Whether the producer that wrote ``packed`` still runs (a zombie does not: its objects are gone)."""
    return is_alive(*packed.owner) and state(packed.owner[0]) not in ("Z", "X")
