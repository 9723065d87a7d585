"""Counters of the tiered store: spills, restores, bytes moved and achieved bandwidth per direction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Directions in which the store moves bytes.
DIRECTIONS = ("device->host", "host->device", "host->disk", "disk->host", "device->disk", "disk->device")


@dataclass(slots=True)
class Transfers:
    """Mutable counters (guarded by the store's lock)."""

    spills: int = 0
    restores: int = 0
    lost: int = 0
    moved_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DIRECTIONS, 0))
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(DIRECTIONS, 0.0))

    def record(self, direction: str, nbytes: int, seconds: float) -> None:
        """Count one transfer of ``nbytes`` that took ``seconds``."""
        self.moved_bytes[direction] += nbytes
        self.seconds[direction] += seconds
        if direction in ("device->host", "host->disk", "device->disk"):
            self.spills += 1
        else:
            self.restores += 1

    def snapshot(self) -> dict[str, Any]:
        """Plain-dict view: counts, ``moved_bytes`` and ``bandwidth_gbps`` per direction (GB/s, None if idle)."""
        return {
            "spills": self.spills,
            "restores": self.restores,
            "lost": self.lost,
            "moved_bytes": dict(self.moved_bytes),
            "bandwidth_gbps": {
                d: (self.moved_bytes[d] / self.seconds[d] / 1e9 if self.seconds[d] > 0 else None) for d in DIRECTIONS
            },
        }
