"""A consumer's mappings of producers' segments, kept from one object to the next (:class:`Mappings`).

Mapping a segment costs a page-table entry per 4 KiB page, and unmapping it as much again:
for 64 MiB, 16k pages, about as long as copying the bytes (on this project's VMs each of
the two took 2-4 ms against a 6.5 ms ``memcpy``), paid by every consumer on every object.
A trainer syncing weights refills the same two segments in place (:mod:`.pool`), so a
rollout that kept its mapping of a segment reads the next object through page-table
entries it already has: the producer's copy lands in the very pages they point to.

What makes that safe:

* a consumer holds the segment's shared ``flock`` only while its tensors live, on a
  descriptor of its own per read (closed when the last tensor is freed), so the producer
  refills a segment only when no consumer uses it -- an idle kept mapping holds no lock;
* the mapping is private (copy-on-write), and a page the consumer wrote into is its own
  anonymous copy, which would hide the producer's later bytes: when a read's tensors are
  freed, :func:`_forget_writes` finds those pages in ``/proc/self/pagemap`` (present,
  not a file page) and drops them with ``MADV_DONTNEED``, so the next access maps the
  segment's page again. Where ``pagemap`` cannot be read the mapping is not kept;
* one read at a time uses a kept mapping: a second read of a segment while the first's
  tensors live gets a mapping of its own (two reads never share a consumer's pages).

Bounded: a mapping whose segment was unlinked (the producer freed it, or died) or that
went unused for :data:`IDLE_S` seconds is unmapped (checked at each read and on a timer
while idle mappings are kept), and at most :data:`KEEP` idle ones are kept. Thread-safe.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Optional

log = logging.getLogger("rayaccel.ray.rdt")

#: Idle mappings kept per consumer process (a trainer's pool alternates two segments per model).
KEEP = 4
#: An idle mapping unused this long is unmapped, seconds.
IDLE_S = 60.0
#: How often idle mappings are checked for segments the producer removed, seconds.
CHECK_S = 5.0

_MADV_POPULATE_READ = 22  # as shm.MADV_POPULATE_READ
_PM_PRESENT = 1 << 63
_PM_SWAPPED = 1 << 62
_PM_FILE = 1 << 61  # file page or shared anonymous: not a copy-on-write copy of the consumer's own


@dataclass
class _Map:
    key: tuple[int, int]  # (st_dev, st_ino) of the segment
    fd: int  # a descriptor without a lock (fstat: was the segment unlinked?)
    mm: Any
    nbytes: int
    addr: int  # where the mapping starts in this process
    busy: bool = False  # a read's tensors use it
    used_at: float = 0.0


class Mappings:
    """One consumer process's kept private mappings of segments, keyed by the segment's inode."""

    def __init__(self, keep: int = KEEP, idle_s: float = IDLE_S) -> None:
        self._keep = keep
        self._idle_s = idle_s
        # reentrant: a read's finalizer (_done) may run from a garbage collection inside a locked block
        self._lock = threading.RLock()
        self._maps: dict[tuple[int, int], _Map] = {}
        self._timer: Optional[threading.Timer] = None
        self.reused = 0
        self.mapped = 0

    def map(self, lock_fd: int, st: os.stat_result, nbytes: int) -> tuple[Any, Any, bool]:
        """A private mapping of ``nbytes`` of the segment open (and shared-locked) on ``lock_fd``.

        The returned buffer owns ``lock_fd`` from here: when the last object made from it (a
        tensor through ``torch.frombuffer``) is freed, ``lock_fd`` is closed (the lock goes) and
        a kept mapping becomes idle, its written pages dropped.

        Returns:
            (a writable buffer of the mapping to make tensors from, the ``mmap`` itself, whether it was
            kept from an earlier read).

        Raises:
            OSError: the segment cannot be mapped (``lock_fd`` is closed then).
        """
        key = (st.st_dev, st.st_ino)
        self._evict()
        with self._lock:
            m = self._maps.get(key)
            reuse = m is not None and not m.busy and m.nbytes == nbytes
            if reuse:
                m.busy = True
            elif m is None and _pagemap_ok():
                m = _Map(key, -1, None, nbytes, 0, busy=True)
                self._maps[key] = m  # reserved: filled in below
            else:
                m = None  # a second reader of a busy one: a mapping of its own
        if m is not None and not reuse:
            try:  # a descriptor of its own (another open file description): the mapping must not hold the lock
                m.fd = os.open(f"/proc/self/fd/{lock_fd}", os.O_RDONLY)
            except OSError:  # no /proc here: this read maps on its own, as without a kept mapping
                with self._lock:
                    self._maps.pop(key, None)
                m = None
        try:
            if m is None:
                mm = mmap.mmap(lock_fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                os.close(lock_fd)  # the mapping's own dup keeps the lock until it is unmapped, with its tensors
                self.mapped += 1
                return _owned(mm), mm, False
            if not reuse:
                m.mm = mmap.mmap(m.fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                m.addr = _address(m.mm)
                self.mapped += 1
        except BaseException:
            os.close(lock_fd)
            if m is not None and not reuse:
                with self._lock:
                    self._maps.pop(key, None)
                if m.mm is not None:
                    m.mm.close()
                if m.fd >= 0:
                    os.close(m.fd)
            raise
        if reuse:
            self.reused += 1
        owned = _owned(m.mm)
        weakref.finalize(owned, self._done, m, lock_fd)
        return owned, m.mm, reuse

    def close(self) -> None:
        """Unmap every idle mapping (busy ones go when their tensors do)."""
        with self._lock:
            idle = [m for m in self._maps.values() if not m.busy]
            for m in idle:
                self._maps.pop(m.key, None)
        for m in idle:
            _unmap(m)

    def __len__(self) -> int:
        with self._lock:
            return len(self._maps)

    # ------------------------------------------------------------------ inside
    def _done(self, m: _Map, lock_fd: int) -> None:
        """(A finalizer.) A read's tensors are all freed: its lock goes, the mapping becomes idle."""
        os.close(lock_fd)
        try:
            ok = _forget_writes(m)
        except OSError as e:
            log.debug("rayaccel transport: cannot check a kept mapping's pages (%s): unmapped", e)
            ok = False
        with self._lock:
            m.busy = False
            m.used_at = time.monotonic()
            if not ok:
                self._maps.pop(m.key, None)
            self._schedule()
        if not ok:
            _unmap(m)

    def _evict(self) -> None:
        """Unmap idle mappings of removed segments, unused ones, and the oldest beyond :data:`KEEP`."""
        now = time.monotonic()
        with self._lock:
            idle = sorted([m for m in list(self._maps.values()) if not m.busy], key=lambda m: m.used_at)
            out = [m for i, m in enumerate(idle)
                   if i < len(idle) - self._keep or now - m.used_at > self._idle_s or _unlinked(m)]
            for m in out:
                self._maps.pop(m.key, None)
        for m in out:
            _unmap(m)

    def _schedule(self) -> None:
        """(Under the lock.) A timer that checks idle mappings, while there are some."""
        if self._timer is not None or not any(not m.busy for m in self._maps.values()):
            return
        self._timer = threading.Timer(CHECK_S, self._tick)
        self._timer.daemon = True
        self._timer.start()

    def _tick(self) -> None:
        with self._lock:
            self._timer = None
        self._evict()
        with self._lock:
            self._schedule()


