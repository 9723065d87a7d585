"""Moving objects between tiers: placement, LRU eviction, all-or-nothing moves, drops.

:class:`TierMoves` is a mixin of :class:`~rayaccel.memory.Store`; it works on
the store's state (``budgets``, ``_entries``, ``_lru``, ``_used``,
``_backend``, ``_transfers``, ``_exports``, ``_segments``, ``spill_dir``,
``chunk_bytes``, ``checksum``) under the store's lock, which every caller holds.

Placement: an object goes on the highest tier that can make room, evicting
least-recently-used unpinned objects down one tier (recursively); an object
larger than a tier's budget skips it. Every move of one object is
all-or-nothing: a full disk leaves the object where it was.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptObject, StoreFull
from . import share as _share
from .buffers import CudaBackend
from .entry import Entry
from .spill import read_spill, remove_later, write_spill

TIERS = ("device", "host", "disk")


class TierMoves:
    """Tier bookkeeping and moves for :class:`~rayaccel.memory.Store` (see the module docstring)."""

    def _meta(self, e: Entry) -> dict[str, Any]:
        return {"name": e.name, "kind": e.layout.kind, "dtype": e.layout.dtype, "shape": list(e.layout.shape)}

    def _spill_path(self, e: Entry) -> Path:
        self._spill_seq += 1  # a fresh name each time: a file being removed later never collides
        return self.spill_dir / f"{e.key}-{self._spill_seq}.spill"

    def _account(self, e: Entry, tier: str, sign: int) -> None:
        self._used[tier] += sign * e.layout.nbytes
        if sign > 0:
            self._lru[tier][e.key] = e
        else:
            self._lru[tier].pop(e.key, None)

    def _fits(self, tier: str, nbytes: int) -> bool:
        budget = self.budgets[tier]
        return budget is None or nbytes <= budget

    def _place(self, e: Entry) -> str:
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

    def _make_room(self, tier: str, nbytes: int, exclude: Entry | None) -> bool:
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

    def _move(self, e: Entry, target: str) -> None:
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
                record = write_spill(self._spill_path(e), memoryview(view), self._meta(e), self.chunk_bytes,
                                     self.checksum)
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
        if self.on_move is not None:
            self.on_move(e.key, src, target)

    def _free(self, buf: Any, tier: str) -> None:
        pool = self._backend.device_pool if tier == "device" else self._backend.host_pool
        if pool is not None and isinstance(buf, np.ndarray):
            budget = self.budgets[tier]
            pool.give(buf, max(0, budget - self._used[tier]), held=2)

    def _lose(self, e: Entry, why: str) -> None:
        self._account(e, e.tier, -1)
        if e.record is not None:
            _unlink(e.record.path)
        e.data, e.record, e.lost = None, None, why
        self._transfers.lost += 1

    def _drop(self, e: Entry) -> None:
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


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
