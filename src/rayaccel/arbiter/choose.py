"""The chooser a worker uses: the node table's precomputed plans first, the placer only when they have no answer."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from .table import NodeTable


class TableChooser:
    """A :class:`~.decide.Chooser` answering plain requests from the node table.

    Args:
        table: the node table (its plans cover pools of up to :data:`~.table.PLAN_MAX` devices).
        topology: loads the node's topology, called only when the placer is needed.
    """

    def __init__(self, table: NodeTable, topology: Callable[[], Any]):
        self.table = table
        self._topology = topology
        self._placer: Any = None
        self._positions = {r: {u: i for i, u in enumerate(t.units)} for r, t in table.resources.items()}
        #: How many choices the plans answered / the placer had to make (the overhead benchmark reports them).
        self.answered = 0
        self.placed = 0

    def placer(self) -> Any:
        """The placer over the node's topology (loaded on first use)."""
        if self._placer is None:
            # Imported here, not at the top: the placer and the topology model cost tens of
            # milliseconds to import, which a worker whose grants the table answers never pays.
            from .placer import PlacerChooser, spec_of

            specs = {r: spec_of(t.spec) for r, t in self.table.resources.items() if t.spec}
            self._placer = PlacerChooser(self._topology(), specs)
        return self._placer

    def _plan(self, resource: str, avail: frozenset, k: int) -> str | None:
        t = self.table.resources.get(resource)
        if t is None or t.plans is None:
            return None
        pos = self._positions[resource]
        mask = 0
        for u in avail:
            mask |= 1 << pos[u]
        return t.plan(mask, k)

    def choose(self, resource: str, avail: frozenset, k: int, request: Any) -> tuple[tuple | None, str]:
        if request is None:
            e = self._plan(resource, avail, k)
            if e:
                self.answered += 1
                units = self.table.resources[resource].units
                return tuple(units[int(c, 16)] for c in e.rstrip("+")), ""
        self.placed += 1
        return self.placer().choose(resource, avail, k, request)

    def gang(self, resource: str, avail: frozenset, sizes: Mapping[int, int]) -> Mapping[int, tuple] | None:
        if sizes and all(v == 1 for v in sizes.values()):
            e = self._plan(resource, avail, len(sizes))
            if e:
                self.answered += 1
                units = self.table.resources[resource].units
                order = [units[int(c, 16)] for c in e.rstrip("+")]
                if e.endswith("+"):  # ascending is a best ring too: Ray Train ranks by lowest id
                    order.sort()
                return {b: (order[i],) for i, b in enumerate(sorted(sizes))}
        self.placed += 1
        return self.placer().gang(resource, avail, sizes)
