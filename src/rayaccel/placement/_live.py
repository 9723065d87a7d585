"""Incremental node ranking for :func:`~rayaccel.placement.cluster.place` across calls.

A cluster placer is called again and again on (nearly) the same node list:
between two decisions a few nodes change state. :class:`NodeState` is frozen,
so a node whose object is the same one as last time has the same state and the
same rank. :class:`LiveRanks` keeps, per request, the node objects seen last
time, their ranks, and per distinct rank a heap of positions; a call compares
the list with that snapshot by identity (one pass at C speed), re-ranks only the
positions that changed, and reads the best rank (few distinct values) and its
first position (heap top) without a pass over all ranks. The answer is the same
as ranking every node afresh: ties still go to the first node in the list.
"""

from __future__ import annotations

import heapq
from operator import is_not


class LiveRanks:
    """Ranks of one node list for one request (see the module docstring). Not thread-safe: callers lock."""

    __slots__ = ("snap", "ranks", "heaps", "counts", "pushes", "ids")

    def __init__(self, nodes: list, ranks: list[int]):
        self.snap = list(nodes)
        self.ranks = ranks
        self.ids: dict | None = None  # node_id -> first position, built on first use
        self._index()

    def _index(self) -> None:
        self.heaps: dict[int, list[int]] = {}
        self.counts: dict[int, int] = {}
        self.pushes = 0
        for i, r in enumerate(self.ranks):
            self.heaps.setdefault(r, []).append(i)  # ascending positions: already a heap
            self.counts[r] = self.counts.get(r, 0) + 1

    def position_of(self, node_id) -> int | None:
        """The first position whose node has ``node_id``, or None."""
        if self.ids is None:
            ids: dict = {}
            for i, st in enumerate(self.snap):
                ids.setdefault(st.node_id, i)
            self.ids = ids
        return self.ids.get(node_id)

    def changed(self, nodes) -> list[int] | None:
        """Positions whose node object differs from the snapshot; None when the list length changed."""
        if len(nodes) != len(self.snap):
            return None
        diff = list(map(is_not, nodes, self.snap))
        out = []
        try:
            i = diff.index(True)
            while True:
                out.append(i)
                i = diff.index(True, i + 1)
        except ValueError:
            pass
        return out

    def update(self, i: int, node, rank: int) -> None:
        """Position ``i`` now holds ``node`` with ``rank``."""
        prev = self.snap[i]
        self.snap[i] = node
        if self.ids is not None and prev.node_id != node.node_id:
            self.ids = None  # rare (a node list reordered in place): rebuilt on next use
        old = self.ranks[i]
        if old == rank:
            return
        self.ranks[i] = rank
        c = self.counts[old] - 1
        if c:
            self.counts[old] = c
        else:
            del self.counts[old]
            del self.heaps[old]
        self.counts[rank] = self.counts.get(rank, 0) + 1
        heapq.heappush(self.heaps.setdefault(rank, []), i)
        self.pushes += 1
        if self.pushes > 4 * len(self.ranks) + 64:  # stale heap entries: rebuild (amortized O(1))
            self._index()

    def best(self) -> tuple[int, int]:
        """(the highest rank, the first position holding it); (-1, -1) for an empty list."""
        if not self.counts:
            return -1, -1
        top = max(self.counts)
        heap = self.heaps[top]
        ranks = self.ranks
        while ranks[heap[0]] != top:  # positions that have since moved to another rank
            heapq.heappop(heap)
        return top, heap[0]
