"""Accelerator memory tiers: a store that spills device -> (pinned) host -> disk.

    from rayaccel.memory import Store
    with Store(device_bytes="1GiB", host_bytes="4GiB", spill_dir="/scratch") as store:
        h = store.put(tensor)
        x = store.get(h)

Modules: :mod:`.store` (the store's public API), :mod:`.tiers` (placement,
LRU eviction and moves between tiers), :mod:`.entry` (the record of one
stored object), :mod:`.handle` (handles),
:mod:`.buffers` (byte views, buffer pools, the simulated and CUDA backends),
:mod:`.spill` (chunked, checksummed, self-describing spill files: xxh3 with
the ``xxhash`` package, CRC-32 without), :mod:`.share` (same-node hand-off
through shared memory / CUDA IPC), :mod:`.owners` (owner tags and the sweeper
of dead processes' leftovers), :mod:`.stats` (counters).

No import of torch or ray here: torch is loaded when a store is created (to see
whether a GPU is present) and only the Ray layer imports ray.
"""

from __future__ import annotations

from ..errors import CorruptObject, StoreError, StoreFull, UnknownObject
from .buffers import Layout, UnsupportedObject
from .owners import sweep
from .share import SharedObject
from .spill import SpillRecord, verify_file
from .store import TIERS, Handle, Store

__all__ = sorted([
    "CorruptObject",
    "Handle",
    "Layout",
    "SharedObject",
    "SpillRecord",
    "Store",
    "StoreError",
    "StoreFull",
    "TIERS",
    "UnknownObject",
    "UnsupportedObject",
    "sweep",
    "verify_file",
])