def _owned(mm: Any) -> Any:
    """The bytes of one read: an ndarray over the mapping, weakly referable (its finalizer ends the read);
    ``torch.frombuffer`` keeps it alive while any tensor made from it lives."""
    import numpy as np

    return np.frombuffer(mm, dtype=np.uint8).view(_owned_type())


_OWNED: Any = None


def _owned_type() -> Any:
    global _OWNED
    if _OWNED is None:
        import numpy as np

        class Owned(np.ndarray):
            pass

        _OWNED = Owned
    return _OWNED


def _address(mm: Any) -> int:
    import numpy as np

    a = np.frombuffer(mm, dtype=np.uint8)
    addr = a.ctypes.data
    del a
    return addr


def _unlinked(m: _Map) -> bool:
    try:
        return os.fstat(m.fd).st_nlink == 0
    except OSError:
        return True


def _unmap(m: _Map) -> None:
    try:
        m.mm.close()
    except BufferError:  # still exported somewhere: it goes when that view does
        pass
    os.close(m.fd)


_PAGEMAP: Optional[bool] = None


def _pagemap_ok() -> bool:
    """Whether this process can read its own ``/proc/self/pagemap`` (Linux; else mappings are not kept)."""
    global _PAGEMAP
    if _PAGEMAP is None:
        try:
            with open("/proc/self/pagemap", "rb") as f:
                f.read(8)
            _PAGEMAP = True
        except OSError:
            _PAGEMAP = False
    return _PAGEMAP


def _forget_writes(m: _Map) -> bool:
    """Drop the pages of ``m`` this process wrote (its copy-on-write copies), so the segment's show again.

    Returns:
        True; False when a page's state could not be read (the mapping must not be kept).
    """
    import numpy as np

    page = mmap.PAGESIZE
    npages = -(-m.nbytes // page)
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        raw = os.pread(fd, npages * 8, (m.addr // page) * 8)
    finally:
        os.close(fd)
    if len(raw) != npages * 8:
        return False
    e = np.frombuffer(raw, dtype=np.uint64)
    own = ((e & np.uint64(_PM_PRESENT | _PM_SWAPPED)) != 0) & ((e & np.uint64(_PM_FILE)) == 0)
    if not own.any():
        return True
    edges = np.flatnonzero(np.diff(np.concatenate(([0], own.astype(np.int8), [0]))))
    for start, stop in zip(edges[::2], edges[1::2]):
        off, size = int(start) * page, int(stop - start) * page
        m.mm.madvise(mmap.MADV_DONTNEED, off, size)
        try:  # the segment's pages back in now (a kept mapping is read without filling its page tables)
            m.mm.madvise(_MADV_POPULATE_READ, off, size)
        except OSError:
            pass  # before Linux 5.14: they come back by faults
    return True
