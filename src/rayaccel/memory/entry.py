"""The store's record of one object: which tier holds it, its bytes there, its references and pins.

Shared by the store (:mod:`.store`), the moves between tiers (:mod:`.tiers`) and the
hand-off to other processes (:mod:`.share`); it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .buffers import Layout
from .spill import SpillRecord


@dataclass(slots=True, eq=False)
class Entry:
    """One stored object (mutable; guarded by its store's lock).

    Attributes:
        key: its number in the store. name: used in messages. layout: kind, dtype, shape, nbytes.
        tier: ``"device"``, ``"host"`` or ``"disk"`` (``""`` while being put).
        data: device tier: backend bytes; host tier: a uint8 CPU buffer; disk: None.
        pooled: ``data`` came from a buffer pool (may go back to it).
        record: the spill file, while on disk. refs: references held. pins: open ``pinned()`` contexts.
        lost: why the object is lost (a damaged spill file), or None.
    """

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
