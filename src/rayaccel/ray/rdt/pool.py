"""A producer's shared-memory segments, refilled by its later objects of the same size (:class:`Pool`).

A trainer syncing weights returns the same tensors, changed, every step. A new segment per
object costs more than the copy itself: the kernel allocates and zeroes each fresh
``/dev/shm`` page before the copy lands in it, and unlinking frees them all again (on this
project's VMs a fresh segment took about 1.5x a plain copy of the same bytes). So when Ray
frees an object, its segment is kept, and a later object of the same size is copied into
it through a mapping the producer keeps: one plain copy, into pages already there.

Refilling is safe only when nobody reads the old bytes any more. Consumers hold a shared
``flock`` on a segment for as long as their tensors live (:func:`.shm.read`); the pool
refills a segment only under an exclusive lock it could take without waiting
(:func:`.shm.try_lock`), else it uses another one or makes a new one. So a consumer that
keeps last step's weights while the trainer sends this step's keeps last step's bytes
(the pool then alternates between two segments), and a write the producer makes after
``wait_tensor_freed`` is its own: its tensors were never the segment. Each refill writes
a new generation into the segment's header, so a consumer holding stale metadata gets an
error, not another object's bytes.

Bounded: at most :data:`KEEP_PER_SIZE` free segments of one size, and a free segment
unused for :data:`IDLE_S` seconds is removed (a timer, so an idle producer gives its
memory back). Thread-safe.

A refill can run in the background (``write(..., background=True)``): the producer hands
out the segment's metadata at once, still holding the exclusive lock, and one thread
copies; consumers wait for the lock (:func:`.shm.read`), so the copy overlaps with Ray
sending the metadata to them instead of preceding it.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..._proc import start_time
from . import shm

log = logging.getLogger("rayaccel.ray.rdt")

#: Free segments kept per size (two: the one consumers still map, and the one refilled next).
KEEP_PER_SIZE = 2
#: A free segment unused this long is removed, seconds.
IDLE_S = 60.0


@dataclass
class _Segment:
    name: str
    fd: int  # the producer's own descriptor (its exclusive lock is taken on it)
    nbytes: int
    mm: Any = None  # the producer's shared mapping, made at the first refill
    freed_at: float = 0.0
    filling: Optional[Future] = None  # a background fill in progress


@dataclass
class PoolStats:
    """What a pool did: ``made`` new segments, ``refilled`` ones, ``busy``: free ones skipped
    because a consumer still mapped them, ``removed`` ones."""

    made: int = 0
    refilled: int = 0
    busy: int = 0
    removed: int = 0
    free: dict = field(default_factory=dict)  # size -> free segments now


class Pool:
    """One producer's segments: :meth:`write` an object's tensors, :meth:`release` when Ray frees it."""

    def __init__(self, keep_per_size: int = KEEP_PER_SIZE, idle_s: float = IDLE_S) -> None:
        self._keep = keep_per_size
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._free: dict[int, list[_Segment]] = {}
        self._live: dict[str, _Segment] = {}
        self._gen = itertools.count(1)
        self._timer: Optional[threading.Timer] = None
        self._stats = PoolStats()
        self._filler: Optional[ThreadPoolExecutor] = None

    def write(self, tensors: Sequence[Any], background: bool = False) -> tuple[shm.Packed, list[Any]]:
        """Copy ``tensors`` into a free segment of their size that no consumer maps, else a new one.

        Args:
            tensors: what to copy. background: refill in a thread when the tensors are contiguous CPU
                ones (consumers wait for it); a new segment is always written before this returns.

        Returns and raises as :func:`.shm.write` (a new segment that cannot be made: ``OSError``).
        """
        sizes = tuple(t.numel() * t.element_size() for t in tensors)
        offsets, total = shm.layout(sizes)
        gen = next(self._gen)
        seg = self._take(total)
        if seg is None:
            packed, made = shm.write(tensors, gen)
            try:
                fd = os.open(shm.SHM_DIR / packed.name, os.O_RDWR | os.O_NOFOLLOW)
            except OSError:
                shm.unlink(packed)
                raise
            with self._lock:
                self._live[packed.name] = _Segment(packed.name, fd, total)
                self._stats.made += 1
            return packed, made
        later = background and all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)
        try:  # ours exclusively (try_lock in _take): consumers wait for the lock
            if seg.mm is None:
                seg.mm = mmap.mmap(seg.fd, seg.nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                shm.populate(seg.mm, shm.MADV_POPULATE_WRITE)
            if later:
                if self._filler is None:
                    self._filler = ThreadPoolExecutor(1, thread_name_prefix="rayaccel-rdt-fill")
                seg.filling = self._filler.submit(self._fill, seg, list(tensors), offsets, gen)
                made = [None] * len(tensors)
            else:
                made = shm.fill(seg.mm, tensors, offsets, gen)
        except BaseException:
            shm.unlock(seg.fd)
            self._remove(seg)
            raise
        if not later:
            shm.unlock(seg.fd)
        with self._lock:
            self._live[seg.name] = seg
            self._stats.refilled += 1
        pid = os.getpid()
        return shm.Packed(seg.name, total, offsets, sizes, (pid, start_time(pid) or 0), gen), made

    def release(self, packed: shm.Packed) -> None:
        """Ray freed the object in ``packed``: keep its segment for a later object (idempotent).

        A segment this pool did not make is unlinked.
        """
        with self._lock:
            seg = self._live.pop(packed.name, None)
            if seg is not None:
                seg.freed_at = time.monotonic()
                free = self._free.setdefault(seg.nbytes, [])
                free.append(seg)
                extra = free[:-self._keep] if len(free) > self._keep else []
                del free[:len(extra)]
                self._schedule()
        if seg is None:
            shm.unlink(packed)
            return
        for old in extra:
            self._remove(old)

    def trim(self, idle_s: Optional[float] = None) -> int:
        """Remove free segments unused for ``idle_s`` seconds (default: the pool's); how many."""
        cut = time.monotonic() - (self._idle_s if idle_s is None else idle_s)
        with self._lock:
            old = [s for free in self._free.values() for s in free if s.freed_at <= cut]
            for size in list(self._free):
                self._free[size] = [s for s in self._free[size] if s.freed_at > cut]
                if not self._free[size]:
                    del self._free[size]
        for s in old:
            self._remove(s)
        return len(old)

    def close(self) -> None:
        """Remove every segment, free or live (the process is done with RDT)."""
        with self._lock:
            segs = list(self._live.values()) + [s for free in self._free.values() for s in free]
            self._live.clear()
            self._free.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if self._filler is not None:
            self._filler.shutdown(wait=True)
            self._filler = None
        for s in segs:
            self._remove(s)

    def stats(self) -> PoolStats:
        with self._lock:
            st = PoolStats(**{k: v for k, v in vars(self._stats).items() if k != "free"})
            st.free = {size: len(free) for size, free in self._free.items()}
        return st

    # ------------------------------------------------------------------ inside
    @staticmethod
    def _fill(seg: _Segment, tensors: list, offsets: Sequence[int], gen: int) -> None:
        """(The fill thread.) Copy, then let consumers in; a failure is marked in the header for them."""
        try:
            shm.fill(seg.mm, tensors, offsets, gen)
        except BaseException as e:  # noqa: BLE001 - the consumers get the failure from the header
            log.warning("rayaccel transport: filling segment %s failed: %s: %s", seg.name, type(e).__name__, e)
            seg.mm[:shm.HEADER_BYTES] = shm.header(shm.FAILED)
        finally:
            shm.unlock(seg.fd)

    def _take(self, nbytes: int) -> Optional[_Segment]:
        """A free segment of ``nbytes`` that nobody maps, locked exclusively; None when there is none."""
        with self._lock:
            free = self._free.get(nbytes, [])
            for i, seg in enumerate(free):  # the longest-freed first: the likeliest to be unmapped
                if shm.try_lock(seg.fd):
                    del free[i]
                    return seg
                self._stats.busy += 1
        return None

    def _remove(self, seg: _Segment) -> None:
        if seg.filling is not None:
            seg.filling.result()  # a fill in progress finishes first (it holds no other lock)
        if seg.mm is not None:
            try:
                seg.mm.close()
            except BufferError:  # a view still exported: the mapping goes when it does
                pass
        os.close(seg.fd)
        try:
            os.unlink(shm.SHM_DIR / seg.name)
        except FileNotFoundError:
            pass  # swept, or removed by hand
        with self._lock:
            self._stats.removed += 1

    def _schedule(self) -> None:
        """(Under the lock.) A timer that trims idle segments, while there are free ones."""
        if self._timer is not None or not self._free:
            return
        self._timer = threading.Timer(self._idle_s / 2, self._tick)
        self._timer.daemon = True
        self._timer.start()

    def _tick(self) -> None:
        with self._lock:
            self._timer = None
        self.trim()
        with self._lock:
            self._schedule()
