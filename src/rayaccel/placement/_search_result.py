"""What the exact searches return: :class:`SearchResult` (the tables of :mod:`._table`, the branch and bound of :mod:`.search`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SearchResult:
    """Best sets found. ``key`` = (min level, total milli-GB/s, -NUMA nodes, near NICs, PCIe-path score); higher is better.

    ``sets`` tie on everything but the PCIe-path score (criterion 4 comes before it), best PCIe paths first.
    """

    key: tuple
    sets: list[int]  # tied masks (at most the tie cap)
    runners: list[tuple[tuple, int]] = field(default_factory=list)  # (key, mask), best first
    optimal: bool = True
    bound_mgbps: int | None = None
    expansions: int = 0
    hit: int | None = None  # table search: index of the first tied set in the sorted k-subsets
